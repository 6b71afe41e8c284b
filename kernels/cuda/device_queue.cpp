// The stream, the cuBLAS handle bound to it, waiting, asynchronous error reporting and the device
// time of each pass.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

DeviceQueue::DeviceQueue(ExecCounters& counters) : counters_(counters) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0)
    throw std::runtime_error(std::string("[cuda] no CUDA device: ") +
                             (e != cudaSuccess ? cudaGetErrorString(e) : "none found"));
  EDBATCH_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
  stream_ = own_stream_;
  EDBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&switch_, cudaEventDisableTiming));
  // The arenas grow through the device's pool: keep what they free for the next growth.
  int device = 0;
  cudaMemPool_t pool;
  EDBATCH_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 1;
  EDBATCH_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  multiprocessors_ = static_cast<uint32_t>(std::max(sms, 1));
  EDBATCH_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  EDBATCH_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  EDBATCH_CUBLAS_CHECK(blas::create(&blas_));
  EDBATCH_CUBLAS_CHECK(blas::set_stream(blas_, stream_));
  warm_up_cublas();
  for (Timing& t : timings_) {
    EDBATCH_CUDA_CHECK(cudaEventCreate(&t.start));
    EDBATCH_CUDA_CHECK(cudaEventCreate(&t.stop));
  }
}

DeviceQueue::~DeviceQueue() {
  for (Timing& t : timings_) {
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.stop);
  }
  cudaEventDestroy(switch_);
  release_blas();
  if (stream_ != own_stream_) {  // the caller's stream: its later work may free what ours reads
    cudaStreamSynchronize(stream_);
  }
  cudaStreamDestroy(own_stream_);
}

void DeviceQueue::release_blas() {
  if (blas_) blas::destroy(blas_);
  blas_ = nullptr;
}

// cuBLAS pays 29-45 ms on its first batched GEMMs (measured on an H100, inside timed
// mini-batches; not module loading). Pay it here, once, on tiny products of every transpose
// combination the encoder uses: afterwards those calls took 0.13 ms.
void DeviceQueue::warm_up_cublas() {
  constexpr int n = 64, batch = 2;
  float* buf = nullptr;
  const float** ptrs = nullptr;
  EDBATCH_CUDA_CHECK(cudaMalloc(&buf, sizeof(float) * 3 * batch * n * n));
  EDBATCH_CUDA_CHECK(cudaMalloc(&ptrs, sizeof(float*) * 3 * batch));
  EDBATCH_CUDA_CHECK(cudaMemsetAsync(buf, 0, sizeof(float) * 3 * batch * n * n, stream_));
  const float* host[3 * batch];
  for (int i = 0; i < 3 * batch; ++i) host[i] = buf + static_cast<size_t>(i) * n * n;
  EDBATCH_CUDA_CHECK(
      cudaMemcpyAsync(ptrs, host, sizeof(host), cudaMemcpyHostToDevice, stream_));
  const float one = 1.0f;
  const cublasOperation_t ops[3][2] = {
      {CUBLAS_OP_N, CUBLAS_OP_N}, {CUBLAS_OP_N, CUBLAS_OP_T}, {CUBLAS_OP_T, CUBLAS_OP_N}};
  for (const auto& op : ops) {
    EDBATCH_CUBLAS_CHECK(
        blas::sgemm_batched(blas_, op[0], op[1], n, n, n, &one, ptrs, n, ptrs + batch, n, &one,
                            const_cast<float* const*>(ptrs + 2 * batch), n, batch));
    EDBATCH_CUBLAS_CHECK(blas::sgemm(blas_, op[0], op[1], n, n, n, &one, buf, n, buf + n * n, n,
                                     &one, buf + 2 * n * n, n));
  }
  EDBATCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  EDBATCH_CUDA_CHECK(cudaFree(ptrs));
  EDBATCH_CUDA_CHECK(cudaFree(buf));
}

void DeviceQueue::switch_to(cudaStream_t next) {
  if (next == stream_) return;
  queued_work_ = true;  // the next wait covers the stream we leave too
  EDBATCH_CUDA_CHECK(cudaEventRecord(switch_, stream_));
  EDBATCH_CUDA_CHECK(cudaStreamWaitEvent(next, switch_, 0));
  stream_ = next;
  EDBATCH_CUBLAS_CHECK(blas::set_stream(blas_, stream_));
}

void DeviceQueue::note_queued(const char* name, const char* kernels) {
  Queued& q = queued_[queued_count_++ % kQueuedKept];
  q = Queued{};
  q.name = name;
  q.kernels = kernels;
}

void DeviceQueue::note_pass(const char* name, const std::vector<Command>& commands, bool chained) {
  Queued& q = queued_[queued_count_++ % kQueuedKept];
  q = Queued{};
  q.name = name;
  if (commands.empty()) return;
  q.first = commands.front().what;
  q.first_batch = commands.front().batch;
  q.last = commands.back().what;
  q.last_batch = commands.back().batch;
  q.chained = chained;
}

std::string DeviceQueue::Queued::where() const {
  if (kernels) return kernels;
  if (!first) return "no kernel";
  return std::string(chained ? "chained launches running " : "") + "kernels from " +
         describe_kernel(first, first_batch, name) + " to " +
         describe_kernel(last, last_batch, name);
}

void DeviceQueue::wait() {
  if (!queued_work_) return;  // value() reads node by node: nothing to wait for after the first
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) check_async(e);  // throws, naming what was queued
  // Everything queued is done (a stream waits for the one it switched from): no queries, which
  // are calls into the driver of a microsecond or more in a decoding step's round trip.
  queued_count_ = 0;
  collect_timings(true);
  queued_work_ = false;
  ++syncs_;
}

void DeviceQueue::wait_event(cudaEvent_t ev) {
  check_async(cudaEventSynchronize(ev));
  collect_timings();
}

bool DeviceQueue::done(cudaEvent_t ev) {
  const cudaError_t e = cudaEventQuery(ev);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) check_async(e);  // throws
  return false;
}

void DeviceQueue::check_async(cudaError_t e) {
  if (e == cudaSuccess) {
    if (cudaStreamQuery(stream_) == cudaSuccess) queued_count_ = 0;
    return;
  }
  std::string names, where;
  const size_t kept = std::min(queued_count_, kQueuedKept);
  for (size_t i = queued_count_ - kept; i < queued_count_; ++i) {  // oldest first
    const Queued& q = queued_[i % kQueuedKept];
    names += (names.empty() ? "" : ", ") + std::string(q.name);
    where += (where.empty() ? "" : "; ") + q.where();
  }
  if (names.empty()) names = "device";
  if (where.empty()) where = "no kernel";
  queued_count_ = 0;
  throw std::runtime_error("[cuda] " + names + ": asynchronous error " + cudaGetErrorString(e) +
                           " in " + where +
                           "; CudaOptions::sync_each_launch (EDBATCH_CUDA_SYNC=1) checks after "
                           "every kernel and names the failing one");
}

DeviceQueue::Timing& DeviceQueue::next_timing(bool forward, bool adds) {
  Timing& timing = timings_[next_timing_];
  next_timing_ = (next_timing_ + 1) % timings_.size();
  if (timing.queued && !done(timing.stop)) wait_event(timing.stop);
  if (timing.queued) add_time(timing);  // finished (the oldest of the ring)
  timing.forward = forward;
  timing.adds = adds;
  return timing;
}

// Device time of finished passes (CUDA events): the latest finished forward (with the increments
// that continued it) and backward.
void DeviceQueue::collect_timings(bool all_done) {
  for (size_t i = 0; i < timings_.size(); ++i) {
    Timing& t = timings_[(next_timing_ + i) % timings_.size()];  // oldest first
    if (!t.queued || (!all_done && cudaEventQuery(t.stop) != cudaSuccess)) continue;
    add_time(t);
  }
}

void DeviceQueue::add_time(Timing& t) {
  float ms = 0;
  EDBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
  double& total = t.forward ? counters_.device_forward_ms : counters_.device_backward_ms;
  total = t.adds ? total + ms : ms;
  t.queued = false;
}

}  // namespace edbatch::cuda
