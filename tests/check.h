// Numeric comparison helpers for tests: report the worst element, not just pass/fail.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

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

}  // namespace edbatch::testing
