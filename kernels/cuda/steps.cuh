// Internal to the CUDA kernels: the elementwise family's device code (one thread block runs a
// group of steps over a chunk of invocations), shared by its own kernels and the persistent one.
#pragma once
#include "kernels/cuda/device.h"
#include "kernels/cuda/operands.cuh"
#include "kernels/op_math.h"

namespace edbatch::cuda {

namespace {


constexpr uint32_t kStepThreads = 256;

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
__device__ inline float load_adjoint(const float* p) { return __ldcg(p); }

__device__ float log_sum_exp(const float* x, uint32_t n) {
  float m = x[0];
  for (uint32_t r = 1; r < n; ++r) m = fmaxf(m, x[r]);
  float s = 0;
  for (uint32_t r = 0; r < n; ++r) s += expf(x[r] - m);
  return m + logf(s);
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

// Element r of node v.
__device__ void forward_item(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                             uint32_t r) {
  float* y = d.values + s.out_offset + static_cast<uint64_t>(v) * s.out_size;
  const Op op = static_cast<Op>(s.op);
  switch (op) {
    case Op::Lookup:
      y[r] = d.params[s.table + static_cast<uint64_t>(d.aux[s.aux_begin + v]) * s.rows + r];
      return;
    case Op::Sum: {
      const Operand& o0 = slot(ops, s, 0);
      float acc = 0;
      if (o0.mode == OperandMode::Ragged) {
        const uint32_t* rows = d.index + o0.index_begin;
        const uint32_t* offs = rows + s.count + 1;
        for (uint32_t q = rows[v]; q < rows[v + 1]; ++q) acc += d.values[offs[q] + r];
      } else {
        for (uint32_t j = 0; j < s.operand_count; ++j) acc += value_at(d, ops, slot(ops, s, j), v, s.k)[r];
      }
      y[r] = acc;
      return;
    }
#define EDBATCH_STEP_UNARY(op, m)                                                     \
  case Op::op:                                                                        \
    y[r] = math::m::value<math::ScalarMath>(value_at(d, ops, slot(ops, s, 0), v, s.k)[r], \
                                            math::Attr{s.alpha, s.beta});             \
    return;
    EDBATCH_UNARY_OPS(EDBATCH_STEP_UNARY)
#undef EDBATCH_STEP_UNARY
#define EDBATCH_STEP_BINARY(op, m)                                                    \
  case Op::op:                                                                        \
    y[r] = math::m::value<math::ScalarMath>(value_at(d, ops, slot(ops, s, 0), v, s.k)[r], \
                                            value_at(d, ops, slot(ops, s, 1), v, s.k)[r]); \
    return;
    EDBATCH_BINARY_OPS(EDBATCH_STEP_BINARY)
#undef EDBATCH_STEP_BINARY
    case Op::Concat: {
      const uint32_t col = r / s.rows, row = r % s.rows;
      uint32_t local, len;
      const uint32_t j = concat_slot(s, row, &local, &len);
      y[r] = value_at(d, ops, slot(ops, s, j), v, s.k)[col * len + local];
      return;
    }
    case Op::Pick:
      y[0] = value_at(d, ops, slot(ops, s, 0), v, s.k)[d.aux[s.aux_begin + v]];
      return;
    case Op::PickNegLogSoftmax: {
      const float* x = value_at(d, ops, slot(ops, s, 0), v, s.k);
      y[0] = log_sum_exp(x, s.arg_rows) - x[d.aux[s.aux_begin + v]];
      return;
    }
    default: return;  // the host never builds other steps
  }
}

// The backward of an op of kernels/op_math.h at element r of node v, loading only what its
// gradient reads.
template <class U>
__device__ void unary_backward(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                               uint32_t r, uint64_t out, float dy) {
  const Operand& o = slot(ops, s, 0);
  float x = 0, y = 0;
  if constexpr (U::kUsesX) x = value_at(d, ops, o, v, s.k)[r];
  if constexpr (U::kUsesY) y = d.values[out + r];
  const float g = U::template gradient<math::ScalarMath>(dy, x, y, math::Attr{s.alpha, s.beta});
  if (g != 0.0f) atomicAdd(adjoint_at(d, ops, o, v, s.k) + r, g);
}

template <class B>
__device__ void binary_backward(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                                uint32_t r, float dy) {
  const Operand& o0 = slot(ops, s, 0);
  const Operand& o1 = slot(ops, s, 1);
  float a = 0, b = 0, y = 0;
  if constexpr (B::kUsesA || B::kUsesY) a = value_at(d, ops, o0, v, s.k)[r];
  if constexpr (B::kUsesB || B::kUsesY) b = value_at(d, ops, o1, v, s.k)[r];
  if constexpr (B::kUsesY) y = B::template value<math::ScalarMath>(a, b);
  atomicAdd(adjoint_at(d, ops, o0, v, s.k) + r, B::template grad_a<math::ScalarMath>(dy, a, b, y));
  atomicAdd(adjoint_at(d, ops, o1, v, s.k) + r, B::template grad_b<math::ScalarMath>(dy, a, b, y));
}

__device__ void backward_item(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                              uint32_t r) {
  const uint64_t out = s.out_offset + static_cast<uint64_t>(v) * s.out_size;
  const float dy = load_adjoint(d.adjoints + out + r);
  const Op op = static_cast<Op>(s.op);
  if (dy == 0.0f && op != Op::PickNegLogSoftmax) return;
  switch (op) {
    case Op::Lookup: {
      const uint64_t row = d.aux[s.aux_begin + v];
      atomicAdd(d.grads + s.table + row * s.rows + r, dy);
      return;
    }
    case Op::Sum: {
      const Operand& o0 = slot(ops, s, 0);
      if (o0.mode == OperandMode::Ragged) {
        const uint32_t* rows = d.index + o0.index_begin;
        const uint32_t* offs = rows + s.count + 1;
        for (uint32_t q = rows[v]; q < rows[v + 1]; ++q) atomicAdd(d.adjoints + offs[q] + r, dy);
      } else {
        for (uint32_t j = 0; j < s.operand_count; ++j)
          atomicAdd(adjoint_at(d, ops, slot(ops, s, j), v, s.k) + r, dy);
      }
      return;
    }
#define EDBATCH_STEP_UNARY(op, m)        \
  case Op::op:                           \
    unary_backward<math::m>(d, ops, s, v, r, out, dy); \
    return;
    EDBATCH_UNARY_OPS(EDBATCH_STEP_UNARY)
#undef EDBATCH_STEP_UNARY
#define EDBATCH_STEP_BINARY(op, m)        \
  case Op::op:                            \
    binary_backward<math::m>(d, ops, s, v, r, dy); \
    return;
    EDBATCH_BINARY_OPS(EDBATCH_STEP_BINARY)
#undef EDBATCH_STEP_BINARY
    case Op::Concat: {
      const uint32_t col = r / s.rows, row = r % s.rows;
      uint32_t local, len;
      const uint32_t j = concat_slot(s, row, &local, &len);
      atomicAdd(adjoint_at(d, ops, slot(ops, s, j), v, s.k) + col * len + local, dy);
      return;
    }
    case Op::Pick:
      atomicAdd(adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + d.aux[s.aux_begin + v], dy);
      return;
    case Op::PickNegLogSoftmax: {
      if (dy == 0.0f) return;
      const float* x = value_at(d, ops, slot(ops, s, 0), v, s.k);
      float* dx = adjoint_at(d, ops, slot(ops, s, 0), v, s.k);
      const float lse = log_sum_exp(x, s.arg_rows);
      const uint32_t label = d.aux[s.aux_begin + v];
      for (uint32_t q = 0; q < s.arg_rows; ++q)
        atomicAdd(dx + q, dy * expf(x[q] - lse) - (q == label ? dy : 0.0f));
      return;
    }
    default: return;
  }
}

// Elements first, first + stride, ... of Lookup step s (hoisted: see launch_lookups).
template <bool Forward>
__device__ void lookup_range(const DeviceView& d, const StepDesc& s, uint64_t first,
                             uint64_t stride) {
  const uint64_t total = static_cast<uint64_t>(s.count) * s.out_size;
  for (uint64_t e = first; e < total; e += stride) {
    const uint32_t v = static_cast<uint32_t>(e / s.out_size), r = static_cast<uint32_t>(e % s.out_size);
    const uint64_t row = d.aux[s.aux_begin + v];
    const uint64_t out = s.out_offset + static_cast<uint64_t>(v) * s.out_size + r;
    if (Forward) {
      d.values[out] = d.params[s.table + row * s.rows + r];
    } else {
      const float dy = load_adjoint(d.adjoints + out);
      if (dy != 0.0f) atomicAdd(d.grads + s.table + row * s.rows + r, dy);
    }
  }
}

// Thread block b of the hoisted lookups (launch_lookups): it belongs to lookup i with
// starts[i] <= b < starts[i + 1].
template <bool Forward>
__device__ void lookups_block(const DeviceView& d, const StepDesc* descs, const uint32_t* starts,
                              uint32_t count, uint32_t b) {
  uint32_t lo = 0, hi = count;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (starts[mid] <= b)
      lo = mid;
    else
      hi = mid;
  }
  const uint32_t blocks = starts[lo + 1] - starts[lo];
  lookup_range<Forward>(d, descs[lo], static_cast<uint64_t>(b - starts[lo]) * blockDim.x + threadIdx.x,
                        static_cast<uint64_t>(blocks) * blockDim.x);
}

// Thread block b runs every step over invocations [b * chunk, (b + 1) * chunk).
// Copies every step's operands, and the per-member operands they refer to (re-pointed into the
// copy), to shared memory.
__device__ void cache_operands(const DeviceView& d, const StepGroup& g, Operand* slots,
                               Operand* members) {
  uint32_t member_at = 0;
  for (uint32_t q = 0; q < g.step_count; ++q) {
    const StepDesc& s = g.steps[q];
    const uint32_t per = s.count / s.k;
    for (uint32_t j = 0; j < s.operand_count; ++j) {
      Operand o = d.operands[s.operand_begin + j];
      if (o.mode == OperandMode::PerMember) {
        for (uint32_t m = threadIdx.x; m < per; m += blockDim.x)
          members[member_at + m] = d.member_operands[o.index_begin + m];
        o.index_begin = member_at;
        member_at += per;
      }
      if (threadIdx.x == 0) slots[s.cache_begin + j] = o;
    }
  }
  __syncthreads();
}

template <bool Forward>
__device__ void steps_body(const DeviceView& d, const StepGroup& g, uint32_t block) {
  __shared__ Operand slots[kOperandCache];
  __shared__ Operand members[kMemberCache];
  const bool cached = g.cached_operands > 0;
  if (cached) cache_operands(d, g, slots, members);
  const uint32_t i0 = block * g.chunk;
  const uint32_t n = min(g.chunk, g.k - i0);
  for (uint32_t q = 0; q < g.step_count; ++q) {
    const StepDesc& s = g.steps[Forward ? q : g.step_count - 1 - q];
    const Ops ops = cached ? Ops{slots + s.cache_begin, members}
                           : Ops{d.operands + s.operand_begin, d.member_operands};
    const uint32_t members = s.count / s.k;
    const uint32_t per_node =
        (s.op == static_cast<uint32_t>(Op::Pick) || s.op == static_cast<uint32_t>(Op::PickNegLogSoftmax))
            ? 1u
            : s.out_size;
    const uint32_t items = members * n * per_node;
    for (uint32_t t = threadIdx.x; t < items; t += blockDim.x) {
      const uint32_t r = t % per_node, rest = t / per_node;
      const uint32_t v = (rest / n) * s.k + i0 + rest % n;
      if (Forward)
        forward_item(d, ops, s, v, r);
      else
        backward_item(d, ops, s, v, r);
    }
    if (q + 1 < g.step_count) __syncthreads();
  }
}

}  // namespace

}  // namespace edbatch::cuda
