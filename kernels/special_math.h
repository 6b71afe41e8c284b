// Special functions of the elementwise ops (kernels/op_math.h) that neither the C library nor
// CUDA's math library has: digamma and trigamma, and the inverse error function on the host
// (CUDA has erfinvf); and the float modulo of PyTorch's remainder and floor division. Written
// once for the host and the device. The functions with series and iterations are computed in
// double and rounded: float callers lose nothing to the recurrences, and these ops are rare
// enough that double's cost does not matter.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define EDBATCH_HD __host__ __device__
// Called, not inlined, in device code: a rare op's loops and doubles then add no registers to
// the step kernels' common paths.
#define EDBATCH_HD_CALLED __host__ __device__ __noinline__
#else
#define EDBATCH_HD
#define EDBATCH_HD_CALLED
#endif

namespace edbatch::math::special {

inline constexpr double kPi = 3.14159265358979323846;

// The C library's functions by overload, the same names on the host and the device.
EDBATCH_HD inline float floor_of(float x) {
  return ::floorf(x);
}
EDBATCH_HD inline double floor_of(double x) {
  return ::floor(x);
}
EDBATCH_HD inline float trunc_of(float x) {
  return ::truncf(x);
}
EDBATCH_HD inline double trunc_of(double x) {
  return ::trunc(x);
}
EDBATCH_HD inline float fmod_of(float a, float b) {
  return ::fmodf(a, b);
}
EDBATCH_HD inline double fmod_of(double a, double b) {
  return ::fmod(a, b);
}
EDBATCH_HD inline float copysign_of(float a, float b) {
  return ::copysignf(a, b);
}
EDBATCH_HD inline double copysign_of(double a, double b) {
  return ::copysign(a, b);
}

// digamma(x) = d/dx log Gamma(x), with PyTorch's values at the poles: -inf at +0, +inf at -0,
// NaN at the negative integers and -inf. Below 0 by reflection, psi(x) = psi(1 - x) -
// pi / tan(pi x), tan taken of x less its nearest integer (exact, and as small as x near 0,
// where pi x would lose digits far from 0 and x less its floor would lose them near 0); then
// psi(x) = psi(x + 1) - 1 / x up to x >= 10, and the asymptotic series there, whose first
// omitted term is below 1e-15.
EDBATCH_HD_CALLED inline double digamma(double x) {
  if (x == 0) return ::copysign(HUGE_VAL, -x);
  double acc = 0;
  if (x < 0) {
    const double r = x - ::round(x);
    if (r == 0 || r != r) return static_cast<double>(NAN);  // an integer, or -inf
    acc = -kPi / ::tan(kPi * r);
    x = 1 - x;
  }
  for (; x < 10; x += 1) acc -= 1 / x;
  // ln x - 1 / (2x) - sum of B_2k / (2k x^2k), k = 1..6
  const double z = 1 / (x * x);
  const double series =
      z *
      (1.0 / 12 -
       z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 - z * (691.0 / 32760))))));
  return acc + ::log(x) - 0.5 / x - series;
}

// trigamma(x) = d/dx digamma(x), digamma's gradient: +inf at 0 and the negative integers, as
// PyTorch's (which gives a large finite value at most negative integers). Below 1/2 by
// reflection, psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x); then psi1(x) = psi1(x + 1) + 1 / x^2 up
// to x >= 10 and the asymptotic series there.
EDBATCH_HD_CALLED inline double trigamma(double x) {
  double reflected = 0;
  const bool reflect = x < 0.5;
  if (reflect) {
    const double s = ::sin(kPi * (x - ::round(x)));  // as in digamma
    reflected = kPi * kPi / (s * s);
    x = 1 - x;
  }
  double acc = 0;
  for (; x < 10; x += 1) acc += 1 / (x * x);
  // 1 / x + 1 / (2x^2) + sum of B_2k / x^(2k + 1), k = 1..6
  const double z = 1 / (x * x);
  acc +=
      1 / x + 0.5 * z +
      z / x *
          (1.0 / 6 -
           z * (1.0 / 30 - z * (1.0 / 42 - z * (1.0 / 30 - z * (5.0 / 66 - z * (691.0 / 2730))))));
  return reflect ? reflected - acc : acc;
}

// The inverse error function: erfinv(erf(y)) = y on (-1, 1), +-inf at +-1, NaN outside [-1, 1]
// and at NaN; -0 at -0. A first guess within 0.2% (Winitzki's closed form, log(1 - x^2) taken as
// log(t (2 - t)) with t = 1 - |x|), then Halley steps on erf(y) = |x|, or on erfc(y) = t where
// |x| > 1/2: t is exact there, and erfc keeps the tail's relative precision where erf(y) is 1
// to the last bit. Each step triples the correct digits; three leave double's rounding.
EDBATCH_HD_CALLED inline double erfinv(double x) {
  const double t = 1 - ::fabs(x);
  if (!(t >= 0)) return static_cast<double>(NAN);
  if (t == 0) return ::copysign(HUGE_VAL, x);
  constexpr double a = 0.147;
  const double l = ::log(t * (2 - t));
  const double b = 2 / (kPi * a) + l / 2;
  double y = ::sqrt(::sqrt(b * b - l / a) - b);
  const bool tail = t < 0.5;
  for (int i = 0; i < 3; ++i) {
    // f(y) = erf(y) - |x| or erfc(y) - t; f' = +-(2 / sqrt(pi)) e^(-y^2) and f'' = -2 y f', so
    // Halley's step f / (f' - f f'' / (2 f')) is f / (f' + y f).
    const double f = tail ? ::erfc(y) - t : ::erf(y) - ::fabs(x);
    if (f == 0) break;
    const double slope = (tail ? -1.1283791670955126 : 1.1283791670955126) * ::exp(-y * y);
    y -= f / (slope + y * f);
  }
  return ::copysign(y, x);
}

// Python's modulo, torch.remainder: a - b floor(a / b), of b's sign (or a zero), computed as
// PyTorch does, from fmod (exact) moved by b where the signs differ.
template <class T>
EDBATCH_HD_CALLED T mod(T a, T b) {
  T r = fmod_of(a, b);
  if (r != 0 && ((b < 0) != (r < 0))) r += b;
  return r;
}

// PyTorch's division rounded down (torch.div(a, b, rounding_mode="floor")): the exact quotient
// (a - fmod(a, b)) / b, less 1 where fmod's sign differs from b's, rounded to the nearest integer
// (the division can land a hair off one); a / b where b is 0 (+-inf or NaN).
template <class T>
EDBATCH_HD_CALLED T floor_div(T a, T b) {
  if (b == 0) return a / b;
  const T r = fmod_of(a, b);
  T q = (a - r) / b;
  if (r != 0 && ((b < 0) != (r < 0))) q -= 1;
  if (q == 0) return copysign_of(T(0), a / b);
  T whole = floor_of(q);
  if (q - whole > T(0.5)) whole += 1;
  return whole;
}

}  // namespace edbatch::math::special
