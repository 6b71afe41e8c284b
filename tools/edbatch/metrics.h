// Per-mini-batch measurements of `edbatch run`, their summaries (median and p10/p90 over
// mini-batches), the metrics JSON and the human table.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "edbatch/engine.h"

namespace edbatch::cli {

struct MiniBatchSample {
  uint32_t instances = 0;
  double total_ms = 0;  // construction through update, as the caller sees it
  double construction_ms = 0, scheduling_ms = 0, execution_ms = 0, backward_ms = 0,
         update_ms = 0;
  // CUDA: the device time of the latest forward pass that had finished when the sample was
  // taken (CUDA events; Stats::device_forward_ms): this mini-batch's, or with --train or
  // --pipeline, whose passes are waited for later, possibly the one before.
  double device_forward_ms = 0;
  uint64_t nodes = 0, batches = 0, lower_bound = 0, kernels = 0, stages = 0, bytes_copied = 0;
  uint64_t split_call_backward = 0;  // CPU: block-call batches whose backward split by range
  uint64_t policy_hits = 0, policy_misses = 0;  // learned policies: table hits, fallbacks
  uint64_t policy_scored = 0;                    // ... of the fallbacks, the scorer's
  bool plan_reused = false;  // the schedule and plan came from the engine's plan cache
  uint64_t increments_repeated = 0;  // incremental forwards planned as the one before, again
  uint64_t increments_replanned = 0;  // ... of those, with their operands planned afresh
  double loss = 0;  // summed over the mini-batch (NaN with the null device)
};

// Fills what the engine counts for a mini-batch: its scheduling, execution and device times and
// batching figures from `st`, and the counters that accumulate over the engine's life as the
// difference from `before` (the stats when the mini-batch began).
void take_engine_stats(MiniBatchSample& s, const Stats& st, const Stats& before);

struct Spread {
  double median = 0, p10 = 0, p90 = 0, mean = 0;
};
Spread spread(std::vector<double> v);

// Everything about the run that is not a sample: echoed into the JSON and the table header.
struct RunInfo {
  std::string model, data, device, policy;
  uint32_t data_instances = 0, batch = 0, hidden = 0, vocab = 0, threads = 0, warmup = 0;
  uint64_t seed = 0;
  bool blocks = false, packed = false, train = false, pipeline = false;
  bool decode = false;  // greedy decoding (--decode), with max_len
  uint32_t max_len = 0;
  uint32_t planned = 0;     // mini-batches the run was to measure
  std::string interrupted;  // "SIGINT" or "SIGTERM" when the run stopped early; "" otherwise
  float lr = 0;
  uint64_t arena_bytes = 0, arena_growths_after_warmup = 0, peak_rss_bytes = 0;
  double wall_s = 0;
};

// The process's peak resident memory so far.
uint64_t peak_rss_bytes();
// The progress bar on stderr: `done` of `total` mini-batches at `instances` per `ms`.
void progress(uint32_t done, uint32_t total, double instances, double ms);

// A loss in a message: "nan" whatever its sign bit, "inf", "-inf" or the number.
std::string loss_text(double loss);
// A float setting (a learning rate) for the JSON: the shortest decimal that reads back as the
// float, 0.1 rather than its double value 0.10000000149011612.
double json_decimal(float value);

nlohmann::json metrics_json(const RunInfo& info, const std::vector<MiniBatchSample>& samples);
// The table printed at the end of a run.
std::string metrics_table(const RunInfo& info, const std::vector<MiniBatchSample>& samples);

}  // namespace edbatch::cli
