// The one place where environment variables reach edbatch: debugging switches mapped onto the
// options structs. Nothing else in the library reads the environment.
//
//   EDBATCH_CUDA_CHAIN=0|forward   CudaOptions::chain (None | Forward; unset or 1: All)
//   EDBATCH_CUDA_STAGE_WAITS=0|1   CudaOptions::stage_waits (InOrder | Always; unset or auto: Auto)
//   EDBATCH_CUDA_SYNC=1            CudaOptions::sync_each_launch
//   EDBATCH_CUDA_LINEAR=cublas     CudaOptions::fused_linear = false
//   EDBATCH_CUDA_EPILOGUE=1|0      CudaOptions::gemm_epilogue
//   EDBATCH_CUDA_RUNS=0|1          CudaOptions::pointwise_runs
//   EDBATCH_CUDA_PREPARE=0|1       CudaOptions::prepare_ahead
//   EDBATCH_CUDA_LINEAR_BLOCKS=N   CudaOptions::linear_min_blocks (a whole number; 0: the device's)
//   EDBATCH_CUDA_PROFILE=1         CudaOptions::profile
//   EDBATCH_TORCH_PROFILE=1        AdapterDebugOptions::profile
//   EDBATCH_TORCH_HOST_COPY=1      AdapterDebugOptions::host_copy
//   EDBATCH_TORCH_WAIT=1           AdapterDebugOptions::wait_each_call
//   XDG_CACHE_HOME, HOME           default_policy_cache_dir() (the "auto" policy's cache)
//   EDBATCH_INTERRUPT_AFTER=N      interrupt_after_env() (`edbatch run` sends itself SIGINT)
//   EDBATCH_FAIL_FORWARD=N         EngineOptions::fail_forward_at (pass N of each engine fails)
//   EDBATCH_FAIL_BACKWARD=N        EngineOptions::fail_backward_at
//
// The command line and the PyTorch adapter apply it to their options; programs using the C++
// API call it where they want the same switches.
#pragma once
#include <cstdint>
#include <string>

#include "edbatch/backend.h"
#include "edbatch/engine.h"

namespace edbatch {

// Returns `o` with the switches the environment sets; unset variables leave fields as they are.
// A set variable with a value it does not know throws std::invalid_argument naming it.
CudaOptions apply_debug_env(CudaOptions o);
EngineOptions apply_debug_env(EngineOptions o);
// The PyTorch adapter's debugging switches (docs/pytorch.md).
struct AdapterDebugOptions {
  bool profile = false;         // host time per call by phase, printed at exit
  bool host_copy = false;       // CUDA tensors through host memory instead of device interop
  bool wait_each_call = false;  // wait for the device after every call (attributes errors)
};
AdapterDebugOptions adapter_debug_env();

// Where the "auto" policy caches what it learns: $XDG_CACHE_HOME/edbatch/policies, else
// $HOME/.cache/edbatch/policies; empty when neither variable is set (then nothing is cached).
std::string default_policy_cache_dir();

// EDBATCH_INTERRUPT_AFTER: the measured mini-batches after which `edbatch run` sends itself
// SIGINT (0 when unset or empty); throws std::invalid_argument for anything but a positive
// whole number.
uint64_t interrupt_after_env();

// A switch: false when `name` is unset or empty, or 0, false, no or off; true for 1, true, yes or
// on (either case). Throws std::invalid_argument naming the variable for anything else.
bool env_flag(const char* name);

}  // namespace edbatch
