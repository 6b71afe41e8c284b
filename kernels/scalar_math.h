// The scalar primitives of kernels/op_math.h: float on the host and the device (the CUDA step
// kernels), double on the host (the test reference); with the per-node attributes and constants in
// a value type's precision.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/special_math.h"  // EDBATCH_HD

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
  EDBATCH_HD static float log(float x) {
#if defined(__CUDA_ARCH__)
    return logf(x);
#else
    return std::log(x);
#endif
  }
  EDBATCH_HD static float sqrt(float x) {
#if defined(__CUDA_ARCH__)
    return sqrtf(x);
#else
    return std::sqrt(x);
#endif
  }
  EDBATCH_HD static float erf(float x) {
#if defined(__CUDA_ARCH__)
    return erff(x);
#else
    return std::erf(x);
#endif
  }
  EDBATCH_HD static float atan(float x) {
#if defined(__CUDA_ARCH__)
    return atanf(x);
#else
    return std::atan(x);
#endif
  }
  EDBATCH_HD static float atan2(float a, float b) {
#if defined(__CUDA_ARCH__)
    return atan2f(a, b);
#else
    return std::atan2(a, b);
#endif
  }
  EDBATCH_HD static float hypot(float a, float b) {
#if defined(__CUDA_ARCH__)
    return hypotf(a, b);
#else
    return std::hypot(a, b);
#endif
  }
  EDBATCH_HD static float erfc(float x) {
#if defined(__CUDA_ARCH__)
    return erfcf(x);
#else
    return std::erfc(x);
#endif
  }
  EDBATCH_HD static float lgamma(float x) {
#if defined(__CUDA_ARCH__)
    return lgammaf(x);
#else
    return std::lgamma(x);
#endif
  }
  EDBATCH_HD static float erfinv(float x) {
#if defined(__CUDA_ARCH__)
    return erfinvf(x);
#else
    return static_cast<float>(special::erfinv(x));
#endif
  }
  EDBATCH_HD static float digamma(float x) {
    return static_cast<float>(special::digamma(x));
  }
  EDBATCH_HD static float trigamma(float x) {
    return static_cast<float>(special::trigamma(x));
  }
  EDBATCH_HD static float fmod(float a, float b) {
    return special::fmod_of(a, b);
  }
  EDBATCH_HD static float mod(float a, float b) {
    return special::mod(a, b);
  }
  EDBATCH_HD static float trunc_div(float a, float b) {
    return special::trunc_of(a / b);
  }
  EDBATCH_HD static float floor_div(float a, float b) {
    return special::floor_div(a, b);
  }
  EDBATCH_HD static float copysign(float a, float b) {
    return special::copysign_of(a, b);
  }
  // y / x, 0 where x is 0.
  EDBATCH_HD static float div_or_zero(float y, float x) {
    return x == 0 ? 0.0f : y / x;
  }
  EDBATCH_HD static float sinh(float x) {
#if defined(__CUDA_ARCH__)
    return sinhf(x);
#else
    return std::sinh(x);
#endif
  }
  EDBATCH_HD static float cosh(float x) {
#if defined(__CUDA_ARCH__)
    return coshf(x);
#else
    return std::cosh(x);
#endif
  }
  EDBATCH_HD static float asinh(float x) {
#if defined(__CUDA_ARCH__)
    return asinhf(x);
#else
    return std::asinh(x);
#endif
  }
  EDBATCH_HD static float atanh(float x) {
#if defined(__CUDA_ARCH__)
    return atanhf(x);
#else
    return std::atanh(x);
#endif
  }
  EDBATCH_HD static float asin(float x) {
#if defined(__CUDA_ARCH__)
    return asinf(x);
#else
    return std::asin(x);
#endif
  }
  EDBATCH_HD static float acos(float x) {
#if defined(__CUDA_ARCH__)
    return acosf(x);
#else
    return std::acos(x);
#endif
  }
  EDBATCH_HD static float floor(float x) {
#if defined(__CUDA_ARCH__)
    return floorf(x);
#else
    return std::floor(x);
#endif
  }
  // Halves to even (the default rounding mode), as torch.round.
  EDBATCH_HD static float rint(float x) {
#if defined(__CUDA_ARCH__)
    return rintf(x);
#else
    return std::nearbyint(x);
#endif
  }
  EDBATCH_HD static float sin(float x) {
#if defined(__CUDA_ARCH__)
    return sinf(x);
#else
    return std::sin(x);
#endif
  }
  EDBATCH_HD static float cos(float x) {
#if defined(__CUDA_ARCH__)
    return cosf(x);
#else
    return std::cos(x);
#endif
  }
  EDBATCH_HD static float sigmoid(float x) {
    return 1.0f / (1.0f + exp(-x));
  }
  EDBATCH_HD static float abs(float x) {
    return x < 0 ? -x : x;
  }
  // max(x, 0) with PyTorch's NaN: relu(NaN) is NaN (the array form's Eigen max keeps it too).
  EDBATCH_HD static float max0(float x) {
    return x <= 0 ? 0.0f : x;
  }
  EDBATCH_HD static float step(float x) {
    return x > 0 ? 1.0f : 0.0f;
  }
  EDBATCH_HD static float step0(float x) {
    return x >= 0 ? 1.0f : 0.0f;
  }
  EDBATCH_HD static float keep(float a, float m) {
    return m > 0 ? a : 0.0f;
  }
  EDBATCH_HD static float unless_zero(float a, float dy) {
    return dy == 0.0f ? 0.0f : a;
  }
  EDBATCH_HD static float zero(float) {
    return 0.0f;
  }

  static double exp(double x) {
    return std::exp(x);
  }
  static double tanh(double x) {
    return std::tanh(x);
  }
  static double log1p(double x) {
    return std::log1p(x);
  }
  static double log(double x) {
    return std::log(x);
  }
  static double sqrt(double x) {
    return std::sqrt(x);
  }
  static double erf(double x) {
    return std::erf(x);
  }
  static double atan(double x) {
    return std::atan(x);
  }
  static double atan2(double a, double b) {
    return std::atan2(a, b);
  }
  static double hypot(double a, double b) {
    return std::hypot(a, b);
  }
  static double erfc(double x) {
    return std::erfc(x);
  }
  static double lgamma(double x) {
    return std::lgamma(x);
  }
  static double erfinv(double x) {
    return special::erfinv(x);
  }
  static double digamma(double x) {
    return special::digamma(x);
  }
  static double trigamma(double x) {
    return special::trigamma(x);
  }
  static double fmod(double a, double b) {
    return std::fmod(a, b);
  }
  static double mod(double a, double b) {
    return special::mod(a, b);
  }
  static double trunc_div(double a, double b) {
    return std::trunc(a / b);
  }
  static double floor_div(double a, double b) {
    return special::floor_div(a, b);
  }
  static double copysign(double a, double b) {
    return std::copysign(a, b);
  }
  static double div_or_zero(double y, double x) {
    return x == 0 ? 0.0 : y / x;
  }
  static double sinh(double x) {
    return std::sinh(x);
  }
  static double cosh(double x) {
    return std::cosh(x);
  }
  static double asinh(double x) {
    return std::asinh(x);
  }
  static double atanh(double x) {
    return std::atanh(x);
  }
  static double asin(double x) {
    return std::asin(x);
  }
  static double acos(double x) {
    return std::acos(x);
  }
  static double floor(double x) {
    return std::floor(x);
  }
  static double rint(double x) {
    return std::nearbyint(x);
  }
  static double sin(double x) {
    return std::sin(x);
  }
  static double cos(double x) {
    return std::cos(x);
  }
  static double sigmoid(double x) {
    return 1.0 / (1.0 + std::exp(-x));
  }
  static double abs(double x) {
    return std::abs(x);
  }
  static double max0(double x) {
    return x <= 0 ? 0.0 : x;
  }
  static double step(double x) {
    return x > 0 ? 1.0 : 0.0;
  }
  static double step0(double x) {
    return x >= 0 ? 1.0 : 0.0;
  }
  static double unless_zero(double a, double dy) {
    return dy == 0.0 ? 0.0 : a;
  }
  static double keep(double a, double m) {
    return m > 0 ? a : 0.0;
  }
  static double zero(double) {
    return 0.0;
  }
};

// A constant in T's precision: double for the reference, float for the kernels (Eigen arrays of
// float do not mix with double scalars).
template <class T>
EDBATCH_HD constexpr auto constant(double c) {
  if constexpr (std::is_same_v<T, double>)
    return c;
  else
    return static_cast<float>(c);
}

}  // namespace edbatch::math
