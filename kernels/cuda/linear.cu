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

__global__ void __launch_bounds__(kLinearThreads) forward_kernel(DeviceView d, LinearDesc l) {
  linear_forward_body(d, l, blockIdx);
}
// Thread blocks [0, dX blocks) compute dX, the rest dW (and db): both read only dY, X and W.
__global__ void __launch_bounds__(kLinearThreads) backward_kernel(DeviceView d, LinearDesc l) {
  const dim3 gx = linear_backward_x_grid(l);
  const uint32_t nx = gx.x * gx.y * gx.z;
  if (blockIdx.x < nx)
    linear_backward_x_body(d, l, block_of(blockIdx.x, gx));
  else
    linear_backward_w_body(d, l, block_of(blockIdx.x - nx, linear_backward_w_grid(l)));
}
__global__ void bias_kernel(DeviceView d, LinearDesc l) {
  linear_bias_body(d, l, blockIdx.x, gridDim.x);
}

}  // namespace

void launch_linear_forward(const DeviceView& d, const LinearDesc& l, Stream s) {
  forward_kernel<<<linear_forward_grid(l), kLinearThreads, 0, s>>>(d, l);
}

void launch_linear_backward(const DeviceView& d, const LinearDesc& l, Stream s) {
  const dim3 gx = linear_backward_x_grid(l), gw = linear_backward_w_grid(l);
  backward_kernel<<<gx.x * gx.y * gx.z + gw.x * gw.y * gw.z, kLinearThreads, 0, s>>>(d, l);
  if (l.bias != kNoOperand && !l.bias_in_w) bias_kernel<<<linear_bias_blocks(l), 256, 0, s>>>(d, l);
}

uint32_t linear_backward_launches(const LinearDesc& l) {
  return l.bias != kNoOperand && !l.bias_in_w ? 2 : 1;
}

}  // namespace edbatch::cuda
