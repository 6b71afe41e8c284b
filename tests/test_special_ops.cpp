// The special functions and float modulo of the elementwise ops (kernels/special_math.h) against
// closed forms and identities, in double (the reference) and float (the kernels), at the poles,
// the signed zeros, the tails and NaN. tests/test_ops.cpp runs the ops through every backend
// against the reference and finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/op_math.h"

using namespace edbatch;
using math::Attr;
using math::ScalarMath;
namespace special = math::special;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kPi = 3.14159265358979323846;
const double kEuler = 0.57721566490153286061;

// got equals want: both NaN, the same infinity, or within rel relative error (abs near 0).
void check_close(double got, double want, double rel, double abs = 0) {
  if (std::isnan(want)) {
    CHECK(std::isnan(got));
  } else if (std::isinf(want)) {
    CHECK(got == want);
  } else {
    CHECK(std::abs(got - want) <= rel * std::abs(want) + abs);
  }
}

}  // namespace

TEST_CASE("special ops: digamma and trigamma against closed forms, poles and the recurrence") {
  // psi(1) = -gamma, psi(1/2) = -gamma - 2 ln 2, psi(-1/2) = psi(1/2) + 2, psi(n + 1) = H_n -
  // gamma.
  const double half = -kEuler - 2 * std::log(2.0);
  double harmonic = 0;
  for (int n = 1; n <= 30; ++n) harmonic += 1.0 / n;
  for (const auto& [x, psi, psi1] : std::vector<std::tuple<double, double, double>>{
           {1.0, -kEuler, kPi * kPi / 6},
           {0.5, half, kPi * kPi / 2},
           {-0.5, half + 2, kPi * kPi / 2 + 4},
           {-1.5, half + 2 + 2.0 / 3, kPi * kPi / 2 + 4 + 4.0 / 9},
           {31.0, harmonic - kEuler, kNan},
           {+0.0, -kInf, kInf},
           {-0.0, kInf, kInf},
           {-1e-30, 1e30 - kEuler, 1e60},
           {-2.0, kNan, kInf},
           {-kInf, kNan, kNan},
           {kInf, kInf, 0.0},
           {kNan, kNan, kNan}}) {
    CAPTURE(x);
    check_close(math::Digamma::value<ScalarMath>(x, Attr{}), psi, 1e-13, 1e-13);
    check_close(ScalarMath::digamma(static_cast<float>(x)), psi, 1e-6, 1e-7);
    if (!std::isnan(psi1) || std::isnan(x)) check_close(ScalarMath::trigamma(x), psi1, 1e-13);
  }
  // The recurrences across the switch to the series at 10 and the reflection at 0 and 1/2.
  for (double x : {-7.3, -0.999, 1e-3, 0.3, 0.5000001, 9.999, 10.0, 10.5, 1e6}) {
    CAPTURE(x);
    // within double's rounding of the larger term
    const double psi = special::digamma(x), psi1 = special::trigamma(x);
    check_close(special::digamma(x + 1), psi + 1 / x, 0, 1e-14 * (1 + std::abs(psi) + 1 / x));
    check_close(special::trigamma(x + 1), psi1 - 1 / (x * x), 0, 1e-14 * (1 + std::abs(psi1)));
  }
  // lgamma's gradient is digamma: central differences of std::lgamma.
  for (double x : {-2.7, -0.3, 0.2, 1.0, 4.5, 80.0}) {
    CAPTURE(x);
    const double h = 1e-6 * std::max(1.0, std::abs(x));
    const double slope = (std::lgamma(x + h) - std::lgamma(x - h)) / (2 * h);
    CHECK(math::Lgamma::gradient<ScalarMath>(1.0, x, 0.0, Attr{}) ==
          doctest::Approx(slope).epsilon(1e-6));
    const double slope1 = (special::digamma(x + h) - special::digamma(x - h)) / (2 * h);
    CHECK(math::Digamma::gradient<ScalarMath>(1.0, x, 0.0, Attr{}) ==
          doctest::Approx(slope1).epsilon(1e-6));
  }
  // A zero upstream gradient gives 0 at a pole, not 0 * inf.
  CHECK(math::Digamma::gradient<ScalarMath>(0.0, 0.0, 0.0, Attr{}) == 0.0);
  CHECK(math::Lgamma::gradient<ScalarMath>(0.0f, -3.0f, 0.0f, Attr{}) == 0.0f);
  CHECK(std::isnan(math::Lgamma::gradient<ScalarMath>(1.0f, -3.0f, 0.0f, Attr{})));
  // lgamma: ln sqrt(pi) at 1/2, ln(2 sqrt(pi)) at -1/2, +inf at the poles.
  check_close(math::Lgamma::value<ScalarMath>(0.5, Attr{}), 0.5 * std::log(kPi), 1e-15);
  check_close(math::Lgamma::value<ScalarMath>(-0.5f, Attr{}), std::log(2 * std::sqrt(kPi)), 1e-6);
  CHECK(math::Lgamma::value<ScalarMath>(-4.0, Attr{}) == kInf);
  CHECK(math::Lgamma::value<ScalarMath>(0.0f, Attr{}) == std::numeric_limits<float>::infinity());
}

TEST_CASE("special ops: erfinv inverts erf and erfc to double's precision, tails and edges") {
  // Inside: erf(erfinv(x)) = x; the tail: erfc(erfinv(1 - t)) = t in relative terms, down to
  // the smallest t of double and of float.
  for (double x = -0.999; x < 1; x += 0.0137) {
    CAPTURE(x);
    CHECK(std::abs(std::erf(special::erfinv(x)) - x) <= 4e-16);
  }
  for (double t : {0.5, 0.3, 1e-3, 1e-8, 1e-12, 1.1102230246251565e-16}) {
    CAPTURE(t);
    const double x = 1 - t, y = special::erfinv(x);
    check_close(std::erfc(y), 1 - x, 1e-12);  // 1 - x: t as x holds it
    check_close(special::erfinv(t - 1), -y, 0);
    // Float: x = 1 - t rounded to float (t from 2^-24, 1 - x's smallest step), y to float.
    const float xf = 1.0f - static_cast<float>(t);
    if (xf < 1.0f) check_close(std::erfc(ScalarMath::erfinv(xf)), 1.0 - xf, 1e-5);
  }
  check_close(special::erfinv(0.5), 0.47693627620446987338, 1e-15);
  check_close(special::erfinv(-0.9), -1.16308715367667425, 1e-15);
  check_close(special::erfinv(1e-300), 1e-300 * std::sqrt(kPi) / 2, 1e-15);
  CHECK(special::erfinv(1.0) == kInf);
  CHECK(special::erfinv(-1.0) == -kInf);
  CHECK(std::isnan(special::erfinv(1.0000001)));
  CHECK(std::isnan(special::erfinv(kNan)));
  CHECK(std::signbit(special::erfinv(-0.0)));
  CHECK(ScalarMath::erfinv(-0.0f) == 0.0f);
  // Its gradient sqrt(pi) / 2 e^(y^2), from y: central differences of erfinv itself.
  for (double x : {-0.95, -0.2, 0.0, 0.6, 0.999}) {
    CAPTURE(x);
    const double h = 1e-7, y = special::erfinv(x);
    const double slope = (special::erfinv(x + h) - special::erfinv(x - h)) / (2 * h);
    CHECK(math::Erfinv::gradient<ScalarMath>(1.0, x, y, Attr{}) ==
          doctest::Approx(slope).epsilon(1e-6));
  }
  CHECK(math::Erfinv::gradient<ScalarMath>(0.0, 1.0, kInf, Attr{}) == 0.0);
  // erfc keeps the tail: erfc(5) = 1.5375e-12, where 1 - erf(5) in float is 0.
  check_close(math::Erfc::value<ScalarMath>(5.0f, Attr{}), 1.5374597944280348502e-12, 1e-6);
  check_close(math::Erfc::value<ScalarMath>(-1.0, Attr{}), 1.8427007929497148693, 1e-15);
  CHECK(math::Erfc::gradient<ScalarMath>(2.0, 0.0, 0.0, Attr{}) ==
        doctest::Approx(-4 / std::sqrt(kPi)));
}

TEST_CASE("special ops: fmod, remainder and copysign by sign, at zeros, infinities and NaN") {
  // {a, b, fmod, remainder, floor(a / b), trunc(a / b)}
  for (const auto& [a, b, fm, rem, fl, tr] :
       std::vector<std::tuple<double, double, double, double, double, double>>{
           {5.5, 2.0, 1.5, 1.5, 2.0, 2.0},
           {-5.5, 2.0, -1.5, 0.5, -3.0, -2.0},
           {5.5, -2.0, 1.5, -0.5, -3.0, -2.0},
           {-5.5, -2.0, -1.5, -1.5, 2.0, 2.0},
           {-0.5, 2.0, -0.5, 1.5, -1.0, -0.0},
           {0.3, 0.1, 0.3 - 2 * 0.1, 0.3 - 2 * 0.1, 2.0, 2.0},  // 0.3 < 3 x 0.1 in double
           {1.0, kInf, 1.0, 1.0, 0.0, 0.0},
           {-1.0, kInf, -1.0, kInf, -1.0, -0.0},
           {1.0, 0.0, kNan, kNan, kInf, kInf},
           {kInf, 2.0, kNan, kNan, kNan, kInf},
           {kNan, 2.0, kNan, kNan, kNan, kNan}}) {
    CAPTURE(a);
    CAPTURE(b);
    check_close(math::Fmod::value<ScalarMath>(a, b), fm, 1e-15);
    check_close(math::Remainder::value<ScalarMath>(a, b), rem, 1e-15);
    if (a != 0.3)  // 0.3f > 3 x 0.1f in float (below)
      check_close(math::Fmod::value<ScalarMath>(static_cast<float>(a), static_cast<float>(b)),
                  static_cast<float>(fm), 1e-6, 1e-7);
    if (!std::isnan(fl)) {
      check_close(-math::Remainder::grad_b<ScalarMath>(1.0, a, b, 0.0), fl, 0);
      check_close(-math::Fmod::grad_b<ScalarMath>(1.0, a, b, 0.0), tr, 0);
    }
    CHECK(math::Fmod::grad_a<ScalarMath>(2.0, a, b, 0.0) == 2.0);
  }
  CHECK(math::Fmod::value<ScalarMath>(0.3f, 0.1f) == static_cast<float>(0.3f - 3.0 * 0.1f));
  CHECK(math::Remainder::grad_b<ScalarMath>(1.0f, 0.3f, 0.1f, 0.0f) == -3.0f);
  // The remainder of a multiple is a zero of a's sign (PyTorch's -0 for -4 % 2).
  CHECK(math::Remainder::value<ScalarMath>(4.0, -2.0) == 0.0);
  CHECK(std::signbit(math::Remainder::value<ScalarMath>(-4.0f, 2.0f)));
  CHECK(!std::signbit(math::Remainder::value<ScalarMath>(4.0f, 2.0f)));
  // copysign: b's sign bit (-0, NaN of either sign); a's gradient y / a, 0 at a = 0, NaN at inf.
  CHECK(math::Copysign::value<ScalarMath>(3.0, -0.0) == -3.0);
  CHECK(math::Copysign::value<ScalarMath>(-2.0f, std::numeric_limits<float>::quiet_NaN()) == 2.0f);
  CHECK(math::Copysign::value<ScalarMath>(-2.0, -kNan) == -2.0);
  CHECK(math::Copysign::grad_a<ScalarMath>(5.0, -2.0, 1.0, 2.0) == -5.0);
  CHECK(math::Copysign::grad_a<ScalarMath>(5.0f, 2.0f, 1.0f, 2.0f) == 5.0f);
  CHECK(math::Copysign::grad_a<ScalarMath>(5.0, 0.0, -1.0, -0.0) == 0.0);
  CHECK(std::isnan(math::Copysign::grad_a<ScalarMath>(5.0, kInf, -1.0, -kInf)));
  CHECK(math::Copysign::grad_b<ScalarMath>(5.0, 1.0, -1.0, -1.0) == 0.0);
}
