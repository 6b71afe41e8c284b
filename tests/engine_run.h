// One engine run for equivalence tests: forward and backward on the CPU with every kernel that
// can split split, the schedule checked, the loss, gradients and watched values kept.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "edbatch/graph.h"

namespace edbatch::testing {

struct EngineRun {
  double loss = 0;
  std::vector<std::vector<float>> grads;   // per parameter id (empty for views of other ones)
  std::vector<std::vector<float>> values;  // of the watched expressions, in order
  uint64_t batches = 0, lower_bound = 0;
  uint64_t split_call_backward = 0;  // Stats::split_call_backward
};

// Checks the schedule is valid and not below its lower bound; zeroes the gradients afterwards.
EngineRun run_engine(Graph& g, const Expr& loss, const std::string& policy, int threads,
                     const std::vector<Expr>& watch = {});

}  // namespace edbatch::testing
