// Op-level binary Tree-LSTM per scheduling policy: trees/s and ms per mini-batch split into
// construction / scheduling / execution, batches vs the chain lower bound, per-node costs and
// arena growth after warm-up. One JSON line per policy on stdout, a table on stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/harness.h"
#include "edbatch/edbatch.h"
#include "edbatch/zoo.h"

using namespace edbatch;

int main(int argc, char** argv) {
  CLI::App app{"edbatch core benchmark: op-level Tree-LSTM, one mini-batch at a time"};
  uint32_t batch = 32, hidden = 128, reps = 30, warmup = 5, threads = 1, vocab = 256;
  std::string data = "synthetic", policies = "none,depth,agenda,lb-greedy", device = "cpu";
  bool backward = false;
  app.add_option("--batch", batch, "trees per mini-batch")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--hidden", hidden, "hidden size")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--reps", reps, "timed mini-batches per policy")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed mini-batches first")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--device", device, "cpu or null (no math)")
      ->check(CLI::IsMember({"cpu", "null"}))
      ->capture_default_str();
  app.add_option("--data", data, "'synthetic' or an SST-format tree file")->capture_default_str();
  app.add_option("--policies", policies, "comma-separated policies")->capture_default_str();
  app.add_flag("--backward", backward, "also time backward");
  if (const int code = bench::parse(app, argc, argv); code >= 0) return code;
  return bench::guarded("bench_core", [&] {
    const std::vector<Tree> trees = data == "synthetic"
                                        ? synthetic_trees(batch * (reps + warmup), 42, vocab)
                                        : load_trees(data, vocab);
    if (trees.size() < batch) {
      std::fprintf(stderr, "need at least %u trees, got %zu\n", batch, trees.size());
      return 1;
    }
    std::fprintf(stderr, "%-10s %9s %9s %8s %8s %8s %8s %8s %7s %7s %9s %9s %6s\n", "policy",
                 "trees/s", "ms/batch", "constr", "sched", "exec", "bwd", "spread", "batches", "LB",
                 "ns/n con", "ns/n sch", "grow");
    for (const std::string& policy : CLI::detail::split(policies, ',')) {
      ParameterCollection pc(1);
      TreeLstmOps model(pc, vocab, hidden);
      EngineOptions o;
      o.policy = policy;
      o.device = device;
      o.threads = static_cast<int>(threads);
      Engine engine(pc, o);
      Graph g(pc);
      std::vector<double> total, construct, schedule, execute, bwd, batches, bound, nodes;
      uint64_t growth_at_warmup = 0;
      size_t next = 0;
      std::vector<Expr> losses;
      for (uint32_t it = 0; it < warmup + reps; ++it) {
        const double t0 = bench::now_ms();
        g.clear();
        losses.clear();
        for (uint32_t i = 0; i < batch; ++i)
          losses.push_back(model.build(g, trees[next++ % trees.size()]));
        const Expr loss = sum_losses(losses);
        const double t1 = bench::now_ms();
        engine.forward(g, loss);
        if (backward) engine.backward(g, loss);
        const double t2 = bench::now_ms();
        if (it + 1 == warmup) growth_at_warmup = engine.stats().arena_growths;
        if (it < warmup) continue;
        const Stats& s = engine.stats();
        total.push_back(t2 - t0);
        construct.push_back(t1 - t0);
        schedule.push_back(s.scheduling_ms);
        execute.push_back(s.execution_ms);
        bwd.push_back(s.backward_ms);
        batches.push_back(static_cast<double>(s.batches));
        bound.push_back(static_cast<double>(s.lower_bound));
        nodes.push_back(static_cast<double>(g.size()));
      }
      const auto T = bench::summarize(total), C = bench::summarize(construct),
                 S = bench::summarize(schedule), E = bench::summarize(execute),
                 B = bench::summarize(bwd), NB = bench::summarize(batches),
                 LB = bench::summarize(bound), N = bench::summarize(nodes);
      const uint64_t growth = engine.stats().arena_growths - growth_at_warmup;
      const double trees_per_s = batch / (T.median / 1e3);
      std::fprintf(
          stderr,
          "%-10s %9.0f %9.3f %8.3f %8.3f %8.3f %8.3f %7.0f%% %7.0f %7.0f %9.1f %9.1f %6lu\n",
          policy.c_str(), trees_per_s, T.median, C.median, S.median, E.median, B.median,
          100.0 * (T.p90 - T.p10) / T.median, NB.median, LB.median, C.median * 1e6 / N.median,
          S.median * 1e6 / N.median, static_cast<unsigned long>(growth));
      nlohmann::json j = {{"bench", "core_tree_lstm_ops"},
                          {"policy", policy},
                          {"device", device},
                          {"threads", threads},
                          {"batch", batch},
                          {"hidden", hidden},
                          {"data", data},
                          {"backward", backward},
                          {"reps", reps},
                          {"trees_per_s", trees_per_s},
                          {"ms_per_batch", T.median},
                          {"ms_p10", T.p10},
                          {"ms_p90", T.p90},
                          {"construction_ms", C.median},
                          {"scheduling_ms", S.median},
                          {"execution_ms", E.median},
                          {"backward_ms", B.median},
                          {"batches", NB.median},
                          {"lower_bound", LB.median},
                          {"nodes", N.median},
                          {"construction_ns_per_node", C.median * 1e6 / N.median},
                          {"scheduling_ns_per_node", S.median * 1e6 / N.median},
                          {"arena_growths_after_warmup", growth}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
    return 0;
  });
}
