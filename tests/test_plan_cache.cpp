// Plan reuse (EngineOptions::plan_cache_bytes): a graph whose structure was planned twice before
// runs on the kept schedule and plan with its own per-node integers. Every zoo model, through
// blocks and op by op, gives bitwise the loss and gradients of an engine that plans every graph,
// also when word ids, labels and tags changed; a structure that differs in one edge or one
// attribute is planned anew; an incremental forward after a reuse
// leaves the kept plan as it was; a budget too small for a plan keeps none.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>

#include "edbatch/block.h"
#include "edbatch/engine.h"
#include "edbatch/models.h"
#include "src/core/plan_cache.h"
#include "tests/check.h"
#include "tests/step_net.h"

using namespace edbatch;
using edbatch::testing::bitwise_equal;
using edbatch::testing::check_same_gradients;

namespace {

// Moves every word id, label and tag of the data set one place along (across instances), so
// each instance keeps its structure and gets other integers from the same ranges.
template <class T>
void rotate(std::vector<T*>& at) {
  if (at.size() < 2) return;
  const T first = *at[0];
  for (size_t i = 0; i + 1 < at.size(); ++i) *at[i] = *at[i + 1];
  *at.back() = first;
}

void relabel(Dataset& d) {
  std::vector<uint32_t*> words;
  std::vector<uint8_t*> small;
  std::vector<uint32_t*> labels;
  for (Tree& t : d.trees)
    for (TreeNode& n : t.nodes) {
      if (n.leaf()) words.push_back(&n.word);
      small.push_back(&n.label);
    }
  for (Lattice& l : d.lattices) {
    for (uint8_t& tag : l.tags) small.push_back(&tag);
    for (LatticeArc& a : l.arcs) words.push_back(&a.id);
  }
  for (TaggedSentence& s : d.tagged.sentences) {
    for (uint32_t& w : s.words) words.push_back(&w);
    for (uint32_t& t : s.tags) labels.push_back(&t);
  }
  for (Dag& g : d.dags) {
    for (uint32_t& x : g.inputs) words.push_back(&x);
    for (uint8_t& y : g.labels) small.push_back(&y);
  }
  for (SentencePair& p : d.pairs) {
    for (uint32_t& w : p.source) words.push_back(&w);
    for (uint32_t& w : p.target) labels.push_back(&w);
  }
  rotate(words);
  rotate(small);
  rotate(labels);
}

}  // namespace

TEST_CASE("plan cache: every zoo model reuses repeated structures with bitwise equal results") {
  for (const std::string& name : model_names()) {
    for (const bool blocks : {true, false}) {
      CAPTURE(name);
      CAPTURE(blocks);
      Dataset data = load_dataset(model_data_kind(name), "synthetic:6", 19, 7);
      ModelOptions mo;
      mo.hidden = 6;
      mo.vocab = 19;
      mo.blocks = blocks;
      ParameterCollection pa{3}, pb{3};
      const std::unique_ptr<Model> ma = make_model(name, pa, data, mo);
      const std::unique_ptr<Model> mb = make_model(name, pb, data, mo);
      EngineOptions planned;
      planned.policy = "lb-greedy";
      planned.plan_cache_bytes = 0;
      EngineOptions cached = planned;
      cached.plan_cache_bytes = size_t{16} << 20;
      Engine ea(pa, cached), eb(pb, planned);
      Graph ga(pa), gb(pb);
      // A structure is planned at its first two sights (its key remembered, then kept) and
      // reused from the third, also after the data's integers changed.
      const std::vector<uint32_t> A = {0, 2, 3}, B = {1, 4};
      struct Step {
        const std::vector<uint32_t>* ids;
        bool relabel, reused;
      };
      const Step steps[] = {{&A, false, false}, {&B, false, false}, {&A, false, false},
                            {&A, true, true},   {&B, false, false}, {&B, true, true},
                            {&A, false, true}};
      int k = 0;
      for (const Step& s : steps) {
        CAPTURE(k++);
        if (s.relabel) relabel(data);
        ga.clear();
        gb.clear();
        std::vector<Expr> la, lb;
        for (uint32_t i : *s.ids) {
          la.push_back(ma->build(ga, i));
          lb.push_back(mb->build(gb, i));
        }
        const Expr a = sum_losses(la), b = sum_losses(lb);
        const float va = as_scalar(ea.forward(ga, a)), vb = as_scalar(eb.forward(gb, b));
        CHECK(ea.stats().plan_reused == s.reused);
        CHECK(!eb.stats().plan_reused);
        CHECK(bitwise_equal(&va, &vb, 1));
        CHECK(ea.stats().batches == eb.stats().batches);
        ea.backward(ga, a);
        eb.backward(gb, b);
        check_same_gradients(pa, pb, name);
      }
      CHECK(ea.stats().plans_reused == 3);
    }
  }
}

namespace {

constexpr uint32_t H = 5, V = 11;

struct Net : edbatch::testing::StepNet {
  explicit Net(ParameterCollection& pc) : StepNet(pc, H, V) {}

  // Four chains of states from word embeddings; state 3 of chain 2 reads chain `joined`'s (0
  // or 1) state 2 instead of its own (the edge that varies), `scale` multiplies the last loss
  // (the attribute that varies), and a last loss reads h0 - h1 or, with `swap`, h1 - h0 (the
  // same nodes, types and argument multiset: only the exact comparison tells them apart).
  // Words, labels and the block calls' words come from `seed`.
  Expr build(Graph& g, uint32_t joined, float scale, uint64_t seed, bool swap = false) const {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<Expr>> h(4);
    std::vector<Expr> losses;
    for (uint32_t c = 0; c < 4; ++c) {
      h[c].push_back(tanh(lookup(g, E, static_cast<uint32_t>(rng() % V))));
      for (uint32_t t = 1; t < 5; ++t) {
        const Expr prev = c == 2 && t == 3 ? h[joined][2] : h[c][t - 1];
        const uint32_t word = static_cast<uint32_t>(rng() % V);
        Expr out;
        if (t % 2) {
          cell->call(g, &prev, 1, &word, 1, &out);
        } else {
          out = tanh(affine(
              {parameter(g, b), parameter(g, W), prev, parameter(g, U), lookup(g, E, word)}));
        }
        h[c].push_back(out);
        losses.push_back(
            pick_neg_log_softmax(parameter(g, Wo) * out, static_cast<uint32_t>(rng() % V)));
      }
    }
    losses.back() = losses.back() * scale;
    const Expr d = swap ? h[1][4] - h[0][4] : h[0][4] - h[1][4];
    losses.push_back(pick_neg_log_softmax(parameter(g, Wo) * d, 2));
    return sum_losses(losses);
  }
};

struct Twin {
  ParameterCollection pa{9}, pb{9};
  Net na{pa}, nb{pb};
  Graph ga{pa}, gb{pb};
  Engine ea, eb;

  explicit Twin(size_t budget) : ea(pa, options(budget)), eb(pb, options(0)) {}
  static EngineOptions options(size_t budget) {
    EngineOptions o;
    o.policy = "agenda";
    o.plan_cache_bytes = budget;
    return o;
  }
  // Builds the same graph in both, runs forward and backward, checks the results bitwise equal
  // and returns whether the cached engine reused a plan.
  bool run(uint32_t joined, float scale, uint64_t seed, bool swap = false) {
    ga.clear();
    gb.clear();
    const Expr a = na.build(ga, joined, scale, seed, swap);
    const Expr b = nb.build(gb, joined, scale, seed, swap);
    const float va = as_scalar(ea.forward(ga, a)), vb = as_scalar(eb.forward(gb, b));
    CHECK(bitwise_equal(&va, &vb, 1));
    ea.backward(ga, a);
    eb.backward(gb, b);
    check_same_gradients(pa, pb, "twin");
    return ea.stats().plan_reused;
  }
};

}  // namespace

TEST_CASE("plan cache: a structure that differs in one edge or one attribute is planned anew") {
  Twin t(size_t{1} << 20);
  CHECK(!t.run(1, 1.0f, 1));  // a key seen for the first time
  CHECK(!t.run(1, 1.0f, 2));  // planned again, and kept
  CHECK(t.run(1, 1.0f, 3));   // reused, with other words, labels and call integers
  // One edge moved to another node of the same type and shape: another structure, planned
  // anew until it is kept in turn.
  CHECK(!t.run(0, 1.0f, 4));
  CHECK(!t.run(0, 1.0f, 5));
  CHECK(t.run(0, 1.0f, 6));
  // Two arguments swapped: another key (arguments count by position), kept in turn.
  CHECK(!t.run(1, 1.0f, 7, true));
  CHECK(!t.run(1, 1.0f, 8, true));
  CHECK(t.run(1, 1.0f, 9, true));
  // One attribute: the same key as the first structure, which the exact comparison turns down.
  CHECK(!t.run(1, 0.5f, 10));
  CHECK(t.run(1, 1.0f, 11));  // the first structure is still kept
  CHECK(t.ea.stats().plans_reused == 4);
}

// Every tree of n leaves has the same counts of nodes and arguments, and each node but the root
// is an argument once: the key tells their shapes apart, so trees that never repeat are not
// kept (a kept plan that is never served only takes the budget).
TEST_CASE("plan cache: trees of one size but other shapes have other keys") {
  std::mt19937_64 rng(5);
  ParameterCollection pc(1);
  const Parameter W = pc.add_parameters("W", Dim{3, 6});
  std::map<std::vector<uint32_t>, uint64_t> key_of;  // every node's arguments -> key
  for (int trial = 0; trial < 300; ++trial) {
    Graph g(pc);
    std::vector<Expr> forest;  // random merges of 9 leaves
    for (int i = 0; i < 9; ++i) forest.push_back(tanh(input(g, Dim{3, 1}, {1, 2, 3})));
    while (forest.size() > 1) {
      Expr pair[2];
      for (Expr& e : pair) {
        const auto at = forest.begin() + static_cast<std::ptrdiff_t>(rng() % forest.size());
        e = *at;
        forest.erase(at);
      }
      forest.push_back(tanh(parameter(g, W) * concat({pair[0], pair[1]})));
    }
    const auto [it, added] = key_of.emplace(g.all_args(), PlanCache::key(g));
    CHECK(it->second == PlanCache::key(g));  // one structure, one key
  }
  REQUIRE(key_of.size() > 250);
  std::set<uint64_t> keys;
  for (const auto& [structure, key] : key_of) keys.insert(key);
  CHECK(keys.size() == key_of.size());
}

TEST_CASE("plan cache: a budget too small for one plan keeps none") {
  Twin t(64);
  for (uint64_t seed = 1; seed < 5; ++seed) CHECK(!t.run(1, 1.0f, seed));
}

TEST_CASE("plan cache: an incremental forward after a reuse leaves the kept plan intact") {
  Twin t(size_t{1} << 20);
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    t.ga.clear();
    t.gb.clear();
    const Expr a = t.na.build(t.ga, 1, 1.0f, 10 + round);
    const Expr b = t.nb.build(t.gb, 1, 1.0f, 10 + round);
    const float va = as_scalar(t.ea.forward(t.ga, a)), vb = as_scalar(t.eb.forward(t.gb, b));
    CHECK(bitwise_equal(&va, &vb, 1));
    CHECK(t.ea.stats().plan_reused == (round >= 2));
    // Grow both graphs by a step that reads the loss's graph and run only that.
    const uint32_t word = 3 + round;
    const Expr x = lookup(t.ga, t.na.E, word), y = lookup(t.gb, t.nb.E, word);
    const Expr ha = tanh(affine({parameter(t.ga, t.na.b), parameter(t.ga, t.na.W), x}));
    const Expr hb = tanh(affine({parameter(t.gb, t.nb.b), parameter(t.gb, t.nb.W), y}));
    const Expr la = sum_losses({a, pick_neg_log_softmax(parameter(t.ga, t.na.Wo) * ha, 1)});
    const Expr lb = sum_losses({b, pick_neg_log_softmax(parameter(t.gb, t.nb.Wo) * hb, 1)});
    const float wa = as_scalar(t.ea.forward(t.ga, la)), wb = as_scalar(t.eb.forward(t.gb, lb));
    CHECK(bitwise_equal(&wa, &wb, 1));
    t.ea.backward(t.ga, la);
    t.eb.backward(t.gb, lb);
    check_same_gradients(t.pa, t.pb, "incremental");
  }
}
