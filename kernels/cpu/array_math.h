// The primitives of kernels/op_math.h over Eigen array expressions: the CPU kernels evaluate an
// op's math on whole columns (or runs of columns) at once, with Eigen's vectorised functions.
#pragma once
#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <unsupported/Eigen/SpecialFunctions>  // Array::erf (vectorised)

#include "kernels/op_math.h"

namespace edbatch::cpu {

// sqrt and log as PyTorch gives them at every float. Eigen's vectorised sqrt (EIGEN_FAST_MATH,
// on by default, and wanted for tanh and erf) is a reciprocal estimate with a Newton step: NaN
// at +inf, zero for subnormals, and a bit or two short of the rounded root. Its log clamps
// subnormal inputs to the smallest normal float (log(1e-40) = -87.34 instead of -92.10).
namespace exact {
template <class Packet>
Packet sqrt(const Packet& p) {
  return Eigen::internal::psqrt(p);
}
#if defined(__SSE__)
inline __m128 sqrt(__m128 p) {
  return _mm_sqrt_ps(p);
}
#endif
#if defined(__AVX__)
inline __m256 sqrt(__m256 p) {
  return _mm256_sqrt_ps(p);
}
#endif
#if defined(__AVX512F__)
inline __m512 sqrt(__m512 p) {
  return _mm512_sqrt_ps(p);
}
#endif
}  // namespace exact

struct SqrtOp {
  float operator()(float x) const { return std::sqrt(x); }
  template <class Packet>
  Packet packetOp(const Packet& p) const {
    return exact::sqrt(p);
  }
};

struct LogOp {
  float operator()(float x) const { return std::log(x); }
  template <class Packet>
  Packet packetOp(const Packet& p) const {
    using namespace Eigen::internal;
    const Packet y = plog(p);
    const Packet tiny =
        pand(pcmp_lt(p, pset1<Packet>(std::numeric_limits<float>::min())), pcmp_lt(pzero(p), p));
    if (!predux_any(tiny)) return y;
    // A subnormal x: log(x 2^24) - 24 log 2, x 2^24 being normal.
    const Packet scaled =
        psub(plog(pmul(p, pset1<Packet>(16777216.0f))), pset1<Packet>(16.635532333438686f));
    return pselect(tiny, scaled, y);
  }
};

struct ArrayMath {
  template <class X> static auto exp(const X& x) { return x.exp(); }
  template <class X> static auto tanh(const X& x) { return x.tanh(); }
  template <class X> static auto log1p(const X& x) { return x.log1p(); }
  template <class X>
  static auto log(const X& x) {
    return x.unaryExpr(LogOp{});
  }
  template <class X>
  static auto sqrt(const X& x) {
    return x.unaryExpr(SqrtOp{});
  }
  template <class X> static auto erf(const X& x) { return x.erf(); }
  template <class X>
  static auto atan(const X& x) {
    return x.atan();
  }
  template <class X>
  static auto sinh(const X& x) {
    return x.sinh();
  }
  template <class X>
  static auto cosh(const X& x) {
    return x.cosh();
  }
  template <class X>
  static auto asinh(const X& x) {
    return x.asinh();
  }
  template <class X>
  static auto atanh(const X& x) {
    return x.atanh();
  }
  template <class X>
  static auto asin(const X& x) {
    return x.asin();
  }
  template <class X>
  static auto acos(const X& x) {
    return x.acos();
  }
  template <class X>
  static auto floor(const X& x) {
    return x.floor();
  }
  template <class X>
  static auto rint(const X& x) {
    return x.rint();
  }
  template <class A, class B>
  static auto atan2(const A& a, const B& b) {
    return a.binaryExpr(b, [](float y, float x) { return std::atan2(y, x); });
  }
  template <class A, class B>
  static auto hypot(const A& a, const B& b) {
    return a.binaryExpr(b, [](float x, float y) { return std::hypot(x, y); });
  }
  // The rare special functions elementwise through the scalar ones (kernels/special_math.h).
  template <class X>
  static auto erfc(const X& x) {
    return x.unaryExpr([](float v) { return std::erfc(v); });
  }
  template <class X>
  static auto lgamma(const X& x) {
    return x.lgamma();  // lgammaf_r: no write to signgam from the threads
  }
  template <class X>
  static auto erfinv(const X& x) {
    return x.unaryExpr([](float v) { return math::ScalarMath::erfinv(v); });
  }
  template <class X>
  static auto digamma(const X& x) {
    return x.unaryExpr([](float v) { return math::ScalarMath::digamma(v); });
  }
  template <class X>
  static auto trigamma(const X& x) {
    return x.unaryExpr([](float v) { return math::ScalarMath::trigamma(v); });
  }
  template <class A, class B>
  static auto fmod(const A& a, const B& b) {
    return a.binaryExpr(b, [](float x, float y) { return math::ScalarMath::fmod(x, y); });
  }
  template <class A, class B>
  static auto mod(const A& a, const B& b) {
    return a.binaryExpr(b, [](float x, float y) { return math::ScalarMath::mod(x, y); });
  }
  template <class A, class B>
  static auto trunc_div(const A& a, const B& b) {
    return a.binaryExpr(b, [](float x, float y) { return math::ScalarMath::trunc_div(x, y); });
  }
  template <class A, class B>
  static auto floor_div(const A& a, const B& b) {
    return a.binaryExpr(b, [](float x, float y) { return math::ScalarMath::floor_div(x, y); });
  }
  template <class A, class B>
  static auto copysign(const A& a, const B& b) {
    return a.binaryExpr(b, [](float x, float y) { return math::ScalarMath::copysign(x, y); });
  }
  template <class Y, class X>
  static auto div_or_zero(const Y& y, const X& x) {
    return (x == 0.0f).select(0.0f, y / x);
  }
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
  template <class A, class D>
  static auto unless_zero(const A& a, const D& dy) {
    return (dy == 0.0f).select(0.0f, a);
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

namespace Eigen::internal {
template <>
struct functor_traits<edbatch::cpu::SqrtOp> {
  enum { Cost = 14, PacketAccess = packet_traits<float>::HasSqrt };
};
template <>
struct functor_traits<edbatch::cpu::LogOp> {
  enum {
    Cost = functor_traits<scalar_log_op<float>>::Cost + 2,
    PacketAccess = packet_traits<float>::HasLog
  };
};
}  // namespace Eigen::internal
