// One launch per pass: a cooperative kernel walks the pass's stages. Each stage's thread blocks
// (the grid its own launch would have) are shared out over the resident blocks, and a grid-wide
// barrier separates dependent stages, so a pass pays one launch instead of one per step.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device.h"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/steps.cuh"

namespace edbatch::cuda {

namespace {

constexpr uint32_t kPersistentThreads = 256;
static_assert(kPersistentThreads == kStepThreads && kPersistentThreads == kLinearThreads,
              "the persistent kernel runs every stage with one block size");

// Runs body(virtual block) for every block of a grid of `blocks`, shared over the resident ones;
// the barrier lets the next virtual block reuse shared memory.
template <class F>
__device__ void share(uint32_t blocks, const F& body) {
  for (uint32_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    body(b);
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kPersistentThreads)
    persistent_kernel(DeviceView d, const Stage* stages, uint32_t count, const StepGroup* groups,
                      const LinearDesc* linears, const StepDesc* lookups) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  for (uint32_t i = 0; i < count; ++i) {
    const Stage st = stages[i];
    switch (st.kind) {
      case Stage::StepsForward:
      case Stage::StepsBackward: {
        const StepGroup& g = groups[st.index];
        const bool forward = st.kind == Stage::StepsForward;
        share((g.k + g.chunk - 1) / g.chunk, [&](uint32_t b) {
          if (forward)
            steps_body<true>(d, g, b);
          else
            steps_body<false>(d, g, b);
        });
        break;
      }
      case Stage::LinearForward: {
        const LinearDesc& l = linears[st.index];
        const dim3 g = linear_forward_grid(l);
        share(g.x * g.y * g.z, [&](uint32_t b) { linear_forward_body(d, l, block_of(b, g)); });
        break;
      }
      case Stage::LinearBackwardX: {
        const LinearDesc& l = linears[st.index];
        const dim3 g = linear_backward_x_grid(l);
        share(g.x * g.y * g.z, [&](uint32_t b) { linear_backward_x_body(d, l, block_of(b, g)); });
        break;
      }
      case Stage::LinearBackwardW: {
        // The weight and bias gradients read only dY: no barrier between them.
        const LinearDesc& l = linears[st.index];
        const dim3 g = linear_backward_w_grid(l);
        share(g.x * g.y * g.z, [&](uint32_t b) { linear_backward_w_body(d, l, block_of(b, g)); });
        if (l.bias != kNoOperand && !l.bias_in_w) {
          const uint32_t blocks = linear_bias_blocks(l);
          share(blocks, [&](uint32_t b) { linear_bias_body(d, l, b, blocks); });
        }
        break;
      }
      case Stage::LookupsForward:
        share(st.index, [&](uint32_t b) { lookup_range<true>(d, lookups[b], threadIdx.x, blockDim.x); });
        break;
      case Stage::LookupsBackward:
        share(st.index, [&](uint32_t b) { lookup_range<false>(d, lookups[b], threadIdx.x, blockDim.x); });
        break;
      default: break;
    }
    if (i + 1 < count) grid.sync();
  }
}

// Two resident blocks per multiprocessor at most: more only make every barrier slower.
int persistent_blocks() {
  static const int blocks = [] {
    int device = 0, sms = 0, per_sm = 0, cooperative = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel,
                                                      kPersistentThreads, 0) != cudaSuccess ||
        !cooperative)
      return 0;
    return sms * (per_sm < 2 ? per_sm : 2);
  }();
  return blocks;
}

}  // namespace

bool launch_persistent(const DeviceView& d, const Stage* stages, uint32_t count,
                       const StepGroup* groups, const LinearDesc* linears,
                       const StepDesc* lookups, Stream s) {
  const int blocks = persistent_blocks();
  if (blocks == 0) return false;
  DeviceView view = d;
  void* args[] = {&view, &stages, &count, &groups, &linears, &lookups};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel), dim3(blocks),
                                     dim3(kPersistentThreads), args, 0, s) == cudaSuccess;
}

}  // namespace edbatch::cuda
