#include "tests/reference.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

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

void Reference::forward() {
  const uint32_t n = g_.size();
  values.assign(n, {});
  for (uint32_t v = 0; v < n; ++v) {
    const Node& nd = g_.node(v);
    const uint32_t* a = g_.args(nd);
    std::vector<double>& y = values[v];
    const uint32_t R = nd.dim.rows, C = nd.dim.cols;
    y.assign(nd.dim.size(), 0.0);
    auto x = [&](uint32_t j) -> const std::vector<double>& { return values[a[j]]; };
    switch (nd.op) {
      case Op::Input:
        std::copy(inputs.begin() + nd.aux, inputs.begin() + nd.aux + nd.dim.size(), y.begin());
        break;
      case Op::Parameter: y = params[nd.aux]; break;
      case Op::Lookup:
        for (uint32_t r = 0; r < R; ++r) y[r] = params[nd.aux][nd.aux2 * R + r];
        break;
      case Op::Affine:
      case Op::MatMul: {
        uint32_t j0 = 0;
        if (nd.op == Op::Affine) {
          y = x(0);
          j0 = 1;
        }
        for (uint32_t j = j0; j + 1 < nd.num_args; j += 2) {
          const Dim wd = g_.node(a[j]).dim;
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
      case Op::Subtract:
        for (uint32_t i = 0; i < y.size(); ++i) y[i] = x(0)[i] - x(1)[i];
        break;
      case Op::CMult:
        for (uint32_t i = 0; i < y.size(); ++i) y[i] = x(0)[i] * x(1)[i];
        break;
      case Op::ScalarAffine:
        for (uint32_t i = 0; i < y.size(); ++i) y[i] = double(nd.alpha) * x(0)[i] + nd.beta;
        break;
      case Op::Tanh:
        for (uint32_t i = 0; i < y.size(); ++i) y[i] = std::tanh(x(0)[i]);
        break;
      case Op::Sigmoid:
        for (uint32_t i = 0; i < y.size(); ++i) y[i] = 1.0 / (1.0 + std::exp(-x(0)[i]));
        break;
      case Op::Relu:
        for (uint32_t i = 0; i < y.size(); ++i) y[i] = std::max(0.0, x(0)[i]);
        break;
      case Op::Concat: {
        uint32_t r0 = 0;
        for (uint32_t j = 0; j < nd.num_args; ++j) {
          const uint32_t rj = g_.node(a[j]).dim.rows;
          for (uint32_t c = 0; c < C; ++c)
            for (uint32_t r = 0; r < rj; ++r) y[c * R + r0 + r] = x(j)[c * rj + r];
          r0 += rj;
        }
        break;
      }
      case Op::Pick: y[0] = x(0)[nd.aux2]; break;
      case Op::PickNegLogSoftmax: {
        const auto& z = x(0);
        const double m = *std::max_element(z.begin(), z.end());
        double s = 0;
        for (double e : z) s += std::exp(e - m);
        y[0] = m + std::log(s) - z[nd.aux2];
        break;
      }
      case Op::Count: throw std::logic_error("[Reference] bad op");
    }
  }
}

void Reference::backward(uint32_t loss) {
  const uint32_t n = g_.size();
  adjoints.assign(n, {});
  for (uint32_t v = 0; v < n; ++v) adjoints[v].assign(values[v].size(), 0.0);
  param_grads.assign(params.size(), {});
  for (size_t p = 0; p < params.size(); ++p) param_grads[p].assign(params[p].size(), 0.0);
  adjoints[loss][0] = 1.0;
  for (uint32_t v = n; v-- > 0;) {
    const Node& nd = g_.node(v);
    const uint32_t* a = g_.args(nd);
    const std::vector<double>& dy = adjoints[v];
    const std::vector<double>& y = values[v];
    const uint32_t R = nd.dim.rows, C = nd.dim.cols;
    auto x = [&](uint32_t j) -> const std::vector<double>& { return values[a[j]]; };
    auto dx = [&](uint32_t j) -> std::vector<double>& { return adjoints[a[j]]; };
    switch (nd.op) {
      case Op::Input: break;
      case Op::Parameter:
        for (size_t i = 0; i < dy.size(); ++i) param_grads[nd.aux][i] += dy[i];
        break;
      case Op::Lookup:
        for (uint32_t r = 0; r < R; ++r) param_grads[nd.aux][nd.aux2 * R + r] += dy[r];
        break;
      case Op::Affine:
      case Op::MatMul: {
        uint32_t j0 = 0;
        if (nd.op == Op::Affine) {
          for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += dy[i];
          j0 = 1;
        }
        for (uint32_t j = j0; j + 1 < nd.num_args; j += 2) {
          const uint32_t K = g_.node(a[j]).dim.cols;
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
      case Op::Subtract:
        for (size_t i = 0; i < dy.size(); ++i) {
          dx(0)[i] += dy[i];
          dx(1)[i] -= dy[i];
        }
        break;
      case Op::CMult:
        for (size_t i = 0; i < dy.size(); ++i) {
          dx(0)[i] += dy[i] * x(1)[i];
          dx(1)[i] += dy[i] * x(0)[i];
        }
        break;
      case Op::ScalarAffine:
        for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += double(nd.alpha) * dy[i];
        break;
      case Op::Tanh:
        for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += dy[i] * (1 - y[i] * y[i]);
        break;
      case Op::Sigmoid:
        for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += dy[i] * y[i] * (1 - y[i]);
        break;
      case Op::Relu:
        for (size_t i = 0; i < dy.size(); ++i) dx(0)[i] += x(0)[i] > 0 ? dy[i] : 0.0;
        break;
      case Op::Concat: {
        uint32_t r0 = 0;
        for (uint32_t j = 0; j < nd.num_args; ++j) {
          const uint32_t rj = g_.node(a[j]).dim.rows;
          for (uint32_t c = 0; c < C; ++c)
            for (uint32_t r = 0; r < rj; ++r) dx(j)[c * rj + r] += dy[c * R + r0 + r];
          r0 += rj;
        }
        break;
      }
      case Op::Pick: dx(0)[nd.aux2] += dy[0]; break;
      case Op::PickNegLogSoftmax: {
        const auto& z = x(0);
        const double m = *std::max_element(z.begin(), z.end());
        double s = 0;
        for (double e : z) s += std::exp(e - m);
        for (size_t i = 0; i < z.size(); ++i)
          dx(0)[i] += dy[0] * (std::exp(z[i] - m) / s - (i == nd.aux2 ? 1.0 : 0.0));
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
