// Fused GEMM steps: Y += b + sum_p W_p X_p (into outputs the forward zeroed) with the columns of
// every X_p read in place through their operand modes (no gather copies) and the bias added in
// the same pass; backward writes
// dX_p straight into each node's operand adjoint and reduces dW_p and db per member. Tiles of
// 64 output rows x 32 columns, 16-deep, in shared memory; every tile's columns belong to one
// member, so it has one weight per product.
#include <cuda_runtime.h>

#include "kernels/cuda/device.h"
#include "kernels/cuda/linear.cuh"

namespace edbatch::cuda {

namespace {

// One or two GEMM steps in one grid: thread blocks [0, n1) are l's, the rest l2's.
__global__ void __launch_bounds__(kLinearThreads) forward_kernel(DeviceView d, LinearDesc l,
                                                                 LinearDesc l2, uint32_t n1) {
  if (blockIdx.x < n1)
    linear_forward_body(d, l, block_of(blockIdx.x, linear_forward_grid(l)));
  else
    linear_forward_body(d, l2, block_of(blockIdx.x - n1, linear_forward_grid(l2)));
}

__global__ void __launch_bounds__(kLinearThreads) backward_kernel(DeviceView d, LinearDesc l,
                                                                  LinearDesc l2, uint32_t n1) {
  if (blockIdx.x < n1)
    linear_backward_block(d, l, blockIdx.x);
  else
    linear_backward_block(d, l2, blockIdx.x - n1);
}
__global__ void bias_kernel(DeviceView d, LinearDesc l) {
  linear_bias_body(d, l, blockIdx.x, gridDim.x);
}

}  // namespace

void launch_linear_forward(const DeviceView& d, const LinearDesc& l, const LinearDesc* l2,
                           Stream s) {
  const uint32_t n1 = grid_blocks(linear_forward_grid(l));
  const uint32_t n = n1 + (l2 ? grid_blocks(linear_forward_grid(*l2)) : 0);
  forward_kernel<<<n, kLinearThreads, 0, s>>>(d, l, l2 ? *l2 : l, n1);
}

void launch_linear_backward(const DeviceView& d, const LinearDesc& l, const LinearDesc* l2,
                            Stream s) {
  const uint32_t n1 = linear_backward_blocks(l);
  const uint32_t n = n1 + (l2 ? linear_backward_blocks(*l2) : 0);
  backward_kernel<<<n, kLinearThreads, 0, s>>>(d, l, l2 ? *l2 : l, n1);
  for (const LinearDesc* x : {&l, l2})
    if (x && separate_bias(*x))
      bias_kernel<<<linear_bias_blocks(*x), 256, 0, s>>>(d, *x);
}

uint32_t linear_backward_launches(const LinearDesc& l) {
  return separate_bias(l) ? 2 : 1;
}

void linear_chunk_sizes(LinearDesc& l, uint32_t min_blocks) {
  l.kc = l.kcx = kLinearChunk;
  for (;;) {
    LinearDesc wider = l;
    wider.kc *= 2;
    if (l.kc >= l.max_n || linear_forward_blocks(wider) < min_blocks) break;
    l.kc = wider.kc;
  }
  for (;;) {
    LinearDesc wider = l;
    wider.kcx *= 2;
    if (l.kcx >= l.m || linear_backward_x_blocks(wider) < min_blocks) break;
    l.kcx = wider.kcx;
  }
}

// Measured on an H200 (docs/cuda.md, "Inner chunks"), limits from 2^25 to none, hidden 256 and
// 512, B 128 and 512: the fused backward's dW reduction falls behind cuBLAS sooner than its
// forward does.
bool fused_linear_size(double macs, bool forward) {
  return macs <= (forward ? double(1 << 30) : double(1 << 28));
}

}  // namespace edbatch::cuda
