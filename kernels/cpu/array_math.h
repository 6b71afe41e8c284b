// The primitives of kernels/op_math.h over Eigen array expressions: the CPU kernels evaluate an
// op's math on whole columns (or runs of columns) at once, with Eigen's vectorised functions.
#pragma once
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>  // Array::erf (vectorised)

#include "kernels/op_math.h"

namespace edbatch::cpu {

struct ArrayMath {
  template <class X> static auto exp(const X& x) { return x.exp(); }
  template <class X> static auto tanh(const X& x) { return x.tanh(); }
  template <class X> static auto log1p(const X& x) { return x.log1p(); }
  template <class X> static auto log(const X& x) { return x.log(); }
  template <class X> static auto sqrt(const X& x) { return x.sqrt(); }
  template <class X> static auto erf(const X& x) { return x.erf(); }
  template <class X>
  static auto sin(const X& x) {
    return x.sin();
  }
  template <class X>
  static auto cos(const X& x) {
    return x.cos();
  }
  template <class X> static auto sigmoid(const X& x) { return x.logistic(); }
  template <class X> static auto abs(const X& x) { return x.abs(); }
  template <class X> static auto max0(const X& x) { return x.max(0.0f); }
  template <class X> static auto step(const X& x) { return (x > 0.0f).template cast<float>(); }
  template <class X>
  static auto step0(const X& x) {
    return (x >= 0.0f).template cast<float>();
  }
  template <class A, class B>
  static auto keep(const A& a, const B& m) {
    return (m > 0.0f).select(a, 0.0f);
  }
  template <class X>
  static auto zero(const X& x) {
    return X::PlainObject::Zero(x.rows(), x.cols());
  }
};

}  // namespace edbatch::cpu
