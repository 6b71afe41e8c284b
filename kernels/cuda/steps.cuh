// Internal to the CUDA kernels: the elementwise family's device code (one thread block runs a
// group of steps over a chunk of invocations), shared by its own kernels and the persistent one.
#pragma once
#include "kernels/cuda/device.h"
#include "kernels/cuda/operands.cuh"
#include "kernels/cuda/step_operands.cuh"
#include "kernels/cuda/step_runs.cuh"
#include "kernels/op_math.h"

namespace edbatch::cuda {

namespace {

constexpr uint32_t kStepThreads = 256;

// A running sum with Kahan's compensation, so that a sum over many arguments (a reduce over a
// node of large fan-in, added by one thread) keeps float32's accuracy instead of losing a
// rounding per term. An infinite or NaN sum carries on as a plain one.
struct CompensatedSum {
  float value = 0, carry = 0;
  __device__ void add(float x) {
    const float y = x - carry, t = value + y;
    carry = isfinite(t) ? (t - value) - y : 0.0f;
    value = t;
  }
};

// ---- reductions over the rows of a column (softmax, log softmax, layer norm, max_index,
// pick_neg_log_softmax): one warp per column. steps_body gives such a step 32 items per column
// (items_per_node, device.h), and a thread block's threads and a step's items are multiples of 32,
// so the 32 lanes of a warp hold the same node and column; each lane takes rows lane, lane + 32,
// ..., and the column's statistics are reduced with shuffles, once per column. ----

constexpr uint32_t kWarp = kColumnThreads;

__device__ inline float warp_sum(float x) {
  for (uint32_t o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ inline float warp_max(float x) {
  for (uint32_t o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// f(q, x[q]) for the rows q = lane, lane + 32, ... of a column of n rows, in that order, with
// eight loads in flight: a few columns of thousands of rows (a vocabulary's scores) are a few
// warps for the whole device, so each waits on memory less often.
template <class F>
__device__ inline void each_row(const float* x, uint32_t n, uint32_t lane, F f) {
  constexpr uint32_t kInFlight = 8;
  uint32_t q = lane;
  for (; q + (kInFlight - 1) * kWarp < n; q += kInFlight * kWarp) {
    float v[kInFlight];
#pragma unroll
    for (uint32_t i = 0; i < kInFlight; ++i) v[i] = x[q + i * kWarp];
#pragma unroll
    for (uint32_t i = 0; i < kInFlight; ++i) f(q + i * kWarp, v[i]);
  }
  for (; q < n; q += kWarp) f(q, x[q]);
}

// The largest of a column of n rows and sum_q exp(x[q] - largest), reduced across the warp
// (every lane gets both).
__device__ inline void warp_max_sum_exp(const float* x, uint32_t n, uint32_t lane, float* max,
                                        float* sum_exp) {
  float m = -INFINITY;
  each_row(x, n, lane, [&](uint32_t, float xq) { m = fmaxf(m, xq); });
  m = warp_max(m);
  float e = 0;
  each_row(x, n, lane, [&](uint32_t, float xq) { e += expf(xq - m); });
  *max = m;
  *sum_exp = warp_sum(e);
}

// log sum_q exp(x[q] - m) over a column of n rows, m its largest entry (every lane gets both):
// log softmax(x)[q] = (x[q] - m) - this, exact where |m| is large (a column masked at -1e9).
__device__ inline float warp_log_sum_exp_shifted(const float* x, uint32_t n, uint32_t lane,
                                                 float* max) {
  float e;
  warp_max_sum_exp(x, n, lane, max, &e);
  return logf(e);
}

// Mean and 1 / sqrt(var + eps) (biased variance) of a column of n rows.
__device__ inline void column_moments(const float* x, uint32_t n, uint32_t lane, float eps,
                                      float* mean, float* inv_std) {
  float acc = 0;
  for (uint32_t q = lane; q < n; q += kWarp) acc += x[q];
  const float m = warp_sum(acc) / n;
  acc = 0;
  for (uint32_t q = lane; q < n; q += kWarp) acc += (x[q] - m) * (x[q] - m);
  *mean = m;
  *inv_std = rsqrtf(warp_sum(acc) / n + eps);
}

// max_index of column r / 32 of node v: each lane's first largest of its rows (a NaN counts as
// the largest, math::takes_max; an entry equal to -inf counts when the lane has none yet), then
// the warp's largest, the lowest row on ties and among NaNs. The same row as math::first_max_row.
__device__ void max_index_forward(const DeviceView& d, const Ops& ops, const StepDesc& s,
                                  uint32_t v, uint32_t r) {
  constexpr uint32_t kNone = 0xffffffffu;
  const uint32_t lane = r % kWarp, c = r / kWarp, n = s.arg_rows;
  const float* x = value_at(d, ops, slot(ops, s, 0), v, s.k) + static_cast<uint64_t>(c) * n;
  float m = -INFINITY;
  uint32_t at = kNone;
  each_row(x, n, lane, [&](uint32_t q, float xq) {
    const bool take = math::takes_max(xq, m) || (at == kNone && xq == m);
    m = take ? xq : m;
    at = take ? q : at;
  });
  for (uint32_t o = kWarp / 2; o > 0; o /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const uint32_t oa = __shfl_xor_sync(0xffffffffu, at, o);
    const bool tie = om == m || (om != om && m != m);
    if (oa != kNone && (at == kNone || math::takes_max(om, m) || (tie && oa < at))) {
      m = om;
      at = oa;
    }
  }
  if (lane != 0) return;
  if (at == kNone) at = 0;
  float* y = d.values + s.out_offset + static_cast<uint64_t>(v) * s.out_size + 2 * c;
  y[0] = x[at];
  y[1] = static_cast<float>(at);
}

// Column r / 32 of node v (lane r % 32).
__device__ void column_forward(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                               uint32_t r) {
  if (static_cast<Op>(s.op) == Op::MaxIndex) {
    max_index_forward(d, ops, s, v, r);
    return;
  }
  if (static_cast<Op>(s.op) == Op::ColumnSum) {  // column r / 32 of arg_rows rows: one value
    const uint32_t c = r / kWarp;
    const float* x =
        value_at(d, ops, slot(ops, s, 0), v, s.k) + static_cast<uint64_t>(c) * s.arg_rows;
    float acc = 0;
    each_row(x, s.arg_rows, r % kWarp, [&](uint32_t, float xq) { acc += xq; });
    acc = warp_sum(acc);
    if (r % kWarp == 0) d.values[s.out_offset + static_cast<uint64_t>(v) * s.out_size + c] = acc;
    return;
  }
  if (static_cast<Op>(s.op) == Op::PickNegLogSoftmax) {  // one column of arg_rows: 1 x 1
    const float* x = value_at(d, ops, slot(ops, s, 0), v, s.k);
    float m;
    const float lse = warp_log_sum_exp_shifted(x, s.arg_rows, r % kWarp, &m);
    if (r % kWarp == 0)
      d.values[s.out_offset + static_cast<uint64_t>(v) * s.out_size] =
          lse - (x[d.aux[s.aux_begin + v]] - m);
    return;
  }
  const uint32_t lane = r % kWarp, n = s.rows;
  const uint64_t col = static_cast<uint64_t>(r / kWarp) * n;
  const float* x = value_at(d, ops, slot(ops, s, 0), v, s.k) + col;
  float* y = d.values + s.out_offset + static_cast<uint64_t>(v) * s.out_size + col;
  const Op op = static_cast<Op>(s.op);
  if (op == Op::LayerNorm) {
    float mean, inv_std;
    column_moments(x, n, lane, s.alpha, &mean, &inv_std);
    for (uint32_t q = lane; q < n; q += kWarp) y[q] = (x[q] - mean) * inv_std;
    return;
  }
  float m, e;
  warp_max_sum_exp(x, n, lane, &m, &e);
  if (op == Op::Softmax) {
    for (uint32_t q = lane; q < n; q += kWarp) y[q] = expf(x[q] - m) / e;
  } else {
    const float lse = logf(e);
    for (uint32_t q = lane; q < n; q += kWarp) y[q] = (x[q] - m) - lse;
  }
}

__device__ void column_backward(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                                uint32_t r) {
  if (static_cast<Op>(s.op) == Op::MaxIndex) {  // row 0's adjoint to the maximal entry
    const uint32_t c = r / kWarp;
    if (r % kWarp != 0) return;
    const uint64_t out = s.out_offset + static_cast<uint64_t>(v) * s.out_size + 2 * c;
    const float dy = load_adjoint(d.adjoints + out);
    const uint32_t at = static_cast<uint32_t>(d.values[out + 1]);
    if (dy != 0.0f)
      atomicAdd(
          adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + static_cast<uint64_t>(c) * s.arg_rows + at,
          dy);
    return;
  }
  if (static_cast<Op>(s.op) == Op::ColumnSum) {  // every row of the column gets its adjoint
    const uint32_t c = r / kWarp;
    const float dy =
        load_adjoint(d.adjoints + s.out_offset + static_cast<uint64_t>(v) * s.out_size + c);
    if (dy == 0.0f) return;  // the same for every lane of the warp
    float* dx = adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + static_cast<uint64_t>(c) * s.arg_rows;
    for (uint32_t q = r % kWarp; q < s.arg_rows; q += kWarp) atomicAdd(dx + q, dy);
    return;
  }
  if (static_cast<Op>(s.op) == Op::PickNegLogSoftmax) {  // dx = dy (softmax(x) - onehot(label))
    const float dy =
        load_adjoint(d.adjoints + s.out_offset + static_cast<uint64_t>(v) * s.out_size);
    if (dy == 0.0f) return;  // the same for every lane of the warp
    const float* x = value_at(d, ops, slot(ops, s, 0), v, s.k);
    float* dx = adjoint_at(d, ops, slot(ops, s, 0), v, s.k);
    const uint32_t label = d.aux[s.aux_begin + v];
    float m;
    const float lse = warp_log_sum_exp_shifted(x, s.arg_rows, r % kWarp, &m);
    each_row(x, s.arg_rows, r % kWarp, [&](uint32_t q, float xq) {
      atomicAdd(dx + q, dy * expf((xq - m) - lse) - (q == label ? dy : 0.0f));
    });
    return;
  }
  const uint32_t lane = r % kWarp, n = s.rows;
  const uint64_t col = static_cast<uint64_t>(r / kWarp) * n;
  const uint64_t out = s.out_offset + static_cast<uint64_t>(v) * s.out_size + col;
  const float* y = d.values + out;
  const float* dy = d.adjoints + out;
  float* dx = adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + col;
  const Op op = static_cast<Op>(s.op);
  float sum_dy = 0, sum_dy_y = 0;
  for (uint32_t q = lane; q < n; q += kWarp) {
    const float g = load_adjoint(dy + q);
    sum_dy += g;
    sum_dy_y += g * y[q];
  }
  sum_dy = warp_sum(sum_dy);
  sum_dy_y = warp_sum(sum_dy_y);
  float mean = 0, inv_std = 0;
  if (op == Op::LayerNorm)
    column_moments(value_at(d, ops, slot(ops, s, 0), v, s.k) + col, n, lane, s.alpha, &mean,
                   &inv_std);
  for (uint32_t q = lane; q < n; q += kWarp) {
    const float g = load_adjoint(dy + q);
    float gx;
    if (op == Op::Softmax)
      gx = y[q] * (g - sum_dy_y);
    else if (op == Op::LogSoftmax)
      gx = g - expf(y[q]) * sum_dy;
    else
      gx = inv_std * (g - sum_dy / n - y[q] * (sum_dy_y / n));
    if (gx != 0.0f) atomicAdd(dx + q, gx);
  }
}

// A wide sum (wide_sum, device.h): element r / 32 of node v, lane r % 32 of its warp taking
// arguments lane, lane + 32, ... of the node's CSR row. Forward reduces across the warp; backward
// adds the element's adjoint to each argument's.
__device__ void wide_sum_item(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                              uint32_t r, bool forward) {
  const uint32_t e = r / kWarp, lane = r % kWarp;
  const uint32_t* rows = d.index + slot(ops, s, 0).index_begin;
  const uint32_t* offs = rows + s.count + 1;
  const uint64_t out = s.out_offset + static_cast<uint64_t>(v) * s.out_size + e;
  if (forward) {
    CompensatedSum sum;
    for (uint32_t q = rows[v] + lane; q < rows[v + 1]; q += kWarp) sum.add(d.values[offs[q] + e]);
    const float acc = warp_sum(sum.value);
    if (lane == 0) d.values[out] = acc;
    return;
  }
  const float dy = load_adjoint(d.adjoints + out);
  if (dy == 0.0f) return;
  for (uint32_t q = rows[v] + lane; q < rows[v + 1]; q += kWarp)
    atomicAdd(d.adjoints + offs[q] + e, dy);
}

// Element r of node v.
__device__ void forward_item(const DeviceView& d, const Ops& ops, const StepDesc& s, uint32_t v,
                             uint32_t r) {
  float* y = d.values + s.out_offset + static_cast<uint64_t>(v) * s.out_size;
  const Op op = static_cast<Op>(s.op);
  if (column_op(op)) {
    column_forward(d, ops, s, v, r);
    return;
  }
  if (wide_sum(s)) {
    wide_sum_item(d, ops, s, v, r, true);
    return;
  }
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
        CompensatedSum sum;
        for (uint32_t q = rows[v]; q < rows[v + 1]; ++q) sum.add(d.values[offs[q] + r]);
        acc = sum.value;
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
    case Op::Average:
    case Op::Maximum: {
      const VarArgs a = var_args(d, ops, s, v);
      if (op == Op::Average) {
        CompensatedSum sum;
        for (uint32_t j = 0; j < a.count; ++j) sum.add(var_value(d, ops, s, a, v, j)[r]);
        y[r] = sum.value / static_cast<float>(a.count);
        return;
      }
      float acc = var_value(d, ops, s, a, v, 0)[r];
      for (uint32_t j = 1; j < a.count; ++j) {
        const float x = var_value(d, ops, s, a, v, j)[r];
        acc = math::takes_max(x, acc) ? x : acc;
      }
      y[r] = acc;
      return;
    }
    case Op::SliceRows: {
      const uint32_t col = r / s.rows, row = r % s.rows;
      y[r] = value_at(d, ops, slot(ops, s, 0), v, s.k)[col * s.arg_rows + s.attr + row];
      return;
    }
    case Op::Dropout:
      y[r] = value_at(d, ops, slot(ops, s, 0), v, s.k)[r] *
             math::dropout_factor(d.aux[s.aux_begin + v], r, s.attr, math::dropout_scale(s.alpha));
      return;
    case Op::Pick:
      y[0] = value_at(d, ops, slot(ops, s, 0), v, s.k)[d.aux[s.aux_begin + v]];
      return;
    case Op::Broadcast:  // column r / rows holds the argument's value r / rows
      y[r] = value_at(d, ops, slot(ops, s, 0), v, s.k)[r / s.rows];
      return;
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
  const Op op = static_cast<Op>(s.op);
  if (column_op(op)) {  // every lane of the warp, whatever its adjoints
    column_backward(d, ops, s, v, r);
    return;
  }
  if (wide_sum(s)) {
    wide_sum_item(d, ops, s, v, r, false);
    return;
  }
  const uint64_t out = s.out_offset + static_cast<uint64_t>(v) * s.out_size;
  const float dy = load_adjoint(d.adjoints + out + r);
  if (dy == 0.0f) return;
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
    case Op::Average: {
      const VarArgs a = var_args(d, ops, s, v);
      const float share = dy / static_cast<float>(a.count);
      for (uint32_t j = 0; j < a.count; ++j) atomicAdd(var_adjoint(d, ops, s, a, v, j) + r, share);
      return;
    }
    case Op::Maximum: {
      const VarArgs a = var_args(d, ops, s, v);
      atomicAdd(var_adjoint(d, ops, s, a, v, first_max(d, ops, s, a, v, r)) + r, dy);
      return;
    }
    case Op::SliceRows: {
      const uint32_t col = r / s.rows, row = r % s.rows;
      atomicAdd(adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + col * s.arg_rows + s.attr + row, dy);
      return;
    }
    case Op::Dropout: {
      const float f =
          math::dropout_factor(d.aux[s.aux_begin + v], r, s.attr, math::dropout_scale(s.alpha));
      if (f != 0.0f) atomicAdd(adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + r, dy * f);
      return;
    }
    case Op::Pick:
      atomicAdd(adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + d.aux[s.aux_begin + v], dy);
      return;
    case Op::Broadcast:
      atomicAdd(adjoint_at(d, ops, slot(ops, s, 0), v, s.k) + r / s.rows, dy);
      return;
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

// A group's operands in shared memory (StepGroup::cached_operands).
struct OperandCache {
  Operand slots[kOperandCache];
  Operand members[kMemberCache];
};

// Copies every step's operands, and the per-member operands they refer to (re-pointed into the
// copy), to shared memory when the group's fit (StepGroup::cached_operands). They are the
// plan's metadata, which no stage writes, so a chained stage does this before its waits.
__device__ void cache_operands(const DeviceView& d, const StepGroup& g, OperandCache& cache) {
  if (g.cached_operands == 0) return;
  Operand* slots = cache.slots;
  Operand* members = cache.members;
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

// Every step of the group over invocations [i0, i0 + n), operands from `cache` (filled by
// cache_operands) where the group's fit there; forward, a pointwise run as one pass
// (step_runs.cuh).
template <bool Forward>
__device__ void steps_range(const DeviceView& d, const StepGroup& g, const OperandCache& cache,
                            uint32_t i0, uint32_t n) {
  const bool cached = g.cached_operands > 0;
  const auto ops_of = [&](const StepDesc& s) {
    return cached ? Ops{cache.slots + s.cache_begin, cache.members}
                  : Ops{d.operands + s.operand_begin, d.member_operands};
  };
  for (uint32_t u = 0; u < g.step_count;) {
    const uint32_t at = Forward ? u : g.step_count - 1 - u;
    if (Forward && g.steps[at].run_len > 1) {
      run_forward(d, g, at, g.steps[at].run_len, i0, n, ops_of);
      u += g.steps[at].run_len;
      if (u < g.step_count) __syncthreads();
      continue;
    }
    ++u;
    const StepDesc& s = g.steps[at];
    const Ops ops = ops_of(s);
    const uint32_t members = s.count / s.k;
    const uint32_t per_node = items_per_node(s);
    const uint32_t items = members * n * per_node;
    for (uint32_t t = threadIdx.x; t < items; t += blockDim.x) {
      const uint32_t r = t % per_node, rest = t / per_node;
      const uint32_t v = (rest / n) * s.k + i0 + rest % n;
      if (Forward)
        forward_item(d, ops, s, v, r);
      else
        backward_item(d, ops, s, v, r);
    }
    if (u < g.step_count) __syncthreads();
  }
}

// Thread block `block` of a group's own launch: invocations [block * chunk, + chunk).
template <bool Forward>
__device__ void steps_body(const DeviceView& d, const StepGroup& g, uint32_t block) {
  __shared__ OperandCache cache;
  cache_operands(d, g, cache);
  const uint32_t i0 = block * g.chunk;
  steps_range<Forward>(d, g, cache, i0, min(g.chunk, g.k - i0));
}

}  // namespace

}  // namespace edbatch::cuda
