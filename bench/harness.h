// Shared benchmark plumbing: repeated timing with medians and spread, JSON lines, a table.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace edbatch::bench {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median and the 10th/90th percentiles of a sample, each interpolated linearly between the two
// closest ranks (as `edbatch run --json` and the Python benchmarks: an even count's median is
// the mean of the middle two).
struct Summary {
  double median = 0, p10 = 0, p90 = 0;
};
inline double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}
inline Summary summarize(std::vector<double> xs) {
  Summary s;
  std::sort(xs.begin(), xs.end());
  s.median = quantile(xs, 0.5);
  s.p10 = quantile(xs, 0.1);
  s.p90 = quantile(xs, 0.9);
  return s;
}

// Parses a benchmark's flags: --help prints and gives 0, a usage error is printed and gives 2;
// -1 when the benchmark goes on.
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return -1;
}

// Runs a benchmark's body after its flags are parsed: an error on the way (a missing data file,
// an unknown policy or model) is printed after the program's name, exit status 1.
template <class Body>
int guarded(const char* program, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace edbatch::bench
