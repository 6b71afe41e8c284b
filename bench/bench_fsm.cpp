// The learned FSM policy on every zoo model: batches per validation mini-batch under fsm, depth,
// agenda and lb-greedy against the lower bound, training time, and the cost of one decision.
//
//   bench_fsm [--models a,b] [--batch 32] [--train-batches 64] [--val-batches 16]
//             [--episodes 400] [--encoding set+top] [--reps 3] [--seed 1]
//
// Training runs --reps times with the same seed (deterministic: the same table each time), so
// the spread is the machine's. Decision cost: the scheduler runs the validation mini-batches
// records every frontier the FSM policy sees on the validation mini-batches, then times
// choose() over the recorded frontiers (hits and fallbacks as they occur), in cache as in the
// scheduler (median and p10-p90 of 101 samples) and cold (median), in thread CPU time.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/harness.h"
#include "edbatch/fsm.h"
#include "edbatch/models.h"

using namespace edbatch;
using edbatch::bench::now_ms;
using edbatch::bench::summarize;

namespace {

// Runs the FSM policy and keeps a copy of every frontier it was asked about.
class Recorder : public Policy {
 public:
  explicit Recorder(FsmPolicy& inner) : inner_(inner) {}
  const char* name() const override { return "recorder"; }
  void begin(const Graph& g) override { inner_.begin(g); }
  uint32_t choose(const Frontier& f) override {
    frontiers.push_back(f);
    return inner_.choose(f);
  }
  std::vector<Frontier> frontiers;

 private:
  FsmPolicy& inner_;
};

struct DecisionCost {
  double ns = 0, p10 = 0, p90 = 0, cold_ns = 0, hit_rate = 0;
};

// choose() on real frontiers recorded from the validation mini-batches, timed in a loop.
DecisionCost decision_cost(const std::vector<const Graph*>& graphs, FsmPolicy& policy) {
  Recorder rec(policy);
  Scheduler scheduler;
  Schedule s;
  uint64_t hits = 0, misses = 0;
  for (const Graph* g : graphs) {
    scheduler.run(*g, rec, s);
    hits += policy.lookups().hits;
    misses += policy.lookups().misses;
  }
  policy.begin(*graphs.front());  // the type maps are the same for every graph of the model
  std::vector<double> samples;
  uint64_t sink = 0;
  // Thread CPU time: on a shared machine, wall time counts the other processes' slices too.
  auto cpu_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  };
  // A copied frontier is cold in cache, unlike the scheduler's (just updated), so each sample
  // times one call per frontier and then nine: the difference over 8 calls is the cost of a
  // decision on a frontier in cache, one call alone the cold cost. Many short samples: on a
  // loaded machine preemptions spoil a few of them, not the median.
  std::vector<double> cold;
  const double n = static_cast<double>(rec.frontiers.size());
  for (int r = 0; r < 101; ++r) {
    double t0 = cpu_ms();
    for (const Frontier& f : rec.frontiers) sink += policy.choose(f);
    const double one = cpu_ms() - t0;
    t0 = cpu_ms();
    for (const Frontier& f : rec.frontiers)
      for (int k = 0; k < 9; ++k) sink += policy.choose(f);
    const double nine = cpu_ms() - t0;
    samples.push_back((nine - one) * 1e6 / (8 * n));
    cold.push_back(one * 1e6 / n);
  }
  if (sink == 42) std::printf(" ");
  const auto sum = summarize(samples);
  return {sum.median, sum.p10, sum.p90, summarize(cold).median, double(hits) / double(hits + misses)};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models = model_names();
  uint32_t batch = 32, train_batches = 64, val_batches = 16, reps = 3;
  uint64_t seed = 1;
  FsmTrainOptions o;
  CLI::App app{
      "the learned FSM policy on every zoo model: batches per validation mini-batch against the "
      "heuristics and the lower bound, training time and the cost of one decision"};
  std::string encoding = fsm_encoding_name(o.encoding);
  app.add_option("--models", models, "comma-separated zoo models (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(model_names()));
  app.add_option("--batch", batch, "instances per mini-batch")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--train-batches", train_batches, "training mini-batches")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--val-batches", val_batches, "validation mini-batches")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--episodes", o.episodes, "Q-learning episodes")->capture_default_str();
  app.add_option("--encoding", encoding, "state encoding of the table")->capture_default_str();
  app.add_option("--reps", reps, "training runs (same seed: the spread is the machine's)")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--beam", o.beam_width, "beam width of the teacher")->capture_default_str();
  app.add_option("--refine-passes", o.refine_passes, "table search passes")->capture_default_str();
  app.add_option("--refine-states", o.refine_states, "states tried per table search pass")
      ->capture_default_str();
  app.add_option("--seed", seed, "seed of the data and the training")->capture_default_str();
  if (const int code = bench::parse(app, argc, argv); code >= 0) return code;
  return bench::guarded("bench_fsm", [&] {
    o.encoding = parse_fsm_encoding(encoding);
    o.seed = seed;
    std::fprintf(stderr, "%-24s %8s %8s %8s %9s %8s %8s %12s %10s %8s %11s %6s\n", "model", "fsm",
                 "depth", "agenda", "lb-greedy", "bound", "teacher", "train s", "p10-p90", "ns/dec",
                 "p10-p90", "hits");
    for (const std::string& m : models) {
      const uint32_t n = (train_batches + val_batches) * batch;
      const Dataset data =
          load_dataset(model_data_kind(m), "synthetic:" + std::to_string(n), 256, seed);
      ParameterCollection pc(seed);
      ModelOptions mo;
      mo.seed = seed;
      auto model = make_model(m, pc, data, mo);
      const FsmWorkload w = make_fsm_workload(*model, batch, train_batches, val_batches, seed);
      const auto train = w.train_graphs(), val = w.validation_graphs();
      std::vector<double> seconds;
      FsmTrainResult result;
      for (uint32_t r = 0; r < reps; ++r) {
        const double t0 = now_ms();
        result = train_fsm_policy(train, val, o);
        seconds.push_back((now_ms() - t0) / 1e3);
      }
      result.policy.info.model = m;
      FsmPolicy fsm(result.policy, m);
      const double fsm_b = mean_batches(val, fsm);
      double heur[3];
      const char* names[3] = {"depth", "agenda", "lb-greedy"};
      for (int h = 0; h < 3; ++h) heur[h] = mean_batches(val, *make_policy(names[h]));
      const double bound = mean_lower_bound(val);
      const DecisionCost cost = decision_cost(val, fsm);
      const auto t = summarize(seconds);
      std::fprintf(
          stderr,
          "%-24s %8.1f %8.1f %8.1f %9.1f %8.1f %8.1f %12.2f %5.2f-%-5.2f %8.1f %5.1f-%-5.1f "
          "%6.3f\n",
          m.c_str(), fsm_b, heur[0], heur[1], heur[2], bound, result.teacher_batches, t.median,
          t.p10, t.p90, cost.ns, cost.p10, cost.p90, cost.hit_rate);
      nlohmann::json j = {
          {"bench", "fsm"},
          {"model", m},
          {"batch", batch},
          {"encoding", fsm_encoding_name(o.encoding)},
          {"train_minibatches", train.size()},
          {"validation_minibatches", val.size()},
          {"fsm", fsm_b},
          {"depth", heur[0]},
          {"agenda", heur[1]},
          {"lb_greedy", heur[2]},
          {"lower_bound", bound},
          {"teacher", result.teacher_batches},
          {"best_source", result.best_source},
          {"table_entries", result.policy.table.size()},
          {"types", result.policy.info.types.size()},
          {"train_s", {{"median", t.median}, {"p10", t.p10}, {"p90", t.p90}}},
          {"ns_per_decision", {{"median", cost.ns}, {"p10", cost.p10}, {"p90", cost.p90}}},
          {"ns_per_decision_cold_frontier", cost.cold_ns},
          {"table_hit_rate", cost.hit_rate}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
    return 0;
  });
}
