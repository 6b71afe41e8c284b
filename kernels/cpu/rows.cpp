// Elementwise ops that are not a function of one element: row slices, reductions over the rows of
// each column (softmax, log softmax, layer norm, max_index, column sums) and broadcasts back over
// them, variadic means and maxima (ragged like sum) and dropout. Forward splits by nodes. Backward
// splits by rows where an element's gradient needs only its own row; the column reductions split by
// nodes when every node has its own operand adjoint (a view), and run serially otherwise (shared or
// indexed operands may repeat).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/op_math.h"

namespace edbatch::cpu {

namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;
using CVec = Eigen::Map<const Eigen::ArrayXf>;

double batch_floats(const BatchArgs& b) {
  return static_cast<double>(b.count) * b.out_dim.size();
}

// f(i) for every node, over the threads when `parallel`.
template <class F>
void each_node(Context& c, const BatchArgs& b, bool parallel, const F& f) {
  if (!parallel) {
    for (uint32_t i = 0; i < b.count; ++i) f(i);
    return;
  }
  for_chunks(c, b.count, 4 * batch_floats(b), [&](uint32_t i0, uint32_t i1) {
    for (uint32_t i = i0; i < i1; ++i) f(i);
  });
}

// f(r0, r1) for chunks of the rows [0, n) of every node's output, over the threads.
template <class F>
void each_rows(Context& c, const BatchArgs& b, const F& f) {
  for_chunks(c, b.out_dim.size(), batch_floats(b), f);
}

}  // namespace

// ---- slice_rows: rows [first_row, first_row + rows) of each column ----

void slice_rows_forward(Context& c, const BatchArgs& b) {
  const uint32_t rows = b.out_dim.rows, cols = b.out_dim.cols, in_rows = arg_dim(b, 0).rows;
  each_node(c, b, true, [&](uint32_t i) {
    const float* x = operand_value(c, b.operands[0], i) + b.first_row;
    float* y = out_value(c, b, i);
    for (uint32_t col = 0; col < cols; ++col) {
      const float* from = x + static_cast<size_t>(col) * in_rows;
      std::copy(from, from + rows, y + static_cast<size_t>(col) * rows);
    }
  });
}

// Split by rows of the slice: chunks touch disjoint rows of the argument.
void slice_rows_backward(Context& c, const BatchArgs& b) {
  const uint32_t rows = b.out_dim.rows, cols = b.out_dim.cols, in_rows = arg_dim(b, 0).rows;
  for_chunks(c, rows, batch_floats(b), [&](uint32_t r0, uint32_t r1) {
    for (uint32_t i = 0; i < b.count; ++i) {
      float* dx = operand_adjoint(c, b.operands[0], i) + b.first_row + r0;
      const float* dy = out_adjoint(c, b, i) + r0;
      for (uint32_t col = 0; col < cols; ++col)
        Vec(dx + static_cast<size_t>(col) * in_rows, r1 - r0) +=
            CVec(dy + static_cast<size_t>(col) * rows, r1 - r0);
    }
  });
}

// ---- reductions over the rows of each column ----

namespace {

// Every node has its own operand adjoint, so nodes may run in parallel in backward.
bool own_adjoints(const BatchArgs& b) {
  return b.operands[0].mode == OperandMode::Contiguous;
}

// f(x, y) per column of every node: forward (y the output).
template <class F>
void columns_forward(Context& c, const BatchArgs& b, const F& f) {
  const uint32_t rows = b.out_dim.rows, cols = b.out_dim.cols;
  each_node(c, b, true, [&](uint32_t i) {
    const float* x = operand_value(c, b.operands[0], i);
    float* y = out_value(c, b, i);
    for (uint32_t col = 0; col < cols; ++col)
      f(CVec(x + static_cast<size_t>(col) * rows, rows),
        Vec(y + static_cast<size_t>(col) * rows, rows));
  });
}

// g(dx, dy, y, x) per column of every node: backward.
template <class G>
void columns_backward(Context& c, const BatchArgs& b, const G& g) {
  const uint32_t rows = b.out_dim.rows, cols = b.out_dim.cols;
  each_node(c, b, own_adjoints(b), [&](uint32_t i) {
    const float* x = operand_value(c, b.operands[0], i);
    float* dx = operand_adjoint(c, b.operands[0], i);
    const float* y = out_value(c, b, i);
    const float* dy = out_adjoint(c, b, i);
    for (uint32_t col = 0; col < cols; ++col) {
      const size_t at = static_cast<size_t>(col) * rows;
      g(Vec(dx + at, rows), CVec(dy + at, rows), CVec(y + at, rows), CVec(x + at, rows));
    }
  });
}

}  // namespace

void softmax_forward(Context& c, const BatchArgs& b) {
  columns_forward(c, b, [](CVec x, Vec y) {
    y = (x - x.maxCoeff()).exp();
    y /= y.sum();
  });
}

void softmax_backward(Context& c, const BatchArgs& b) {
  columns_backward(c, b, [](Vec dx, CVec dy, CVec y, CVec) { dx += y * (dy - (dy * y).sum()); });
}

void log_softmax_forward(Context& c, const BatchArgs& b) {
  columns_forward(c, b, [](CVec x, Vec y) {
    const float m = x.maxCoeff();
    y = (x - m) - std::log((x - m).exp().sum());  // exact where |m| is large
  });
}

void log_softmax_backward(Context& c, const BatchArgs& b) {
  columns_backward(c, b, [](Vec dx, CVec dy, CVec y, CVec) { dx += dy - y.exp() * dy.sum(); });
}

namespace {
// 1 / sqrt(var + eps) of one column, with the biased variance.
float inv_std(CVec x, float eps) {
  return 1.0f / std::sqrt((x - x.mean()).square().mean() + eps);
}
}  // namespace

void layer_norm_forward(Context& c, const BatchArgs& b) {
  const float eps = b.alpha;
  columns_forward(c, b, [eps](CVec x, Vec y) { y = (x - x.mean()) * inv_std(x, eps); });
}

void layer_norm_backward(Context& c, const BatchArgs& b) {
  const float eps = b.alpha;
  columns_backward(c, b, [eps](Vec dx, CVec dy, CVec y, CVec x) {
    dx += inv_std(x, eps) * (dy - dy.mean() - y * (dy * y).mean());
  });
}

// ---- max_index: per column, (its largest value, the row holding it first) ----

void max_index_forward(Context& c, const BatchArgs& b) {
  const uint32_t rows = arg_dim(b, 0).rows, cols = b.out_dim.cols;
  each_node(c, b, true, [&](uint32_t i) {
    const float* x = operand_value(c, b.operands[0], i);
    float* y = out_value(c, b, i);
    for (uint32_t col = 0; col < cols; ++col) {
      const float* xc = x + static_cast<size_t>(col) * rows;
      const uint32_t r = math::first_max_row(xc, rows);
      y[2 * col] = xc[r];
      y[2 * col + 1] = static_cast<float>(r);
    }
  });
}

// The maximal entry gets row 0's adjoint; the row index carries no gradient.
void max_index_backward(Context& c, const BatchArgs& b) {
  const uint32_t rows = arg_dim(b, 0).rows, cols = b.out_dim.cols;
  each_node(c, b, own_adjoints(b), [&](uint32_t i) {
    float* dx = operand_adjoint(c, b.operands[0], i);
    const float* y = out_value(c, b, i);
    const float* dy = out_adjoint(c, b, i);
    for (uint32_t col = 0; col < cols; ++col)
      dx[static_cast<size_t>(col) * rows + static_cast<uint32_t>(y[2 * col + 1])] += dy[2 * col];
  });
}

// ---- column_sum (each column's rows summed: 1 x cols) and broadcast (its inverse shape) ----

// y[col] = sum of x's column col. Its gradient reaches every row of the column.
void column_sum_forward(Context& c, const BatchArgs& b) {
  const uint32_t rows = arg_dim(b, 0).rows, cols = b.out_dim.cols;
  each_node(c, b, true, [&](uint32_t i) {
    const float* x = operand_value(c, b.operands[0], i);
    float* y = out_value(c, b, i);
    for (uint32_t col = 0; col < cols; ++col)
      y[col] = CVec(x + static_cast<size_t>(col) * rows, rows).sum();
  });
}

void column_sum_backward(Context& c, const BatchArgs& b) {
  const uint32_t rows = arg_dim(b, 0).rows, cols = b.out_dim.cols;
  each_node(c, b, own_adjoints(b), [&](uint32_t i) {
    float* dx = operand_adjoint(c, b.operands[0], i);
    const float* dy = out_adjoint(c, b, i);
    for (uint32_t col = 0; col < cols; ++col)
      Vec(dx + static_cast<size_t>(col) * rows, rows) += dy[col];
  });
}

// Column col of y is x[col] in every row; its gradient is the sum of the column's adjoints.
void broadcast_forward(Context& c, const BatchArgs& b) {
  const uint32_t rows = b.out_dim.rows, cols = b.out_dim.cols;
  each_node(c, b, true, [&](uint32_t i) {
    const float* x = operand_value(c, b.operands[0], i);
    float* y = out_value(c, b, i);
    for (uint32_t col = 0; col < cols; ++col)
      Vec(y + static_cast<size_t>(col) * rows, rows).setConstant(x[col]);
  });
}

void broadcast_backward(Context& c, const BatchArgs& b) {
  const uint32_t rows = b.out_dim.rows, cols = b.out_dim.cols;
  each_node(c, b, own_adjoints(b), [&](uint32_t i) {
    float* dx = operand_adjoint(c, b.operands[0], i);
    const float* dy = out_adjoint(c, b, i);
    for (uint32_t col = 0; col < cols; ++col)
      dx[col] += CVec(dy + static_cast<size_t>(col) * rows, rows).sum();
  });
}

// ---- average and maximum: ragged (a CSR of offsets) or one operand per slot ----

namespace {

struct NodeArgs {
  uint32_t count;
  const uint32_t* offs;  // ragged: the arguments' arena offsets; else nullptr
};

NodeArgs node_args(const Context& c, const BatchArgs& b, uint32_t i) {
  if (b.operands[0].mode != OperandMode::Ragged) return {b.bp->operand_count, nullptr};
  NodeArgs a;
  a.count = ragged_args(c, b, i, &a.offs);
  return a;
}
const float* arg_value(const Context& c, const BatchArgs& b, const NodeArgs& a, uint32_t i,
                       uint32_t j) {
  return a.offs ? c.values + a.offs[j] : operand_value(c, b.operands[j], i);
}
float* arg_adjoint(const Context& c, const BatchArgs& b, const NodeArgs& a, uint32_t i,
                   uint32_t j) {
  return a.offs ? c.adjoints + a.offs[j] : operand_adjoint(c, b.operands[j], i);
}

}  // namespace

void average_forward(Context& c, const BatchArgs& b) {
  const uint32_t n = b.out_dim.size();
  each_node(c, b, true, [&](uint32_t i) {
    const NodeArgs a = node_args(c, b, i);
    Vec y(out_value(c, b, i), n);
    if (a.count > kPairwiseBlock) {
      pairwise_sum(
          y.data(), n, 0, a.count, [&](uint32_t j) { return arg_value(c, b, a, i, j); },
          pairwise_scratch(n));
    } else {
      y = CVec(arg_value(c, b, a, i, 0), n);
      for (uint32_t j = 1; j < a.count; ++j) y += CVec(arg_value(c, b, a, i, j), n);
    }
    y /= static_cast<float>(a.count);
  });
}

void average_backward(Context& c, const BatchArgs& b) {
  each_rows(c, b, [&](uint32_t r0, uint32_t r1) {
    const uint32_t len = r1 - r0;
    for (uint32_t i = 0; i < b.count; ++i) {
      const NodeArgs a = node_args(c, b, i);
      const float share = 1.0f / static_cast<float>(a.count);
      CVec dy(out_adjoint(c, b, i) + r0, len);
      for (uint32_t j = 0; j < a.count; ++j)
        Vec(arg_adjoint(c, b, a, i, j) + r0, len) += share * dy;
    }
  });
}

void maximum_forward(Context& c, const BatchArgs& b) {
  const uint32_t n = b.out_dim.size();
  each_node(c, b, true, [&](uint32_t i) {
    const NodeArgs a = node_args(c, b, i);
    Vec y(out_value(c, b, i), n);
    y = CVec(arg_value(c, b, a, i, 0), n);
    for (uint32_t j = 1; j < a.count; ++j) {
      const CVec x(arg_value(c, b, a, i, j), n);
      y = (x > y || (x != x && y == y)).select(x, y);  // math::takes_max
    }
  });
}

// Each element's gradient goes to the first argument holding the maximum (NaN: the first NaN).
void maximum_backward(Context& c, const BatchArgs& b) {
  each_rows(c, b, [&](uint32_t r0, uint32_t r1) {
    for (uint32_t i = 0; i < b.count; ++i) {
      const NodeArgs a = node_args(c, b, i);
      const float* dy = out_adjoint(c, b, i);
      for (uint32_t r = r0; r < r1; ++r) {
        uint32_t best = 0;
        float m = arg_value(c, b, a, i, 0)[r];
        for (uint32_t j = 1; j < a.count; ++j) {
          const float v = arg_value(c, b, a, i, j)[r];
          if (math::takes_max(v, m)) {
            m = v;
            best = j;
          }
        }
        arg_adjoint(c, b, a, i, best)[r] += dy[r];
      }
    }
  });
}

// ---- dropout: the mask of node i comes from its key (b.aux[i]) and the entry's index ----

void dropout_forward(Context& c, const BatchArgs& b) {
  const uint32_t n = b.out_dim.size();
  const uint32_t threshold = math::dropout_threshold(b.alpha);
  const float scale = math::dropout_scale(b.alpha);
  each_node(c, b, true, [&](uint32_t i) {
    const float* x = operand_value(c, b.operands[0], i);
    float* y = out_value(c, b, i);
    for (uint32_t e = 0; e < n; ++e)
      y[e] = x[e] * math::dropout_factor(b.aux[i], e, threshold, scale);
  });
}

void dropout_backward(Context& c, const BatchArgs& b) {
  const uint32_t threshold = math::dropout_threshold(b.alpha);
  const float scale = math::dropout_scale(b.alpha);
  each_rows(c, b, [&](uint32_t r0, uint32_t r1) {
    for (uint32_t i = 0; i < b.count; ++i) {
      float* dx = operand_adjoint(c, b.operands[0], i);
      const float* dy = out_adjoint(c, b, i);
      for (uint32_t e = r0; e < r1; ++e)
        dx[e] += dy[e] * math::dropout_factor(b.aux[i], e, threshold, scale);
    }
  });
}

}  // namespace edbatch::cpu
