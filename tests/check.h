// Numeric comparison helpers for tests: report the worst element, not just pass/fail.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "edbatch/params.h"

namespace edbatch::testing {

// max |a - b| <= rel * max(1, max |b|): relative to the tensor's scale, so tiny entries of a large
// gradient do not fail on rounding.
template <class A, class B>
void check_close(const A& a, const B& b, size_t n, double rel, const std::string& what) {
  double worst = 0, scale = 1;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(double(b[i])));
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  INFO(what << ": worst element " << at << " differs by " << worst << " (scale " << scale << ")");
  CHECK(worst <= rel * scale);
}

inline bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Every gradient (views aside) bitwise equal in two collections of the same model, then both
// zeroed for the next comparison.
inline void check_same_gradients(ParameterCollection& a, ParameterCollection& b,
                                 const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (uint32_t p = 0; p < a.size(); ++p) {
    if (a.is_view(p)) continue;
    INFO(what << ": gradient of " << a.name(p));
    CHECK(bitwise_equal(a.grads(p), b.grads(p), a.dim(p).size()));
  }
  a.zero_grads();
  b.zero_grads();
}

// maximum's and max_index's NaN rule on `device` (tests/test_ops.cpp).
void check_maximum_nan(const std::string& device, int threads);
// relu, leaky_relu, elu and softplus at NaN and the infinities (same file).
void check_rectifiers_nan(const std::string& device, int threads);
// log_softmax's and pick_neg_log_softmax's precision far from 0 and under a mask (same file).
void check_log_softmax_far(const std::string& device, int threads);
// Sums and means of 10^5 arguments keep float32's precision; infinities and NaN carry (same file).
void check_wide_sums(const std::string& device, int threads);
// Nodes no seed depends on leave the gradients alone (same file).
void check_unused_nodes(const std::string& device, int threads);

}  // namespace edbatch::testing
