// Optimizer steps on the device (edbatch/optim.h has the formulas): a squared-norm reduction for
// clipping and one update kernel over segments, a thread block per segment, the same per-element
// arithmetic as apply_update on the host (src/core/optim.cpp).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device.h"

namespace edbatch::cuda {

namespace {

constexpr uint32_t kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    squared_norm_kernel(const float* grads, const UpdateSegment* segments, uint32_t count,
                        double* sum) {
  __shared__ double partial[kThreads];
  double s = 0;
  for (uint32_t k = blockIdx.x; k < count; k += gridDim.x) {
    const UpdateSegment seg = segments[k];
    const float* g = grads + seg.offset;
    for (uint32_t i = threadIdx.x; i < seg.floats; i += blockDim.x) {
      const double x = g[i];
      s += x * x;
    }
  }
  partial[threadIdx.x] = s;
  __syncthreads();
  for (uint32_t half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0 && partial[0] != 0) atomicAdd(sum, partial[0]);
}

// The factor s of the formulas, as clip_scale on the host.
__device__ float scale_of(const DeviceRule& r, const double* squared_norm) {
  if (r.clip_norm <= 0 || squared_norm == nullptr) return r.grad_scale;
  const double norm = fabs(static_cast<double>(r.grad_scale)) * sqrt(*squared_norm);
  if (!(norm > r.clip_norm)) return r.grad_scale;
  return static_cast<float>(r.grad_scale * (r.clip_norm / norm));
}

__global__ void __launch_bounds__(kThreads)
    update_kernel(float* values, float* grads, float* m, float* v, const UpdateSegment* segments,
                  uint32_t count, DeviceRule r, const double* squared_norm) {
  const float scale = scale_of(r, squared_norm);
  for (uint32_t k = blockIdx.x; k < count; k += gridDim.x) {
    const UpdateSegment seg = segments[k];
    for (uint32_t i = threadIdx.x; i < seg.floats; i += blockDim.x) {
      const uint64_t at = seg.offset + i;
      float w = values[at];
      // No contraction into fused multiply-adds: the same roundings as the host.
      const float g = __fadd_rn(__fmul_rn(grads[at], scale), __fmul_rn(r.weight_decay, w));
      if (r.kind == 0) {  // sgd
        if (r.momentum_slot) {
          const float b = __fadd_rn(__fmul_rn(r.momentum, m[at]), g);
          m[at] = b;
          w = __fsub_rn(w, __fmul_rn(r.lr, b));
        } else {
          w = __fsub_rn(w, __fmul_rn(r.lr, g));
        }
      } else if (r.kind == 1) {  // adam
        const float mm = __fadd_rn(__fmul_rn(r.beta1, m[at]), __fmul_rn(1.0f - r.beta1, g));
        const float vv =
            __fadd_rn(__fmul_rn(r.beta2, v[at]), __fmul_rn(__fmul_rn(1.0f - r.beta2, g), g));
        m[at] = mm;
        v[at] = vv;
        const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(vv, r.bc2)), r.eps);
        w = __fsub_rn(w, __fdiv_rn(__fmul_rn(r.lr, __fdiv_rn(mm, r.bc1)), denom));
      } else {  // adagrad
        const float G = __fadd_rn(m[at], __fmul_rn(g, g));
        m[at] = G;
        w = __fsub_rn(w, __fdiv_rn(__fmul_rn(r.lr, g), __fadd_rn(__fsqrt_rn(G), r.eps)));
      }
      values[at] = w;
      grads[at] = 0.0f;
    }
  }
}

unsigned blocks_for(uint32_t count) {
  return std::max(1u, std::min(count, 65535u));
}

}  // namespace

void launch_squared_norm(const float* grads, const UpdateSegment* segments, uint32_t count,
                         double* sum, Stream s) {
  if (count == 0) return;
  squared_norm_kernel<<<std::min(blocks_for(count), 1024u), kThreads, 0, s>>>(grads, segments,
                                                                              count, sum);
}

void launch_update(float* values, float* grads, float* m, float* v, const UpdateSegment* segments,
                   uint32_t count, const DeviceRule& rule, const double* squared_norm, Stream s) {
  if (count == 0) return;
  update_kernel<<<blocks_for(count), kThreads, 0, s>>>(values, grads, m, v, segments, count, rule,
                                                       squared_norm);
}

}  // namespace edbatch::cuda
