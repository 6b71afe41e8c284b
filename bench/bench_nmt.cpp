// lstm_nmt: greedy decoding (sentences/s, and the host work of one decoding step, with and
// without the first increment's encoders spread over the steps) and teacher-forced training
// (instances/s), per hidden size and mini-batch size, on synthetic pairs or an IWSLT file pair.
// Medians and p10-p90 over mini-batches; one JSON line per result.
//
//   bench_nmt [--device cpu|cuda] [--hidden 128,256] [--batch 32,128] [--reps N] [--vocab V]
//             [--data synthetic:N | SRC,TGT] [--policy P] [--max-len N] [--modes decode,train]
//             [--plan-cache MB]
//
// EDBATCH_CUDA_PROFILE=1 with --modes decode: where the host time of decoding steps goes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "edbatch/options.h"

using namespace edbatch;
using edbatch::bench::now_ms;
using edbatch::bench::summarize;

namespace {

struct Options {
  std::string device = "cpu", data = "synthetic:1024", policy = "lb-greedy";
  std::vector<uint32_t> hidden = {128, 256}, batch = {32, 128};
  uint32_t reps = 10, vocab = 256, max_len = 100;
  double plan_cache_mb = 64;  // EngineOptions::plan_cache_bytes; 0: every step planned
  bool decode = true, train = true;
};

// Per decoding step, in microseconds: the host's work (all of it, and the part planning the
// step's nodes and, on a device, the part encoding and queueing its kernels), and the kernels'
// time (on a device, the GPU's, which the host waits for); and the share of steps planned as a
// repeat of the step before (Stats::increments_repeated).
struct StepTimes {
  std::vector<double> host, plan, submit, kernels, repeated;
  std::vector<double> increment;  // host work per increment after the first (a decoding step)
  uint64_t arena_growths = 0;     // arena growths during the timed mini-batches (0: steady)
};

void report(const char* mode, const Options& o, uint32_t hidden, uint32_t batch,
            const std::vector<double>& per_s, const StepTimes& step, double steps) {
  const auto r = summarize(per_s);
  std::fprintf(stderr, "%-7s hidden %4u  B %4u  %10.1f /s  (p10 %.1f, p90 %.1f)", mode, hidden,
               batch, r.median, r.p10, r.p90);
  const bool decode = !step.host.empty();
  if (decode) {
    const auto h = summarize(step.host);
    std::fprintf(stderr,
                 "  host per step %.1f us (p10 %.1f, p90 %.1f; per decoding step after the first "
                 "%.1f; planning %.1f",
                 h.median, h.p10, h.p90, summarize(step.increment).median,
                 summarize(step.plan).median);
    if (o.device == "cuda") std::fprintf(stderr, ", queueing %.1f", summarize(step.submit).median);
    std::fprintf(stderr, "), %s %.1f us, %.1f steps (%.0f%% repeats), arena growths %llu",
                 o.device == "cuda" ? "device" : "kernels", summarize(step.kernels).median, steps,
                 100 * summarize(step.repeated).median,
                 static_cast<unsigned long long>(step.arena_growths));
  }
  std::fprintf(stderr, "\n");
  std::printf(
      "{\"bench\":\"nmt\",\"impl\":\"edbatch\",\"mode\":\"%s\",\"device\":\"%s\","
      "\"policy\":\"%s\",\"plan_cache_mb\":%g,\"hidden\":%u,\"batch\":%u,"
      "\"per_s_median\":%.3f,\"per_s_p10\":%.3f,\"per_s_p90\":%.3f",
      mode, o.device.c_str(), o.policy.c_str(), o.plan_cache_mb, hidden, batch, r.median, r.p10,
      r.p90);
  if (decode) {
    const auto h = summarize(step.host);
    std::printf(
        ",\"host_us_per_step_median\":%.3f,\"host_us_p10\":%.3f,\"host_us_p90\":%.3f,"
        "\"plan_us_per_step_median\":%.3f,\"queue_us_per_step_median\":%.3f,"
        "\"kernel_us_per_step_median\":%.3f,\"steps\":%.1f,\"repeated_steps_median\":%.3f,"
        "\"host_us_per_increment_median\":%.3f,\"host_us_per_increment_p10\":%.3f,"
        "\"host_us_per_increment_p90\":%.3f,\"arena_growths\":%llu",
        h.median, h.p10, h.p90, summarize(step.plan).median, summarize(step.submit).median,
        summarize(step.kernels).median, steps, summarize(step.repeated).median,
        summarize(step.increment).median, summarize(step.increment).p10,
        summarize(step.increment).p90, static_cast<unsigned long long>(step.arena_growths));
  }
  std::printf("}\n");
  std::fflush(stdout);
}

// Mini-batch r: instances r * batch onwards, cycling through the data.
void batch_ids(uint32_t r, uint32_t batch, uint32_t n, std::vector<uint32_t>& ids) {
  ids.clear();
  for (uint32_t k = 0; k < batch; ++k) ids.push_back((r * batch + k) % n);
}

// Decoding: every step's host work is the step's time less its kernels (the CPU runs them
// inline; on a device the host waits for them when it reads the step's values). The engine's
// planning, host execution and device times sum over the increments of the decoding graph.
// The first increment holds every encoder and every first step: decoding each mini-batch once
// more with one token per sentence measures it alone, so that the host work of the increments
// after it (one decoding step each) is told apart from it.
void decode(const Options& o, Model& model, Engine& engine, Graph& g, uint32_t hidden,
            uint32_t batch) {
  std::vector<uint32_t> ids;
  std::vector<double> per_s;
  StepTimes step;
  double steps_sum = 0;
  const bool cuda = o.device == "cuda";
  uint64_t growths_before = 0;
  struct Run {
    double ms, host_ms, steps;
  };
  const auto run = [&](uint32_t max_len) {
    const double t0 = now_ms();
    model.decode(engine, g, ids, DecodeOptions{max_len});
    const double ms = now_ms() - t0;
    const Stats& s = engine.stats();
    const double kernels_ms = cuda ? s.device_forward_ms : s.execution_ms;
    return Run{ms, ms - kernels_ms, static_cast<double>(engine.plan().segments.size())};
  };
  for (uint32_t r = 0; r < o.reps + 2; ++r) {
    batch_ids(r, batch, model.size(), ids);
    const Run first = run(1);
    const uint64_t repeated_before = engine.stats().increments_repeated;
    const Run all = run(o.max_len);
    const Stats& s = engine.stats();
    const double steps = all.steps;
    if (r < 2) {  // warm-up
      growths_before = s.arena_growths;
      continue;
    }
    step.arena_growths = s.arena_growths - growths_before;
    per_s.push_back(batch / (all.ms / 1e3));
    step.host.push_back(all.host_ms * 1e3 / steps);
    if (steps > first.steps)
      step.increment.push_back((all.host_ms - first.host_ms) * 1e3 / (steps - first.steps));
    step.plan.push_back(s.scheduling_ms * 1e3 / steps);
    step.submit.push_back(cuda ? s.execution_ms * 1e3 / steps : 0);
    step.kernels.push_back((all.ms - all.host_ms) * 1e3 / steps);
    step.repeated.push_back(static_cast<double>(s.increments_repeated - repeated_before) / steps);
    steps_sum += steps;
  }
  report("decode", o, hidden, batch, per_s, step, steps_sum / o.reps);
}

void train(const Options& o, Model& model, Engine& engine, Graph& g, uint32_t hidden,
           uint32_t batch) {
  std::vector<uint32_t> ids;
  std::vector<double> per_s;
  std::vector<Expr> losses;
  for (uint32_t r = 0; r < o.reps + 2; ++r) {
    batch_ids(r, batch, model.size(), ids);
    const double t0 = now_ms();
    g.clear();
    losses.clear();
    for (uint32_t i : ids) losses.push_back(model.build(g, i));
    const Expr loss = sum_losses(losses);
    engine.forward(g, loss);
    engine.backward(g, loss);
    engine.sgd_update(0.1f / batch);
    engine.synchronize();
    const double ms = now_ms() - t0;
    if (r >= 2) per_s.push_back(batch / (ms / 1e3));
  }
  report("train", o, hidden, batch, per_s, StepTimes{}, 0);
}

void run(const Options& o, const Dataset& data, uint32_t hidden, uint32_t batch) {
  ParameterCollection pc(1);
  ModelOptions mo;
  mo.hidden = hidden;
  mo.vocab = o.vocab;
  auto model = make_model("lstm_nmt", pc, data, mo);
  EngineOptions eo{o.policy, o.device, 1};
  eo.plan_cache_bytes = static_cast<size_t>(o.plan_cache_mb * (1 << 20));
  Engine engine(pc, apply_debug_env(eo));  // EDBATCH_CUDA_*
  Graph g(pc);
  if (o.decode) decode(o, *model, engine, g, hidden, batch);
  if (o.train) train(o, *model, engine, g, hidden, batch);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "lstm_nmt benchmark: greedy decoding (sentences/s and the host work of one decoding step) "
      "and teacher-forced training (instances/s), one JSON line per result"};
  std::string modes = "decode,train";
  app.add_option("--device", o.device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "comma-separated hidden sizes")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "comma-separated mini-batch sizes")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--reps", o.reps, "timed mini-batches per configuration")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--vocab", o.vocab, "words per side (ids fold modulo this)")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--data", o.data, "synthetic:N or SOURCE,TARGET files")->capture_default_str();
  app.add_option("--policy", o.policy, "batching policy")->capture_default_str();
  app.add_option("--plan-cache", o.plan_cache_mb,
                 "MB of plan reuse; 0 plans every decoding step (no repeats)")
      ->check(CLI::Range(0.0, 1e6))  // as edbatch run's --plan-cache
      ->capture_default_str();
  app.add_option("--max-len", o.max_len, "decoding: the most tokens per sentence")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--modes", modes, "decode, train or both, comma-separated")->capture_default_str();
  if (const int code = bench::parse(app, argc, argv); code >= 0) return code;
  return bench::guarded("bench_nmt", [&] {
    const std::string m = "," + modes + ",";
    o.decode = m.find(",decode,") != std::string::npos;
    o.train = m.find(",train,") != std::string::npos;
    if (!o.decode && !o.train) {
      std::fprintf(stderr, "bench_nmt: --modes: decode, train or both\n");
      return 2;
    }
    const Dataset data = load_dataset(DataKind::Pairs, o.data, o.vocab, 1);
    for (uint32_t h : o.hidden)
      for (uint32_t b : o.batch) run(o, data, h, b);
    return 0;
  });
}
