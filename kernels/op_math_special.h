// The math of the special elementwise ops, as kernels/op_math.h writes every op's (value and
// gradient as templates over a primitives struct M and a value type T), kept apart from the
// common ones: the error function's complement and inverse, lgamma and digamma, and the float
// modulo and sign ops. Their primitives are in kernels/special_math.h and the math backends.
#pragma once

#include "kernels/scalar_math.h"

namespace edbatch::math {

// ---- unary ----

// The complementary error function 1 - erf(x), whose tail 1 - erf loses (erfc(5) = 1.5e-12);
// its gradient -2 / sqrt(pi) e^(-x^2).
struct Erfc {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::erfc(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy * M::exp(-1.0f * x * x) * constant<T>(-1.12837916709551257390);
  }
};

// log |Gamma(x)|, +inf at 0 and the negative integers; its gradient digamma(x), as PyTorch's.
struct Lgamma {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::lgamma(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(dy * M::digamma(x), dy);
  }
};

// digamma(x), the derivative of lgamma (-inf at +0, NaN at the negative integers, as PyTorch's);
// its gradient trigamma(x) (torch.polygamma(1, x)), infinite at the poles.
struct Digamma {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::digamma(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(dy * M::trigamma(x), dy);
  }
};

// The inverse error function on [-1, 1] (+-inf at +-1, NaN outside); its gradient
// sqrt(pi) / 2 e^(y^2), infinite at +-1.
struct Erfinv {
  static constexpr bool kUsesX = false, kUsesY = true;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::erfinv(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T& y, Attr) {
    return M::unless_zero(dy * M::exp(y * y) * constant<T>(0.88622692545275801365), dy);
  }
};

// ---- binary ----

// fmod(a, b) = a - trunc(a / b) b, of a's sign, as torch.fmod; its gradients PyTorch's, dy and
// -dy trunc(a / b) (infinite where b is 0).
struct Fmod {
  static constexpr bool kUsesA = true, kUsesB = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) {
    return M::fmod(a, b);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T&, const T&, const T&) {
    return dy;
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T& a, const T& b, const T&) {
    return M::unless_zero(-dy * M::trunc_div(a, b), dy);
  }
};

// Python's a % b = a - floor(a / b) b, of b's sign, as torch.remainder; its gradients PyTorch's,
// dy and -dy floor(a / b).
struct Remainder {
  static constexpr bool kUsesA = true, kUsesB = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) {
    return M::mod(a, b);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T&, const T&, const T&) {
    return dy;
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T& a, const T& b, const T&) {
    return M::unless_zero(-dy * M::floor_div(a, b), dy);
  }
};

// |a| with b's sign bit (so -0 and NaNs of either sign count), as torch.copysign; a's gradient
// PyTorch's, dy y / a (0 where a is 0, NaN where a is infinite), b's 0.
struct Copysign {
  static constexpr bool kUsesA = true, kUsesB = true, kUsesY = true;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) {
    return M::copysign(a, b);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T& a, const T&, const T& y) {
    return M::unless_zero(dy * M::div_or_zero(y, a), dy);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T&, const T&, const T&) {
    return M::zero(dy);
  }
};

}  // namespace edbatch::math
