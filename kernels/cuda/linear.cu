// Fused GEMM steps: Y += b + sum_p W_p X_p (the forward pass zeroes the arena first) with the columns of every X_p read in place through
// their operand modes (no gather copies) and the bias added in the same pass; backward writes
// dX_p straight into each node's operand adjoint and reduces dW_p and db per member. Tiles of
// 64 output rows x 32 columns, 16-deep, in shared memory; every tile's columns belong to one
// member, so it has one weight per product.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device.h"
#include "kernels/cuda/operands.cuh"

namespace edbatch::cuda {

namespace {

constexpr uint32_t kTM = 64, kTN = 32, kTK = 16, kThreads = 256;

struct Columns {
  uint32_t begin, end;  // batch columns of this tile
};

// Tile `tile` of member `member`: k * cols columns per member.
__device__ inline Columns member_columns(const LinearDesc& l, uint32_t member, uint32_t tile) {
  const uint32_t per_member = l.k * l.cols;
  const uint32_t base = member * per_member;
  const uint32_t b = base + tile * kTN;
  return Columns{b, min(base + per_member, b + kTN)};
}

__device__ inline const Operand& op(const DeviceView& d, uint32_t i) { return d.operands[i]; }

// Inner-dimension chunk of one thread block: the products' inner sizes are split so that even a
// batch of a few columns spreads over many thread blocks; partial sums meet in the zeroed output
// with atomics, and the first chunk adds the bias.
constexpr uint32_t kKC = 32;

__host__ __device__ inline uint32_t chunks(uint32_t n) { return (n + kKC - 1) / kKC; }

// Grid: x = row tiles of m, y = members x column tiles, z = (product, inner chunk) pairs.
__global__ void __launch_bounds__(kThreads) forward_kernel(DeviceView d, LinearDesc l) {
  __shared__ float ws[kTK][kTM + 4];
  __shared__ float xs[kTK][kTN + 1];
  __shared__ const float* xcol[kTN];
  uint32_t p = 0, z = blockIdx.z;
  while (p + 1 < l.products && z >= chunks(l.n[p])) z -= chunks(l.n[p++]);
  const uint32_t n = l.n[p], kb = z * kKC, ke = min(n, kb + kKC);
  const uint32_t tiles = (l.k * l.cols + kTN - 1) / kTN;
  const uint32_t member = blockIdx.y / tiles;
  const Columns cs = member_columns(l, member, blockIdx.y % tiles);
  const uint32_t r0 = blockIdx.x * kTM;
  const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  const float* w = value_ptr(d, op(d, l.w[p]), member * l.k, l.k);
  if (threadIdx.x < kTN) {
    const uint32_t t = cs.begin + threadIdx.x;
    xcol[threadIdx.x] =
        t < cs.end ? value_ptr(d, op(d, l.x[p]), t / l.cols, l.k) + (t % l.cols) * n : nullptr;
  }
  __syncthreads();
  for (uint32_t k0 = kb; k0 < ke; k0 += kTK) {
    for (uint32_t e = threadIdx.x; e < kTK * kTM; e += kThreads) {
      const uint32_t q = e / kTM, r = e % kTM;
      ws[q][r] = (r0 + r < l.m && k0 + q < ke) ? w[(r0 + r) + static_cast<uint64_t>(k0 + q) * l.m] : 0.0f;
    }
    for (uint32_t e = threadIdx.x; e < kTK * kTN; e += kThreads) {
      const uint32_t c = e / kTK, q = e % kTK;
      xs[q][c] = (xcol[c] != nullptr && k0 + q < ke) ? xcol[c][k0 + q] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (uint32_t q = 0; q < kTK; ++q) {
      const float b0 = xs[q][tx * 2], b1 = xs[q][tx * 2 + 1];
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const float a = ws[q][ty * 4 + i];
        acc[i][0] += a * b0;
        acc[i][1] += a * b1;
      }
    }
    __syncthreads();
  }
  const bool bias = l.bias != kNoOperand && blockIdx.z == 0;
#pragma unroll
  for (uint32_t j = 0; j < 2; ++j) {
    const uint32_t t = cs.begin + tx * 2 + j;
    if (t >= cs.end) continue;
    const uint32_t v = t / l.cols, c = t % l.cols;
    float* y = d.values + l.out_offset + static_cast<uint64_t>(v) * l.out_size + c * l.m;
    const float* b = bias ? value_ptr(d, op(d, l.bias), v, l.k) + c * l.m : nullptr;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t r = r0 + ty * 4 + i;
      if (r < l.m) atomicAdd(y + r, acc[i][j] + (b ? b[r] : 0.0f));
    }
  }
}

// dX_p = W_p^T dY. Grid: x = row tiles of max_n, y = members x column tiles, z = products x
// chunks of m (the reduced dimension).
__global__ void __launch_bounds__(kThreads) backward_x_kernel(DeviceView d, LinearDesc l) {
  __shared__ float ws[kTK][kTM + 4];  // ws[q][i] = W[k0 + q, r0 + i]
  __shared__ float ys[kTK][kTN + 1];
  const uint32_t p = blockIdx.z / chunks(l.m), n = l.n[p];
  const uint32_t kb = (blockIdx.z % chunks(l.m)) * kKC, ke = min(l.m, kb + kKC);
  const uint32_t r0 = blockIdx.x * kTM;
  if (r0 >= n) return;
  const uint32_t tiles = (l.k * l.cols + kTN - 1) / kTN;
  const uint32_t member = blockIdx.y / tiles;
  const Columns cs = member_columns(l, member, blockIdx.y % tiles);
  const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const float* w = value_ptr(d, op(d, l.w[p]), member * l.k, l.k);
  float acc[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  for (uint32_t k0 = kb; k0 < ke; k0 += kTK) {
    for (uint32_t e = threadIdx.x; e < kTK * kTM; e += kThreads) {
      const uint32_t i = e / kTK, q = e % kTK;
      ws[q][i] = (r0 + i < n && k0 + q < ke) ? w[(k0 + q) + static_cast<uint64_t>(r0 + i) * l.m] : 0.0f;
    }
    for (uint32_t e = threadIdx.x; e < kTK * kTN; e += kThreads) {
      const uint32_t c = e / kTK, q = e % kTK;
      const uint32_t t = cs.begin + c;
      float y = 0.0f;
      if (t < cs.end && k0 + q < ke)
        y = d.adjoints[l.out_offset + static_cast<uint64_t>(t / l.cols) * l.out_size +
                       (t % l.cols) * l.m + k0 + q];
      ys[q][c] = y;
    }
    __syncthreads();
#pragma unroll
    for (uint32_t q = 0; q < kTK; ++q) {
      const float b0 = ys[q][tx * 2], b1 = ys[q][tx * 2 + 1];
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const float a = ws[q][ty * 4 + i];
        acc[i][0] += a * b0;
        acc[i][1] += a * b1;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (uint32_t j = 0; j < 2; ++j) {
    const uint32_t t = cs.begin + tx * 2 + j;
    if (t >= cs.end) continue;
    float* dx = adjoint_ptr(d, op(d, l.x[p]), t / l.cols, l.k) + (t % l.cols) * n;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t r = r0 + ty * 4 + i;
      if (r < n && acc[i][j] != 0.0f) atomicAdd(dx + r, acc[i][j]);
    }
  }
}

// dW_p += dY X_p^T over one member's columns (a share of them per split). Grid: x = row tiles of
// m, y = column tiles of max_n, z = (products x members) x splits.
__global__ void __launch_bounds__(kThreads) backward_w_kernel(DeviceView d, LinearDesc l) {
  __shared__ float ys[kTK][kTM + 4];  // ys[q][r] = dY[r0 + r, column t0 + q]
  __shared__ float xs[kTK][kTN + 1];  // xs[q][j] = X[j0 + j, column t0 + q]
  __shared__ const float* xcol[kTK];
  const uint32_t members = l.count / l.k;
  const uint32_t split = blockIdx.z % l.splits, pm = blockIdx.z / l.splits;
  const uint32_t p = pm / members, member = pm % members, n = l.n[p];
  const uint32_t r0 = blockIdx.x * kTM, j0 = blockIdx.y * kTN;
  if (j0 >= n) return;
  const uint32_t per_member = l.k * l.cols;
  const uint32_t chunk = (per_member + l.splits - 1) / l.splits;
  const uint32_t t_begin = member * per_member + split * chunk;
  const uint32_t t_end = min(member * per_member + per_member, t_begin + chunk);
  const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  for (uint32_t t0 = t_begin; t0 < t_end; t0 += kTK) {
    if (threadIdx.x < kTK) {
      const uint32_t t = t0 + threadIdx.x;
      xcol[threadIdx.x] =
          t < t_end ? value_ptr(d, op(d, l.x[p]), t / l.cols, l.k) + (t % l.cols) * n : nullptr;
    }
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < kTK * kTM; e += kThreads) {
      const uint32_t q = e / kTM, r = e % kTM;
      const uint32_t t = t0 + q;
      float y = 0.0f;
      if (t < t_end && r0 + r < l.m)
        y = d.adjoints[l.out_offset + static_cast<uint64_t>(t / l.cols) * l.out_size +
                       (t % l.cols) * l.m + r0 + r];
      ys[q][r] = y;
    }
    for (uint32_t e = threadIdx.x; e < kTK * kTN; e += kThreads) {
      const uint32_t q = e / kTN, j = e % kTN;
      xs[q][j] = (xcol[q] != nullptr && j0 + j < n) ? xcol[q][j0 + j] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (uint32_t q = 0; q < kTK; ++q) {
      const float b0 = xs[q][tx * 2], b1 = xs[q][tx * 2 + 1];
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const float a = ys[q][ty * 4 + i];
        acc[i][0] += a * b0;
        acc[i][1] += a * b1;
      }
    }
    __syncthreads();
  }
  float* dw = adjoint_ptr(d, op(d, l.w[p]), member * l.k, l.k);
#pragma unroll
  for (uint32_t j = 0; j < 2; ++j) {
    const uint32_t c = j0 + tx * 2 + j;
    if (c >= n) continue;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t r = r0 + ty * 4 + i;
      if (r < l.m && acc[i][j] != 0.0f) atomicAdd(dw + r + static_cast<uint64_t>(c) * l.m, acc[i][j]);
    }
  }
}

// db: one thread per (member, element) sums its member's nodes when the member's bias is shared
// by them; otherwise each node's gradient goes to its own bias.
__global__ void bias_kernel(DeviceView d, LinearDesc l) {
  const uint32_t members = l.count / l.k;
  const uint64_t total = static_cast<uint64_t>(members) * l.out_size;
  for (uint64_t e = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t member = static_cast<uint32_t>(e / l.out_size);
    const uint32_t r = static_cast<uint32_t>(e % l.out_size);
    Operand b = op(d, l.bias);
    uint32_t v0 = member * l.k;
    b = member_operand(d, b, v0, l.k);
    const float* dy = d.adjoints + l.out_offset + r;
    if (b.mode == OperandMode::Param || b.mode == OperandMode::Shared) {
      float s = 0.0f;
      for (uint32_t i = 0; i < l.k; ++i)
        s += dy[static_cast<uint64_t>(member * l.k + i) * l.out_size];
      if (s != 0.0f) atomicAdd(adjoint_ptr(d, op(d, l.bias), member * l.k, l.k) + r, s);
    } else {
      for (uint32_t i = 0; i < l.k; ++i) {
        const uint32_t v = member * l.k + i;
        const float g = dy[static_cast<uint64_t>(v) * l.out_size];
        if (g != 0.0f) atomicAdd(adjoint_ptr(d, op(d, l.bias), v, l.k) + r, g);
      }
    }
  }
}

dim3 column_grid(const LinearDesc& l, uint32_t rows) {
  const uint32_t members = l.count / l.k;
  const uint32_t tiles = (l.k * l.cols + kTN - 1) / kTN;
  return dim3((rows + kTM - 1) / kTM, members * tiles, 1);
}

}  // namespace

void launch_linear_forward(const DeviceView& d, const LinearDesc& l, Stream s) {
  dim3 grid = column_grid(l, l.m);
  grid.z = 0;
  for (uint32_t p = 0; p < l.products; ++p) grid.z += chunks(l.n[p]);
  forward_kernel<<<grid, kThreads, 0, s>>>(d, l);
}

void launch_linear_backward_x(const DeviceView& d, const LinearDesc& l, Stream s) {
  dim3 grid = column_grid(l, l.max_n);
  grid.z = l.products * chunks(l.m);
  backward_x_kernel<<<grid, kThreads, 0, s>>>(d, l);
}

void launch_linear_backward_w(const DeviceView& d, const LinearDesc& l, Stream s) {
  const uint32_t members = l.count / l.k;
  const dim3 grid((l.m + kTM - 1) / kTM, (l.max_n + kTN - 1) / kTN, l.products * members * l.splits);
  backward_w_kernel<<<grid, kThreads, 0, s>>>(d, l);
  if (l.bias == kNoOperand) return;
  const uint64_t total = static_cast<uint64_t>(members) * l.out_size;
  const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>((total + 255) / 256, 4096));
  bias_kernel<<<blocks, 256, 0, s>>>(d, l);
}

}  // namespace edbatch::cuda
