// Building in bulk (PackedGraph, edbatch/packed.h): every zoo model built through a packed run
// gives node for node the graph of per-node Block::calls and Expr builders, the same schedule and
// bitwise the same loss and gradients; a run written by hand from child arrays (ids computed, no
// Exprs) gives the graph of the Expr path; every malformed entry is refused with a message naming
// it, and the graph is left as it was.
#include <doctest/doctest.h>

#include <random>

#include "edbatch/block.h"
#include "edbatch/engine.h"
#include "edbatch/models.h"
#include "edbatch/packed.h"
#include "edbatch/types.h"
#include "tests/check.h"

using namespace edbatch;
using edbatch::testing::bitwise_equal;
using edbatch::testing::check_same_gradients;

namespace {

// The two graphs hold the same nodes, arguments, integers and input values, field by field.
void check_same_graph(const Graph& a, const Graph& b) {
  REQUIRE(a.size() == b.size());
  for (uint32_t id = 0; id < a.size(); ++id) {
    const Node &x = a.node(id), &y = b.node(id);
    CAPTURE(id);
    CHECK(x.op == y.op);
    CHECK(x.type == y.type);
    CHECK(x.dim == y.dim);
    CHECK(x.arg_begin == y.arg_begin);
    CHECK(x.num_args == y.num_args);
    CHECK(x.aux == y.aux);
    CHECK(x.aux2 == y.aux2);
    CHECK(float_bits(x.alpha) == float_bits(y.alpha));
    CHECK(float_bits(x.beta) == float_bits(y.beta));
  }
  CHECK(a.all_args() == b.all_args());
  CHECK(a.ints() == b.ints());
  CHECK(a.input_values() == b.input_values());
}

}  // namespace

TEST_CASE("packed: every zoo model builds the graph of per-node calls, bitwise the same numbers") {
  for (const std::string& name : model_names()) {
    CAPTURE(name);
    const Dataset data = load_dataset(model_data_kind(name), "synthetic:7", 23, 5);
    ModelOptions mo;
    mo.hidden = 7;
    mo.vocab = 23;
    mo.blocks = true;
    ParameterCollection pa{4}, pb{4};
    mo.packed = true;
    const std::unique_ptr<Model> ma = make_model(name, pa, data, mo);
    mo.packed = false;
    const std::unique_ptr<Model> mb = make_model(name, pb, data, mo);
    EngineOptions eo;
    eo.policy = "lb-greedy";
    eo.plan_cache_bytes = 0;
    Engine ea(pa, eo), eb(pb, eo);
    Graph ga(pa), gb(pb);
    for (const std::vector<uint32_t>& ids :
         {std::vector<uint32_t>{0, 3, 5, 6}, std::vector<uint32_t>{1, 2, 4}}) {
      ga.clear();
      gb.clear();
      std::vector<Expr> la, lb, xa, xb;
      for (uint32_t i : ids) {
        la.push_back(ma->build(ga, i, &xa));
        lb.push_back(mb->build(gb, i, &xb));
      }
      REQUIRE(xa.size() == xb.size());
      for (size_t k = 0; k < xa.size(); ++k) CHECK(xa[k].id == xb[k].id);
      for (size_t k = 0; k < la.size(); ++k) CHECK(la[k].id == lb[k].id);
      const Expr a = sum_losses(la), b = sum_losses(lb);
      check_same_graph(ga, gb);
      const float va = as_scalar(ea.forward(ga, a)), vb = as_scalar(eb.forward(gb, b));
      CHECK(bitwise_equal(&va, &vb, 1));
      CHECK(ea.schedule().nodes == eb.schedule().nodes);
      CHECK(ea.schedule().batches.size() == eb.schedule().batches.size());
      ea.backward(ga, a);
      eb.backward(gb, b);
      check_same_gradients(pa, pb, name);
    }
  }
}

namespace {

constexpr uint32_t H = 5, V = 13;

// A binary tree cell with its node loss: leaf (integers word, label), inner (inputs h1, h2;
// integer label); outputs h, loss.
struct TreeNet {
  Parameter W, b, Wo;
  LookupParameter E;
  std::unique_ptr<Block> leaf, inner;

  explicit TreeNet(ParameterCollection& pc) {
    W = pc.add_parameters("W", Dim{H, 2 * H});
    b = pc.add_parameters("b", Dim{H, 1});
    Wo = pc.add_parameters("Wo", Dim{3, H});
    E = pc.add_lookup_parameters("E", V, H);
    leaf = std::make_unique<Block>(pc, "leaf");
    {
      const Expr h = tanh(leaf->lookup(E, leaf->index("word")));
      leaf->output("h", h);
      leaf->output("loss", leaf->pick_neg_log_softmax(parameter(leaf->body(), Wo) * h,
                                                      leaf->index("label")));
      leaf->freeze();
    }
    inner = std::make_unique<Block>(pc, "inner");
    {
      Graph& body = inner->body();
      const Expr x = concat({inner->input("h1", Dim{H, 1}), inner->input("h2", Dim{H, 1})});
      const Expr h = tanh(affine({parameter(body, b), parameter(body, W), x}));
      inner->output("h", h);
      inner->output("loss",
                    inner->pick_neg_log_softmax(parameter(body, Wo) * h, inner->index("label")));
      inner->freeze();
    }
  }
};

// Post-order binary trees as child arrays (-1: a leaf), words and labels, from a seed.
struct PackedTrees {
  std::vector<uint32_t> begin;  // per tree: its first node; one more entry at the end
  std::vector<int32_t> left, right;
  std::vector<uint32_t> word, label;
};

PackedTrees random_trees(uint32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  PackedTrees t;
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t first = static_cast<uint32_t>(t.left.size());
    t.begin.push_back(first);
    std::vector<int32_t> open;  // roots of subtrees built so far (a stack)
    const uint32_t leaves = 1 + static_cast<uint32_t>(rng() % 9);
    uint32_t placed = 0;
    while (placed < leaves || open.size() > 1) {
      const int32_t id = static_cast<int32_t>(t.left.size() - first);
      if (placed < leaves && (open.size() < 2 || rng() % 2)) {
        t.left.push_back(-1);
        t.right.push_back(-1);
        ++placed;
      } else {
        t.right.push_back(open.back());
        open.pop_back();
        t.left.push_back(open.back());
        open.pop_back();
      }
      t.word.push_back(static_cast<uint32_t>(rng() % V));
      t.label.push_back(static_cast<uint32_t>(rng() % 3));
      open.push_back(id);
    }
  }
  t.begin.push_back(static_cast<uint32_t>(t.left.size()));
  return t;
}

}  // namespace

TEST_CASE("packed: a run written from child arrays equals the Expr path") {
  const PackedTrees trees = random_trees(11, 3);
  ParameterCollection pa{2}, pb{2};
  TreeNet na(pa), nb(pb);
  Graph ga(pa), gb(pb);

  // The Expr path.
  std::vector<Expr> losses, h(trees.left.size());
  for (size_t k = 0; k + 1 < trees.begin.size(); ++k)
    for (uint32_t n = trees.begin[k]; n < trees.begin[k + 1]; ++n) {
      Expr out[2];
      if (trees.left[n] < 0) {
        const uint32_t ints[2] = {trees.word[n], trees.label[n]};
        na.leaf->call(ga, nullptr, 0, ints, 2, out);
      } else {
        const Expr in[2] = {h[trees.begin[k] + trees.left[n]], h[trees.begin[k] + trees.right[n]]};
        na.inner->call(ga, in, 2, &trees.label[n], 1, out);
      }
      h[n] = out[0];
      losses.push_back(out[1]);
    }
  sum_losses(losses);

  // The packed run: ids only. A call's outputs follow it, so output o of the call recorded for
  // node n is first_output[n] + o.
  PackedGraph run;
  run.reset(gb);
  std::vector<uint32_t> first_output(trees.left.size()), loss_ids;
  for (size_t k = 0; k + 1 < trees.begin.size(); ++k)
    for (uint32_t n = trees.begin[k]; n < trees.begin[k + 1]; ++n) {
      if (trees.left[n] < 0) {
        const uint32_t ints[2] = {trees.word[n], trees.label[n]};
        first_output[n] = run.call(*nb.leaf, nullptr, ints);
      } else {
        const uint32_t in[2] = {first_output[trees.begin[k] + trees.left[n]],
                                first_output[trees.begin[k] + trees.right[n]]};
        first_output[n] = run.call(*nb.inner, in, &trees.label[n]);
      }
      loss_ids.push_back(first_output[n] + 1);
    }
  const uint32_t total = run.reduce(PackedGraph::Reduce::SumLosses, loss_ids.data(),
                                    static_cast<uint32_t>(loss_ids.size()));
  CHECK(total + 1 == run.end());
  CHECK(gb.size() == 0);  // nothing is added before append
  run.append(gb);
  check_same_graph(ga, gb);

  // Every reduction, lookups and reshapes, against the Expr builders on the same nodes.
  {
    const uint32_t h1 = first_output[0], h2 = first_output[trees.begin[1]];
    const Expr e1 = ga.expr(h[0].id), e2 = ga.expr(h[trees.begin[1]].id);
    CHECK(e1.id == h1);
    maximum({e1, e2});
    average({e1, e2, e1});
    sum({e2, e1});
    reshape(lookup(ga, na.E, 3), Dim{1, H});
    PackedGraph more;
    more.reset(gb);
    const uint32_t two[2] = {h1, h2}, three[3] = {h1, h2, h1}, swapped[2] = {h2, h1};
    more.reduce(PackedGraph::Reduce::Maximum, two, 2);
    more.reduce(PackedGraph::Reduce::Average, three, 3);
    more.reduce(PackedGraph::Reduce::Sum, swapped, 2);
    CHECK(more.reduce(PackedGraph::Reduce::Sum, &h1, 1) == h1);  // one argument: itself
    more.reshape(more.lookup(nb.E, 3), Dim{1, H});
    more.append(gb);
    check_same_graph(ga, gb);
  }

  // The run can be appended after nodes of the Expr path and be followed by more of them.
  gb.clear();
  const Expr x = tanh(lookup(gb, nb.E, 4));
  run.reset(gb);
  const uint32_t label = 1;
  const uint32_t in[2] = {x.id, x.id};
  const uint32_t hid = run.call(*nb.inner, in, &label);
  CHECK(hid == x.id + 2);  // after the call node
  run.append(gb);
  const Expr twice = gb.expr(hid) + gb.expr(hid);
  CHECK(gb.node(twice.id).dim == Dim{H, 1});
}

TEST_CASE("packed: malformed entries are refused by name and leave the graph as it was") {
  ParameterCollection pc{1};
  TreeNet net(pc);
  Graph g(pc);
  const Expr x = tanh(lookup(g, net.E, 2));
  const Expr wide = concat({x, x});
  const uint32_t size0 = g.size();
  const uint32_t word_label[2] = {1, 2};
  const uint32_t label = 0;
  PackedGraph run;

  auto refused = [&](const char* needle) {
    try {
      run.append(g);
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find("[PackedGraph::append]") != std::string::npos);
      CHECK(what.find(needle) != std::string::npos);
      CHECK(g.size() == size0);
      return;
    }
    FAIL("append did not throw");
  };

  SUBCASE("an input of the wrong shape") {
    run.reset(g);
    const uint32_t h = run.call(*net.leaf, nullptr, word_label);
    const uint32_t in[2] = {h, wide.id};
    run.call(*net.inner, in, &label);
    refused("entry 1 (call of block 'inner', node 6): input 'h2' has shape 10, expected 5");
  }
  SUBCASE("an input that is not an earlier node") {
    run.reset(g);
    const uint32_t in[2] = {x.id, 100};
    run.call(*net.inner, in, &label);
    refused("input 'h2' is node 100, not an earlier node");
  }
  SUBCASE("a call node instead of its outputs") {
    run.reset(g);
    const uint32_t h = run.call(*net.leaf, nullptr, word_label);
    const uint32_t in[2] = {h - 1, h};
    run.call(*net.inner, in, &label);
    refused("a block call: pass its outputs");
  }
  SUBCASE("an integer out of range") {
    run.reset(g);
    const uint32_t bad[2] = {V, 0};
    run.call(*net.leaf, nullptr, bad);
    refused("integer 'word' = 13 is out of range (must be below 13)");
  }
  SUBCASE("reductions of different shapes, and sum_losses of a vector") {
    run.reset(g);
    const uint32_t ids[2] = {x.id, wide.id};
    run.reduce(PackedGraph::Reduce::Maximum, ids, 2);
    refused("(maximum, node 3): argument 2 has shape 10 but argument 1 has shape 5");
    run.reset(g);
    const uint32_t same[2] = {x.id, x.id};
    run.reduce(PackedGraph::Reduce::SumLosses, same, 2);
    refused("argument 1 is 5, not a scalar");
  }
  SUBCASE("a lookup out of range and a reshape of the wrong size") {
    run.reset(g);
    run.lookup(net.E, V + 4);
    refused("index 17 out of range for 'E'");
    run.reset(g);
    run.reshape(wide.id, Dim{3, 3});
    refused("cannot reshape 10");
  }
  SUBCASE("a block destroyed after its call was recorded, another made in its place") {
    run.reset(g);
    const uint32_t in[2] = {x.id, x.id};
    run.call(*net.inner, in, &label);
    net.inner.reset();
    refused("entry 0 (call of block 'inner', node 3): the block was destroyed after its call");
    // A block of the same inputs made since, perhaps at the same address, is not the one called.
    Block other(pc, "other");
    other.output("h", sigmoid(other.input("h1", Dim{H, 1}) + other.input("h2", Dim{H, 1})));
    other.index("label");
    other.freeze();
    refused("the block was destroyed after its call was recorded");
  }
  SUBCASE("a graph that changed since reset, and a run never reset") {
    run.reset(g);
    run.call(*net.leaf, nullptr, word_label);
    tanh(x);
    CHECK_THROWS_WITH_AS(run.append(g), doctest::Contains("the graph is not the one reset() saw"),
                         std::invalid_argument);
    PackedGraph fresh;
    CHECK_THROWS_WITH_AS(fresh.call(*net.leaf, nullptr, word_label),
                         doctest::Contains("call reset(graph) first"), std::invalid_argument);
    return;
  }
  SUBCASE("an unfrozen block, and Expr inputs of another graph") {
    Block open(pc, "open");
    open.output("y", tanh(open.input("x", Dim{H, 1})));
    run.reset(g);
    CHECK_THROWS_WITH_AS(run.call(open, &x.id, nullptr), doctest::Contains("call freeze()"),
                         std::invalid_argument);
    Graph other(pc);
    const Expr y = tanh(lookup(other, net.E, 1));
    const Expr in[2] = {y, y};
    Expr out[2];
    CHECK_THROWS_WITH_AS(run.call(*net.inner, in, 2, &label, 1, out),
                         doctest::Contains("another graph"), std::invalid_argument);
    return;
  }
  // After a refusal the graph builds on as if nothing happened.
  const Expr after = tanh(x);
  CHECK(after.id == size0);
}
