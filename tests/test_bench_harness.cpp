// The benchmarks' statistics and flag handling (bench/harness.h): medians and percentiles
// interpolated between the closest ranks, usage errors as exit status 2, errors named.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "bench/harness.h"

namespace {

int parse_args(std::vector<std::string> args) {
  CLI::App app{"test"};
  uint32_t reps = 3;
  app.add_option("--reps", reps, "timed repetitions")->check(CLI::Range(1, 1 << 30));
  std::vector<char*> argv;
  std::string name = "bench_test";
  argv.push_back(name.data());
  for (std::string& a : args) argv.push_back(a.data());
  return edbatch::bench::parse(app, static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("bench harness: medians and percentiles interpolate between ranks") {
  using edbatch::bench::summarize;
  const auto one = summarize({7});
  CHECK(one.median == 7);
  CHECK(one.p10 == 7);
  CHECK(one.p90 == 7);
  // Two values: the median is their mean, not the larger one.
  const auto two = summarize({4, 2});
  CHECK(two.median == doctest::Approx(3));
  CHECK(two.p10 == doctest::Approx(2.2));
  CHECK(two.p90 == doctest::Approx(3.8));
  const auto four = summarize({10, 40, 20, 30});
  CHECK(four.median == doctest::Approx(25));
  CHECK(four.p10 == doctest::Approx(13));  // position 0.3 between 10 and 20
  CHECK(four.p90 == doctest::Approx(37));  // position 2.7 between 30 and 40
  std::vector<double> eleven;
  for (int i = 10; i >= 0; --i) eleven.push_back(i);
  const auto e = summarize(eleven);
  CHECK(e.median == 5);
  CHECK(e.p10 == doctest::Approx(1));
  CHECK(e.p90 == doctest::Approx(9));
  CHECK(summarize({}).median == 0);
}

TEST_CASE("bench harness: usage errors give 2, help 0, an error in the body 1") {
  CHECK(parse_args({"--reps", "2"}) == -1);
  CHECK(parse_args({"--reps", "0"}) == 2);
  CHECK(parse_args({"--reps", "x"}) == 2);
  CHECK(parse_args({"--nope"}) == 2);
  CHECK(parse_args({"--help"}) == 0);
  CHECK(edbatch::bench::guarded("bench_test", [] { return 0; }) == 0);
  CHECK(edbatch::bench::guarded("bench_test",
                                []() -> int { throw std::runtime_error("cannot open 'x'"); }) == 1);
}
