// Launching a planned pass: chained launches, our own kernels and cuBLAS calls queued on the
// stream, each launch error named by kernel and batch, and the pass's kernels counted.
#include <chrono>
#include <stdexcept>
#include <string>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

std::string describe_kernel(const char* what, uint32_t batch, const char* pass) {
  return std::string("kernel '") + what + "' of the " + pass + " pass (batch " +
         std::to_string(batch) + ")";
}

namespace {

std::string describe(const Command& c, const char* pass) {
  return describe_kernel(c.what, c.batch, pass);
}

std::string describe(const Pass& pass, const Launch& l, const char* name) {
  const Command& c = pass.commands[l.begin];
  if (l.stages == 0) return describe(c, name);
  return "a chained launch of " + std::to_string(l.end - l.begin) + " kernels, from " +
         describe(c, name) + " to " + describe(pass.commands[l.end - 1], name);
}

}  // namespace

const LinearDesc* Launcher::second_linear(const Command& c) const {
  return c.group2 == kNoOperand ? nullptr : &linears_[c.group2];
}

void Launcher::launch(const Command& c, const PassAddresses& at) {
  const cudaStream_t stream = queue_.stream();
  const cublasHandle_t blas = queue_.blas();
  switch (c.kind) {
    case Command::Kind::Steps:
      launch_steps(at.view, groups_[c.group], forward_, stream);
      return;
    case Command::Kind::Gather:
      launch_gather(at.view, c.operand, c.count, c.k, c.per_node, c.buffer, stream);
      return;
    case Command::Kind::Scatter:
      launch_scatter_add(at.view, c.operand, c.count, c.k, c.per_node, c.buffer, stream);
      return;
    case Command::Kind::Gemm:
      EDBATCH_CUBLAS_CHECK(blas::sgemm(blas, c.ta, c.tb, c.m, c.n, c.kk, &c.alpha, c.a, c.lda, c.b,
                                       c.ldb, &c.beta, c.c, c.ldc));
      return;
    case Command::Kind::GemmBatched: {
      const float* const* a = at.ptrs + c.ptr_begin;
      const float* const* b = a + c.batch_count;
      float* const* cc = const_cast<float* const*>(b + c.batch_count);
      EDBATCH_CUBLAS_CHECK(blas::sgemm_batched(blas, c.ta, c.tb, c.m, c.n, c.kk, &c.alpha, a, c.lda,
                                               b, c.ldb, &c.beta, cc, c.ldc, c.batch_count));
      return;
    }
    case Command::Kind::LinearForward:
      launch_linear_forward(at.view, linears_[c.group], second_linear(c), stream);
      return;
    case Command::Kind::LinearBackward:
      launch_linear_backward(at.view, linears_[c.group], second_linear(c), stream);
      return;
    case Command::Kind::Lookups:
      launch_lookups(at.view, at.lookups, at.lookup_starts, c.count, at.lookup_blocks, forward_,
                     stream);
      return;
    case Command::Kind::SumColumns:
      launch_sum_columns(c.a, static_cast<uint32_t>(c.lda), static_cast<uint32_t>(c.m),
                         static_cast<uint32_t>(c.n), c.c, stream);
      return;
  }
}

void Launcher::run_pass(Pass& pass, const char* name, const LaunchPlan& plan,
                        const PassAddresses& at, DeviceQueue::Timing& timing) {
  const std::vector<Launch>& launches = plan.launches;
  groups_ = std::move(pass.groups);
  linears_ = std::move(pass.linears);
  forward_ = pass.forward;
  const bool profile = profiler_.enabled();
  unsigned long long* stage_times = nullptr;
  if (profile) {
    profiler_.reserve_events(launches.size() + 1);
    stage_times = profiler_.stage_times(plan.stages.size(), queue_.stream());
  }
  const auto host_start = std::chrono::steady_clock::now();  // timing.start: at the upload
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    if (profile) EDBATCH_CUDA_CHECK(cudaEventRecord(profiler_.event(i), queue_.stream()));
    try {
      if (l.stages > 0)
        launch_chain(at.view,
                     Chain{at.stages + l.stage_begin, at.stage_of + l.map_begin,
                           at.counters + l.counter_begin, at.groups, at.linears, at.lookups,
                           at.lookup_starts, at.waits, l.blocks,
                           stage_times ? stage_times + 2 * l.stage_begin : nullptr},
                     queue_.stream());
      else
        launch(pass.commands[l.begin], at);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string(e.what()) + " in " + describe(pass, l, name));
    }
    cudaError_t e = cudaPeekAtLastError();
    if (e == cudaSuccess && options_.sync_each_launch) e = cudaStreamSynchronize(queue_.stream());
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string("[cuda] ") + cudaGetErrorString(e) + " in " +
                               describe(pass, l, name));
    }
  }
  if (profile)
    EDBATCH_CUDA_CHECK(cudaEventRecord(profiler_.event(launches.size()), queue_.stream()));
  EDBATCH_CUDA_CHECK(cudaEventRecord(timing.stop, queue_.stream()));
  timing.queued = true;
  const double host_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - host_start).count();
  queue_.note_pass(name, pass.commands, !plan.stages.empty());
  queue_.mark_queued();
  if (profile) {
    queue_.wait();
    float ms = 0;
    EDBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, timing.start, timing.stop));
    profiler_.add_pass(pass, plan, host_ms, ms);
  }
  counters_.kernels += launches.size();
  for (const Launch& l : launches) {
    counters_.stages += l.stages > 0 ? l.critical : 1;  // its longest chain of waits
    const Command& c = pass.commands[l.begin];
    if (l.stages == 0 && c.kind == Command::Kind::LinearBackward)
      for (uint32_t g : {c.group, c.group2})  // a bias gradient that needs its own launch
        if (g != kNoOperand) {
          counters_.kernels += linear_backward_launches(linears_[g]) - 1;
          counters_.stages += linear_backward_launches(linears_[g]) - 1;
        }
  }
  counters_.bytes_copied += pass.bytes_copied;
  counters_.arena_bytes =
      arenas_.values.bytes() + arenas_.adjoints.bytes() + arenas_.scratch.bytes();
}

}  // namespace edbatch::cuda
