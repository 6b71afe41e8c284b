#include "tests/reference.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "kernels/op_math.h"

namespace edbatch::testing {

Reference::Reference(const Graph& g) : g_(g) {
  const ParameterCollection& pc = g.params();
  params.resize(pc.size());
  for (uint32_t p = 0; p < pc.size(); ++p) {
    const float* v = pc.values(p);
    params[p].assign(v, v + pc.dim(p).size());
  }
  inputs.assign(g.input_values().begin(), g.input_values().end());
}

namespace {
const BlockPlan& block_of(const Graph& g, const Node& call) {
  const Block* b = g.params().block(call.aux);
  if (b == nullptr) throw std::logic_error("[Reference] block destroyed");
  return b->plan();
}
// A node's integer argument: per invocation inside a block body, else its own.
uint32_t int_arg(const Reference::Env& env, const Node& nd, uint32_t v) {
  if (env.block == nullptr || env.block->source_slot[v] == UINT32_MAX) return nd.aux2;
  return env.ints[env.block->source_slot[v]];
}

// Softmax, log softmax and layer norm of one column of n rows.
void column_forward(const Node& nd, const double* x, double* y, uint32_t n) {
  double mean = 0, var = 0, m = x[0], s = 0;
  for (uint32_t r = 0; r < n; ++r) {
    mean += x[r] / n;
    m = std::max(m, x[r]);
  }
  for (uint32_t r = 0; r < n; ++r) {
    var += (x[r] - mean) * (x[r] - mean) / n;
    s += std::exp(x[r] - m);
  }
  for (uint32_t r = 0; r < n; ++r) {
    if (nd.op == Op::Softmax) y[r] = std::exp(x[r] - m) / s;
    if (nd.op == Op::LogSoftmax) y[r] = x[r] - m - std::log(s);
    if (nd.op == Op::LayerNorm) y[r] = (x[r] - mean) / std::sqrt(var + double(nd.alpha));
  }
}

// dx_j += sum_i dy_i dy_i/dx_j with the Jacobian written out entry by entry.
void column_backward(const Node& nd, const double* x, const double* y, const double* dy,
                     double* dx, uint32_t n) {
  double mean = 0, var = 0;
  for (uint32_t r = 0; r < n; ++r) mean += x[r] / n;
  for (uint32_t r = 0; r < n; ++r) var += (x[r] - mean) * (x[r] - mean) / n;
  const double inv_std = 1 / std::sqrt(var + double(nd.alpha));
  for (uint32_t j = 0; j < n; ++j)
    for (uint32_t i = 0; i < n; ++i) {
      const double delta = i == j ? 1.0 : 0.0;
      double jac = 0;
      if (nd.op == Op::Softmax) jac = y[i] * (delta - y[j]);
      if (nd.op == Op::LogSoftmax) jac = delta - std::exp(y[j]);
      if (nd.op == Op::LayerNorm) jac = inv_std * (delta - 1.0 / n - y[i] * y[j] / n);
      dx[j] += dy[i] * jac;
    }
}

// Entry i of a dropout value: kept, times 1 / (1 - p), when its hash is at least p * 2^32.
double dropout_factor(const Node& nd, uint32_t key, size_t i) {
  const double p = nd.alpha;
  const bool keep = math::dropout_hash(key, static_cast<uint32_t>(i)) >= p * 4294967296.0;
  return keep ? 1 / (1 - p) : 0.0;
}
}  // namespace

void Reference::forward() {
  values.clear();
  calls.clear();
  run_forward(g_, Env{}, values, calls);
}

void Reference::run_forward(const Graph& g, const Env& env, Values& vals,
                            std::vector<Values>& sub) {
  const uint32_t n = g.size();
  vals.assign(n, {});
  sub.assign(n, {});
  for (uint32_t v = 0; v < n; ++v) {
    const Node& nd = g.node(v);
    const uint32_t* a = g.args(nd);
    std::vector<double>& y = vals[v];
    const uint32_t R = nd.dim.rows, C = nd.dim.cols;
    const uint32_t aux2 = int_arg(env, nd, v);
    y.assign(nd.dim.size(), 0.0);
    auto x = [&](uint32_t j) -> const std::vector<double>& { return vals[a[j]]; };
    switch (nd.op) {
      case Op::Input:
        if (env.block != nullptr) {
          const auto& ins = env.block->source_inputs;
          y = (*env.inputs)[std::find(ins.begin(), ins.end(), v) - ins.begin()];
        } else {
          std::copy(inputs.begin() + nd.aux, inputs.begin() + nd.aux + nd.dim.size(), y.begin());
        }
        break;
      case Op::Call: {
        const BlockPlan& b = block_of(g, nd);
        Values args;
        for (uint32_t j = 0; j < nd.num_args; ++j) args.push_back(x(j));
        Env inner{&b, &args, g.ints().data() + nd.aux2};
        std::vector<Values> unused;
        run_forward(*b.source, inner, sub[v], unused);
        break;
      }
      case Op::Output: {
        const BlockPlan& b = block_of(g, g.node(a[0]));
        y = sub[a[0]][b.source_outputs[nd.aux]];
        break;
      }
      case Op::Reshape: y = x(0); break;
      case Op::Parameter: y = params[nd.aux]; break;
      case Op::Lookup:
        for (uint32_t r = 0; r < R; ++r) y[r] = params[nd.aux][aux2 * R + r];
        break;
      case Op::Affine:
      case Op::MatMul: {
        uint32_t j0 = 0;
        if (nd.op == Op::Affine) {
          y = x(0);
          j0 = 1;
        }
        for (uint32_t j = j0; j + 1 < nd.num_args; j += 2) {
          const Dim wd = g.node(a[j]).dim;
          const std::vector<double>& W = x(j);
          const std::vector<double>& X = x(j + 1);
          for (uint32_t c = 0; c < C; ++c)
            for (uint32_t k = 0; k < wd.cols; ++k)
              for (uint32_t r = 0; r < R; ++r) y[c * R + r] += W[k * R + r] * X[c * wd.cols + k];
        }
        break;
      }
      case Op::Sum:
        for (uint32_t j = 0; j < nd.num_args; ++j)
          for (uint32_t i = 0; i < y.size(); ++i) y[i] += x(j)[i];
        break;
#define EDBATCH_REF_UNARY(op, m)                                                      \
  case Op::op:                                                                        \
    for (uint32_t i = 0; i < y.size(); ++i)                                           \
      y[i] = math::m::value<math::ScalarMath>(x(0)[i], math::Attr{nd.alpha, nd.beta}); \
    break;
      EDBATCH_UNARY_OPS(EDBATCH_REF_UNARY)
#undef EDBATCH_REF_UNARY
#define EDBATCH_REF_BINARY(op, m)                                                     \
  case Op::op:                                                                        \
    for (uint32_t i = 0; i < y.size(); ++i)                                           \
      y[i] = math::m::value<math::ScalarMath>(x(0)[i], x(1)[i]);                      \
    break;
      EDBATCH_BINARY_OPS(EDBATCH_REF_BINARY)
#undef EDBATCH_REF_BINARY
      case Op::Concat: {
        uint32_t r0 = 0;
        for (uint32_t j = 0; j < nd.num_args; ++j) {
          const uint32_t rj = g.node(a[j]).dim.rows;
          for (uint32_t c = 0; c < C; ++c)
            for (uint32_t r = 0; r < rj; ++r) y[c * R + r0 + r] = x(j)[c * rj + r];
          r0 += rj;
        }
        break;
      }
      case Op::Pick: y[0] = x(0)[aux2]; break;
      case Op::PickNegLogSoftmax: {
        const auto& z = x(0);
        const double m = *std::max_element(z.begin(), z.end());
        double s = 0;
        for (double e : z) s += std::exp(e - m);
        y[0] = m + std::log(s) - z[aux2];
        break;
      }
      case Op::Average:
        for (uint32_t j = 0; j < nd.num_args; ++j)
          for (uint32_t i = 0; i < y.size(); ++i) y[i] += x(j)[i] / nd.num_args;
        break;
      case Op::Maximum:
        y = x(0);
        for (uint32_t j = 1; j < nd.num_args; ++j)
          for (uint32_t i = 0; i < y.size(); ++i)  // NaN where any argument is NaN
            y[i] = std::isnan(y[i]) || std::isnan(x(j)[i]) ? NAN : std::max(y[i], x(j)[i]);
        break;
      case Op::SliceRows: {
        const uint32_t in_rows = g.node(a[0]).dim.rows;
        for (uint32_t c = 0; c < C; ++c)
          for (uint32_t r = 0; r < R; ++r) y[c * R + r] = x(0)[c * in_rows + nd.aux + r];
        break;
      }
      case Op::Softmax:
      case Op::LogSoftmax:
      case Op::LayerNorm:
        for (uint32_t c = 0; c < C; ++c)
          column_forward(nd, x(0).data() + c * R, y.data() + c * R, R);
        break;
      case Op::Dropout:
        for (uint32_t i = 0; i < y.size(); ++i) y[i] = x(0)[i] * dropout_factor(nd, aux2, i);
        break;
      case Op::ColumnSum: {
        const uint32_t in_rows = g.node(a[0]).dim.rows;
        for (uint32_t c = 0; c < C; ++c)
          for (uint32_t r = 0; r < in_rows; ++r) y[c] += x(0)[c * in_rows + r];
        break;
      }
      case Op::Broadcast:
        for (uint32_t c = 0; c < C; ++c)
          for (uint32_t r = 0; r < R; ++r) y[c * R + r] = x(0)[c];
        break;
      case Op::MaxIndex: {
        const uint32_t in_rows = g.node(a[0]).dim.rows;
        for (uint32_t c = 0; c < C; ++c) {
          const auto col = x(0).begin() + c * in_rows;
          const auto at = std::max_element(col, col + in_rows);
          y[2 * c] = *at;
          y[2 * c + 1] = static_cast<double>(at - col);
        }
        break;
      }
      case Op::Count: throw std::logic_error("[Reference] bad op");
    }
  }
}

void Reference::backward(uint32_t loss) {
  param_grads.assign(params.size(), {});
  for (size_t p = 0; p < params.size(); ++p) param_grads[p].assign(params[p].size(), 0.0);
  adjoints.assign(g_.size(), {});
  for (uint32_t v = 0; v < g_.size(); ++v) adjoints[v].assign(values[v].size(), 0.0);
  adjoints[loss][0] = 1.0;
  run_backward(g_, Env{}, values, adjoints, calls);
}

void Reference::run_backward(const Graph& g, const Env& env, const Values& vals, Values& adj,
                             const std::vector<Values>& sub) {
  const uint32_t n = g.size();
  std::vector<Values> sub_adj(n);  // per call node: adjoints of its body
  for (uint32_t v = n; v-- > 0;) {
    const Node& nd = g.node(v);
    const uint32_t* a = g.args(nd);
    const std::vector<double>& dy = adj[v];
    const std::vector<double>& y = vals[v];
    const uint32_t R = nd.dim.rows, C = nd.dim.cols;
    const uint32_t aux2 = int_arg(env, nd, v);
    auto x = [&](uint32_t j) -> const std::vector<double>& { return vals[a[j]]; };
    auto dx = [&](uint32_t j) -> std::vector<double>& { return adj[a[j]]; };
    switch (nd.op) {
      case Op::Input:
        if (env.block != nullptr) {
          const auto& ins = env.block->source_inputs;
          auto& d = (*env.input_adjoints)[std::find(ins.begin(), ins.end(), v) - ins.begin()];
          for (size_t i = 0; i < dy.size(); ++i) d[i] += dy[i];
        }
        break;
      case Op::Output: {
        const uint32_t call = a[0];
        const BlockPlan& b = block_of(g, g.node(call));
        Values& ba = sub_adj[call];
        if (ba.empty()) {
          ba.resize(sub[call].size());
          for (size_t i = 0; i < ba.size(); ++i) ba[i].assign(sub[call][i].size(), 0.0);
        }
        auto& d = ba[b.source_outputs[nd.aux]];
        for (size_t i = 0; i < dy.size(); ++i) d[i] += dy[i];
        break;
      }
      case Op::Reshape:
        for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += dy[i];
        break;
      case Op::Call: {
        if (sub_adj[v].empty()) break;  // no output reaches the loss
        const BlockPlan& b = block_of(g, nd);
        Values args, arg_adj;
        for (uint32_t j = 0; j < nd.num_args; ++j) {
          args.push_back(x(j));
          arg_adj.emplace_back(x(j).size(), 0.0);
        }
        Env inner{&b, &args, g.ints().data() + nd.aux2, &arg_adj};
        run_backward(*b.source, inner, sub[v], sub_adj[v], std::vector<Values>(b.source->size()));
        for (uint32_t j = 0; j < nd.num_args; ++j)
          for (size_t i = 0; i < arg_adj[j].size(); ++i) dx(j)[i] += arg_adj[j][i];
        break;
      }
      case Op::Parameter:
        for (size_t i = 0; i < dy.size(); ++i) param_grads[nd.aux][i] += dy[i];
        break;
      case Op::Lookup:
        for (uint32_t r = 0; r < R; ++r) param_grads[nd.aux][aux2 * R + r] += dy[r];
        break;
      case Op::Affine:
      case Op::MatMul: {
        uint32_t j0 = 0;
        if (nd.op == Op::Affine) {
          for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += dy[i];
          j0 = 1;
        }
        for (uint32_t j = j0; j + 1 < nd.num_args; j += 2) {
          const uint32_t K = g.node(a[j]).dim.cols;
          const std::vector<double>& W = x(j);
          const std::vector<double>& X = x(j + 1);
          for (uint32_t c = 0; c < C; ++c)
            for (uint32_t k = 0; k < K; ++k)
              for (uint32_t r = 0; r < R; ++r) {
                dx(j)[k * R + r] += dy[c * R + r] * X[c * K + k];
                dx(j + 1)[c * K + k] += W[k * R + r] * dy[c * R + r];
              }
        }
        break;
      }
      case Op::Sum:
        for (uint32_t j = 0; j < nd.num_args; ++j)
          for (size_t i = 0; i < dy.size(); ++i) dx(j)[i] += dy[i];
        break;
#define EDBATCH_REF_UNARY(op, m)                                                         \
  case Op::op:                                                                           \
    for (size_t i = 0; i < dy.size(); ++i)                                               \
      dx(0)[i] += math::m::gradient<math::ScalarMath>(dy[i], x(0)[i], y[i],              \
                                                      math::Attr{nd.alpha, nd.beta});   \
    break;
      EDBATCH_UNARY_OPS(EDBATCH_REF_UNARY)
#undef EDBATCH_REF_UNARY
#define EDBATCH_REF_BINARY(op, m)                                                        \
  case Op::op:                                                                           \
    for (size_t i = 0; i < dy.size(); ++i) {                                             \
      dx(0)[i] += math::m::grad_a<math::ScalarMath>(dy[i], x(0)[i], x(1)[i], y[i]);      \
      dx(1)[i] += math::m::grad_b<math::ScalarMath>(dy[i], x(0)[i], x(1)[i], y[i]);      \
    }                                                                                    \
    break;
      EDBATCH_BINARY_OPS(EDBATCH_REF_BINARY)
#undef EDBATCH_REF_BINARY
      case Op::Concat: {
        uint32_t r0 = 0;
        for (uint32_t j = 0; j < nd.num_args; ++j) {
          const uint32_t rj = g.node(a[j]).dim.rows;
          for (uint32_t c = 0; c < C; ++c)
            for (uint32_t r = 0; r < rj; ++r) dx(j)[c * rj + r] += dy[c * R + r0 + r];
          r0 += rj;
        }
        break;
      }
      case Op::Pick: dx(0)[aux2] += dy[0]; break;
      case Op::Average:
        for (uint32_t j = 0; j < nd.num_args; ++j)
          for (size_t i = 0; i < dy.size(); ++i) dx(j)[i] += dy[i] / nd.num_args;
        break;
      case Op::Maximum:
        for (size_t i = 0; i < dy.size(); ++i) {
          uint32_t first = 0;  // the first argument equal to the maximum, or the first NaN
          while (!(x(first)[i] == y[i] || (std::isnan(y[i]) && std::isnan(x(first)[i])))) ++first;
          dx(first)[i] += dy[i];
        }
        break;
      case Op::SliceRows: {
        const uint32_t in_rows = g.node(a[0]).dim.rows;
        for (uint32_t c = 0; c < C; ++c)
          for (uint32_t r = 0; r < R; ++r) dx(0)[c * in_rows + nd.aux + r] += dy[c * R + r];
        break;
      }
      case Op::Softmax:
      case Op::LogSoftmax:
      case Op::LayerNorm:
        for (uint32_t c = 0; c < C; ++c)
          column_backward(nd, x(0).data() + c * R, y.data() + c * R, dy.data() + c * R,
                          dx(0).data() + c * R, R);
        break;
      case Op::Dropout:
        for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += dy[i] * dropout_factor(nd, aux2, i);
        break;
      case Op::ColumnSum: {
        const uint32_t in_rows = g.node(a[0]).dim.rows;
        for (uint32_t c = 0; c < C; ++c)
          for (uint32_t r = 0; r < in_rows; ++r) dx(0)[c * in_rows + r] += dy[c];
        break;
      }
      case Op::Broadcast:
        for (uint32_t c = 0; c < C; ++c)
          for (uint32_t r = 0; r < R; ++r) dx(0)[c] += dy[c * R + r];
        break;
      case Op::MaxIndex: {
        const uint32_t in_rows = g.node(a[0]).dim.rows;
        for (uint32_t c = 0; c < C; ++c)
          dx(0)[c * in_rows + static_cast<uint32_t>(y[2 * c + 1])] += dy[2 * c];
        break;
      }
      case Op::PickNegLogSoftmax: {
        const auto& z = x(0);
        const double m = *std::max_element(z.begin(), z.end());
        double s = 0;
        for (double e : z) s += std::exp(e - m);
        for (size_t i = 0; i < z.size(); ++i)
          dx(0)[i] += dy[0] * (std::exp(z[i] - m) / s - (i == aux2 ? 1.0 : 0.0));
        break;
      }
      case Op::Count: throw std::logic_error("[Reference] bad op");
    }
  }
}

double Reference::fd_param(uint32_t loss, uint32_t param, uint32_t k, double eps) {
  const double saved = params[param][k];
  params[param][k] = saved + eps;
  forward();
  const double up = values[loss][0];
  params[param][k] = saved - eps;
  forward();
  const double down = values[loss][0];
  params[param][k] = saved;
  forward();
  return (up - down) / (2 * eps);
}

double Reference::fd_input(uint32_t loss, uint32_t k, double eps) {
  const double saved = inputs[k];
  inputs[k] = saved + eps;
  forward();
  const double up = values[loss][0];
  inputs[k] = saved - eps;
  forward();
  const double down = values[loss][0];
  inputs[k] = saved;
  forward();
  return (up - down) / (2 * eps);
}

}  // namespace edbatch::testing
