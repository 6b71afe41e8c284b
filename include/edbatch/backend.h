// Backends take a whole plan (graph, schedule, memory plan) and run it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edbatch/dim.h"
#include "edbatch/schedule.h"

namespace edbatch {

class Graph;
class ParameterCollection;
class OptimizerState;
struct UpdateRule;
struct Schedule;
struct MemoryPlan;

struct ExecCounters {
  uint64_t kernels = 0;       // kernel launches (a GEMM or an elementwise pass each)
  // Dependent device steps: the longest chain of stages waiting one for another in a chained
  // launch (kernels/cuda/chain.cu; stages that overlap count once), and each other launch one.
  // Equal to kernels where nothing is chained (the CPU, the null backend).
  uint64_t stages = 0;
  uint64_t bytes_copied = 0;  // gathers a kernel could not avoid
  // CPU: block-call batches whose backward ran by invocation range on several threads.
  uint64_t split_call_backward = 0;
  // CPU: weights packed for the small-GEMM kernel (a parameter's W for forward, once per graph
  // and parameter version; W^T for backward, once per pass).
  uint64_t packed_weights = 0;
  uint64_t arena_bytes = 0;   // values + adjoints currently reserved
  uint64_t arena_growths = 0; // times the arena had to grow (0 in steady state)
  uint64_t prepared_passes = 0;  // forward passes run as Backend::prepare_forward encoded them
  // GPU time of the last forward / backward pass, from events around its work on the stream
  // (0 on backends without a device); a forward's adds the increments that continued it.
  double device_forward_ms = 0, device_backward_ms = 0;
};

struct PlanRef {
  const Graph& graph;
  const Schedule& schedule;
  const MemoryPlan& plan;
  ParameterCollection& params;
  // Forward: run the plan's segments from this one (an incremental forward; the values of
  // earlier segments are in the arena and stay there). Backward always covers the whole plan.
  uint32_t first_segment = 0;
};

// The first batch a forward of `p` runs (that of p.first_segment).
uint32_t first_forward_batch(const PlanRef& p);

// Device memory shared with a caller that computes on the same device (the PyTorch adapter on
// CUDA tensors): parameters, gradients, inputs and node values move between the caller's device
// buffers and the backend's without passing through the host. Every call is queued on the
// backend's stream, in order with its passes; pointers are device memory.
class DeviceInterop {
 public:
  virtual ~DeviceInterop() = default;
  // Queue all further work on this stream (a cudaStream_t, as the caller holds it: nullptr is
  // the default stream), after everything already queued on the previous one.
  virtual void use_stream(void* stream) = 0;
  // Back to the backend's own stream (likewise ordered).
  virtual void use_own_stream() = 0;
  // Writes floats [offset, offset + floats) of parameter `id` from `src` (nullptr: zeros). With
  // `row_major` the whole rows x cols parameter is read from a row-major matrix (offset 0).
  // The device copy becomes the current one: the host copy is fetched when host code reads it.
  virtual void write_parameter(ParameterCollection& pc, uint32_t id, const float* src,
                               size_t offset, size_t floats, bool row_major) = 0;
  // Copies parameter `id`'s gradient to `dst` (row-major rows x cols when asked).
  virtual void read_gradient(ParameterCollection& pc, uint32_t id, float* dst, bool row_major) = 0;
  // A parameter and caller device memory: what write_parameters reads, read_gradients writes.
  // `cols`: the parameter's first columns that move (0: all of them; a lookup table with zero
  // columns past the caller's rows moves only the caller's).
  struct Transfer {
    uint32_t id;
    float* data;
    bool row_major;
    uint32_t cols = 0;
  };
  // write_parameter (whole parameters) and read_gradient for several parameters, in one launch.
  virtual void write_parameters(ParameterCollection& pc, const std::vector<Transfer>& t) = 0;
  virtual void read_gradients(ParameterCollection& pc, const std::vector<Transfer>& t) = 0;
  // Zeroes every gradient on the device (ParameterCollection::zero_grads without the host).
  virtual void zero_gradients(ParameterCollection& pc) = 0;
  // The next forward pass takes `floats` floats of the graph's input values, from float
  // `first_input` on, from `src` instead of the host values they were built with. They lie among
  // the inputs of the pass's first segment: a whole graph's first inputs (first_input 0), or
  // those of the nodes an incremental forward adds. src null: none (a pending call is dropped).
  virtual void inputs_from_device(const float* src, size_t floats, size_t first_input) = 0;
  // The first_input of an inputs_from_device that no forward has taken yet, SIZE_MAX if none.
  // Inputs of nodes that ran make the engine run the graph again from its first segment.
  virtual size_t pending_inputs_begin() const = 0;
  // Writes the values (adjoints, after backward) of `nodes` one after another to `dst`: node i's
  // dim.size() floats follow node i-1's.
  virtual void read_nodes(const Graph& g, const MemoryPlan& plan, const std::vector<uint32_t>& nodes,
                          float* dst, bool adjoints) = 0;
};

// Where a backward pass starts: the adjoint 1 at `loss_node`, or, when `nodes` is given, node
// i's adjoint is dim.size() floats of `values` (after node i-1's), added (nodes may repeat or
// share storage; a parameter node's seed goes to its gradient). `values` is host memory, or
// with `on_device` device memory of a device backend.
struct BackwardSeed {
  uint32_t loss_node = UINT32_MAX;
  const std::vector<uint32_t>* nodes = nullptr;
  const float* values = nullptr;
  bool on_device = false;
  // Per batch of the schedule, 1 where no seed depends on any of its nodes: its backward is not
  // run (nullptr: every batch runs). Engine::backward fills it.
  const std::vector<uint8_t>* skip_batches = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Runs the plan's segments from p.first_segment. The arena keeps the values of earlier
  // segments when it grows.
  virtual void forward(const PlanRef& p) = 0;
  // Accumulates parameter gradients into the collection.
  virtual void backward(const PlanRef& p, const BackwardSeed& seed) = 0;
  // Host work of the next forward(p) of this plan done ahead (Engine::prepare): a device
  // backend encodes the pass, growing the buffers it needs, so forward(p) only uploads and
  // launches, unless the graph, the plan or a buffer changed in between. Elsewhere a no-op.
  virtual void prepare_forward(const PlanRef& p) { (void)p; }
  // Host-visible value / adjoint of a node after forward / backward. nullptr where the backend
  // does no math (null).
  // A device backend returns from forward() and backward() once their work is queued, and these
  // wait for it (an asynchronous error surfaces here).
  virtual const float* value(const MemoryPlan& plan, uint32_t node) const = 0;
  virtual const float* adjoint(const MemoryPlan& plan, uint32_t node) const = 0;
  // Host copy of `floats` floats of the value (or adjoint) arena from `offset` after the last
  // pass, waiting for a device: how EngineOptions::check_numerics reads block internals, which
  // are not nodes. nullptr where the backend computes no values.
  virtual const float* arena(const MemoryPlan& plan, uint32_t offset, uint32_t floats,
                             bool adjoints) const;
  // Brings the values of `nodes` (none a parameter) to host memory at once, so that value() of
  // each reads host memory: a device backend copies the range they cover in one copy where they
  // lie close together. Elsewhere a no-op.
  virtual void fetch(const MemoryPlan& plan, const std::vector<uint32_t>& nodes) const;

  // Pipelining: queues a copy of `floats` floats of node's value after the work queued so far,
  // so later passes may be queued before it is read. staged(ticket) waits for the copy and
  // returns host memory, valid until kStagedSlots more stage() calls (nullptr where the backend
  // computes no values). The CPU copies at once.
  static constexpr uint64_t kStagedSlots = 4;
  virtual uint64_t stage(const MemoryPlan& plan, uint32_t node, uint32_t floats);
  virtual const float* staged(uint64_t ticket);
  // values -= lr * grads and zero the gradients, where the parameters live: on a device without
  // a host round trip (the host copies are fetched when host code next reads them).
  virtual void sgd_update(ParameterCollection& params, float lr);
  // One optimizer step (edbatch/optim.h) and the gradients zeroed, where the parameters live: on
  // a device with the optimizer's state kept there too (host code reading the state or the
  // parameters fetches them). The default is apply_update on the host.
  virtual void optimizer_step(ParameterCollection& params, const UpdateRule& rule,
                              OptimizerState& state);
  // Which schedules should list what each batch reads (Schedule::reads), for a backend that
  // orders its work by them: the engine's scheduler makes them.
  virtual BatchReads wants_batch_reads() const { return BatchReads::None; }
  // Waits for all queued work (no-op where nothing is queued).
  virtual void synchronize() {}
  // Device memory interop; nullptr on backends without a device.
  virtual DeviceInterop* device_interop() { return nullptr; }

  const ExecCounters& counters() const { return counters_; }

 protected:
  void check_ticket(uint64_t ticket) const;
  ExecCounters counters_;
  uint64_t next_ticket_ = 0;

 private:
  std::vector<float> staged_[kStagedSlots];
  bool staged_null_[kStagedSlots] = {};
};

// Kernels one forward (or backward) pass of a plan launches: one per batch, and one per step
// group for batches of block calls; from `first_batch` on.
uint64_t kernels_per_pass(const PlanRef& p, uint32_t first_batch = 0);

// Switches of the CUDA backend (ignored elsewhere). Debugging and comparison aids; the defaults
// are the fast path. apply_debug_env (edbatch/options.h) maps EDBATCH_CUDA_* onto them.
struct CudaOptions {
  enum class Chain { None, Forward, All };
  Chain chain = Chain::All;       // chained launches: off, forward passes only, or every pass
  bool sync_each_launch = false;  // wait and check after every launch (names the failing kernel)
  bool fused_linear = true;       // fused GEMM kernels; false: every GEMM step through cuBLAS
  // In a chained forward launch, a block call's elementwise steps run in the stage of the fused
  // GEMM step(s) before them, each thread block once the column tiles of the products holding
  // its invocations are done (GEMM -> elementwise fusion). Off by default: measured no faster
  // than a stage of their own on trees and lattices, slower on random DAGs (docs/cuda.md).
  bool gemm_epilogue = false;
  // A block's consecutive elementwise steps that a thread can evaluate element by element (math,
  // fixed-arity sums, slices of a column) run as one pass with their values in registers, with
  // no barrier between them (kernels/cuda/device.h, "pointwise runs"); false: step by step.
  bool pointwise_runs = true;
  // Engine::prepare encodes the next forward pass too (Backend::prepare_forward); false: the
  // forward encodes it (a comparison aid).
  bool prepare_ahead = true;
  // A fused GEMM step's thread blocks each take a chunk of the inner dimension; the chunk
  // (32 at least) doubles while the step's grid keeps at least this many thread blocks, so a big
  // step runs fewer, longer blocks with fewer atomic partial sums. 0: the device's
  // multiprocessor count (measured best on an H200: docs/cuda.md, "Inner chunks").
  uint32_t linear_min_blocks = 0;
  bool profile = false;  // print kernel counts and device times per pass at exit
  // What a chained launch's stages wait for: the stages whose values they read, so that
  // independent stages overlap (Auto: the passes of graphs scheduled whole; a decoding step's
  // stages form one chain, and the lists of what each batch reads are not made for increments;
  // Always: every pass), or the stage before (InOrder).
  enum class StageWaits { InOrder, Auto, Always };
  StageWaits stage_waits = StageWaits::Auto;
};

struct BackendOptions {
  int threads = 1;
  // A kernel splits over threads only when its work (flops or floats) reaches this.
  double min_parallel_work = 65536;
  CudaOptions cuda = {};
};

// "cpu", "null", "cuda" (throws when built without CUDA).
std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& options);
// The backends this build carries: "cpu", "null", and "cuda" when built with CUDA (whether a GPU
// is present or not: device_unavailable says).
std::vector<std::string> built_backends();
// Empty when make_backend(device) can run here; otherwise why not (built without CUDA, no GPU).
// Cheap: it creates no backend.
std::string device_unavailable(const std::string& device);

}  // namespace edbatch
