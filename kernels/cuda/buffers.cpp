// Grow-only device and pinned host buffers, the staging rings' events, and the host mirror that
// value() and adjoint() read through.
#include <algorithm>
#include <chrono>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

// Growth doubles (from 1 MiB): a run of growing mini-batches pays for few growths (pinned host
// memory in particular costs milliseconds to allocate).
namespace {
size_t grown_size(size_t bytes, size_t old) { return std::max({bytes, 2 * old, size_t{1} << 20}); }
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

bool DeviceBuffer::reserve(size_t bytes, Stream s) {
  if (bytes <= bytes_) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t grown = grown_size(bytes, bytes_);
  if (data_) EDBATCH_CUDA_CHECK(cudaFreeAsync(data_, s));
  data_ = nullptr;
  bytes_ = 0;
  EDBATCH_CUDA_CHECK(cudaMallocAsync(&data_, grown, s));
  bytes_ = grown;
  grow_ms_ += ms_since(t0);
  return true;
}

bool DeviceBuffer::grow_keeping(size_t bytes, size_t keep, Stream s) {
  if (bytes <= bytes_) return false;
  if (data_ == nullptr || keep == 0) return reserve(bytes, s);
  const auto t0 = std::chrono::steady_clock::now();
  const size_t grown = grown_size(bytes, bytes_);
  void* fresh = nullptr;
  EDBATCH_CUDA_CHECK(cudaMallocAsync(&fresh, grown, s));
  EDBATCH_CUDA_CHECK(
      cudaMemcpyAsync(fresh, data_, std::min(keep, bytes_), cudaMemcpyDeviceToDevice, s));
  EDBATCH_CUDA_CHECK(cudaFreeAsync(data_, s));
  data_ = fresh;
  bytes_ = grown;
  grow_ms_ += ms_since(t0);
  return true;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

bool PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t grown = grown_size(bytes, bytes_);
  if (data_) EDBATCH_CUDA_CHECK(cudaFreeHost(data_));
  data_ = nullptr;
  bytes_ = 0;
  EDBATCH_CUDA_CHECK(cudaMallocHost(&data_, grown));
  bytes_ = grown;
  grow_ms_ += ms_since(t0);
  return true;
}

StagingRing::StagingRing() {
  for (cudaEvent_t& ev : copied)
    EDBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
}

StagingRing::~StagingRing() {
  for (cudaEvent_t ev : copied) cudaEventDestroy(ev);
}

void HostMirror::reset(size_t floats) {
  if (floats > capacity) {
    capacity = std::max(floats, 2 * capacity);
    data.reset(new float[capacity]);
  }
  fetched.assign((floats + kMirrorChunk - 1) / kMirrorChunk, 0);
  span = 1;
}

const float* HostMirror::read(const float* device, size_t offset, size_t floats, size_t total) {
  float* host = data.get();
  const size_t c0 = offset / kMirrorChunk;
  const size_t c1 = (offset + std::max<size_t>(floats, 1) - 1) / kMirrorChunk;
  for (size_t c = c0; c <= c1 && c < fetched.size(); ++c) {
    if (fetched[c]) continue;
    // This read's chunks, or the span if longer, up to the first chunk already here.
    const size_t last = std::min(fetched.size(), std::max(c1 + 1, c + span));
    size_t end = c;
    while (end < last && !fetched[end]) fetched[end++] = 1;
    const size_t b = c * kMirrorChunk, e = std::min(total, end * kMirrorChunk);
    EDBATCH_CUDA_CHECK(cudaMemcpy(host + b, device + b, (e - b) * sizeof(float),
                                  cudaMemcpyDeviceToHost));
    span = std::min(2 * span, kMirrorMaxSpan);
    c = end - 1;
  }
  return host + offset;
}

}  // namespace edbatch::cuda
