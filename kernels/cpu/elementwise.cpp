// Elementwise, lookup, concat and loss kernels: one pass over the batch, operands read through
// their index lists (no gather copies). Forward splits by columns (outputs are disjoint);
// backward splits by rows, so accumulation into shared or repeated operands never races.
#include <Eigen/Core>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cpu/array_math.h"
#include "kernels/cpu/cpu_kernels.h"

namespace edbatch::cpu {

namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;
using CVec = Eigen::Map<const Eigen::ArrayXf>;

double batch_floats(const BatchArgs& b) { return static_cast<double>(b.count) * b.out_dim.size(); }

// A view whose stride is the output's: nodes [i0, i1) read it as one flat array, like the output
// (block steps read their internal values this way), so one vector loop covers the whole run.
bool flat(const BatchArgs& b, const Operand& o) {
  const uint32_t n = b.out_dim.size();
  return o.mode == OperandMode::Contiguous && o.stride == n && b.bp->out_size == n;
}

// ---- unary ----

template <class F>
void unary_forward(Context& c, const BatchArgs& b, F f) {
  const uint32_t n = b.out_dim.size();
  const bool one_pass = flat(b, b.operands[0]);
  for_chunks(c, b.count, batch_floats(b), [&](uint32_t i0, uint32_t i1) {
    if (one_pass) {
      const Eigen::Index len = static_cast<Eigen::Index>(i1 - i0) * n;
      f(Vec(out_value(c, b, i0), len), CVec(operand_value(c, b.operands[0], i0), len));
      return;
    }
    for (uint32_t i = i0; i < i1; ++i)
      f(Vec(out_value(c, b, i), n), CVec(operand_value(c, b.operands[0], i), n));
  });
}

// g(dx, dy, y, x) accumulates the input gradient of rows [r0, r1) of one column.
template <class G>
void unary_backward(Context& c, const BatchArgs& b, G g) {
  const uint32_t n = b.out_dim.size();
  for_chunks(c, n, batch_floats(b), [&](uint32_t r0, uint32_t r1) {
    const uint32_t len = r1 - r0;
    for (uint32_t i = 0; i < b.count; ++i)
      g(Vec(operand_adjoint(c, b.operands[0], i) + r0, len), CVec(out_adjoint(c, b, i) + r0, len),
        CVec(out_value(c, b, i) + r0, len), CVec(operand_value(c, b.operands[0], i) + r0, len));
  });
}

// An op of kernels/op_math.h on whole columns (or one flat run of columns).
template <class U>
void unary_math_fwd(Context& c, const BatchArgs& b) {
  const math::Attr a{b.alpha, b.beta};
  unary_forward(c, b, [a](Vec y, CVec x) { y = U::template value<ArrayMath>(x, a); });
}
template <class U>
void unary_math_bwd(Context& c, const BatchArgs& b) {
  const math::Attr a{b.alpha, b.beta};
  unary_backward(c, b, [a](Vec dx, CVec dy, CVec y, CVec x) {
    dx += U::template gradient<ArrayMath>(dy, x, y, a);
  });
}

// ---- binary ----

template <class F>
void binary_forward(Context& c, const BatchArgs& b, F f) {
  const uint32_t n = b.out_dim.size();
  const bool one_pass = flat(b, b.operands[0]) && flat(b, b.operands[1]);
  for_chunks(c, b.count, batch_floats(b), [&](uint32_t i0, uint32_t i1) {
    if (one_pass) {
      const Eigen::Index len = static_cast<Eigen::Index>(i1 - i0) * n;
      f(Vec(out_value(c, b, i0), len), CVec(operand_value(c, b.operands[0], i0), len),
        CVec(operand_value(c, b.operands[1], i0), len));
      return;
    }
    for (uint32_t i = i0; i < i1; ++i)
      f(Vec(out_value(c, b, i), n), CVec(operand_value(c, b.operands[0], i), n),
        CVec(operand_value(c, b.operands[1], i), n));
  });
}

// g(da, db, dy, a, b) over rows [r0, r1).
template <class G>
void binary_backward(Context& c, const BatchArgs& b, G g) {
  const uint32_t n = b.out_dim.size();
  for_chunks(c, n, batch_floats(b), [&](uint32_t r0, uint32_t r1) {
    const uint32_t len = r1 - r0;
    for (uint32_t i = 0; i < b.count; ++i)
      g(Vec(operand_adjoint(c, b.operands[0], i) + r0, len),
        Vec(operand_adjoint(c, b.operands[1], i) + r0, len), CVec(out_adjoint(c, b, i) + r0, len),
        CVec(operand_value(c, b.operands[0], i) + r0, len),
        CVec(operand_value(c, b.operands[1], i) + r0, len));
  });
}

template <class B>
void binary_math_fwd(Context& c, const BatchArgs& b) {
  binary_forward(c, b, [](Vec y, CVec x0, CVec x1) { y = B::template value<ArrayMath>(x0, x1); });
}
template <class B>
void binary_math_bwd(Context& c, const BatchArgs& b) {
  binary_backward(c, b, [](Vec d0, Vec d1, CVec dy, CVec x0, CVec x1) {
    // y is not stored for the binary ops of op_math.h that need it: recompute on demand.
    if constexpr (B::kUsesY) {
      const Eigen::ArrayXf y = B::template value<ArrayMath>(x0, x1);
      const CVec yv(y.data(), y.size());
      d0 += B::template grad_a<ArrayMath>(dy, x0, x1, yv);
      d1 += B::template grad_b<ArrayMath>(dy, x0, x1, yv);
    } else {
      d0 += B::template grad_a<ArrayMath>(dy, x0, x1, x0);
      d1 += B::template grad_b<ArrayMath>(dy, x0, x1, x0);
    }
  });
}

// ---- sum: fixed arity (operand slots) or ragged (CSR of offsets) ----

void sum_fwd(Context& c, const BatchArgs& b) {
  const uint32_t n = b.out_dim.size();
  const bool ragged = b.operands[0].mode == OperandMode::Ragged;
  const uint32_t slots = b.bp->operand_count;
  bool one_pass = !ragged && slots <= kPairwiseBlock;
  for (uint32_t j = 0; j < slots && one_pass; ++j) one_pass = flat(b, b.operands[j]);
  for_chunks(c, b.count, batch_floats(b), [&](uint32_t i0, uint32_t i1) {
    if (one_pass) {
      const Eigen::Index len = static_cast<Eigen::Index>(i1 - i0) * n;
      Vec y(out_value(c, b, i0), len);
      y = CVec(operand_value(c, b.operands[0], i0), len);
      for (uint32_t j = 1; j < slots; ++j) y += CVec(operand_value(c, b.operands[j], i0), len);
      return;
    }
    for (uint32_t i = i0; i < i1; ++i) {
      Vec y(out_value(c, b, i), n);
      if (ragged) {
        const uint32_t* offs;
        const uint32_t k = ragged_args(c, b, i, &offs);
        if (k > kPairwiseBlock) {
          pairwise_sum(
              y.data(), n, 0, k, [&](uint32_t j) { return c.values + offs[j]; },
              pairwise_scratch(n));
          continue;
        }
        y = CVec(c.values + offs[0], n);
        for (uint32_t j = 1; j < k; ++j) y += CVec(c.values + offs[j], n);
      } else if (slots > kPairwiseBlock) {
        pairwise_sum(
            y.data(), n, 0, slots, [&](uint32_t j) { return operand_value(c, b.operands[j], i); },
            pairwise_scratch(n));
      } else {
        y = CVec(operand_value(c, b.operands[0], i), n);
        for (uint32_t j = 1; j < slots; ++j) y += CVec(operand_value(c, b.operands[j], i), n);
      }
    }
  });
}

void sum_bwd(Context& c, const BatchArgs& b) {
  const uint32_t n = b.out_dim.size();
  const bool ragged = b.operands[0].mode == OperandMode::Ragged;
  const uint32_t slots = b.bp->operand_count;
  for_chunks(c, n, batch_floats(b), [&](uint32_t r0, uint32_t r1) {
    const uint32_t len = r1 - r0;
    for (uint32_t i = 0; i < b.count; ++i) {
      CVec dy(out_adjoint(c, b, i) + r0, len);
      if (ragged) {
        const uint32_t* offs;
        const uint32_t k = ragged_args(c, b, i, &offs);
        for (uint32_t j = 0; j < k; ++j) Vec(c.adjoints + offs[j] + r0, len) += dy;
      } else {
        for (uint32_t j = 0; j < slots; ++j) Vec(operand_adjoint(c, b.operands[j], i) + r0, len) += dy;
      }
    }
  });
}

// ---- lookup ----

void lookup_fwd(Context& c, const BatchArgs& b) {
  const uint32_t n = b.out_dim.rows;
  const float* table = c.params->values(b.table);
  for_chunks(c, b.count, batch_floats(b), [&](uint32_t i0, uint32_t i1) {
    for (uint32_t i = i0; i < i1; ++i)
      Vec(out_value(c, b, i), n) = CVec(table + static_cast<size_t>(b.aux[i]) * n, n);
  });
}

void lookup_bwd(Context& c, const BatchArgs& b) {
  if (c.param_grads_later) return;  // the table's rows: after the batch (call.cpp)
  const uint32_t n = b.out_dim.rows;
  float* grad = c.params->grads(b.table);
  for (uint32_t i = 0; i < b.count; ++i) {
    Vec(grad + static_cast<size_t>(b.aux[i]) * n, n) += CVec(out_adjoint(c, b, i), n);
    c.params->mark_lookup_row(b.table, b.aux[i]);
  }
}

// ---- concat: arguments stacked vertically, column by column ----

// f(slot, offset in the output, offset in the argument, length) for each column of each slot.
template <class F>
void concat_walk(const BatchArgs& b, F f) {
  const uint32_t rows = b.out_dim.rows;
  const uint32_t cols = b.out_dim.cols;
  uint32_t r = 0;
  for (uint32_t j = 0; j < b.bp->operand_count; ++j) {
    const uint32_t len = arg_dim(b, j).rows;
    for (uint32_t col = 0; col < cols; ++col) f(j, r + col * rows, col * len, len);
    r += len;
  }
}

void concat_fwd(Context& c, const BatchArgs& b) {
  for_chunks(c, b.count, batch_floats(b), [&](uint32_t i0, uint32_t i1) {
    for (uint32_t i = i0; i < i1; ++i) {
      float* y = out_value(c, b, i);
      concat_walk(b, [&](uint32_t j, uint32_t yoff, uint32_t xoff, uint32_t len) {
        const float* x = operand_value(c, b.operands[j], i) + xoff;
        std::copy(x, x + len, y + yoff);
      });
    }
  });
}

void concat_bwd(Context& c, const BatchArgs& b) {
  for (uint32_t i = 0; i < b.count; ++i) {
    const float* dy = out_adjoint(c, b, i);
    concat_walk(b, [&](uint32_t j, uint32_t yoff, uint32_t xoff, uint32_t len) {
      Vec(operand_adjoint(c, b.operands[j], i) + xoff, len) += CVec(dy + yoff, len);
    });
  }
}

// ---- pick and the softmax loss ----

void pick_fwd(Context& c, const BatchArgs& b) {
  for (uint32_t i = 0; i < b.count; ++i)
    *out_value(c, b, i) = operand_value(c, b.operands[0], i)[b.aux[i]];
}
void pick_bwd(Context& c, const BatchArgs& b) {
  for (uint32_t i = 0; i < b.count; ++i)
    operand_adjoint(c, b.operands[0], i)[b.aux[i]] += *out_adjoint(c, b, i);
}

// log sum_q exp(x[q] - m), with m = max x: -log softmax(x)[q] = this - (x[q] - m). Subtracting
// m from x[q] first keeps the result exact where |m| is large (all entries masked at -1e9).
float log_sum_exp_shifted(CVec x, float* max_out) {
  const float m = x.maxCoeff();
  *max_out = m;
  return std::log((x - m).exp().sum());
}

void pnls_fwd(Context& c, const BatchArgs& b) {
  const uint32_t n = arg_dim(b, 0).rows;
  for_chunks(c, b.count, static_cast<double>(b.count) * n, [&](uint32_t i0, uint32_t i1) {
    for (uint32_t i = i0; i < i1; ++i) {
      CVec x(operand_value(c, b.operands[0], i), n);
      float m;
      const float lse = log_sum_exp_shifted(x, &m);
      *out_value(c, b, i) = lse - (x[b.aux[i]] - m);
    }
  });
}

void pnls_bwd(Context& c, const BatchArgs& b) {
  const uint32_t n = arg_dim(b, 0).rows;
  for (uint32_t i = 0; i < b.count; ++i) {
    CVec x(operand_value(c, b.operands[0], i), n);
    float m;
    const float lse = log_sum_exp_shifted(x, &m);
    const float dy = *out_adjoint(c, b, i);
    Vec dx(operand_adjoint(c, b.operands[0], i), n);
    dx += dy * ((x - m) - lse).exp();
    dx[b.aux[i]] -= dy;
  }
}

[[noreturn]] void source_kernel(Context&, const BatchArgs& b) {
  throw std::runtime_error(std::string("[cpu] source op '") + op_name(b.op) +
                           "' is never scheduled");
}

[[noreturn]] void block_kernel(Context&, const BatchArgs& b) {
  throw std::runtime_error(std::string("[cpu] '") + op_name(b.op) +
                           "' has no kernel: block calls run their block's steps; outputs and reshapes are views");
}

[[noreturn]] void missing_kernel(Context&, const BatchArgs& b) {
  throw std::runtime_error(std::string("[cpu] op '") + op_name(b.op) + "' has no CPU kernel");
}

// The rows of ops with kernels of their own; the math ops of op_math.h get theirs below.
KernelRow own_kernels(Op op) {
  switch (op) {
    case Op::Input: case Op::Parameter: return {source_kernel, source_kernel};
    case Op::Lookup: return {lookup_fwd, lookup_bwd};
    case Op::Affine: return {affine_forward, affine_backward};
    case Op::MatMul: return {matmul_forward, matmul_backward};
    case Op::Sum: return {sum_fwd, sum_bwd};
    case Op::Concat: return {concat_fwd, concat_bwd};
    case Op::Pick: return {pick_fwd, pick_bwd};
    case Op::PickNegLogSoftmax: return {pnls_fwd, pnls_bwd};
    case Op::SliceRows: return {slice_rows_forward, slice_rows_backward};
    case Op::Softmax: return {softmax_forward, softmax_backward};
    case Op::LogSoftmax: return {log_softmax_forward, log_softmax_backward};
    case Op::LayerNorm: return {layer_norm_forward, layer_norm_backward};
    case Op::MaxIndex:
      return {max_index_forward, max_index_backward};
    case Op::ColumnSum:
      return {column_sum_forward, column_sum_backward};
    case Op::Broadcast:
      return {broadcast_forward, broadcast_backward};
    case Op::Average: return {average_forward, average_backward};
    case Op::Maximum: return {maximum_forward, maximum_backward};
    case Op::Dropout: return {dropout_forward, dropout_backward};
    case Op::Call: case Op::Output: case Op::Reshape: return {block_kernel, block_kernel};
    default: return {missing_kernel, missing_kernel};
  }
}

struct KernelTable {
  KernelRow rows[static_cast<size_t>(Op::Count)];
  KernelTable() {
    for (size_t i = 0; i < static_cast<size_t>(Op::Count); ++i)
      rows[i] = own_kernels(static_cast<Op>(i));
#define EDBATCH_UNARY_ROW(op, m) \
  rows[static_cast<size_t>(Op::op)] = {unary_math_fwd<math::m>, unary_math_bwd<math::m>};
    EDBATCH_UNARY_OPS(EDBATCH_UNARY_ROW)
#undef EDBATCH_UNARY_ROW
#define EDBATCH_BINARY_ROW(op, m) \
  rows[static_cast<size_t>(Op::op)] = {binary_math_fwd<math::m>, binary_math_bwd<math::m>};
    EDBATCH_BINARY_OPS(EDBATCH_BINARY_ROW)
#undef EDBATCH_BINARY_ROW
  }
};
}  // namespace

const KernelRow& cpu_kernels(Op op) {
  static const KernelTable table;
  return table.rows[static_cast<size_t>(op)];
}

}  // namespace edbatch::cpu
