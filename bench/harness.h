// Shared benchmark plumbing: repeated timing with medians and spread, JSON lines, a table.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace edbatch::bench {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median and the 10th/90th percentiles of a sample.
struct Summary {
  double median = 0, p10 = 0, p90 = 0;
};
inline Summary summarize(std::vector<double> xs) {
  Summary s;
  if (xs.empty()) return s;
  std::sort(xs.begin(), xs.end());
  auto at = [&](double q) { return xs[static_cast<size_t>(q * (xs.size() - 1) + 0.5)]; };
  s.median = at(0.5);
  s.p10 = at(0.1);
  s.p90 = at(0.9);
  return s;
}

}  // namespace edbatch::bench
