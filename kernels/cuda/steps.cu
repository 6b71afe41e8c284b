// The elementwise family on the GPU: one kernel runs a group of steps (a plain batch, or a
// fused chain of a block's steps) over its invocations. Operands are read through their plan
// modes inside the kernel (views, index lists, ragged lists, per-member operands): no gathers.
// Backward accumulates with atomics, since shared, indexed and weight operands may repeat.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device.h"
#include "kernels/cuda/operands.cuh"
#include "kernels/cuda/steps.cuh"

namespace edbatch::cuda {

namespace {

template <bool Forward>
__global__ void __launch_bounds__(kStepThreads) steps_kernel(DeviceView d, StepGroup g) {
  steps_body<Forward>(d, g, blockIdx.x);
}

template <bool Forward>
__global__ void __launch_bounds__(kLookupThreads) lookups_kernel(DeviceView d, const StepDesc* descs,
                                                                 const uint32_t* starts,
                                                                 uint32_t count) {
  lookups_block<Forward>(d, descs, starts, count, blockIdx.x);
}

__global__ void gather_kernel(DeviceView d, Operand o, uint32_t count, uint32_t k,
                              uint32_t per_node, float* dst) {
  const uint64_t total = static_cast<uint64_t>(count) * per_node;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t v = static_cast<uint32_t>(t / per_node), r = static_cast<uint32_t>(t % per_node);
    dst[t] = value_ptr(d, o, v, k)[r];
  }
}

__global__ void scatter_add_kernel(DeviceView d, Operand o, uint32_t count, uint32_t k,
                                   uint32_t per_node, const float* src) {
  const uint64_t total = static_cast<uint64_t>(count) * per_node;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t v = static_cast<uint32_t>(t / per_node), r = static_cast<uint32_t>(t % per_node);
    const float x = src[t];
    if (x != 0.0f) atomicAdd(adjoint_ptr(d, o, v, k) + r, x);
  }
}

// Thread i of the x blocks adds its element of columns [y * chunk, (y + 1) * chunk) of `a`,
// four loads in flight, into c[i].
__global__ void sum_columns_kernel(const float* a, uint32_t lda, uint32_t m, uint32_t n,
                                   uint32_t chunk, float* c) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  const uint32_t begin = blockIdx.y * chunk, end = min(n, begin + chunk);
  const float* p = a + i;
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  uint32_t j = begin;
  for (; j + 4 <= end; j += 4) {
    s0 += p[uint64_t(j) * lda];
    s1 += p[uint64_t(j + 1) * lda];
    s2 += p[uint64_t(j + 2) * lda];
    s3 += p[uint64_t(j + 3) * lda];
  }
  for (; j < end; ++j) s0 += p[uint64_t(j) * lda];
  if (begin < end) atomicAdd(c + i, (s0 + s1) + (s2 + s3));
}

__global__ void fill_kernel(float* dst, uint64_t n, float value) {
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    dst[t] = value;
}

__global__ void sgd_kernel(float* values, float* grads, uint64_t n, float lr) {
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    values[t] -= lr * grads[t];
    grads[t] = 0.0f;
  }
}

constexpr uint32_t kTile = 32;

// 32 x 32 tiles through shared memory: reads and writes both coalesced.
__global__ void transpose_kernel(const float* src, uint32_t rows, uint32_t cols, float* dst) {
  __shared__ float tile[kTile][kTile + 1];
  const uint32_t r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  for (uint32_t i = threadIdx.y; i < kTile; i += blockDim.y) {
    const uint32_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[static_cast<uint64_t>(r) * cols + c];
  }
  __syncthreads();
  for (uint32_t i = threadIdx.y; i < kTile; i += blockDim.y) {
    const uint32_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[static_cast<uint64_t>(c) * rows + r] = tile[threadIdx.x][i];
  }
}

__global__ void gather_spans_kernel(const float* src, const uint32_t* spans, uint32_t count,
                                    float* dst) {
  for (uint32_t i = blockIdx.x; i < count; i += gridDim.x) {
    const uint32_t from = spans[3 * i], to = spans[3 * i + 1], n = spans[3 * i + 2];
    for (uint32_t r = threadIdx.x; r < n; r += blockDim.x) dst[to + r] = src[from + r];
  }
}

__global__ void add_spans_kernel(const float* src, const uint32_t* spans, uint32_t count,
                                 float* dst) {
  for (uint32_t i = blockIdx.x; i < count; i += gridDim.x) {
    const uint32_t to = spans[3 * i], from = spans[3 * i + 1], n = spans[3 * i + 2];
    for (uint32_t r = threadIdx.x; r < n; r += blockDim.x) atomicAdd(dst + to + r, src[from + r]);
  }
}

__global__ void transfers_kernel(const TransferDesc* descs) {
  const TransferDesc t = descs[blockIdx.y];
  const uint64_t n = static_cast<uint64_t>(t.rows) * t.cols;
  for (uint64_t e = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = e / t.cols, c = e % t.cols;
    if (t.mode == 0)
      t.dst[e] = t.src[e];
    else if (t.mode == 1)
      t.dst[c * t.rows + r] = t.src[e];
    else
      t.dst[e] = t.src[c * t.rows + r];
  }
}

unsigned grid_for(uint64_t items) {
  const uint64_t blocks = (items + kStepThreads - 1) / kStepThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace

void launch_steps(const DeviceView& d, const StepGroup& g, bool forward, Stream s) {
  const unsigned blocks = (g.k + g.chunk - 1) / g.chunk;
  if (forward)
    steps_kernel<true><<<blocks, kStepThreads, 0, s>>>(d, g);
  else
    steps_kernel<false><<<blocks, kStepThreads, 0, s>>>(d, g);
}

void launch_lookups(const DeviceView& d, const StepDesc* descs, const uint32_t* starts,
                    uint32_t count, uint32_t blocks, bool forward, Stream s) {
  if (blocks == 0) return;
  if (forward)
    lookups_kernel<true><<<blocks, kLookupThreads, 0, s>>>(d, descs, starts, count);
  else
    lookups_kernel<false><<<blocks, kLookupThreads, 0, s>>>(d, descs, starts, count);
}

void launch_gather(const DeviceView& d, const Operand& o, uint32_t count, uint32_t k,
                   uint32_t per_node, float* dst, Stream s) {
  gather_kernel<<<grid_for(static_cast<uint64_t>(count) * per_node), kStepThreads, 0, s>>>(
      d, o, count, k, per_node, dst);
}

void launch_scatter_add(const DeviceView& d, const Operand& o, uint32_t count, uint32_t k,
                        uint32_t per_node, const float* src, Stream s) {
  scatter_add_kernel<<<grid_for(static_cast<uint64_t>(count) * per_node), kStepThreads, 0, s>>>(
      d, o, count, k, per_node, src);
}

void launch_sum_columns(const float* a, uint32_t lda, uint32_t m, uint32_t n, float* c, Stream s) {
  if (m == 0 || n == 0) return;
  // About 1,024 thread blocks in all (several per multiprocessor), each adding at least 16
  // columns, so the loads of a column-wide gradient spread over the device rather than one
  // thread per row walking every column.
  constexpr uint32_t kThreads = 128, kBlocks = 1024, kMinChunk = 16;
  const uint32_t x = (m + kThreads - 1) / kThreads;
  const uint32_t most = std::max(1u, (n + kMinChunk - 1) / kMinChunk);
  const uint32_t y = std::min(std::min(most, std::max(1u, kBlocks / x)), 65535u);
  const uint32_t chunk = (n + y - 1) / y;
  sum_columns_kernel<<<dim3(x, (n + chunk - 1) / chunk), kThreads, 0, s>>>(a, lda, m, n, chunk, c);
}

void launch_fill(float* dst, uint64_t n, float value, Stream s) {
  fill_kernel<<<grid_for(n), kStepThreads, 0, s>>>(dst, n, value);
}

void launch_transpose(const float* src, uint32_t rows, uint32_t cols, float* dst, Stream s) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, 8);
  transpose_kernel<<<grid, block, 0, s>>>(src, rows, cols, dst);
}

void launch_gather_spans(const float* src, const uint32_t* spans, uint32_t count, float* dst,
                         Stream s) {
  if (count == 0) return;
  gather_spans_kernel<<<count < 65535 ? count : 65535, 128, 0, s>>>(src, spans, count, dst);
}

void launch_add_spans(const float* src, const uint32_t* spans, uint32_t count, float* dst,
                      Stream s) {
  if (count == 0) return;
  add_spans_kernel<<<count < 65535 ? count : 65535, 128, 0, s>>>(src, spans, count, dst);
}

void launch_transfers(const TransferDesc* descs, uint32_t count, uint64_t max_floats, Stream s) {
  if (count == 0) return;
  const uint32_t x = static_cast<uint32_t>(std::min<uint64_t>(64, (max_floats + 255) / 256));
  for (uint32_t b = 0; b < count; b += 65535)
    transfers_kernel<<<dim3(std::max(x, 1u), std::min(count - b, 65535u)), 256, 0, s>>>(descs + b);
}

void launch_sgd(float* values, float* grads, uint64_t n, float lr, Stream s) {
  sgd_kernel<<<grid_for(n), kStepThreads, 0, s>>>(values, grads, n, lr);
}

}  // namespace edbatch::cuda
