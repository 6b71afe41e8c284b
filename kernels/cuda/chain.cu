// Chained launches: a run of a pass's kernels as one launch (see Chain in device.h). Thread
// blocks take tickets in the order they start; ticket t runs one thread block of the stage that
// holds it once the stages it waits for have finished (LaunchPlan::plan: the stage before it, or
// the stages writing what it reads: in a forward pass its arguments' values, in a backward pass
// its outputs' adjoints), so each stage runs with exactly the thread blocks its own launch would
// have had, stages that do not depend on each other overlap, and only thread blocks of later
// stages wait rather than the whole grid.
#include <cuda_runtime.h>

#include "kernels/cuda/device.h"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/steps.cuh"

namespace edbatch::cuda {

namespace {

constexpr uint32_t kChainThreads = 256;
static_assert(kChainThreads == kStepThreads && kChainThreads == kLinearThreads &&
                  kChainThreads == kLookupThreads,
              "a chained launch runs every stage with one block size");

// A stage's descriptors, copied to shared memory before it starts (the kernels launched alone
// get them as parameters, in the constant bank); a fused GEMM stage's epilogue needs both.
struct Descs {
  StepGroup group;
  LinearDesc linear[2];
};

__device__ inline void copy_words(void* dst, const void* src, uint32_t bytes) {
  uint32_t* to = static_cast<uint32_t*>(dst);
  const uint32_t* from = static_cast<const uint32_t*>(src);
  for (uint32_t i = threadIdx.x; i < bytes / 4; i += blockDim.x) to[i] = from[i];
}

// Stage counters. The waiting thread polls with plain strong loads (an acquiring load or fence
// at every poll would also drop the L1 lines of the thread blocks running beside it on the
// multiprocessor) and acquires once it has seen the count; a finished block releases its count.
// Measured against a __threadfence() by one thread on each side: 0.54 against 0.57 ms of device
// time for a Tree-LSTM forward (mini-batch 32, hidden 128).
__device__ inline uint32_t load_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ inline uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void add_release(uint32_t* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(p) : "memory");
}
__device__ inline unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread blocks of l that add into one column tile of its output (every member's, every row
// tile, every inner chunk): what a fused stage's tile counter counts up to, with one column per
// node and tiles of kTN invocations (LaunchPlan checks both).
__device__ inline uint32_t blocks_per_tile(const LinearDesc& l) {
  const dim3 g = linear_forward_grid(l);
  return (l.count / l.k) * g.x * g.z;
}

// Target of a fused stage's tile counters: the GEMM blocks adding into one column tile.
__device__ inline uint32_t tile_target(const Stage& st, const Descs& desc) {
  static_assert(kEpilogueTile == kTN, "a tile counter counts one column tile of the products");
  uint32_t target = blocks_per_tile(desc.linear[0]);
  if (st.index2 != kNoOperand) target += blocks_per_tile(desc.linear[1]);
  return target;
}

// Thread block j of a fused stage's group (Stage::epilogue): once every GEMM block of the tiles
// holding its invocations has counted itself done there, the group's steps over them.
__device__ inline void epilogue_block(const DeviceView& d, const Chain& c, const Stage& st,
                                      const Descs& desc, const OperandCache& cache, uint32_t j) {
  const StepGroup& g = desc.group;
  const uint32_t i0 = j * g.chunk, n = min(g.chunk, g.k - i0);
  const uint32_t target = tile_target(st, desc);
  const uint32_t first = i0 / kEpilogueTile, last = (i0 + n - 1) / kEpilogueTile;
  for (uint32_t t = first + threadIdx.x; t <= last; t += blockDim.x) {
    const uint32_t* done = c.counters + st.epilogue_counters + t;
    while (load_relaxed(done) < target) continue;
    load_acquire(done);
  }
  __syncthreads();
  steps_range<true>(d, g, cache, i0, n);
}

// A backward GEMM stage's thread blocks, per step in turn: its dX blocks, its dW blocks, its
// separate bias-gradient blocks (LinearBackward: all three; LinearBackwardX: dX and bias;
// LinearBackwardW: dW).
enum class Part : uint32_t { X, W, Bias, Count };
__host__ __device__ inline uint32_t part_blocks(uint32_t kind, const LinearDesc& l, Part p) {
  switch (p) {
    case Part::X:
      return kind == Stage::LinearBackwardW ? 0 : grid_blocks(linear_backward_x_grid(l));
    case Part::W:
      return kind == Stage::LinearBackwardX ? 0 : grid_blocks(linear_backward_w_grid(l));
    case Part::Bias:
      return kind != Stage::LinearBackwardW && separate_bias(l) ? linear_bias_blocks(l) : 0;
    default:
      return 0;
  }
}
__host__ __device__ inline uint32_t backward_blocks(uint32_t kind, const LinearDesc& l) {
  return part_blocks(kind, l, Part::X) + part_blocks(kind, l, Part::W) +
         part_blocks(kind, l, Part::Bias);
}

// What thread block b of a backward GEMM stage is: a step, the part and the block's index in it.
struct BackwardBlock {
  const LinearDesc* l;
  Part part;
  uint32_t index;
};
__device__ inline BackwardBlock backward_block(const Stage& st, const Descs& desc, uint32_t b) {
  for (uint32_t h = 0; h < 2; ++h) {
    if (h == 1 && st.index2 == kNoOperand) break;
    for (uint32_t p = 0; p < static_cast<uint32_t>(Part::Count); ++p) {
      const uint32_t n = part_blocks(st.kind, desc.linear[h], static_cast<Part>(p));
      if (b < n) return BackwardBlock{&desc.linear[h], static_cast<Part>(p), b};
      b -= n;
    }
  }
  return BackwardBlock{nullptr, Part::Count, 0};
}

// At most two thread blocks per multiprocessor run (two_per_multiprocessor), so a thread may
// have 128 registers: without the bound ptxas kept it to 64 and spilled (212 bytes).
__global__ void __launch_bounds__(kChainThreads, 2) chain_kernel(DeviceView d, Chain c) {
  __shared__ uint32_t ticket;
  __shared__ Descs desc;
  __shared__ OperandCache cache;
  __shared__ GemmTiles tiles;
  if (threadIdx.x == 0) ticket = atomicAdd(c.counters, 1u);
  __syncthreads();
  const uint32_t t = ticket;
  const uint32_t i = c.stage_of[t];
  const Stage st = c.stages[i];
  const uint32_t b = t - st.first;
  switch (st.kind) {
    case Stage::StepsForward:
    case Stage::StepsBackward:
      copy_words(&desc.group, c.groups + st.index, sizeof(StepGroup));
      break;
    case Stage::LinearForward:
    case Stage::LinearBackward:
    case Stage::LinearBackwardX:
    case Stage::LinearBackwardW:
      copy_words(&desc.linear[0], c.linears + st.index, sizeof(LinearDesc));
      if (st.index2 != kNoOperand)
        copy_words(&desc.linear[1], c.linears + st.index2, sizeof(LinearDesc));
      if (st.kind == Stage::LinearForward && st.epilogue != kNoOperand && b >= st.epilogue_first)
        copy_words(&desc.group, c.groups + st.epilogue, sizeof(StepGroup));
      break;
    default: break;
  }
  __syncthreads();
  // Before waiting, what reads nothing a pass computes (plan metadata, parameters): a step
  // group's operands into shared memory, a forward GEMM block's column addresses and W slices,
  // a dX block's W^T slices and the addresses it adds into (docs/cuda.md, "Reading before
  // waiting"); the next stages' blocks are resident and waiting while a stage runs.
  const bool epilogue =
      st.kind == Stage::LinearForward && st.epilogue != kNoOperand && b >= st.epilogue_first;
  const LinearDesc* lin = nullptr;
  dim3 block;
  ForwardShare share;
  BackwardXShare xshare;
  BackwardBlock back{nullptr, Part::Count, 0};
  if (st.kind == Stage::StepsForward || st.kind == Stage::StepsBackward || epilogue) {
    cache_operands(d, desc.group, cache);
  } else if (st.kind == Stage::LinearBackward || st.kind == Stage::LinearBackwardX ||
             st.kind == Stage::LinearBackwardW) {
    back = backward_block(st, desc, b);
    if (back.part == Part::X)
      xshare = linear_backward_x_prepare(d, *back.l,
                                         block_of(back.index, linear_backward_x_grid(*back.l)));
  } else if (st.kind == Stage::LinearForward) {
    const dim3 g = linear_forward_grid(desc.linear[0]);
    const uint32_t n1 = grid_blocks(g);
    lin = &desc.linear[b >= n1 ? 1 : 0];
    block = b >= n1 ? block_of(b - n1, linear_forward_grid(*lin)) : block_of(b, g);
    share = linear_forward_prepare(d, *lin, block, tiles);
  }
  // Wait until every thread block of the stages this one waits for has finished (they all hold
  // smaller tickets, so they have started): a thread per stage waited for.
  for (uint32_t w = threadIdx.x; w < st.wait_count; w += blockDim.x) {
    const uint32_t* pair = c.waits + 2 * (st.wait_begin + w);
    const uint32_t* done = c.counters + (pair[0] + 1) * kCounterStride;
    while (load_relaxed(done) < pair[1]) continue;
    load_acquire(done);  // what that stage wrote is visible from here on, to the whole block
  }
  __syncthreads();
  if (c.times != nullptr && threadIdx.x == 0) atomicMax(c.times + 2 * i, ~global_ns());
  switch (st.kind) {
    case Stage::StepsForward:
    case Stage::StepsBackward: {
      const StepGroup& g = desc.group;
      const uint32_t i0 = b * g.chunk, n = min(g.chunk, g.k - i0);
      if (st.kind == Stage::StepsForward)
        steps_range<true>(d, g, cache, i0, n);
      else
        steps_range<false>(d, g, cache, i0, n);
      break;
    }
    case Stage::LinearForward:
      if (epilogue) {
        epilogue_block(d, c, st, desc, cache, b - st.epilogue_first);
        break;
      }
      linear_forward_finish(d, *lin, share, tiles);
      if (st.epilogue != kNoOperand) {  // the tile's share added: count it (a release)
        __syncthreads();
        if (threadIdx.x == 0)
          add_release(c.counters + st.epilogue_counters + block.y % epilogue_tiles(lin->k));
      }
      break;
    case Stage::LinearBackward:
    case Stage::LinearBackwardX:
    case Stage::LinearBackwardW:
      if (back.part == Part::X)
        linear_backward_x_finish(d, *back.l, xshare, tiles);
      else if (back.part == Part::W)
        linear_backward_w_body(d, *back.l, block_of(back.index, linear_backward_w_grid(*back.l)));
      else if (back.part == Part::Bias)
        linear_bias_body(d, *back.l, back.index, linear_bias_blocks(*back.l));
      break;
    case Stage::LookupsForward:
      lookups_block<true>(d, c.lookups, c.lookup_starts, st.index, b);
      break;
    case Stage::LookupsBackward:
      lookups_block<false>(d, c.lookups, c.lookup_starts, st.index, b);
      break;
    default:
      break;
  }
  // The barrier orders every thread's writes before thread 0's release of the count.
  __syncthreads();
  if (c.times != nullptr && threadIdx.x == 0) atomicMax(c.times + 2 * i + 1, global_ns());
  if (threadIdx.x == 0) add_release(c.counters + (i + 1) * kCounterStride);
}

// Dynamic shared memory that leaves room for two thread blocks per multiprocessor and no more.
// Fewer blocks per multiprocessor spread each stage's blocks over more of them, and leave fewer
// waiting blocks beside the running ones. Measured on an H100 (mini-batch 32, hidden 128, device
// ms of a forward pass, four / two / one blocks per multiprocessor): Tree-LSTM 0.64 / 0.62 /
// 0.64, Lattice-LSTM 3.84 / 3.64 / 3.47 (with an earlier fence scheme; the lattice prefers one,
// the tree two).
size_t two_per_multiprocessor() {
  static const size_t bytes = [] {
    int device = 0, per_sm = 0;
    cudaFuncAttributes a{};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
            cudaSuccess ||
        cudaFuncGetAttributes(&a, chain_kernel) != cudaSuccess)
      return size_t{0};
    const size_t reserved = 1024;  // per thread block
    const size_t half = static_cast<size_t>(per_sm) / 2;
    if (half < a.sharedSizeBytes + reserved + 4096) return size_t{0};
    const size_t dynamic = half - a.sharedSizeBytes - reserved - 2048;
    if (cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(dynamic)) != cudaSuccess)
      return size_t{0};
    return dynamic;
  }();
  return bytes;
}

}  // namespace

uint32_t stage_blocks(const Stage& s, const StepGroup* groups, const LinearDesc* linears,
                      uint32_t lookup_blocks) {
  switch (s.kind) {
    case Stage::StepsForward:
    case Stage::StepsBackward: {
      const StepGroup& g = groups[s.index];
      return (g.k + g.chunk - 1) / g.chunk;
    }
    case Stage::LinearForward: {
      uint32_t n = grid_blocks(linear_forward_grid(linears[s.index]));
      if (s.index2 != kNoOperand) n += grid_blocks(linear_forward_grid(linears[s.index2]));
      return n;  // a fused group's blocks are added by LaunchPlan::plan when it joins the stage
    }
    case Stage::LinearBackward:
    case Stage::LinearBackwardX:
    case Stage::LinearBackwardW: {
      uint32_t n = backward_blocks(s.kind, linears[s.index]);
      if (s.index2 != kNoOperand) n += backward_blocks(s.kind, linears[s.index2]);
      return n;
    }
    default:
      return lookup_blocks;
  }
}

void launch_chain(const DeviceView& d, const Chain& c, Stream s) {
  if (c.blocks == 0) return;
  chain_kernel<<<c.blocks, kChainThreads, two_per_multiprocessor(), s>>>(d, c);
}

}  // namespace edbatch::cuda
