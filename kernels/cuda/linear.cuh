// Internal to the CUDA kernels: the fused GEMM steps' device code, shared by their own kernels
// and the persistent one. Thread-block coordinates come in as arguments.
#pragma once
#include <algorithm>

#include "kernels/cuda/device.h"
#include "kernels/cuda/operands.cuh"

namespace edbatch::cuda {

namespace {

constexpr uint32_t kTM = kLinearTileRows, kTN = kLinearTileCols, kTK = 16, kLinearThreads = 256;

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

// Block i of a grid g, in row-major order of (x, y, z).
__device__ inline dim3 block_of(uint32_t i, dim3 g) {
  return dim3(i % g.x, (i / g.x) % g.y, i / (g.x * g.y));
}

// acc[i][j] += sum_q a[q][ty * 4 + i] * b[q][tx * 2 + j]: one thread's 4 x 2 share of a tile
// product, from the 16-deep tiles in shared memory.
__device__ inline void accumulate_tile(const float (&a)[kTK][kTM + 4], const float (&b)[kTK][kTN + 1],
                                       uint32_t tx, uint32_t ty, float (&acc)[4][2]) {
#pragma unroll
  for (uint32_t q = 0; q < kTK; ++q) {
    const float b0 = b[q][tx * 2], b1 = b[q][tx * 2 + 1];
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const float x = a[q][ty * 4 + i];
      acc[i][0] += x * b0;
      acc[i][1] += x * b1;
    }
  }
}

// Inner-dimension chunks of kLinearChunk at least (LinearDesc::kc, kcx): the products' inner
// sizes are split so that even a batch of a few columns spreads over many thread blocks; partial
// sums meet in the zeroed output with atomics, and the first chunk adds the bias.
constexpr uint32_t kKC = kLinearChunk;

// Shared memory of a forward or dX thread block: a weight tile, a tile of X (dX: of dY), and
// the X columns' addresses.
struct GemmTiles {
  float ws[kTK][kTM + 4];
  float xs[kTK][kTN + 1];
  const float* xcol[kTN];
};

// A thread block's W slices for its inner chunk [kb, ke) and its row tile r0 (forward: rows of
// W; dX: rows of W^T, i.e. columns of W). With w_ready (W is a parameter) this thread's elements
// of the chunk's first kKC (two tiles of kTK) are loaded into registers before the block waits.
constexpr uint32_t kWSteps = kKC / kTK, kWPerThread = kTK * kTM / kLinearThreads;
struct WSlices {
  const float* w;
  uint32_t kb, ke, r0;
  bool w_ready;
  float wr[kWSteps][kWPerThread];
};

// This thread's element i of a tile: its slot ws[q][r]. Forward (kTransposed false): ws[q][r] =
// W[r0 + r, k0 + q], read along W's columns (contiguous rows); dX: ws[q][r] = W[k0 + q, r0 + r],
// read along k. W is m x (inner), column-major.
template <bool kTransposed>
__device__ inline void w_slot(uint32_t i, uint32_t* q, uint32_t* r) {
  const uint32_t e = threadIdx.x + i * kLinearThreads;
  *q = kTransposed ? e % kTK : e / kTM;
  *r = kTransposed ? e / kTK : e % kTM;
}

// W's value at slot (q, r) of tile h, zero past `rows` or ke.
template <bool kTransposed>
__device__ inline float w_value(const WSlices& s, uint32_t m, uint32_t rows, uint32_t h, uint32_t q,
                                uint32_t r) {
  const uint32_t row = s.r0 + r, k = s.kb + h * kTK + q;
  if (row >= rows || k >= s.ke) return 0.0f;
  return kTransposed ? s.w[k + static_cast<uint64_t>(row) * m]
                     : s.w[row + static_cast<uint64_t>(k) * m];
}

// Resolves W (node v's member, already resolved by member_operand) and, for a parameter, loads
// this thread's elements of every tile.
template <bool kTransposed>
__device__ inline void load_w_slices(WSlices& s, const DeviceView& d, const Operand& w, uint32_t v,
                                     uint32_t m, uint32_t rows) {
  s.w = operand_value_ptr(d, w, v);
  s.w_ready = w.mode == OperandMode::Param;
  if (!s.w_ready) return;
#pragma unroll
  for (uint32_t h = 0; h < kWSteps; ++h)
#pragma unroll
    for (uint32_t i = 0; i < kWPerThread; ++i) {
      uint32_t q, r;
      w_slot<kTransposed>(i, &q, &r);
      s.wr[h][i] = w_value<kTransposed>(s, m, rows, h, q, r);
    }
}

// acc += the block's W slices (from registers for the first kWSteps tiles when w_ready, else from
// W) times its X tiles over the chunk [kb, ke), tile by tile: each tile's loads from global memory
// are issued before the tile before it is multiplied. load_x(c, k): column c's element k (k < ke).
constexpr uint32_t kXPerThread = kTK * kTN / kLinearThreads;
static_assert(kWSteps == 2, "the register slices are selected as wr[0] or wr[1]");
template <bool kTransposed, class LoadX>
__device__ inline void accumulate_chunk(const WSlices& s, uint32_t m, uint32_t rows, GemmTiles& t,
                                        LoadX load_x, float (&acc)[4][2]) {
  const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const uint32_t steps = (s.ke - s.kb + kTK - 1) / kTK;
  float xn[kXPerThread], wn[kWPerThread];
  auto load = [&](uint32_t h) {
    const uint32_t k0 = s.kb + h * kTK;
#pragma unroll
    for (uint32_t j = 0; j < kXPerThread; ++j) {
      const uint32_t e = threadIdx.x + j * kLinearThreads, c = e / kTK, q = e % kTK;
      xn[j] = k0 + q < s.ke ? load_x(c, k0 + q) : 0.0f;
    }
    if (s.w_ready && h < kWSteps) return;
#pragma unroll
    for (uint32_t i = 0; i < kWPerThread; ++i) {
      uint32_t q, r;
      w_slot<kTransposed>(i, &q, &r);
      wn[i] = w_value<kTransposed>(s, m, rows, h, q, r);
    }
  };
  if (steps > 0) load(0);
  for (uint32_t h = 0; h < steps; ++h) {
    const bool from_registers = s.w_ready && h < kWSteps;
#pragma unroll
    for (uint32_t i = 0; i < kWPerThread; ++i) {
      uint32_t q, r;
      w_slot<kTransposed>(i, &q, &r);
      t.ws[q][r] = from_registers ? (h == 0 ? s.wr[0][i] : s.wr[1][i]) : wn[i];
    }
#pragma unroll
    for (uint32_t j = 0; j < kXPerThread; ++j) {
      const uint32_t e = threadIdx.x + j * kLinearThreads;
      t.xs[e % kTK][e / kTK] = xn[j];
    }
    __syncthreads();
    if (h + 1 < steps) load(h + 1);
    accumulate_tile(t.ws, t.xs, tx, ty, acc);
    __syncthreads();
  }
}

// A forward thread block's share: product p (inner size n), the member and its column tile, and
// its W slices.
struct ForwardShare : WSlices {
  uint32_t p, n, member;
  Columns cs;
};

// Grid: x = row tiles of m, y = members x column tiles, z = (product, inner chunk) pairs.
// What reads nothing a pass computes: the block's share, its X columns' addresses (plan
// metadata) into t.xcol, and, when W is a parameter, its W slices into registers. A chained stage
// does this before waiting for the stages it reads from; t.xcol is read after a barrier.
__device__ inline ForwardShare linear_forward_prepare(const DeviceView& d, const LinearDesc& l,
                                                      dim3 block, GemmTiles& t) {
  ForwardShare s;
  uint32_t p = 0, z = block.z;
  while (p + 1 < l.products && z >= linear_chunks(l.n[p], l.kc)) z -= linear_chunks(l.n[p++], l.kc);
  s.p = p;
  s.n = l.n[p];
  s.kb = z * l.kc;
  s.ke = min(s.n, s.kb + l.kc);
  const uint32_t tiles = (l.k * l.cols + kTN - 1) / kTN;
  s.member = block.y / tiles;
  s.cs = member_columns(l, s.member, block.y % tiles);
  s.r0 = block.x * kTM;
  if (threadIdx.x < kTN) {
    const uint32_t c = s.cs.begin + threadIdx.x;
    t.xcol[threadIdx.x] =
        c < s.cs.end ? value_ptr(d, op(d, l.x[p]), c / l.cols, l.k) + (c % l.cols) * s.n : nullptr;
  }
  uint32_t v = s.member * l.k;
  const Operand w = member_operand(d, op(d, l.w[p]), v, l.k);
  load_w_slices<false>(s, d, w, v, l.m, l.m);
  return s;
}

// The rest, after a barrier (and, chained, the waits): Y += W X (+ b from the first chunk).
__device__ inline void linear_forward_finish(const DeviceView& d, const LinearDesc& l,
                                             const ForwardShare& s, GemmTiles& t) {
  const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  accumulate_chunk<false>(
      s, l.m, l.m, t, [&](uint32_t c, uint32_t k) { return t.xcol[c] ? t.xcol[c][k] : 0.0f; }, acc);
  const bool first_chunk = s.p == 0 && s.kb == 0;
  const bool bias = l.bias != kNoOperand && first_chunk;
#pragma unroll
  for (uint32_t j = 0; j < 2; ++j) {
    const uint32_t c = s.cs.begin + tx * 2 + j;
    if (c >= s.cs.end) continue;
    const uint32_t v = c / l.cols, col = c % l.cols;
    float* y = d.values + l.out_offset + static_cast<uint64_t>(v) * l.out_size + col * l.m;
    const float* b = bias ? value_ptr(d, op(d, l.bias), v, l.k) + col * l.m : nullptr;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t r = s.r0 + ty * 4 + i;
      if (r < l.m) atomicAdd(y + r, acc[i][j] + (b ? b[r] : 0.0f));
    }
  }
}

// A forward thread block launched on its own.
__device__ void linear_forward_body(const DeviceView& d, const LinearDesc& l, dim3 block) {
  __shared__ GemmTiles t;
  const ForwardShare s = linear_forward_prepare(d, l, block, t);
  __syncthreads();
  linear_forward_finish(d, l, s, t);
}

// A dX thread block's share: product p (inner size n: dX's rows), chunk [kb, ke) of m (the
// reduced dimension), the member's column tile, row tile r0 of dX (active: r0 < n); the
// addresses of its two columns' dX; its W^T slices.
struct BackwardXShare : WSlices {
  uint32_t p, n;
  Columns cs;
  bool active;
  float* dx[2];
};

// dX_p = W_p^T dY. Grid: x = row tiles of max_n, y = members x column tiles, z = products x
// chunks of m (the reduced dimension). Before the waits, as forward: what reads nothing the pass
// computes.
__device__ inline BackwardXShare linear_backward_x_prepare(const DeviceView& d, const LinearDesc& l,
                                                           dim3 block) {
  BackwardXShare s;
  s.p = block.z / linear_chunks(l.m, l.kcx);
  s.n = l.n[s.p];
  s.kb = (block.z % linear_chunks(l.m, l.kcx)) * l.kcx;
  s.ke = min(l.m, s.kb + l.kcx);
  s.r0 = block.x * kTM;
  s.active = s.r0 < s.n;
  if (!s.active) return s;
  const uint32_t tiles = (l.k * l.cols + kTN - 1) / kTN;
  const uint32_t member = block.y / tiles;
  s.cs = member_columns(l, member, block.y % tiles);
  const uint32_t tx = threadIdx.x % 16;
#pragma unroll
  for (uint32_t j = 0; j < 2; ++j) {
    const uint32_t t = s.cs.begin + tx * 2 + j;
    s.dx[j] = t < s.cs.end ? adjoint_ptr(d, op(d, l.x[s.p]), t / l.cols, l.k) + (t % l.cols) * s.n
                           : nullptr;
  }
  uint32_t v = member * l.k;
  const Operand w = member_operand(d, op(d, l.w[s.p]), v, l.k);
  load_w_slices<true>(s, d, w, v, l.m, s.n);
  return s;
}

__device__ inline void linear_backward_x_finish(const DeviceView& d, const LinearDesc& l,
                                                const BackwardXShare& s, GemmTiles& t) {
  if (!s.active) return;
  const uint32_t ty = threadIdx.x / 16;
  float acc[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  const float* dy = d.adjoints + l.out_offset;
  accumulate_chunk<true>(
      s, l.m, s.n, t,
      [&](uint32_t c, uint32_t k) {
        const uint32_t col = s.cs.begin + c;
        return col < s.cs.end
                   ? dy[static_cast<uint64_t>(col / l.cols) * l.out_size + (col % l.cols) * l.m + k]
                   : 0.0f;
      },
      acc);
#pragma unroll
  for (uint32_t j = 0; j < 2; ++j) {
    if (s.dx[j] == nullptr) continue;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t r = s.r0 + ty * 4 + i;
      if (r < s.n && acc[i][j] != 0.0f) atomicAdd(s.dx[j] + r, acc[i][j]);
    }
  }
}

// A dX thread block launched on its own.
__device__ void linear_backward_x_body(const DeviceView& d, const LinearDesc& l, dim3 block) {
  __shared__ GemmTiles t;
  const BackwardXShare s = linear_backward_x_prepare(d, l, block);
  linear_backward_x_finish(d, l, s, t);
}

// dW_p += dY X_p^T over one member's columns (a share of them per split). Grid: x = row tiles of
// m, y = column tiles of max_n, z = (products x members) x splits. With bias_in_w the blocks of
// product 0 and column tile 0 also sum their rows of dY over their columns into db.
__device__ void linear_backward_w_body(const DeviceView& d, const LinearDesc& l, dim3 block) {
  __shared__ float ys[kTK][kTM + 4];  // ys[q][r] = dY[r0 + r, column t0 + q]
  __shared__ float xs[kTK][kTN + 1];  // xs[q][j] = X[j0 + j, column t0 + q]
  __shared__ const float* xcol[2][kTK];  // the column addresses of two steps, in turn
  const uint32_t members = l.count / l.k;
  const uint32_t split = block.z % l.splits, pm = block.z / l.splits;
  const uint32_t p = pm / members, member = pm % members, n = l.n[p];
  const uint32_t r0 = block.x * kTM, j0 = block.y * kTN;
  if (j0 >= n) return;
  const uint32_t per_member = l.k * l.cols;
  const uint32_t chunk = (per_member + l.splits - 1) / l.splits;
  const uint32_t t_begin = member * per_member + split * chunk;
  const uint32_t t_end = min(member * per_member + per_member, t_begin + chunk);
  const uint32_t steps = t_end > t_begin ? (t_end - t_begin + kTK - 1) / kTK : 0;
  const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const bool bias = l.bias_in_w && p == 0 && block.y == 0;
  // Step h covers columns [t_begin + h kTK, + kTK): its column addresses (threads < kTK, into
  // xcol[h % 2]) two steps ahead, its dY and X elements one step ahead, in registers.
  auto column = [&](uint32_t h) -> const float* {
    const uint32_t t = t_begin + h * kTK + threadIdx.x;
    return t < t_end ? value_ptr(d, op(d, l.x[p]), t / l.cols, l.k) + (t % l.cols) * n : nullptr;
  };
  constexpr uint32_t kYPerThread = kTK * kTM / kLinearThreads;
  float yn[kYPerThread], xn[kXPerThread];
  auto load = [&](uint32_t h) {
    const uint32_t t0 = t_begin + h * kTK;
#pragma unroll
    for (uint32_t i = 0; i < kYPerThread; ++i) {
      const uint32_t e = threadIdx.x + i * kLinearThreads, q = e / kTM, r = e % kTM, t = t0 + q;
      yn[i] = t < t_end && r0 + r < l.m
                  ? d.adjoints[l.out_offset + static_cast<uint64_t>(t / l.cols) * l.out_size +
                               (t % l.cols) * l.m + r0 + r]
                  : 0.0f;
    }
#pragma unroll
    for (uint32_t i = 0; i < kXPerThread; ++i) {
      const uint32_t e = threadIdx.x + i * kLinearThreads, q = e / kTN, j = e % kTN;
      const float* c = xcol[h % 2][q];
      xn[i] = c != nullptr && j0 + j < n ? c[j0 + j] : 0.0f;
    }
  };
  float acc[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  float db = 0.0f;
  if (steps > 0) {
    if (threadIdx.x < kTK) xcol[0][threadIdx.x] = column(0);
    __syncthreads();
    load(0);
    if (threadIdx.x < kTK && steps > 1) xcol[1][threadIdx.x] = column(1);
  }
  for (uint32_t h = 0; h < steps; ++h) {
#pragma unroll
    for (uint32_t i = 0; i < kYPerThread; ++i) {
      const uint32_t e = threadIdx.x + i * kLinearThreads;
      ys[e / kTM][e % kTM] = yn[i];
    }
#pragma unroll
    for (uint32_t i = 0; i < kXPerThread; ++i) {
      const uint32_t e = threadIdx.x + i * kLinearThreads;
      xs[e / kTN][e % kTN] = xn[i];
    }
    __syncthreads();  // also: xcol[(h + 1) % 2] is complete, xcol[h % 2] is read no more
    if (h + 1 < steps) load(h + 1);
    if (threadIdx.x < kTK && h + 2 < steps) xcol[h % 2][threadIdx.x] = column(h + 2);
    accumulate_tile(ys, xs, tx, ty, acc);
    if (bias && threadIdx.x < kTM)
#pragma unroll
      for (uint32_t q = 0; q < kTK; ++q) db += ys[q][threadIdx.x];
    __syncthreads();
  }
  if (bias && threadIdx.x < kTM && r0 + threadIdx.x < l.m && db != 0.0f)
    atomicAdd(adjoint_ptr(d, op(d, l.bias), member * l.k, l.k) + r0 + threadIdx.x, db);
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

// db: with bias_per_node one thread per (node, element) adds dY to the node's own bias (looping
// over the member's nodes in one thread, as below, made a user cell's dX stages 16.8 us at
// mini-batch 32, against 12.0 this way: docs/cuda.md); otherwise one thread per (member, element)
// sums its member's nodes when the member's bias is shared by them, or sends each node's
// gradient to its own bias.
__device__ void linear_bias_body(const DeviceView& d, const LinearDesc& l, uint32_t block,
                                 uint32_t blocks) {
  if (l.bias_per_node) {
    const uint64_t total = static_cast<uint64_t>(l.count) * l.out_size;
    for (uint64_t e = block * static_cast<uint64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<uint64_t>(blocks) * blockDim.x) {
      const float g = d.adjoints[l.out_offset + e];
      const uint32_t v = static_cast<uint32_t>(e / l.out_size);
      if (g != 0.0f) atomicAdd(adjoint_ptr(d, op(d, l.bias), v, l.k) + e % l.out_size, g);
    }
    return;
  }
  const uint32_t members = l.count / l.k;
  const uint64_t total = static_cast<uint64_t>(members) * l.out_size;
  for (uint64_t e = block * static_cast<uint64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<uint64_t>(blocks) * blockDim.x) {
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

// Thread blocks of each launch, as a grid.
__host__ __device__ inline dim3 linear_forward_grid(const LinearDesc& l) {
  return dim3(linear_row_tiles(l.m), linear_column_tiles(l), linear_forward_chunks(l));
}
__host__ __device__ inline dim3 linear_backward_x_grid(const LinearDesc& l) {
  return dim3(linear_row_tiles(l.max_n), linear_column_tiles(l), linear_backward_x_chunks(l));
}
__host__ __device__ inline dim3 linear_backward_w_grid(const LinearDesc& l) {
  const uint32_t members = l.count / l.k;
  return dim3(linear_row_tiles(l.m), linear_chunks(l.max_n, kTN), l.products * members * l.splits);
}
__host__ __device__ inline uint32_t linear_bias_blocks(const LinearDesc& l) {
  const uint64_t total =
      static_cast<uint64_t>(l.bias_per_node ? l.count : l.count / l.k) * l.out_size;
  const uint64_t b = (total + 255) / 256;
  return static_cast<uint32_t>(b < 4096 ? b : 4096);
}


__host__ __device__ inline uint32_t grid_blocks(dim3 g) { return g.x * g.y * g.z; }

// A step's backward thread blocks: [0, dX blocks) compute dX, the rest dW (and db); both read
// only dY, X and W.
__host__ __device__ inline uint32_t linear_backward_blocks(const LinearDesc& l) {
  return grid_blocks(linear_backward_x_grid(l)) + grid_blocks(linear_backward_w_grid(l));
}
__device__ inline void linear_backward_block(const DeviceView& d, const LinearDesc& l, uint32_t b) {
  const dim3 gx = linear_backward_x_grid(l);
  const uint32_t nx = grid_blocks(gx);
  if (b < nx)
    linear_backward_x_body(d, l, block_of(b, gx));
  else
    linear_backward_w_body(d, l, block_of(b - nx, linear_backward_w_grid(l)));
}
// True when the bias gradient needs thread blocks of its own (linear_bias_body).
__host__ __device__ inline bool separate_bias(const LinearDesc& l) {
  return l.bias != kNoOperand && !l.bias_in_w;
}
}  // namespace

}  // namespace edbatch::cuda
