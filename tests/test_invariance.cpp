// Batched = node by node, every policy = every other, 1 thread = 2 threads, on random trees,
// lattices, chains and DAGs; schedules valid and never below the chain lower bound.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>

#include "edbatch/edbatch.h"
#include "edbatch/zoo.h"
#include "tests/check.h"
#include "tests/engine_run.h"
#include "tests/models.h"
#include "tests/reference.h"

using namespace edbatch;
using namespace edbatch::testing;

namespace {

enum class Kind { Trees, TreeRnns, Lattices, Chains, Dags, Mixed };

struct Fixture {
  ParameterCollection pc{7};
  TestModels models{pc, 7, 11};
  TreeLstmOps tree_lstm{pc, 11, 5};
};

// A mini-batch of instances with awkward sizes: 1-node instances, primes, and larger ones.
Expr build(Graph& g, Fixture& f, Kind kind, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Expr> losses;
  const uint32_t count = 1 + static_cast<uint32_t>(rng() % 6);
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t big = rng() % 3 == 0 ? 5u : 1u;
    Kind k = kind == Kind::Mixed ? static_cast<Kind>(rng() % 5) : kind;
    switch (k) {
      case Kind::Trees: {
        const uint32_t leaves = i == 0 ? 1 : 1 + static_cast<uint32_t>(rng() % (13 * big));
        losses.push_back(f.tree_lstm.build(g, random_tree(rng, leaves, 11)));
        break;
      }
      case Kind::TreeRnns: {
        const uint32_t leaves = i == 0 ? 1 : 1 + static_cast<uint32_t>(rng() % (13 * big));
        losses.push_back(f.models.tree_rnn(g, random_tree(rng, leaves, 11)));
        break;
      }
      case Kind::Lattices:
        losses.push_back(f.models.lattice(g, rng, 1 + static_cast<uint32_t>(rng() % (17 * big))));
        break;
      case Kind::Chains:
        losses.push_back(f.models.chain(g, rng, 1 + static_cast<uint32_t>(rng() % (11 * big))));
        break;
      default:
        losses.push_back(f.models.dag(g, rng, 1 + static_cast<uint32_t>(rng() % (23 * big))));
        break;
    }
  }
  return sum_losses(losses);
}

void check_kind(Kind kind, const char* name, int seeds) {
  for (int s = 0; s < seeds; ++s) {
    Fixture f;
    Graph g(f.pc);
    const Expr loss = build(g, f, kind, 1000 + s);
    CAPTURE(name);
    CAPTURE(s);
    CAPTURE(g.size());
    const EngineRun ref = run_engine(g, loss, "none", 1);
    CHECK(ref.batches >= ref.lower_bound);

    // The node-by-node engine agrees with the independent double-precision interpreter.
    Reference dbl(g);
    dbl.forward();
    dbl.backward(loss.id);
    check_close(&ref.loss, &dbl.values[loss.id][0], 1, 1e-5, "loss vs double reference");
    for (uint32_t p = 0; p < f.pc.size(); ++p)
      check_close(ref.grads[p], dbl.param_grads[p], ref.grads[p].size(), 1e-5,
                  "grad of " + f.pc.name(p) + " vs double reference");

    uint64_t heuristic_best = UINT64_MAX, greedy = 0;
    for (const std::string& policy : policy_names()) {
      for (int threads : {1, 2}) {
        CAPTURE(policy);
        CAPTURE(threads);
        const EngineRun r = run_engine(g, loss, policy, threads);
        CHECK(r.batches >= r.lower_bound);
        check_close(&r.loss, &ref.loss, 1, 1e-5, "loss");
        for (uint32_t p = 0; p < f.pc.size(); ++p)
          check_close(r.grads[p], ref.grads[p], r.grads[p].size(), 1e-5,
                      "grad of " + f.pc.name(p));
        // Trees with consistent per-type levels: the greedy policy meets the bound exactly.
        if (kind == Kind::TreeRnns && policy == "lb-greedy") CHECK(r.batches == r.lower_bound);
        if (policy == "depth" || policy == "agenda")
          heuristic_best = std::min(heuristic_best, r.batches);
        if (policy == "lb-greedy") greedy = r.batches;
      }
    }
    // On op-level Tree-LSTMs the bound is not always attainable (see docs/architecture.md), but
    // the greedy policy never does worse than depth or agenda.
    if (kind == Kind::Trees) CHECK(greedy <= heuristic_best);
  }
}

}  // namespace

TEST_CASE("invariance: trees") { check_kind(Kind::Trees, "trees", 6); }
TEST_CASE("invariance: tree RNNs (lb-greedy meets the lower bound)") {
  check_kind(Kind::TreeRnns, "tree rnns", 8);
}
TEST_CASE("invariance: lattices") { check_kind(Kind::Lattices, "lattices", 6); }
TEST_CASE("invariance: chains") { check_kind(Kind::Chains, "chains", 5); }
TEST_CASE("invariance: DAGs") { check_kind(Kind::Dags, "dags", 6); }
TEST_CASE("invariance: mixed structures in one graph") { check_kind(Kind::Mixed, "mixed", 4); }

TEST_CASE("invariance: a large tree mini-batch (~2,000 tree nodes)") {
  Fixture f;
  Graph g(f.pc);
  std::mt19937_64 rng(77);
  std::vector<Expr> losses;
  uint32_t tree_nodes = 0;
  while (tree_nodes < 2000) {
    const Tree t = random_tree(rng, 1 + static_cast<uint32_t>(rng() % 52), 11);
    tree_nodes += static_cast<uint32_t>(t.nodes.size());
    losses.push_back(f.tree_lstm.build(g, t));
  }
  const Expr loss = sum_losses(losses);
  const EngineRun ref = run_engine(g, loss, "none", 1);
  for (const char* policy : {"depth", "agenda", "lb-greedy"}) {
    CAPTURE(policy);
    const EngineRun r = run_engine(g, loss, policy, 2);
    check_close(&r.loss, &ref.loss, 1, 1e-5, "loss");
    for (uint32_t p = 0; p < f.pc.size(); ++p)
      check_close(r.grads[p], ref.grads[p], r.grads[p].size(), 1e-5, "grad of " + f.pc.name(p));
    CHECK(r.batches >= r.lower_bound);
    CHECK(r.batches < ref.batches / 20);  // batching actually happened
  }
}
