// The block path of every zoo model equals its op-level path: on small synthetic data with awkward
// hidden sizes, two models over collections of the same seed (so the same initial weights) give
// the same loss, logits and gradient of every parameter, under policies none, agenda and lb-greedy
// at 1 and 2 threads; the block graph also equals the double-precision reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "tests/check.h"
#include "tests/engine_run.h"
#include "tests/reference.h"

using namespace edbatch;
using namespace edbatch::testing;

namespace {

constexpr uint32_t kVocab = 19;

// A few small instances, with the shapes that take a model's rarer paths: a one-word tree, a
// lattice whose middle node has no arcs, a one-node lattice, a one-state DAG.
Dataset small_data(const std::string& model) {
  Dataset d;
  d.kind = model_data_kind(model);
  d.source = "test";
  switch (d.kind) {
    case DataKind::Trees: {
      d.trees = synthetic_trees(3, 21, kVocab);
      Tree one;
      one.nodes.push_back(TreeNode{-1, -1, 4, 2});
      d.trees.insert(d.trees.begin() + 1, one);
      break;
    }
    case DataKind::Lattices: {
      d.lattices = synthetic_lattices(2, 21, kVocab);
      Lattice& l = d.lattices[0];
      const uint32_t keep = std::min<uint32_t>(17, l.length());
      l.tags.resize(keep);
      l.arc_begin.resize(keep + 1);
      l.arcs.resize(l.arc_begin.back());
      // Nodes 0..3, node 2 without arcs: arcs from it use the learned state too.
      Lattice gap;
      gap.tags = {0, 3, 1, 4};
      gap.arc_begin = {0, 0, 1, 1, 3};
      gap.arcs = {{0, 5}, {2, 7}, {0, 11}};
      Lattice one;
      one.tags = {3};
      one.arc_begin = {0, 0};
      d.lattices[1] = gap;
      d.lattices.push_back(one);
      break;
    }
    case DataKind::Tagged:
      d.tagged.sentences = synthetic_tagged(3, 21, kVocab, 5);
      d.tagged.num_tags = 5;
      d.tagged.spellings = synthetic_spellings(kVocab - 3, 21);  // the top ids unspelled
      for (TaggedSentence& s : d.tagged.sentences) {
        s.words.resize(std::min<size_t>(s.words.size(), 6));
        s.tags.resize(s.words.size());
      }
      d.tagged.sentences[1].words.resize(1);  // a one-word sentence: first steps only
      d.tagged.sentences[1].tags.resize(1);
      break;
    case DataKind::Pairs:
      d.pairs = synthetic_pairs(3, 21, kVocab);
      for (SentencePair& p : d.pairs) {
        p.source.resize(std::min<size_t>(p.source.size(), 6));
        p.target.resize(std::min<size_t>(p.target.size(), 5));
      }
      d.pairs[1].target.clear();  // an empty target: the loss of </s> alone
      break;
    case DataKind::Dags: {
      DagOptions o;
      o.min_states = 1;
      o.max_states = 19;
      d.dags = synthetic_dags(4, 21, kVocab, o);
      d.dags.push_back(synthetic_dags(1, 5, kVocab, DagOptions{1, 1})[0]);
      break;
    }
  }
  return d;
}

ModelOptions options(uint32_t hidden, bool blocks, bool chars) {
  ModelOptions o;
  o.hidden = hidden;
  o.vocab = kVocab;
  o.blocks = blocks;
  o.seed = 5;
  o.char_embeddings = chars;
  o.char_vocab = 7;
  o.rare_below = 2;  // some words embedded through their characters, some looked up
  return o;
}

struct Built {
  Expr loss;
  std::vector<Expr> logits;  // every instance's, in order
};

Built build_all(Model& m, Graph& g) {
  Built b;
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < m.size(); ++i) {
    std::vector<Expr> logits;
    losses.push_back(m.build(g, i, &logits));
    REQUIRE(logits.size() == m.labels(i).size());
    b.logits.insert(b.logits.end(), logits.begin(), logits.end());
  }
  b.loss = sum_losses(losses);
  return b;
}

// A zoo model's graph of every instance of small_data, hidden 7, through blocks.
struct ZooGraph {
  explicit ZooGraph(const std::string& name)
      : data(small_data(name)),
        pc(3),
        model(make_model(name, pc, data, options(7, true, false))),
        g(pc),
        built(build_all(*model, g)) {}
  Dataset data;
  ParameterCollection pc;
  std::unique_ptr<Model> model;
  Graph g;
  Built built;
};

uint32_t count_calls(const Graph& g) {
  uint32_t n = 0;
  for (const Node& node : g.nodes()) n += node.op == Op::Call;
  return n;
}

void check_blocks(const std::string& name, uint32_t hidden, bool chars = false) {
  CAPTURE(name);
  CAPTURE(hidden);
  CAPTURE(chars);
  const Dataset data = small_data(name);
  ParameterCollection pc_ops(3), pc_blk(3);
  const auto ops = make_model(name, pc_ops, data, options(hidden, false, chars));
  const auto blk = make_model(name, pc_blk, data, options(hidden, true, chars));
  Graph go(pc_ops), gb(pc_blk);
  const Built bo = build_all(*ops, go), bb = build_all(*blk, gb);
  REQUIRE(bo.logits.size() == bb.logits.size());
  CHECK(count_calls(go) == 0);
  CHECK(count_calls(gb) > 0);
  CHECK(gb.size() < go.size());
  for (size_t k = 0; k < bb.logits.size(); ++k)
    CHECK(gb.node(bb.logits[k].id).dim == Dim{blk->num_classes(), 1});

  const EngineRun op = run_engine(go, bo.loss, "agenda", 1, bo.logits);
  Reference ref(gb);
  ref.forward();
  ref.backward(bb.loss.id);
  const double ref_loss = ref.values[bb.loss.id][0];
  check_close(&op.loss, &ref_loss, 1, 1e-4, "op-level loss vs reference");
  for (const char* policy : {"none", "agenda", "lb-greedy"}) {
    for (int threads : {1, 2}) {
      CAPTURE(policy);
      CAPTURE(threads);
      const EngineRun r = run_engine(gb, bb.loss, policy, threads, bb.logits);
      check_close(&r.loss, &ref_loss, 1, 1e-4, "loss vs reference");
      check_close(&r.loss, &op.loss, 1, 1e-4, "loss vs op level");
      for (size_t k = 0; k < r.values.size(); ++k)
        check_close(r.values[k], op.values[k], r.values[k].size(), 1e-4,
                    "logits " + std::to_string(k) + " vs op level");
      uint32_t compared = 0;
      for (uint32_t p = 0; p < pc_blk.size(); ++p) {
        if (pc_blk.is_view(p)) continue;
        const uint32_t q = pc_ops.find(pc_blk.name(p));
        REQUIRE(q != UINT32_MAX);
        const size_t n = r.grads[p].size();
        check_close(r.grads[p], ref.param_grads[p], n, 2e-4,
                    "gradient of " + pc_blk.name(p) + " vs reference");
        check_close(r.grads[p], op.grads[q], n, 2e-4,
                    "gradient of " + pc_blk.name(p) + " vs op level");
        ++compared;
      }
      CHECK(compared == pc_ops.size());
    }
  }

  // The blocks are declared once: a second graph adds no tensors and gives the same loss.
  const uint32_t tensors = pc_blk.size();
  Graph again(pc_blk);
  const Expr first = blk->build(again, 0);
  CHECK(pc_blk.size() == tensors);
  Graph once(pc_ops);
  const Expr first_op = ops->build(once, 0);
  Engine e_blk(pc_blk, EngineOptions{"lb-greedy", "cpu", 1});
  Engine e_ops(pc_ops, EngineOptions{"lb-greedy", "cpu", 1});
  const double l_blk = as_scalar(e_blk.forward(again, first));
  const double l_ops = as_scalar(e_ops.forward(once, first_op));
  check_close(&l_blk, &l_ops, 1, 1e-4, "instance 0 in a new graph");
}

}  // namespace

TEST_CASE("zoo blocks: tree_lstm = op level = reference") {
  check_blocks("tree_lstm", 7);
  check_blocks("tree_lstm", 1);
}
TEST_CASE("zoo blocks: tree_gru = op level = reference") {
  check_blocks("tree_gru", 7);
  check_blocks("tree_gru", 2);
}
TEST_CASE("zoo blocks: double_typed_tree_lstm = op level = reference") {
  check_blocks("double_typed_tree_lstm", 5);
  check_blocks("double_typed_tree_lstm", 11);
}
TEST_CASE("zoo blocks: mvrnn = op level = reference") {
  check_blocks("mvrnn", 5);
  check_blocks("mvrnn", 1);
}
TEST_CASE("zoo blocks: lattice_lstm = op level = reference") {
  check_blocks("lattice_lstm", 7);
  check_blocks("lattice_lstm", 1);
}
TEST_CASE("zoo blocks: lattice_gru = op level = reference") {
  check_blocks("lattice_gru", 3);
  check_blocks("lattice_gru", 13);
}
TEST_CASE("zoo blocks: bilstm_tagger = op level = reference, with and without characters") {
  check_blocks("bilstm_tagger", 7);
  check_blocks("bilstm_tagger", 5, true);
  check_blocks("bilstm_tagger", 1, true);
}
TEST_CASE("zoo blocks: random_dag = op level = reference") {
  check_blocks("random_dag", 7);
  check_blocks("random_dag", 3);
}

// On several threads the backward of a block-call batch runs by invocation range, as its forward
// does, with the invocations that read one input in one range; the parameters' gradients are then
// formed for the whole batch in the one-thread order. Every zoo model splits some batches and
// gives the one-thread gradients within 1e-5 relative; a batch whose shared input no split can
// keep in one range runs whole.
TEST_CASE("zoo blocks: backward by invocation range equals one thread") {
  for (const std::string& name : model_names()) {
    CAPTURE(name);
    ZooGraph z(name);
    ParameterCollection& pc = z.pc;
    const EngineRun one = run_engine(z.g, z.built.loss, "lb-greedy", 1, z.built.logits);
    const EngineRun two = run_engine(z.g, z.built.loss, "lb-greedy", 2, z.built.logits);
    CHECK(one.split_call_backward == 0);
    CHECK(two.split_call_backward > 0);
    check_close(&two.loss, &one.loss, 1, 1e-6, "loss");
    for (uint32_t p = 0; p < pc.size(); ++p)
      if (!pc.is_view(p))
        check_close(two.grads[p], one.grads[p], two.grads[p].size(), 1e-5,
                    "gradient of " + pc.name(p));
  }

  // Calls of a block that read x, x and y split into the calls of x and the call of y; two calls
  // that both read x cannot split.
  for (const bool pair : {false, true}) {
    CAPTURE(pair);
    ParameterCollection pc(4);
    const Parameter W = pc.add_parameters("W", Dim{5, 5});
    const Parameter v = pc.add_parameters("v", Dim{5, 1});
    Block blk(pc, "cell");
    blk.output("h", tanh(parameter(blk.body(), W) * blk.input("x", Dim{5, 1})));
    blk.freeze();
    Graph g(pc);
    const Expr x = tanh(parameter(g, v)), y = sigmoid(parameter(g, v));
    std::vector<Expr> outs;
    std::vector<Expr> picks;
    for (const Expr& in : pair ? std::vector<Expr>{x, x} : std::vector<Expr>{x, x, y}) {
      outs.push_back(blk(g, {in})[0]);
      picks.push_back(pick(outs.back(), static_cast<uint32_t>(outs.size())));
    }
    const Expr loss = sum_losses(picks);
    const EngineRun one = run_engine(g, loss, "lb-greedy", 1);
    const EngineRun two = run_engine(g, loss, "lb-greedy", 2);
    CHECK(two.split_call_backward == (pair ? 0u : 1u));
    for (uint32_t p = 0; p < pc.size(); ++p)
      check_close(two.grads[p], one.grads[p], two.grads[p].size(), 1e-6,
                  "gradient of " + pc.name(p));
  }
}

// An engine whose arenas still hold the values and adjoints of other graphs (larger, then
// smaller) gives a fresh engine's gradients bitwise; seeds on the logits (which the loss also
// reads) give the gradients of the loss sum_i seed_i . logit_i built into the graph. The
// op-level form, for every node's adjoint, is in tests/test_memory.cpp; this one adds every zoo
// model through blocks (their calls' internal regions) and the seeded backward.
TEST_CASE("zoo blocks: an engine reused over other graphs gives a fresh engine's gradients") {
  for (const std::string& name : model_names()) {
    for (const int threads : {1, 2}) {
      CAPTURE(name);
      CAPTURE(threads);
      const Dataset data = small_data(name);
      ParameterCollection pc(3);
      const auto model = make_model(name, pc, data, options(7, true, false));
      Graph whole(pc), one(pc);
      const Built all = build_all(*model, whole);
      std::vector<Expr> logits;
      const Expr loss = model->build(one, 0, &logits);
      REQUIRE(!logits.empty());
      std::mt19937 rng(11);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> seeds;
      std::vector<Expr> dots;
      for (const Expr& e : logits) {
        const uint32_t n = one.node(e.id).dim.size();
        std::vector<float> s(n);
        for (float& x : s) x = u(rng);
        seeds.insert(seeds.end(), s.begin(), s.end());
        dots.push_back(matmul(input(one, Dim{1, n}, s), e));
      }
      const Expr seeded_loss = sum_losses(dots);
      EngineOptions o;
      o.threads = threads;
      o.min_parallel_work = 1;
      auto take_grads = [&pc] {
        std::vector<std::vector<float>> g(pc.size());
        for (uint32_t p = 0; p < pc.size(); ++p)
          if (!pc.is_view(p)) g[p].assign(pc.grads(p), pc.grads(p) + pc.dim(p).size());
        pc.zero_grads();
        return g;
      };
      auto run = [&](Engine& e, Graph& g, const Expr& l) {
        e.forward(g, l);
        e.backward(g, l);
        return take_grads();
      };
      Engine reused(pc, o);
      run(reused, whole, all.loss);
      {
        Engine fresh(pc, o);
        CHECK(run(reused, one, loss) == run(fresh, one, loss));
      }
      {
        Engine fresh(pc, o);
        const auto want = run(fresh, one, seeded_loss);
        reused.forward(one, loss);
        reused.backward(one, logits, seeds.data());
        const auto got = take_grads();
        for (uint32_t p = 0; p < pc.size(); ++p)
          check_close(got[p], want[p], got[p].size(), 1e-5, "seeded gradient of " + pc.name(p));
      }
      Engine fresh(pc, o);
      CHECK(run(reused, whole, all.loss) == run(fresh, whole, all.loss));
    }
  }
}

// Block compilation gathers elementwise steps: the last step of an elementwise group that is
// followed by GEMM (non-elementwise) groups and then another elementwise group is read by one
// of those GEMM steps (else it would have joined the later group). The Tree-LSTM's inner cell,
// whose internal schedule put tanh(u) between its two GEMM steps, is the case that needed it.
TEST_CASE("zoo blocks: no elementwise run is split by GEMM steps that do not read it") {
  for (const std::string& name : model_names()) {
    CAPTURE(name);
    ZooGraph z(name);
    const ParameterCollection& pc = z.pc;
    const Graph& g = z.g;
    std::vector<uint32_t> seen;
    for (const Node& n : g.nodes()) {
      if (n.op != Op::Call || std::find(seen.begin(), seen.end(), n.aux) != seen.end()) continue;
      seen.push_back(n.aux);
      const BlockPlan& p = pc.block(n.aux)->plan();
      CAPTURE(p.name);
      const Graph& body = *p.body;
      auto elementwise = [&](const BlockGroup& gr) {
        return op_info(p.steps[gr.step_begin].op).elementwise;
      };
      for (size_t i = 0; i < p.groups.size(); ++i) {
        if (!elementwise(p.groups[i])) continue;
        size_t j = i + 1;
        while (j < p.groups.size() && !elementwise(p.groups[j])) ++j;
        if (j == i + 1 || j == p.groups.size()) continue;
        const BlockStep& last = p.steps[p.groups[i].step_begin + p.groups[i].step_count - 1];
        const uint32_t* m0 = p.members.data() + last.member_begin;
        const uint32_t* m1 = m0 + last.member_count;
        bool read = false;
        for (size_t q = i + 1; q < j; ++q)
          for (uint32_t s = p.groups[q].step_begin; s < p.groups[q].step_begin + p.groups[q].step_count; ++s)
            for (uint32_t k = 0; k < p.steps[s].member_count; ++k) {
              const Node& mn = body.node(p.members[p.steps[s].member_begin + k]);
              for (uint32_t a = 0; a < mn.num_args; ++a)
                read |= std::find(m0, m1, body.args(mn)[a]) != m1;
            }
        CHECK(read);
      }
    }
    CHECK(!seen.empty());
  }
}
