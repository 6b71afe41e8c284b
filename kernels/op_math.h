// The math of the elementwise ops, written once: each op's value and gradient as templates over
// a primitives struct M and a value type T. The CPU kernels instantiate them with Eigen array
// expressions (kernels/cpu/array_math.h), the CUDA step kernels with float on the device
// (ScalarMath), the double-precision test reference with double. Backends differ in how they
// loop, not in what they compute.
//
// Adding a unary op: a struct below and its name in EDBATCH_UNARY_OPS; binary likewise with
// EDBATCH_BINARY_OPS. The kernels of every backend and the reference follow from these lists.
#pragma once
#include <cmath>

#include "edbatch/op.h"

#if defined(__CUDACC__)
#define EDBATCH_HD __host__ __device__
#else
#define EDBATCH_HD
#endif

namespace edbatch::math {

// Per-node float attributes of an op (Node::alpha, Node::beta).
struct Attr {
  float alpha = 0, beta = 0;
};

// Scalar primitives: float on the host and the device, double on the host (the reference).
struct ScalarMath {
  EDBATCH_HD static float exp(float x) {
#if defined(__CUDA_ARCH__)
    return __expf(x);
#else
    return std::exp(x);
#endif
  }
  EDBATCH_HD static float tanh(float x) {
#if defined(__CUDA_ARCH__)
    return tanhf(x);
#else
    return std::tanh(x);
#endif
  }
  EDBATCH_HD static float log1p(float x) {
#if defined(__CUDA_ARCH__)
    return log1pf(x);
#else
    return std::log1p(x);
#endif
  }
  EDBATCH_HD static float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
  EDBATCH_HD static float abs(float x) { return x < 0 ? -x : x; }
  EDBATCH_HD static float max0(float x) { return x > 0 ? x : 0.0f; }
  EDBATCH_HD static float step(float x) { return x > 0 ? 1.0f : 0.0f; }

  static double exp(double x) { return std::exp(x); }
  static double tanh(double x) { return std::tanh(x); }
  static double log1p(double x) { return std::log1p(x); }
  static double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
  static double abs(double x) { return std::abs(x); }
  static double max0(double x) { return x > 0 ? x : 0.0; }
  static double step(double x) { return x > 0 ? 1.0 : 0.0; }
};

// ---- unary: y = value(x); dx += gradient(dy, x, y), dy times the derivative at x. kUsesX /
// kUsesY say which of x and y the gradient reads, so that kernels load only those. ----

struct Tanh {
  static constexpr bool kUsesX = false, kUsesY = true;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::tanh(x); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T& y, Attr) { return dy * (1.0f - y * y); }
};

struct Sigmoid {
  static constexpr bool kUsesX = false, kUsesY = true;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::sigmoid(x); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T& y, Attr) { return dy * y * (1.0f - y); }
};

struct Relu {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::max0(x); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) { return M::step(x) * dy; }
};

// log(1 + e^x), in the form that neither overflows for large x nor loses small ones.
struct Softplus {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::max0(x) + M::log1p(M::exp(-M::abs(x))); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) { return dy * M::sigmoid(x); }
};

// alpha * x + beta.
struct ScalarAffine {
  static constexpr bool kUsesX = false, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr a) { return a.alpha * x + a.beta; }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T&, Attr a) { return a.alpha * dy; }
};

// ---- binary: y = value(a, b); da += grad_a(dy, a, b, y); db += grad_b(dy, a, b, y). ----

struct Subtract {
  static constexpr bool kUsesA = false, kUsesB = false, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) { return a - b; }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T&, const T&, const T&) { return dy; }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T&, const T&, const T&) { return -dy; }
};

struct CMult {
  static constexpr bool kUsesA = true, kUsesB = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) { return a * b; }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T&, const T& b, const T&) { return dy * b; }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T& a, const T&, const T&) { return dy * a; }
};

// The ops above by name: X(Op enumerator, math struct). Kernels and the reference expand these.
#define EDBATCH_UNARY_OPS(X) \
  X(Tanh, Tanh)              \
  X(Sigmoid, Sigmoid)        \
  X(Relu, Relu)              \
  X(Softplus, Softplus)      \
  X(ScalarAffine, ScalarAffine)
#define EDBATCH_BINARY_OPS(X) \
  X(Subtract, Subtract)       \
  X(CMult, CMult)

EDBATCH_HD constexpr bool is_unary(Op op) {
  switch (op) {
#define EDBATCH_MATH_CASE(op, math) case Op::op:
    EDBATCH_UNARY_OPS(EDBATCH_MATH_CASE)
    return true;
    default:
      return false;
  }
}

EDBATCH_HD constexpr bool is_binary(Op op) {
  switch (op) {
    EDBATCH_BINARY_OPS(EDBATCH_MATH_CASE)
    return true;
    default:
      return false;
  }
#undef EDBATCH_MATH_CASE
}

}  // namespace edbatch::math
