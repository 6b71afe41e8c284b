// The options of `edbatch run` and the checks made on them before any work
// (tools/edbatch/run_options.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "tools/edbatch/commands.h"
#include "tools/edbatch/training.h"

namespace edbatch::cli {

struct RunOptions {
  std::string policy_cache;
  double policy_budget = 2;
  double plan_cache_mb = 64;
  std::string model, data = "synthetic:1000", policy = "lb-greedy", device = "cpu";
  std::string outputs, json, save_weights, load_weights, write_data;
  uint32_t vocab = 256, batch = 32, hidden = 128, threads = 1, epochs = 1, iters = 0, warmup = 2;
  uint32_t max_len = 100;  // --decode
  bool decode = false;
  uint64_t seed = 1;
  TrainingOptions t;  // optimizer, --eval, --save-best (tools/edbatch/training.h)
  bool no_blocks = false, packed = false, train = false, describe = false, chars = false,
       pipeline = false;
  bool check_numerics = false;
};

// Throws UsageError for flags that cannot go together.
void check_usage(const RunOptions& o);
// Before any work: the files the run reads and writes, checked (commands.h).
OutputFiles output_files(const RunOptions& o);

}  // namespace edbatch::cli
