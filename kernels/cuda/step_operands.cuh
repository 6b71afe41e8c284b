// Internal to the CUDA kernels: how a step of the elementwise family reads its operands and adds
// to their adjoints (from the block's shared cache or the plan's arrays), the arguments of
// concatenations and of variadic steps, shared by steps.cuh's forward and backward items.
#pragma once
#include "kernels/cuda/device.h"
#include "kernels/cuda/operands.cuh"
#include "kernels/op_math.h"

namespace edbatch::cuda {

namespace {

// A step's operands and the per-member operands they refer to: in the block's shared cache, or
// the plan's arrays in global memory.
struct Ops {
  const Operand* slots;
  const Operand* members;  // PerMember operands' index_begin points here
};

__device__ inline const Operand& slot(const Ops& o, const StepDesc&, uint32_t j) {
  return o.slots[j];
}

__device__ inline const float* value_at(const DeviceView& d, const Ops& ops, Operand o, uint32_t v,
                                        uint32_t k) {
  if (o.mode == OperandMode::PerMember) {
    o = ops.members[o.index_begin + v / k];
    v %= k;
  }
  return (o.mode == OperandMode::Param ? d.params : d.values) + operand_offset(d, o, v);
}

__device__ inline float* adjoint_at(const DeviceView& d, const Ops& ops, Operand o, uint32_t v,
                                    uint32_t k) {
  if (o.mode == OperandMode::PerMember) {
    o = ops.members[o.index_begin + v / k];
    v %= k;
  }
  return (o.mode == OperandMode::Param ? d.grads : d.adjoints) + operand_offset(d, o, v);
}

// Adjoints are read at L2: other threads of the block may have added to them with atomics.
__device__ inline float load_adjoint(const float* p) {
  return __ldcg(p);
}

// Concat: which argument holds output row `row`, and the row within it.
__device__ inline uint32_t concat_slot(const StepDesc& s, uint32_t row, uint32_t* local,
                                       uint32_t* len) {
  uint32_t j = 0, start = 0;
  while (j + 1 < s.operand_count && row >= start + s.concat_rows[j]) start += s.concat_rows[j++];
  *local = row - start;
  *len = s.concat_rows[j];
  return j;
}

// The arguments of node v of a variadic step (average, maximum): its CSR row of arena offsets
// when ragged, else one per operand slot.
struct VarArgs {
  const uint32_t* offs;  // nullptr: operand slots
  uint32_t count;
};

__device__ inline VarArgs var_args(const DeviceView& d, const Ops& ops, const StepDesc& s,
                                   uint32_t v) {
  const Operand& o0 = slot(ops, s, 0);
  if (o0.mode != OperandMode::Ragged) return VarArgs{nullptr, s.operand_count};
  const uint32_t* rows = d.index + o0.index_begin;
  return VarArgs{rows + s.count + 1 + rows[v], rows[v + 1] - rows[v]};
}
__device__ inline const float* var_value(const DeviceView& d, const Ops& ops, const StepDesc& s,
                                         const VarArgs& a, uint32_t v, uint32_t j) {
  return a.offs ? d.values + a.offs[j] : value_at(d, ops, slot(ops, s, j), v, s.k);
}
__device__ inline float* var_adjoint(const DeviceView& d, const Ops& ops, const StepDesc& s,
                                     const VarArgs& a, uint32_t v, uint32_t j) {
  return a.offs ? d.adjoints + a.offs[j] : adjoint_at(d, ops, slot(ops, s, j), v, s.k);
}

// The first argument holding the maximum of element r (maximum's gradient goes there).
__device__ inline uint32_t first_max(const DeviceView& d, const Ops& ops, const StepDesc& s,
                                     const VarArgs& a, uint32_t v, uint32_t r) {
  uint32_t best = 0;
  float m = var_value(d, ops, s, a, v, 0)[r];
  for (uint32_t j = 1; j < a.count; ++j) {
    const float x = var_value(d, ops, s, a, v, j)[r];
    if (math::takes_max(x, m)) {
      m = x;
      best = j;
    }
  }
  return best;
}

}  // namespace

}  // namespace edbatch::cuda
