// Blocks and layout planning. Part 1, per cell (Tree-LSTM leaf and inner, LSTM, GRU, MV-RNN) at
// k invocations: freeze time, internal steps vs their bound, operands that are one view vs one
// view per member, bytes gathered and time, with and without the internal layout planner. Part 2,
// the zoo's tree_lstm mini-batch with blocks: time, batches, kernels and bytes gathered with and
// without the outer planner, and the op-level form for reference. Part 3 (--part gemm), the CPU's
// small-GEMM kernel (W column-major and packed) against Eigen's GEMM. One JSON line per result, a
// table on stderr.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "bench/harness.h"
#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "kernels/cpu/gemm.h"

using namespace edbatch;

namespace {

struct Cell {
  const char* name;
  std::vector<Dim> inputs;
  uint32_t ints;
  std::function<std::vector<Expr>(Block&, const std::vector<Expr>&)> body;
};

struct CellWeights {
  CellWeights(ParameterCollection& pc, uint32_t H) {
    E = pc.add_lookup_parameters("E", 256, H);
    for (int k = 0; k < 8; ++k) {
      W[k] = pc.add_parameters("W" + std::to_string(k), Dim{H, H});
      U[k] = pc.add_parameters("U" + std::to_string(k), Dim{H, 2 * H});
      b[k] = pc.add_parameters("b" + std::to_string(k), Dim{H, 1});
    }
    bM = pc.add_parameters("bM", Dim{H, H});
    out = pc.add_parameters("out", Dim{5, H});
  }
  LookupParameter E;
  Parameter W[8], U[8], b[8], bM, out;
};

std::vector<Cell> cells(const CellWeights& w, uint32_t H) {
  const Dim h{H, 1};
  auto P = [](Block& blk, Parameter p) { return parameter(blk.body(), p); };
  std::vector<Cell> cs;
  cs.push_back({"tree_lstm_leaf", {}, 2, [&w, P](Block& blk, const std::vector<Expr>&) {
                  const uint32_t word = blk.index("word"), label = blk.index("label");
                  const Expr e = blk.lookup(w.E, word);
                  const Expr i = sigmoid(affine({P(blk, w.b[0]), P(blk, w.W[0]), e}));
                  const Expr o = sigmoid(affine({P(blk, w.b[1]), P(blk, w.W[1]), e}));
                  const Expr u = tanh(affine({P(blk, w.b[2]), P(blk, w.W[2]), e}));
                  const Expr c = cmult(i, u), hh = cmult(o, tanh(c));
                  return std::vector<Expr>{hh, c, blk.pick_neg_log_softmax(matmul(P(blk, w.out), hh), label)};
                }});
  cs.push_back({"tree_lstm_inner", {h, h, h, h}, 1, [&w, P](Block& blk, const std::vector<Expr>& in) {
                  const uint32_t label = blk.index("label");
                  const Expr x = concat({in[0], in[2]});
                  const Expr i = sigmoid(affine({P(blk, w.b[0]), P(blk, w.U[0]), x}));
                  const Expr o = sigmoid(affine({P(blk, w.b[1]), P(blk, w.U[1]), x}));
                  const Expr u = tanh(affine({P(blk, w.b[2]), P(blk, w.U[2]), x}));
                  const Expr f1 = sigmoid(affine({P(blk, w.b[3]), P(blk, w.W[3]), in[0]}));
                  const Expr f2 = sigmoid(affine({P(blk, w.b[3]), P(blk, w.W[4]), in[2]}));
                  const Expr c = sum({cmult(i, u), cmult(f1, in[1]), cmult(f2, in[3])});
                  const Expr hh = cmult(o, tanh(c));
                  return std::vector<Expr>{hh, c, blk.pick_neg_log_softmax(matmul(P(blk, w.out), hh), label)};
                }});
  cs.push_back({"lstm", {h, h, h}, 0, [&w, P](Block& blk, const std::vector<Expr>& in) {
                  Expr g[4];
                  for (int k = 0; k < 4; ++k)
                    g[k] = affine({P(blk, w.b[k]), P(blk, w.W[k]), in[0], P(blk, w.W[k + 4]), in[1]});
                  const Expr c = cmult(sigmoid(g[1]), in[2]) + cmult(sigmoid(g[0]), tanh(g[3]));
                  return std::vector<Expr>{cmult(sigmoid(g[2]), tanh(c)), c};
                }});
  cs.push_back({"gru", {h, h}, 0, [&w, P](Block& blk, const std::vector<Expr>& in) {
                  const Expr r = sigmoid(affine({P(blk, w.b[0]), P(blk, w.W[0]), in[0], P(blk, w.W[1]), in[1]}));
                  const Expr z = sigmoid(affine({P(blk, w.b[1]), P(blk, w.W[2]), in[0], P(blk, w.W[3]), in[1]}));
                  const Expr c = tanh(affine({P(blk, w.b[2]), P(blk, w.W[4]), in[0], P(blk, w.W[5]), cmult(r, in[1])}));
                  return std::vector<Expr>{cmult(z, in[1]) + cmult(1.0f - z, c)};
                }});
  cs.push_back({"mvrnn", {h, Dim{H, H}, h, Dim{H, H}}, 0, [&w, P](Block& blk, const std::vector<Expr>& in) {
                  const Expr v = tanh(affine({P(blk, w.b[4]), P(blk, w.U[4]),
                                              concat({matmul(in[3], in[0]), matmul(in[1], in[2])})}));
                  return std::vector<Expr>{v, affine({P(blk, w.bM), P(blk, w.U[5]), concat({in[1], in[3]})})};
                }});
  return cs;
}

void bench_cells(uint32_t H, uint32_t k, uint32_t reps, int threads) {
  std::fprintf(stderr, "\n%-16s %6s %7s %5s %5s %6s %6s %10s %10s %9s\n", "cell", "layout", "freeze",
               "steps", "LB", "views", "permem", "gatherB", "us/call", "spread");
  for (bool layout : {true, false}) {
    ParameterCollection pc(1);
    CellWeights w(pc, H);
    for (const Cell& cell : cells(w, H)) {
      Block blk(pc, cell.name);
      std::vector<Expr> in;
      for (size_t j = 0; j < cell.inputs.size(); ++j)
        in.push_back(blk.input("in" + std::to_string(j), cell.inputs[j]));
      const std::vector<Expr> outs = cell.body(blk, in);
      for (size_t o = 0; o < outs.size(); ++o) blk.output("out" + std::to_string(o), outs[o]);
      blk.freeze(FreezeOptions{layout});
      const BlockPlan& p = blk.plan();
      // k independent invocations whose inputs come from one batch (tanh of graph inputs).
      Graph g(pc);
      Engine e(pc, EngineOptions{"agenda", "cpu", threads});
      std::mt19937 rng;
      std::vector<Expr> scalars;
      std::vector<double> times;
      uint64_t gathered = 0;
      for (uint32_t r = 0; r < reps + 3; ++r) {
        g.clear();
        rng.seed(3);
        scalars.clear();
        for (uint32_t i = 0; i < k; ++i) {
          std::vector<Expr> xs;
          for (const Dim& d : cell.inputs) {
            std::vector<float> v(d.size());
            for (float& x : v) x = static_cast<float>(rng() % 100) / 100.0f - 0.5f;
            xs.push_back(tanh(input(g, d, v)));
          }
          std::vector<uint32_t> ints(cell.ints, 0);
          for (uint32_t& x : ints) x = rng() % 5;
          for (const Expr& o : blk(g, xs, ints)) {
            const Dim d = g.node(o.id).dim;
            scalars.push_back(d.cols == 1 ? pick(o, 0) : pick(matmul(o, xs[0]), 0));
          }
        }
        const Expr l = sum_losses(scalars);
        const uint64_t before = e.stats().bytes_copied;
        e.forward(g, l);
        gathered = e.stats().bytes_copied - before;
        if (r >= 3) times.push_back(e.stats().execution_ms);
      }
      const auto T = bench::summarize(times);
      std::fprintf(stderr, "%-16s %6s %6.2fm %5zu %5u %6u %6u %10lu %10.2f %8.0f%%\n", cell.name,
                   layout ? "on" : "off", p.freeze_ms, p.steps.size(), p.lower_bound,
                   p.internal_views, p.internal_per_member, static_cast<unsigned long>(gathered),
                   T.median * 1e3 / k, 100.0 * (T.p90 - T.p10) / T.median);
      nlohmann::json j = {{"bench", "block_cell"}, {"cell", cell.name}, {"layout_planning", layout},
                          {"hidden", H}, {"k", k}, {"threads", threads},
                          {"freeze_ms", p.freeze_ms}, {"steps", p.steps.size()},
                          {"lower_bound", p.lower_bound}, {"groups", p.groups.size()},
                          {"internal_views", p.internal_views},
                          {"internal_per_member", p.internal_per_member},
                          {"bytes_gathered_per_forward", gathered},
                          {"us_per_invocation", T.median * 1e3 / k},
                          {"us_p10", T.p10 * 1e3 / k}, {"us_p90", T.p90 * 1e3 / k}};
      std::printf("%s\n", j.dump().c_str());
    }
  }
}

// The three forms run round-robin, one mini-batch each in turn, so machine noise hits them alike
// and their ratios are fair.
// The zoo's tree_lstm (docs/models.md), built with blocks or op by op.
void bench_tree_lstm(uint32_t H, uint32_t batch, uint32_t reps, int threads, const std::string& policy) {
  Dataset data;
  data.kind = DataKind::Trees;
  data.trees = synthetic_trees(batch * (reps + 5), 42, 256);
  const char* names[] = {"blocks, outer planning", "blocks, no planning", "op level"};
  struct Form {
    ParameterCollection pc{1};
    std::unique_ptr<Model> model;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Graph> g;
    std::vector<double> total, con, sch, exe, kernels, gathered, batches;
  };
  Form forms[3];
  for (int f = 0; f < 3; ++f) {
    Form& F = forms[f];
    ModelOptions mo;
    mo.hidden = H;
    mo.blocks = f != 2;
    F.model = make_model("tree_lstm", F.pc, data, mo);
    EngineOptions o{policy, "cpu", threads};
    o.order_for_consumers = f != 1;
    F.engine = std::make_unique<Engine>(F.pc, o);
    F.g = std::make_unique<Graph>(F.pc);
  }
  std::vector<Expr> losses;
  for (uint32_t it = 0; it < reps + 5; ++it) {
    for (int f = 0; f < 3; ++f) {
      Form& F = forms[f];
      Engine& e = *F.engine;
      const double t0 = bench::now_ms();
      F.g->clear();
      losses.clear();
      for (uint32_t i = 0; i < batch; ++i) {
        losses.push_back(F.model->build(*F.g, (it * batch + i) % data.size()));
      }
      const Expr loss = sum_losses(losses);
      const double t1 = bench::now_ms();
      const uint64_t k0 = e.stats().kernels, b0 = e.stats().bytes_copied;
      e.forward(*F.g, loss);
      const double t2 = bench::now_ms();
      if (it < 5) continue;
      F.total.push_back(t2 - t0);
      F.con.push_back(t1 - t0);
      F.sch.push_back(e.stats().scheduling_ms);
      F.exe.push_back(e.stats().execution_ms);
      F.kernels.push_back(static_cast<double>(e.stats().kernels - k0));
      F.gathered.push_back(static_cast<double>(e.stats().bytes_copied - b0));
      F.batches.push_back(static_cast<double>(e.stats().batches));
    }
  }
  std::fprintf(stderr, "\n%-22s %9s %8s %8s %8s %8s %8s %7s %9s %10s\n", "tree_lstm form", "trees/s",
               "ms", "constr", "sched", "exec", "spread", "batches", "kernels", "gatherB");
  for (int f = 0; f < 3; ++f) {
    const Form& F = forms[f];
    const auto T = bench::summarize(F.total), C = bench::summarize(F.con),
               S = bench::summarize(F.sch), E = bench::summarize(F.exe),
               K = bench::summarize(F.kernels), G = bench::summarize(F.gathered),
               B = bench::summarize(F.batches);
    std::fprintf(stderr, "%-22s %9.0f %8.3f %8.3f %8.3f %8.3f %7.0f%% %7.0f %9.0f %10.0f\n",
                 names[f], batch / (T.median / 1e3), T.median, C.median, S.median, E.median,
                 100.0 * (T.p90 - T.p10) / T.median, B.median, K.median, G.median);
    nlohmann::json j = {{"bench", "block_tree_lstm"}, {"form", names[f]}, {"policy", policy},
                        {"threads", threads}, {"batch", batch}, {"hidden", H},
                        {"trees_per_s", batch / (T.median / 1e3)}, {"ms_per_batch", T.median},
                        {"ms_p10", T.p10}, {"ms_p90", T.p90}, {"construction_ms", C.median},
                        {"scheduling_ms", S.median}, {"execution_ms", E.median},
                        {"batches", B.median}, {"kernels", K.median},
                        {"bytes_gathered", G.median}};
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
}

// The CPU's small-GEMM kernel against Eigen's GEMM at the shapes of dynamic batching: W of m x n
// (a gate, stacked gates, an output layer) times k columns (invocations or nodes), W read where it
// is (column-major) and packed (gemm_pack, done once outside the timing, as the backend keeps it),
// the three run in turn so noise hits them alike. Median of `reps` timings, each over enough
// calls for about 2 ms.
void bench_gemm(uint32_t reps) {
  std::fprintf(stderr, "\n%5s %5s %5s %12s %12s %12s %8s %s\n", "m", "n", "k", "eigen GF/s",
               "kernel GF/s", "packed GF/s", "speedup",
               cpu::gemm_acc_native() ? "" : "(no AVX-512 or AVX2: the kernel is Eigen)");
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (uint32_t m : {5u, 128u, 384u, 512u, 1024u, 8000u})
    for (uint32_t n : {128u, 256u, 512u})
      for (uint32_t k : {1u, 4u, 8u, 16u, 32u, 64u, 1024u}) {
        if (static_cast<double>(m) * n * k > 5e8) continue;
        std::vector<float> w(static_cast<size_t>(m) * n), x(static_cast<size_t>(n) * k),
            y(static_cast<size_t>(m) * k, 0.0f), packed(cpu::gemm_packed_size(m, n));
        for (float& v : w) v = normal(rng);
        for (float& v : x) v = normal(rng);
        cpu::gemm_pack(m, n, w.data(), m, packed.data());
        const double flops = 2.0 * m * n * k;
        const uint32_t calls = std::max(1u, static_cast<uint32_t>(2e-3 * 100e9 / flops));
        std::vector<double> t[3];
        for (uint32_t r = 0; r < reps + 2; ++r) {
          for (int which = 0; which < 3; ++which) {
            const double t0 = bench::now_ms();
            for (uint32_t q = 0; q < calls; ++q) {
              if (which == 0)
                cpu::gemm_acc_eigen(m, n, k, w.data(), m, x.data(), n, y.data(), m);
              else if (which == 1)
                cpu::gemm_acc(m, n, k, w.data(), m, x.data(), n, y.data(), m);
              else
                cpu::gemm_acc_packed(m, n, k, packed.data(), x.data(), n, y.data(), m);
            }
            if (r >= 2) t[which].push_back((bench::now_ms() - t0) / calls);
          }
        }
        const auto E = bench::summarize(t[0]), K = bench::summarize(t[1]),
                   P = bench::summarize(t[2]);
        const double ge = flops / (E.median * 1e6), gk = flops / (K.median * 1e6),
                     gp = flops / (P.median * 1e6);
        std::fprintf(stderr, "%5u %5u %5u %12.1f %12.1f %12.1f %7.2fx\n", m, n, k, ge, gk, gp,
                     gk / ge);
        nlohmann::json j = {{"bench", "gemm"},
                            {"m", m},
                            {"n", n},
                            {"k", k},
                            {"native", cpu::gemm_acc_native()},
                            {"eigen_gflops", ge},
                            {"kernel_gflops", gk},
                            {"packed_gflops", gp},
                            {"eigen_us", E.median * 1e3},
                            {"eigen_us_p10", E.p10 * 1e3},
                            {"eigen_us_p90", E.p90 * 1e3},
                            {"kernel_us", K.median * 1e3},
                            {"kernel_us_p10", K.p10 * 1e3},
                            {"kernel_us_p90", K.p90 * 1e3},
                            {"packed_us", P.median * 1e3},
                            {"packed_us_p10", P.p10 * 1e3},
                            {"packed_us_p90", P.p90 * 1e3}};
        std::printf("%s\n", j.dump().c_str());
      }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"edbatch blocks benchmark: compiled cells and a Tree-LSTM written with blocks"};
  uint32_t hidden = 128, k = 64, batch = 32, reps = 30;
  int threads = 1;
  std::string policy = "lb-greedy", part = "all";
  app.add_option("--hidden", hidden, "hidden size")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--k", k, "invocations per cell benchmark")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--batch", batch, "trees per mini-batch")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--policy", policy, "batching policy for the Tree-LSTM")->capture_default_str();
  app.add_option("--part", part, "cells, tree, gemm or all")
      ->check(CLI::IsMember({"cells", "tree", "gemm", "all"}))
      ->capture_default_str();
  if (const int code = bench::parse(app, argc, argv); code >= 0) return code;
  return bench::guarded("bench_blocks", [&] {
    if (part == "all" || part == "cells") bench_cells(hidden, k, reps, threads);
    if (part == "all" || part == "tree") bench_tree_lstm(hidden, batch, reps, threads, policy);
    if (part == "all" || part == "gemm") bench_gemm(reps);
    return 0;
  });
}
