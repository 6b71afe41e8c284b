// The math of the elementwise ops, written once: each op's value and gradient as templates over
// a primitives struct M and a value type T. The CPU kernels instantiate them with Eigen array
// expressions (kernels/cpu/array_math.h), the CUDA step kernels with float on the device
// (ScalarMath), the double-precision test reference with double. Backends differ in how they
// loop, not in what they compute.
//
// Adding a unary op: a struct below and its name in EDBATCH_UNARY_OPS; binary likewise with
// EDBATCH_BINARY_OPS. The kernels of every backend and the reference follow from these lists.
#pragma once
#include <type_traits>

#include "edbatch/op.h"
#include "kernels/op_math_special.h"  // erfc, lgamma, digamma, erfinv, fmod, remainder, copysign
#include "kernels/scalar_math.h"

namespace edbatch::math {

// ---- unary: y = value(x); dx += gradient(dy, x, y), dy times the derivative at x. kUsesX /
// kUsesY say which of x and y the gradient reads, so that kernels load only those. Where the
// derivative can be infinite (exp overflowed, log, sqrt and divisions at 0, products with inf),
// a dy of exactly 0 gives 0 (M::unless_zero): a value only compared, or only selected away,
// gets no gradient, as in PyTorch, where no gradient reaches it, rather than 0 * inf = NaN
// spreading through the batch's shared products into every weight's gradient. ----

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
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::keep(dy, x);  // a selection, as PyTorch's: an infinite dy where x <= 0 gives 0
  }
};

// log(1 + e^x), in the form that neither overflows for large x nor loses small ones.
struct Softplus {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::max0(x) + M::log1p(M::exp(-M::abs(x))); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) { return dy * M::sigmoid(x); }
};

struct Exp {
  static constexpr bool kUsesX = false, kUsesY = true;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::exp(x); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T& y, Attr) {
    return M::unless_zero(dy * y, dy);
  }
};

struct Log {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::log(x); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(dy / x, dy);
  }
};

struct Sqrt {
  static constexpr bool kUsesX = false, kUsesY = true;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) { return M::sqrt(x); }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T& y, Attr) {
    return M::unless_zero(dy * (0.5f / y), dy);
  }
};

// The exact GELU (PyTorch's default): x Phi(x); its derivative Phi(x) + x phi(x).
struct Gelu {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return 0.5f * x * (1.0f + M::erf(x * constant<T>(0.70710678118654752440)));
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy * (0.5f * (1.0f + M::erf(x * constant<T>(0.70710678118654752440))) +
                 x * M::exp(-0.5f * x * x) * constant<T>(0.39894228040143267794));
  }
};

// x if x > 0, else alpha x (PyTorch's leaky_relu, alpha its negative slope; slope alpha at 0).
struct LeakyRelu {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr a) {
    return M::max0(x) - a.alpha * M::max0(-x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr a) {
    return dy * (M::step(x) * (1.0f - a.alpha) + a.alpha);
  }
};

// x if x > 0, else alpha (e^x - 1) (PyTorch's elu; its gradient alpha e^x at 0 and below).
struct Elu {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr a) {
    return M::max0(x) + a.alpha * (M::exp(-M::max0(-x)) - 1.0f);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr a) {
    return dy * (M::step(x) + (1.0f - M::step(x)) * a.alpha * M::exp(-M::max0(-x)));
  }
};

// |x|; its gradient sign(x), 0 at 0 (as PyTorch's).
struct Abs {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::abs(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy * (M::step(x) - M::step(-x));
  }
};

struct Sin {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::sin(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy * M::cos(x);
  }
};

struct Cos {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::cos(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy * (-1.0f * M::sin(x));
  }
};

// The error function; its gradient 2 / sqrt(pi) e^(-x^2).
struct Erf {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::erf(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy * M::exp(-1.0f * x * x) * constant<T>(1.12837916709551257390);
  }
};

// The arctangent; its gradient 1 / (1 + x^2), which goes to 0 where x^2 overflows.
struct Atan {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::atan(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy / (x * x + 1.0f);
  }
};

// The hyperbolic sine; its gradient cosh(x) (a dy of 0 gives 0 where cosh overflows).
struct Sinh {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::sinh(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(dy * M::cosh(x), dy);
  }
};

// The hyperbolic cosine; its gradient sinh(x) (a dy of 0 gives 0 where sinh overflows).
struct Cosh {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::cosh(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(dy * M::sinh(x), dy);
  }
};

// The inverse hyperbolic sine; its gradient 1 / sqrt(x^2 + 1), 0 where x^2 overflows.
struct Asinh {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::asinh(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return dy / M::sqrt(x * x + 1.0f);
  }
};

// The inverse hyperbolic tangent (NaN outside [-1, 1], infinite at -1 and 1); its
// gradient 1 / (1 - x^2).
struct Atanh {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::atanh(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(dy / (1.0f - x * x), dy);
  }
};

// The arcsine (NaN outside [-1, 1]); its gradient 1 / sqrt(1 - x^2).
struct Asin {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::asin(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(dy / M::sqrt(1.0f - x * x), dy);
  }
};

// The arccosine (NaN outside [-1, 1]); its gradient -1 / sqrt(1 - x^2).
struct Acos {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::acos(x);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr) {
    return M::unless_zero(-1.0f * dy / M::sqrt(1.0f - x * x), dy);
  }
};

// The gradient of the ops below: exactly 0, also where dy is infinite (0 * inf would be NaN).
struct ZeroGradient {
  static constexpr bool kUsesX = false, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T&, Attr) {
    return M::zero(dy);
  }
};

// Floor and Round (halves to even, as torch.round): integers, whose gradient is 0, as PyTorch's.
struct Floor : ZeroGradient {
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::floor(x);
  }
};

struct Round : ZeroGradient {
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return M::rint(x);
  }
};

// x itself, through which no gradient passes (torch's detach): what reads it is differentiated
// as if it were a constant.
struct StopGradient : ZeroGradient {
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr) {
    return x;
  }
};

// 1 if x > 0 (x >= 0 with alpha 1), else 0; NaN gives 0 either way, as PyTorch's comparisons.
// The gradient is 0 (a comparison has none in PyTorch).
struct Step : ZeroGradient {
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr a) {
    return M::step(x) + a.alpha * (M::step0(x) - M::step(x));
  }
};

// alpha * x + beta, written alpha * x - (0 - beta) so that a beta of 0 keeps the product's
// zero sign (-x of +0 is -0, as in PyTorch, where alpha * x + 0 would give +0); the same value
// for any other beta.
struct ScalarAffine {
  static constexpr bool kUsesX = false, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr a) {
    return a.alpha * x - (0.0f - a.beta);
  }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T&, const T&, Attr a) { return a.alpha * dy; }
};

// alpha / x.
struct ScalarDivide {
  static constexpr bool kUsesX = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& x, Attr a) { return a.alpha / x; }
  template <class M, class T>
  EDBATCH_HD static auto gradient(const T& dy, const T& x, const T&, Attr a) {
    return M::unless_zero(dy * (-(a.alpha / x) / x), dy);  // not / (x * x): underflows
  }
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
  EDBATCH_HD static auto grad_a(const T& dy, const T&, const T& b, const T&) {
    return M::unless_zero(dy * b, dy);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T& a, const T&, const T&) {
    return M::unless_zero(dy * a, dy);
  }
};

struct Divide {
  static constexpr bool kUsesA = true, kUsesB = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) { return a / b; }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T&, const T& b, const T&) {
    return M::unless_zero(dy / b, dy);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T& a, const T& b, const T&) {
    return M::unless_zero(dy * (-(a / b) / b), dy);  // as PyTorch: b * b underflows below 1e-19
  }
};

// atan2(a, b): the angle of the point (b, a), in (-pi, pi]. Its gradients are PyTorch's,
// b / (a^2 + b^2) and -a / (a^2 + b^2): NaN at (0, 0), as there.
struct Atan2 {
  static constexpr bool kUsesA = true, kUsesB = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) {
    return M::atan2(a, b);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T& a, const T& b, const T&) {
    return M::unless_zero(dy * b / (a * a + b * b), dy);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T& a, const T& b, const T&) {
    return M::unless_zero(dy * -a / (a * a + b * b), dy);
  }
};

// hypot(a, b): sqrt(a^2 + b^2), its squares neither overflowing nor underflowing (hypot(inf, NaN)
// is inf). Its gradients are PyTorch's, a / hypot(a, b) and b / hypot(a, b): NaN at (0, 0), as
// there. Both read y = hypot(a, b), which the kernels compute once for the two.
struct Hypot {
  static constexpr bool kUsesA = true, kUsesB = true, kUsesY = true;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) {
    return M::hypot(a, b);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T& a, const T&, const T& y) {
    return M::unless_zero(dy * a / y, dy);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T&, const T& b, const T& y) {
    return M::unless_zero(dy * b / y, dy);
  }
};

// a where b > 0, else 0: torch.where's selection (a value not selected, even inf or NaN, gives
// exactly 0); a's gradient is dy where b > 0, b's is 0.
struct Keep {
  static constexpr bool kUsesA = false, kUsesB = true, kUsesY = false;
  template <class M, class T>
  EDBATCH_HD static auto value(const T& a, const T& b) {
    return M::keep(a, b);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_a(const T& dy, const T&, const T& b, const T&) {
    return M::keep(dy, b);
  }
  template <class M, class T>
  EDBATCH_HD static auto grad_b(const T& dy, const T&, const T&, const T&) {
    return M::zero(dy);
  }
};

// The ops above by name: X(Op enumerator, math struct). Kernels and the reference expand these.
#define EDBATCH_UNARY_OPS(X)    \
  X(Tanh, Tanh)                 \
  X(Sigmoid, Sigmoid)           \
  X(Relu, Relu)                 \
  X(Softplus, Softplus)         \
  X(Exp, Exp)                   \
  X(Log, Log)                   \
  X(Sqrt, Sqrt)                 \
  X(Gelu, Gelu)                 \
  X(LeakyRelu, LeakyRelu)       \
  X(Elu, Elu)                   \
  X(Abs, Abs)                   \
  X(Step, Step)                 \
  X(Sin, Sin)                   \
  X(Cos, Cos)                   \
  X(Erf, Erf)                   \
  X(Atan, Atan)                 \
  X(Sinh, Sinh)                 \
  X(Cosh, Cosh)                 \
  X(Asinh, Asinh)               \
  X(Atanh, Atanh)               \
  X(Asin, Asin)                 \
  X(Acos, Acos)                 \
  X(Erfc, Erfc)                 \
  X(Lgamma, Lgamma)             \
  X(Digamma, Digamma)           \
  X(Erfinv, Erfinv)             \
  X(Floor, Floor)               \
  X(Round, Round)               \
  X(StopGradient, StopGradient) \
  X(ScalarAffine, ScalarAffine) \
  X(ScalarDivide, ScalarDivide)
#define EDBATCH_BINARY_OPS(X) \
  X(Subtract, Subtract)       \
  X(CMult, CMult)             \
  X(Divide, Divide)           \
  X(Atan2, Atan2)             \
  X(Hypot, Hypot)             \
  X(Fmod, Fmod)               \
  X(Remainder, Remainder)     \
  X(Copysign, Copysign)       \
  X(Keep, Keep)

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

// ---- dropout masks (docs/programs.md): uint32 arithmetic, the same on host, device and in
// python/edbatch/trace.py. Entry i of a dropout value with key k is kept, and scaled by
// 1 / (1 - p), when dropout_hash(k, i) >= p * 2^32. ----

// murmur3's fmix32.
EDBATCH_HD constexpr uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// The key of one dropout site of one invocation: `index` numbers the invocation, `site` the
// dropout instruction within the program.
EDBATCH_HD constexpr uint32_t dropout_key(uint64_t seed, uint32_t index, uint32_t site) {
  return mix32(mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(seed >> 32))) ^
               mix32(index) ^ (site * 0x9e3779b9u));
}

EDBATCH_HD constexpr uint32_t dropout_hash(uint32_t key, uint32_t i) {
  return mix32(key ^ (i * 0x27d4eb2fu) ^ 0x165667b1u);
}

// The least uint32 h with h >= p * 2^32 (p in [0, 1), a float, so p * 2^32 is exact in double):
// entry i is kept iff dropout_hash(key, i) >= dropout_threshold(p).
EDBATCH_HD inline uint32_t dropout_threshold(float p) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(ceil(static_cast<double>(p) * 4294967296.0));
#else
  return static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 4294967296.0));
#endif
}

// The scale of kept entries, in float on every backend.
EDBATCH_HD inline float dropout_scale(float p) { return 1.0f / (1.0f - p); }

// The factor entry i is multiplied by: 1 / (1 - p) when kept, else 0.
EDBATCH_HD inline float dropout_factor(uint32_t key, uint32_t i, uint32_t threshold, float scale) {
  return dropout_hash(key, i) >= threshold ? scale : 0.0f;
}

// Maximum (elementwise, variadic) is NaN where any argument is, as torch.maximum and amax are:
// whether x takes the place of the running maximum m (larger, or NaN where m is not). The
// gradient goes to the first argument that took it.
EDBATCH_HD inline bool takes_max(float x, float m) {
  return x > m || (x != x && m == m);
}

// The first row of x[0, n) holding its largest value, a NaN counting as the largest (the first
// NaN, as torch.max and torch.argmax give), the largest found eight lanes at a time (this form
// of max vectorizes; x * 0 is NaN only for NaN and inf, so a column without them is read twice
// only): max_index on the CPU and argmax(Tensor). The CUDA kernel reduces a warp's lanes to the
// same row.
inline uint32_t first_max_row(const float* x, size_t n) {
  constexpr size_t kLanes = 8;
  float lane[kLanes], probe[kLanes] = {};
  for (float& l : lane) l = -INFINITY;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
      probe[j] += x[i + j] * 0.0f;
    }
  for (; i < n; ++i) {
    lane[0] = x[i] > lane[0] ? x[i] : lane[0];
    probe[0] += x[i] * 0.0f;
  }
  float m = lane[0], p = probe[0];
  for (size_t j = 1; j < kLanes; ++j) {
    m = lane[j] > m ? lane[j] : m;
    p += probe[j];
  }
  if (p != p)
    for (size_t k = 0; k < n; ++k)
      if (x[k] != x[k]) return static_cast<uint32_t>(k);
  for (size_t k = 0; k < n; ++k)
    if (x[k] == m) return static_cast<uint32_t>(k);
  return 0;  // every value -inf
}

}  // namespace edbatch::math
