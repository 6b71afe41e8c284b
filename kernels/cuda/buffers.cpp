// Grow-only device and pinned host buffers, the staging rings' events, and the host mirror that
// value() and adjoint() read through.
#include <algorithm>
#include <chrono>
#include <cstring>

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
  for (cudaEvent_t& ev : own)
    EDBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
}

StagingRing::~StagingRing() {
  for (cudaEvent_t ev : own) cudaEventDestroy(ev);
}

void HostMirror::reset(size_t floats) {
  if (floats > capacity) {
    capacity = std::max(floats, 2 * capacity);
    data.reset(new float[capacity]);
  }
  fetched.assign((floats + kMirrorChunk - 1) / kMirrorChunk, 0);
  span = 1;
  held_used_ = 0;
}

void HostMirror::extend(size_t floats, size_t from) {
  const size_t kept = std::min(fetched.size(), from / kMirrorChunk);
  if (floats > capacity) {
    capacity = std::max(floats, 2 * capacity);
    std::unique_ptr<float[]> grown(new float[capacity]);
    for (size_t c = 0; c < kept; ++c)
      if (fetched[c])
        std::memcpy(grown.get() + c * kMirrorChunk, data.get() + c * kMirrorChunk,
                    kMirrorChunk * sizeof(float));
    data = std::move(grown);
  }
  fetched.resize((floats + kMirrorChunk - 1) / kMirrorChunk, 0);
  std::fill(fetched.begin() + static_cast<std::ptrdiff_t>(kept), fetched.end(), 0);
  held_used_ = 0;
}

const float* HostMirror::read(const float* device, size_t offset, size_t floats, size_t total,
                              Stream s) {
  for (size_t i = 0; i < held_used_; ++i)
    if (offset >= held_[i]->begin && offset + floats <= held_[i]->end)
      return held_[i]->buffer.as() + (offset - held_[i]->begin);
  const size_t c0 = offset / kMirrorChunk;
  const size_t c1 = (offset + std::max<size_t>(floats, 1) - 1) / kMirrorChunk;
  for (size_t c = c0; c <= c1 && c < fetched.size(); ++c) {
    if (fetched[c]) continue;
    // This read's chunks, or the span if longer, up to the first chunk already here.
    const size_t last = std::min(fetched.size(), std::max(c1 + 1, c + span));
    size_t end = c;
    while (end < last && !fetched[end]) ++end;
    copy_run(device, c, end, total, s);
    span = std::min(2 * span, kMirrorMaxSpan);
    c = end - 1;
  }
  return data.get() + offset;
}

void HostMirror::fetch(const float* device, const std::vector<std::pair<size_t, size_t>>& ranges,
                       size_t total, Stream s, const std::function<void()>& wait) {
  if (ranges.size() == 1 && ranges[0].first < ranges[0].second &&
      ranges[0].second - ranges[0].first <= kHeldFloats && held_used_ < kMaxHeld) {
    const auto [begin, end] = ranges[0];
    if (held_used_ == held_.size()) held_.push_back(std::make_unique<Held>());
    Held& h = *held_[held_used_++];
    h.buffer.reserve((end - begin) * sizeof(float));
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(h.buffer.as(), device + begin, (end - begin) * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
    h.begin = h.end = 0;  // readable once the copy is done
    wait();
    h.begin = begin;
    h.end = end;
    return;
  }
  runs_.clear();
  size_t floats = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin >= end) continue;
    const size_t c1 = std::min(fetched.size(), (end + kMirrorChunk - 1) / kMirrorChunk);
    for (size_t c = begin / kMirrorChunk; c < c1; ++c) {
      if (fetched[c]) continue;
      size_t run = c;
      while (run < c1 && !fetched[run]) fetched[run++] = 1;
      runs_.emplace_back(c, run);
      floats += std::min(total, run * kMirrorChunk) - c * kMirrorChunk;
      c = run - 1;
    }
  }
  if (floats > kMirrorMaxSpan * kMirrorChunk) {
    wait();
    for (const auto& [c, end] : runs_) copy_run(device, c, end, total, s);
    return;
  }
  bounce.reserve(std::max<size_t>(floats, 1) * sizeof(float));
  size_t at = 0;
  for (const auto& [c, end] : runs_) {
    const size_t n = std::min(total, end * kMirrorChunk) - c * kMirrorChunk;
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(bounce.as() + at, device + c * kMirrorChunk,
                                       n * sizeof(float), cudaMemcpyDeviceToHost, s));
    at += n;
  }
  wait();
  at = 0;
  for (const auto& [c, end] : runs_) {
    const size_t n = std::min(total, end * kMirrorChunk) - c * kMirrorChunk;
    std::memcpy(data.get() + c * kMirrorChunk, bounce.as() + at, n * sizeof(float));
    at += n;
  }
}

// Chunks [c, end): through the pinned bounce buffer, at most kMirrorMaxSpan chunks a copy.
void HostMirror::copy_run(const float* device, size_t c, size_t end, size_t total, Stream s) {
  std::fill(fetched.begin() + static_cast<std::ptrdiff_t>(c),
            fetched.begin() + static_cast<std::ptrdiff_t>(end), 1);
  const size_t b = c * kMirrorChunk, e = std::min(total, end * kMirrorChunk);
  for (size_t piece = b; piece < e; piece += kMirrorMaxSpan * kMirrorChunk) {
    const size_t bytes =
        (std::min(e, piece + kMirrorMaxSpan * kMirrorChunk) - piece) * sizeof(float);
    bounce.reserve(bytes);
    EDBATCH_CUDA_CHECK(
        cudaMemcpyAsync(bounce.as(), device + piece, bytes, cudaMemcpyDeviceToHost, s));
    EDBATCH_CUDA_CHECK(cudaStreamSynchronize(s));
    std::memcpy(data.get() + piece, bounce.as(), bytes);
  }
}

}  // namespace edbatch::cuda
