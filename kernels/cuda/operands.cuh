// Internal to the CUDA kernels: where node v of a batch finds its operand, in every mode of the
// memory plan (per-member operands first pick member v / k's operand, then its node v % k).
#pragma once
#include "kernels/cuda/device.h"

namespace edbatch::cuda {

__device__ inline Operand member_operand(const DeviceView& d, Operand o, uint32_t& v, uint32_t k) {
  if (o.mode == OperandMode::PerMember) {
    o = d.member_operands[o.index_begin + v / k];
    v %= k;
  }
  return o;
}

// Float offset of node v's operand within values/adjoints (or params/grads for Param).
__device__ inline uint64_t operand_offset(const DeviceView& d, const Operand& o, uint32_t v) {
  switch (o.mode) {
    case OperandMode::Param: return d.param_offset[o.param];
    case OperandMode::Shared: return o.offset;
    case OperandMode::Contiguous: return o.offset + static_cast<uint64_t>(v) * o.stride;
    default: return d.index[o.index_begin + v];
  }
}

// Node v's value through an operand member_operand has already resolved.
__device__ inline const float* operand_value_ptr(const DeviceView& d, const Operand& o,
                                                 uint32_t v) {
  const float* base = o.mode == OperandMode::Param ? d.params : d.values;
  return base + operand_offset(d, o, v);
}

__device__ inline const float* value_ptr(const DeviceView& d, Operand o, uint32_t v, uint32_t k) {
  o = member_operand(d, o, v, k);
  return operand_value_ptr(d, o, v);
}

__device__ inline float* adjoint_ptr(const DeviceView& d, Operand o, uint32_t v, uint32_t k) {
  o = member_operand(d, o, v, k);
  float* base = o.mode == OperandMode::Param ? d.grads : d.adjoints;
  return base + operand_offset(d, o, v);
}

}  // namespace edbatch::cuda
