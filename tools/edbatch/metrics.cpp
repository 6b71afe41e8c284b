#include "tools/edbatch/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>

namespace edbatch::cli {

void progress(uint32_t done, uint32_t total, double instances, double ms) {
  const int width = 30;
  const int filled = total ? static_cast<int>(double(done) / total * width) : width;
  std::fprintf(stderr, "\r[%.*s%*s] %u/%u mini-batches  %.0f instances/s ", filled,
               "##############################", width - filled, "", done, total,
               ms > 0 ? instances / (ms / 1e3) : 0.0);
  if (done == total) std::fprintf(stderr, "\r%*s\r", width + 60, "");
  std::fflush(stderr);
}

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // kilobytes on Linux
}

void take_engine_stats(MiniBatchSample& s, const Stats& st, const Stats& before) {
  s.scheduling_ms = st.scheduling_ms;
  s.execution_ms = st.execution_ms;
  s.device_forward_ms = st.device_forward_ms;
  s.nodes = st.nodes;
  s.batches = st.batches;
  s.lower_bound = st.lower_bound;
  s.policy_hits = st.policy_hits;
  s.policy_misses = st.policy_misses;
  s.policy_scored = st.policy_scored;
  s.plan_reused = st.plan_reused;
  s.increments_repeated = st.increments_repeated - before.increments_repeated;
  s.increments_replanned = st.increments_replanned - before.increments_replanned;
  s.kernels = st.kernels - before.kernels;
  s.stages = st.stages - before.stages;
  s.bytes_copied = st.bytes_copied - before.bytes_copied;
  s.split_call_backward = st.split_call_backward - before.split_call_backward;
}

namespace {

// Linear interpolation between the closest ranks.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - lo) * (sorted[hi] - sorted[lo]);
}

Spread over(const std::vector<MiniBatchSample>& s,
            const std::function<double(const MiniBatchSample&)>& f) {
  std::vector<double> v;
  v.reserve(s.size());
  for (const MiniBatchSample& x : s) v.push_back(f(x));
  return spread(std::move(v));
}

nlohmann::json to_json(const Spread& s) {
  return {{"median", s.median}, {"p10", s.p10}, {"p90", s.p90}, {"mean", s.mean}};
}

std::string bytes_text(double b) {
  char buf[64];
  if (b >= 1 << 30) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else if (b >= 1 << 20) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  else if (b >= 1 << 10) std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

struct Totals {
  double instances = 0, ms = 0, loss = 0, batch_ratio = 0;
  uint64_t policy_hits = 0, policy_misses = 0, policy_scored = 0, plans_reused = 0;
  uint64_t increments_repeated = 0, increments_replanned = 0;
};
Totals totals(const std::vector<MiniBatchSample>& samples) {
  Totals t;
  for (const MiniBatchSample& s : samples) {
    t.instances += s.instances;
    t.ms += s.total_ms;
    t.loss += s.loss;
    t.batch_ratio += s.lower_bound ? double(s.batches) / double(s.lower_bound) : 1.0;
    t.policy_hits += s.policy_hits;
    t.policy_misses += s.policy_misses;
    t.policy_scored += s.policy_scored;
    t.plans_reused += s.plan_reused;
    t.increments_repeated += s.increments_repeated;
    t.increments_replanned += s.increments_replanned;
  }
  if (!samples.empty()) t.batch_ratio /= samples.size();
  return t;
}

}  // namespace

Spread spread(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = quantile(v, 0.5);
  s.p10 = quantile(v, 0.1);
  s.p90 = quantile(v, 0.9);
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  return s;
}

std::string loss_text(double loss) {
  return std::isnan(loss) ? "nan" : std::to_string(loss);
}

double json_decimal(float value) {
  if (!std::isfinite(value)) return value;
  char text[32];
  const std::to_chars_result r = std::to_chars(text, text + sizeof text - 1, value);
  *r.ptr = '\0';
  return std::strtod(text, nullptr);
}

nlohmann::json metrics_json(const RunInfo& info, const std::vector<MiniBatchSample>& samples) {
  const Totals t = totals(samples);
  nlohmann::json j;
  j["model"] = info.model;
  j["data"] = info.data;
  j["data_instances"] = info.data_instances;
  j["batch"] = info.batch;
  j["hidden"] = info.hidden;
  j["vocab"] = info.vocab;
  j["policy"] = info.policy;
  j["device"] = info.device;
  j["threads"] = info.threads;
  j["blocks"] = info.blocks;
  j["packed"] = info.packed;
  j["train"] = info.train;
  j["pipeline"] = info.pipeline;
  j["decode"] = info.decode;
  if (info.decode) j["max_len"] = info.max_len;
  j["lr"] = json_decimal(info.lr);
  j["seed"] = info.seed;
  j["warmup_minibatches"] = info.warmup;
  j["minibatches"] = samples.size();
  j["minibatches_planned"] = info.planned;
  j["interrupted"] = info.interrupted.empty() ? nlohmann::json() : nlohmann::json(info.interrupted);
  j["instances"] = t.instances;
  j["instances_per_s"] = t.ms > 0 ? t.instances / (t.ms / 1e3) : 0.0;
  j["ms_per_minibatch"] = to_json(over(samples, [](auto& s) { return s.total_ms; }));
  j["construction_ms"] = to_json(over(samples, [](auto& s) { return s.construction_ms; }));
  j["scheduling_ms"] = to_json(over(samples, [](auto& s) { return s.scheduling_ms; }));
  j["execution_ms"] = to_json(over(samples, [](auto& s) { return s.execution_ms; }));
  j["backward_ms"] = to_json(over(samples, [](auto& s) { return s.backward_ms; }));
  j["update_ms"] = to_json(over(samples, [](auto& s) { return s.update_ms; }));
  if (info.device == "cuda")
    j["device_forward_ms"] = to_json(over(samples, [](auto& s) { return s.device_forward_ms; }));
  j["nodes_per_minibatch"] = to_json(over(samples, [](auto& s) { return double(s.nodes); }));
  j["batches_per_minibatch"] = to_json(over(samples, [](auto& s) { return double(s.batches); }));
  j["lower_bound_per_minibatch"] =
      to_json(over(samples, [](auto& s) { return double(s.lower_bound); }));
  j["batches_over_lower_bound"] = t.batch_ratio;
  j["policy_hits"] = t.policy_hits;
  j["policy_misses"] = t.policy_misses;
  j["policy_scored"] = t.policy_scored;
  j["plans_reused"] = t.plans_reused;
  j["increments_repeated"] = t.increments_repeated;
  j["increments_replanned"] = t.increments_replanned;
  j["kernels_per_minibatch"] = to_json(over(samples, [](auto& s) { return double(s.kernels); }));
  j["stages_per_minibatch"] = to_json(over(samples, [](auto& s) { return double(s.stages); }));
  j["bytes_copied_per_minibatch"] =
      to_json(over(samples, [](auto& s) { return double(s.bytes_copied); }));
  j["split_backward_batches_per_minibatch"] =
      to_json(over(samples, [](auto& s) { return double(s.split_call_backward); }));
  j["arena_bytes"] = info.arena_bytes;
  j["arena_growths_after_warmup"] = info.arena_growths_after_warmup;
  j["peak_rss_bytes"] = info.peak_rss_bytes;
  if (std::isfinite(t.loss) && t.instances > 0)
    j["mean_loss_per_instance"] = t.loss / t.instances;
  else
    j["mean_loss_per_instance"] = nullptr;
  j["wall_s"] = info.wall_s;
  if (samples.empty()) {  // stopped before the first measured mini-batch: no numbers, not zeros
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it->is_object() && it->contains("median")) *it = nullptr;
    j["instances_per_s"] = j["batches_over_lower_bound"] = nullptr;
  }
  return j;
}

std::string metrics_table(const RunInfo& info, const std::vector<MiniBatchSample>& samples) {
  const Totals t = totals(samples);
  std::string out;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("%s on %s (%u instances): mini-batch %u, hidden %u, policy %s, %s x%u thread(s), %s, %s\n",
      info.model.c_str(), info.data.c_str(), info.data_instances, info.batch, info.hidden,
      info.policy.c_str(), info.device.c_str(), info.threads,
      info.blocks ? (info.packed ? "blocks, packed" : "blocks, per node") : "op-level",
      info.decode  ? "greedy decoding"
      : info.train ? (info.pipeline ? "training, pipelined" : "training")
                   : (info.pipeline ? "forward only, pipelined" : "forward only"));
  add("%zu mini-batches measured after %u warm-up, %.0f instances", samples.size(), info.warmup,
      t.instances);
  if (!info.interrupted.empty())
    add(" (stopped by %s; %u planned)", info.interrupted.c_str(), info.planned);
  if (samples.empty()) return out + "\nno mini-batch was measured, so there are no times\n";
  out += "\n\n";
  add("%-26s %10s %10s %10s\n", "ms per mini-batch", "median", "p10", "p90");
  auto row = [&](const char* name, const std::function<double(const MiniBatchSample&)>& f) {
    const Spread s = over(samples, f);
    add("%-26s %10.3f %10.3f %10.3f\n", name, s.median, s.p10, s.p90);
  };
  row("total", [](auto& s) { return s.total_ms; });
  row("  construction", [](auto& s) { return s.construction_ms; });
  row("  scheduling", [](auto& s) { return s.scheduling_ms; });
  row("  execution", [](auto& s) { return s.execution_ms; });
  if (info.train) {
    row("  backward", [](auto& s) { return s.backward_ms; });
    row("  update", [](auto& s) { return s.update_ms; });
  }
  if (info.device == "cuda")
    row("device time of a forward", [](auto& s) { return s.device_forward_ms; });
  out += "\n";
  const Spread nb = over(samples, [](auto& s) { return double(s.batches); });
  const Spread lb = over(samples, [](auto& s) { return double(s.lower_bound); });
  const Spread nodes = over(samples, [](auto& s) { return double(s.nodes); });
  const Spread copied = over(samples, [](auto& s) { return double(s.bytes_copied); });
  const Spread launches = over(samples, [](auto& s) { return double(s.kernels); });
  const Spread stages = over(samples, [](auto& s) { return double(s.stages); });
  add("%-26s %10.0f\n", "instances/s", t.ms > 0 ? t.instances / (t.ms / 1e3) : 0.0);
  add("%-26s %10.0f\n", "nodes per mini-batch", nodes.median);
  add("%-26s %10.0f   lower bound %.0f, mean ratio %.3f\n", "batches per mini-batch", nb.median,
      lb.median, t.batch_ratio);
  if (stages.median == launches.median)
    add("%-26s %10.0f\n", "kernels per mini-batch", launches.median);
  else  // chained launches run many dependent stages each
    add("%-26s %10.0f   in %.0f launches (chained)\n", "stages per mini-batch", stages.median,
        launches.median);
  if (t.policy_hits + t.policy_misses > 0)
    add("%-26s %10llu   fallback (unseen states) %llu (scorer %llu, lb-greedy %llu), hit rate "
        "%.3f\n",
        "policy table hits", static_cast<unsigned long long>(t.policy_hits),
        static_cast<unsigned long long>(t.policy_misses),
        static_cast<unsigned long long>(t.policy_scored),
        static_cast<unsigned long long>(t.policy_misses - t.policy_scored),
        double(t.policy_hits) / double(t.policy_hits + t.policy_misses));
  if (t.plans_reused > 0)
    add("%-26s %10llu   of %zu mini-batches (a structure planned before)\n", "plans reused",
        static_cast<unsigned long long>(t.plans_reused), samples.size());
  if (t.increments_repeated > 0)
    add("%-26s %10llu   incremental forwards planned as the one before them, shifted (%llu of "
        "them with their operands planned afresh)\n",
        "increments repeated", static_cast<unsigned long long>(t.increments_repeated),
        static_cast<unsigned long long>(t.increments_replanned));
  add("%-26s %10s\n", "bytes copied/mini-batch", bytes_text(copied.median).c_str());
  add("%-26s %10s\n", "arena", bytes_text(double(info.arena_bytes)).c_str());
  add("%-26s %10s\n", "peak memory (RSS)", bytes_text(double(info.peak_rss_bytes)).c_str());
  if (std::isfinite(t.loss) && t.instances > 0)
    add("%-26s %10.4f\n", "mean loss per instance", t.loss / t.instances);
  return out;
}

}  // namespace edbatch::cli
