// Blocks: a block equals the same math written op by op (and the double reference), forward and
// gradients, for the standard cells at k = 1, 7 and 64 invocations; compiled plans are sound;
// misuse is reported.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/dump.h"
#include "edbatch/engine.h"
#include "tests/check.h"
#include "tests/engine_run.h"
#include "tests/models.h"
#include "tests/reference.h"

using namespace edbatch;
using edbatch::testing::check_close;
using edbatch::testing::EngineRun;
using edbatch::testing::run_engine;
using edbatch::testing::Reference;

namespace {

constexpr uint32_t H = 7, V = 11, C = 5;

// How a cell reads its per-invocation integers: in a block through slots, op by op directly.
struct Ints {
  std::function<Expr(Graph&, LookupParameter, uint32_t)> embed;
  std::function<Expr(const Expr&, uint32_t)> loss;
  std::function<Expr(const Expr&, float, uint32_t)> drop;  // dropout keyed by a slot
};

struct CellDef {
  const char* name;
  std::vector<Dim> inputs;
  std::vector<uint32_t> int_limits;
  // The math: inputs and integer slots in, outputs out.
  std::function<std::vector<Expr>(Graph&, const std::vector<Expr>&, const Ints&)> math;
};

struct Weights {
  explicit Weights(ParameterCollection& pc) {
    E = pc.add_lookup_parameters("E", V, H);
    for (int k = 0; k < 8; ++k) {
      W[k] = pc.add_parameters("W" + std::to_string(k), Dim{H, H});
      U[k] = pc.add_parameters("U" + std::to_string(k), Dim{H, 2 * H});
      b[k] = pc.add_parameters("b" + std::to_string(k), Dim{H, 1});
    }
    bM = pc.add_parameters("bM", Dim{H, H});
    out = pc.add_parameters("out", Dim{C, H});
  }
  LookupParameter E;
  Parameter W[8], U[8], b[8], bM, out;
};

Expr P(Graph& g, Parameter p) { return parameter(g, p); }

std::vector<CellDef> cells(const Weights& w) {
  std::vector<CellDef> cs;
  const Dim h{H, 1};
  cs.push_back({"tree_lstm_leaf", {}, {V, C}, [&w](Graph& g, const std::vector<Expr>&, const Ints& ints) {
                  const Expr e = ints.embed(g, w.E, 0);
                  const Expr i = sigmoid(affine({P(g, w.b[0]), P(g, w.W[0]), e}));
                  const Expr o = sigmoid(affine({P(g, w.b[1]), P(g, w.W[1]), e}));
                  const Expr u = tanh(affine({P(g, w.b[2]), P(g, w.W[2]), e}));
                  const Expr c = cmult(i, u);
                  const Expr hh = cmult(o, tanh(c));
                  return std::vector<Expr>{hh, c, ints.loss(matmul(P(g, w.out), hh), 1)};
                }});
  cs.push_back({"tree_lstm_inner", {h, h, h, h}, {C}, [&w](Graph& g, const std::vector<Expr>& in, const Ints& ints) {
                  const Expr x = concat({in[0], in[2]});
                  const Expr i = sigmoid(affine({P(g, w.b[0]), P(g, w.U[0]), x}));
                  const Expr o = sigmoid(affine({P(g, w.b[1]), P(g, w.U[1]), x}));
                  const Expr u = tanh(affine({P(g, w.b[2]), P(g, w.U[2]), x}));
                  const Expr f1 = sigmoid(affine({P(g, w.b[3]), P(g, w.W[3]), in[0]}));
                  const Expr f2 = sigmoid(affine({P(g, w.b[3]), P(g, w.W[4]), in[2]}));
                  const Expr c = sum({cmult(i, u), cmult(f1, in[1]), cmult(f2, in[3])});
                  const Expr hh = cmult(o, tanh(c));
                  return std::vector<Expr>{hh, c, ints.loss(matmul(P(g, w.out), hh), 0)};
                }});
  cs.push_back({"lstm", {h, h, h}, {}, [&w](Graph& g, const std::vector<Expr>& in, const Ints&) {
                  Expr gate[4];
                  for (int k = 0; k < 4; ++k)
                    gate[k] = affine({P(g, w.b[k]), P(g, w.W[k]), in[0], P(g, w.W[k + 4]), in[1]});
                  const Expr i = sigmoid(gate[0]), f = sigmoid(gate[1]), o = sigmoid(gate[2]);
                  const Expr c = cmult(f, in[2]) + cmult(i, tanh(gate[3]));
                  return std::vector<Expr>{cmult(o, tanh(c)), c};
                }});
  cs.push_back({"gru", {h, h}, {}, [&w](Graph& g, const std::vector<Expr>& in, const Ints&) {
                  const Expr r = sigmoid(affine({P(g, w.b[0]), P(g, w.W[0]), in[0], P(g, w.W[1]), in[1]}));
                  const Expr z = sigmoid(affine({P(g, w.b[1]), P(g, w.W[2]), in[0], P(g, w.W[3]), in[1]}));
                  const Expr c = tanh(affine({P(g, w.b[2]), P(g, w.W[4]), in[0], P(g, w.W[5]), cmult(r, in[1])}));
                  return std::vector<Expr>{cmult(z, in[1]) + cmult(1.0f - z, c)};
                }});
  cs.push_back({"mvrnn", {h, Dim{H, H}, h, Dim{H, H}}, {}, [&w](Graph& g, const std::vector<Expr>& in, const Ints&) {
                  const Expr v = tanh(affine({P(g, w.b[4]), P(g, w.U[4]),
                                              concat({matmul(in[3], in[0]), matmul(in[1], in[2])})}));
                  const Expr M = affine({P(g, w.bM), P(g, w.U[5]), concat({in[1], in[3]})});
                  return std::vector<Expr>{v, M};
                }});
  // Pooling (maximum, average), normalisation and the other ops that are not GEMMs, with a
  // dropout keyed by the invocation's integer.
  cs.push_back({"pooled", {h, h, h}, {0xffffffffu}, [&w](Graph& g, const std::vector<Expr>& in, const Ints& ints) {
                  const Expr m = maximum({in[0], in[1], in[2]});
                  const Expr a = average({in[1], in[2]});
                  const Expr z = layer_norm(affine({P(g, w.b[5]), P(g, w.W[5]), m, P(g, w.W[6]), a}), 1e-5f);
                  const Expr s = softmax(slice_rows(gelu(z), 1, H - 1));
                  const Expr r = log_softmax(a / (2.0f + exp(in[0]))) + 0.5f / (1.5f + tanh(m));
                  return std::vector<Expr>{ints.drop(z, 0.25f, 0), s, r, sqrt(1.0f + cmult(m, m))};
                }});
  return cs;
}

// One random invocation: its input values (given through graph inputs, some through tanh so
// operands come from computed batches too) and integers.
struct Invocation {
  std::vector<std::vector<float>> inputs;
  std::vector<uint32_t> ints;
};

std::vector<Invocation> invocations(const CellDef& cell, uint32_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<Invocation> inv(k);
  for (auto& one : inv) {
    for (const Dim& d : cell.inputs) {
      one.inputs.emplace_back(d.size());
      for (float& x : one.inputs.back()) x = u(rng);
    }
    for (uint32_t lim : cell.int_limits) one.ints.push_back(static_cast<uint32_t>(rng() % lim));
  }
  return inv;
}

// A scalar from every output: (row^T out) col, summed over outputs and invocations.
Expr readout(Graph& g, const std::vector<Expr>& outs, uint32_t salt) {
  std::vector<Expr> terms;
  for (size_t o = 0; o < outs.size(); ++o) {
    const Dim d = g.node(outs[o].id).dim;
    if (d == Dim{1, 1}) {
      terms.push_back(outs[o]);
      continue;
    }
    std::vector<float> row(d.rows), col(d.cols);
    for (uint32_t r = 0; r < d.rows; ++r) row[r] = 0.1f * static_cast<float>((r * 7 + salt + o) % 5) - 0.2f;
    for (uint32_t c = 0; c < d.cols; ++c) col[c] = 0.3f - 0.1f * static_cast<float>((c + salt) % 4);
    terms.push_back(matmul(matmul(input(g, Dim{1, d.rows}, row), outs[o]), input(g, Dim{d.cols, 1}, col)));
  }
  return sum_losses(terms);
}

Expr feed(Graph& g, const Dim& d, const std::vector<float>& v, uint32_t i) {
  const Expr x = input(g, d, v);
  return i % 2 ? tanh(x) : x;
}

}  // namespace

TEST_CASE("blocks: every cell equals its op-by-op form and the reference, k = 1, 7, 64") {
  // Cells: Tree-LSTM leaf and inner, LSTM, GRU, MV-RNN, and a pooling cell (maximum, average,
  // layer norm, softmax, slices, dropout, ...).
  for (uint32_t k : {1u, 7u, 64u}) {
    ParameterCollection pc(5);
    Weights w(pc);
    for (const CellDef& cell : cells(w)) {
      const std::string cell_name = cell.name;
      CAPTURE(cell_name);
      CAPTURE(k);
      Block blk(pc, cell.name);
      std::vector<Expr> in;
      for (size_t j = 0; j < cell.inputs.size(); ++j)
        in.push_back(blk.input("in" + std::to_string(j), cell.inputs[j]));
      std::vector<uint32_t> slots;
      for (size_t s = 0; s < cell.int_limits.size(); ++s) slots.push_back(blk.index("i" + std::to_string(s)));
      Ints block_ints{[&](Graph&, LookupParameter t, uint32_t s) { return blk.lookup(t, slots[s]); },
                      [&](const Expr& x, uint32_t s) { return blk.pick_neg_log_softmax(x, slots[s]); },
                      [&](const Expr& x, float p, uint32_t s) { return blk.dropout(x, p, slots[s]); }};
      const std::vector<Expr> outs = cell.math(blk.body(), in, block_ints);
      for (size_t o = 0; o < outs.size(); ++o) blk.output("out" + std::to_string(o), outs[o]);
      blk.freeze();
      CHECK(blk.plan().steps.size() >= blk.plan().lower_bound);
      if (cell_name == "tree_lstm_inner") {
        // i, o, u multiply column views of U0..U2 in one step, f1 and f2 W3 and W4: their
        // weights now live stacked, one after the other.
        CHECK(pc.adjacent(w.U[0].id, w.U[1].id));
        CHECK(pc.adjacent(w.U[1].id, w.U[2].id));
        CHECK(pc.adjacent(w.W[3].id, w.W[4].id));
      }

      const auto inv = invocations(cell, k, 100 + k);
      Graph gb(pc), go(pc);
      std::vector<Expr> lb, lo;
      for (uint32_t i = 0; i < k; ++i) {
        std::vector<Expr> xb, xo;
        for (size_t j = 0; j < cell.inputs.size(); ++j) {
          xb.push_back(feed(gb, cell.inputs[j], inv[i].inputs[j], i));
          xo.push_back(feed(go, cell.inputs[j], inv[i].inputs[j], i));
        }
        lb.push_back(readout(gb, blk(gb, xb, inv[i].ints), i));
        const std::vector<uint32_t>& ints = inv[i].ints;
        Ints direct{[&](Graph& g, LookupParameter t, uint32_t s) { return lookup(g, t, ints[s]); },
                    [&](const Expr& x, uint32_t s) { return pick_neg_log_softmax(x, ints[s]); },
                    [&](const Expr& x, float p, uint32_t s) { return dropout(x, p, ints[s]); }};
        lo.push_back(readout(go, cell.math(go, xo, direct), i));
      }
      const Expr loss_b = sum_losses(lb), loss_o = sum_losses(lo);

      Reference ref(gb);
      ref.forward();
      ref.backward(loss_b.id);
      const EngineRun op = run_engine(go, loss_o, "agenda", 1);
      for (const char* policy : {"none", "agenda", "lb-greedy"})
        for (int threads : {1, 2}) {
          const std::string policy_name = policy;
          CAPTURE(policy_name);
          CAPTURE(threads);
          const EngineRun blocked = run_engine(gb, loss_b, policy, threads);
          const double ref_loss = ref.values[loss_b.id][0];
          check_close(&blocked.loss, &ref_loss, 1, 1e-4, "loss vs reference");
          check_close(&blocked.loss, &op.loss, 1, 1e-4, "loss vs op by op");
          for (uint32_t p = 0; p < pc.size(); ++p) {
            if (pc.is_view(p)) continue;
            const size_t n = blocked.grads[p].size();
            check_close(blocked.grads[p].data(), ref.param_grads[p].data(), n, 2e-4,
                        "gradient of " + pc.name(p) + " vs reference");
            check_close(blocked.grads[p].data(), op.grads[p].data(), n, 2e-4,
                        "gradient of " + pc.name(p) + " vs op by op");
          }
        }
    }
  }
}

TEST_CASE("blocks: calls whose inputs are parameters batch apart and equal the reference") {
  // A chain of LSTM-like cells whose first step reads a learned initial state (parameters) and
  // the others computed states: calls of one block with a parameter in a slot must not share a
  // batch (and an operand mode) with calls that read arena values there.
  ParameterCollection pc(9);
  const Parameter W = pc.add_parameters("W", Dim{H, H}), U = pc.add_parameters("U", Dim{H, H});
  const Parameter b = pc.add_parameters("b", Dim{H, 1}), h0 = pc.add_parameters("h0", Dim{H, 1});
  const Parameter h1 = pc.add_parameters("h1", Dim{H, 1});
  Block step(pc, "step");
  const Expr x = step.input("x", Dim{H, 1}), h = step.input("h", Dim{H, 1});
  Graph& body = step.body();
  step.output("h", tanh(affine({parameter(body, b), parameter(body, W), x, parameter(body, U), h})));
  step.freeze();
  Graph g(pc);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < 9; ++i) {
    Expr state = parameter(g, i % 3 == 2 ? h1 : h0);
    for (uint32_t t = 0; t < 1 + i % 4; ++t) {
      std::vector<float> v(H);
      for (float& f : v) f = u(rng);
      // Odd chains feed a parameter again in the middle: parameter and computed inputs mix.
      if (t == 2 && i % 2) state = parameter(g, h0);
      state = step(g, {input(g, Dim{H, 1}, v), state})[0];
    }
    losses.push_back(pick(state, i % H));
  }
  const Expr loss = sum_losses(losses);
  Reference ref(g);
  ref.forward();
  ref.backward(loss.id);
  for (int threads : {1, 2}) {
    const EngineRun run = run_engine(g, loss, "lb-greedy", threads);
    check_close(&run.loss, &ref.values[loss.id][0], 1, 1e-5, "loss vs reference");
    for (uint32_t p = 0; p < pc.size(); ++p)
      check_close(run.grads[p].data(), ref.param_grads[p].data(), run.grads[p].size(), 1e-4,
                  "gradient of " + pc.name(p) + " vs reference");
  }
}

TEST_CASE("blocks: calls with many inputs equal the reference, and name a wrong one") {
  // 21 inputs: more than a call keeps on the stack. Each call mixes them with its own weights per
  // input slot; two calls per chain link read the previous link's output in different slots.
  constexpr uint32_t kInputs = 21;
  ParameterCollection pc(5);
  std::vector<Parameter> W;
  for (uint32_t k = 0; k < kInputs; ++k)
    W.push_back(pc.add_parameters("W" + std::to_string(k), Dim{H, H}));
  Block mix(pc, "mix");
  std::vector<Expr> terms;
  for (uint32_t k = 0; k < kInputs; ++k)
    terms.push_back(
        matmul(parameter(mix.body(), W[k]), mix.input("x" + std::to_string(k), Dim{H, 1})));
  mix.output("h", tanh(sum(terms)));
  mix.freeze();
  Graph g(pc);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<Expr> xs, losses;
  for (uint32_t k = 0; k < kInputs; ++k) {
    std::vector<float> v(H);
    for (float& f : v) f = u(rng);
    xs.push_back(input(g, Dim{H, 1}, v));
  }
  for (uint32_t step = 0; step < 3; ++step) {
    std::vector<Expr> a = xs, b = xs;
    a[step] = mix(g, xs)[0];
    b[kInputs - 1 - step] = a[step];
    xs[step % kInputs] = mix(g, b)[0];
    losses.push_back(pick(a[step], step));
    losses.push_back(pick(xs[step % kInputs], (step + 3) % H));
  }
  const Expr loss = sum_losses(losses);
  Reference ref(g);
  ref.forward();
  ref.backward(loss.id);
  const EngineRun run = run_engine(g, loss, "lb-greedy", 1);
  check_close(&run.loss, &ref.values[loss.id][0], 1, 1e-5, "loss vs reference");
  for (uint32_t p = 0; p < pc.size(); ++p)
    check_close(run.grads[p].data(), ref.param_grads[p].data(), run.grads[p].size(), 1e-4,
                "gradient of " + pc.name(p) + " vs reference");
  std::vector<Expr> wrong = xs;
  wrong[19] = input(g, Dim{H + 1, 1}, std::vector<float>(H + 1, 0.5f));
  CHECK_THROWS_WITH_AS(mix(g, wrong), doctest::Contains("input 'x19' has shape 8, expected 7"),
                       std::invalid_argument);
  Graph other(pc);
  wrong[19] = input(other, Dim{H, 1}, std::vector<float>(H, 0.5f));
  CHECK_THROWS_WITH_AS(mix(g, wrong), doctest::Contains("input 'x19' is from another graph"),
                       std::invalid_argument);
}

TEST_CASE("blocks: misuse is reported with the block's name") {
  ParameterCollection pc(2);
  const Parameter W = pc.add_parameters("W", Dim{3, 3});
  Block blk(pc, "cell");
  const Expr x = blk.input("x", Dim{3, 1});
  Graph g(pc);
  const Expr in = input(g, Dim{3, 1}, std::vector<float>{1, 2, 3});
  CHECK_THROWS_WITH_AS(blk(g, {in}), doctest::Contains("call freeze() before invoking"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(blk.freeze(), doctest::Contains("no outputs declared"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(blk.output("x", x), doctest::Contains("not computed by the body"),
                       std::invalid_argument);
  blk.output("y", tanh(matmul(parameter(blk.body(), W), x)));
  CHECK_THROWS_WITH_AS(Block(pc, "cell"), doctest::Contains("already exists"), std::invalid_argument);
  blk.freeze();
  CHECK_THROWS_WITH_AS(blk.freeze(), doctest::Contains("already frozen"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(blk.input("z", Dim{3, 1}), doctest::Contains("after freeze()"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(blk(g, {}), doctest::Contains("expects 1 inputs, got 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(blk(g, {in, in}), doctest::Contains("expects 1 inputs, got 2"),
                       std::invalid_argument);
  const Expr wrong = input(g, Dim{4, 1}, std::vector<float>{1, 2, 3, 4});
  CHECK_THROWS_WITH_AS(blk(g, {wrong}), doctest::Contains("input 'x' has shape 4, expected 3"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(blk(g, {in}, {7}), doctest::Contains("expects 0 integers, got 1"),
                       std::invalid_argument);
  Graph other(pc);
  const Expr foreign = input(other, Dim{3, 1}, std::vector<float>{1, 2, 3});
  CHECK_THROWS_WITH_AS(blk(g, {foreign}), doctest::Contains("from another graph"),
                       std::invalid_argument);
  // An input made by hand past the graph's nodes, and one from before clear().
  const Expr past{&g, g.size() + 5, g.generation()};
  CHECK_THROWS_WITH_AS(blk(g, {past}), doctest::Contains("[Block::call] expression"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(blk(g, {past}), doctest::Contains("past the graph's"),
                       std::invalid_argument);
  const Expr in_other = input(other, Dim{3, 1}, std::vector<float>{1, 2, 3});
  other.clear();
  CHECK_THROWS_WITH_AS(blk(other, {in_other}), doctest::Contains("from before Graph::clear()"),
                       std::invalid_argument);

  // Integers are range-checked at the call, where the caller can still be named.
  const LookupParameter E = pc.add_lookup_parameters("E", 5, 3);
  Block leaf(pc, "leaf");
  const uint32_t word = leaf.index("word");
  leaf.output("h", tanh(leaf.lookup(E, word)));
  leaf.freeze();
  CHECK_THROWS_WITH_AS(leaf(g, {}, {5}), doctest::Contains("integer 'word' = 5 is out of range"),
                       std::invalid_argument);
  CHECK_NOTHROW(leaf(g, {}, {4}));
}

TEST_CASE("blocks: planned layouts on random trees: outputs contiguous, views are real views") {
  // Tree-LSTM-like cells over random trees; every policy; with and without outer planning. Each
  // batch's outputs must be where the plan says, and every operand classified as a view must
  // read exactly the argument's value.
  ParameterCollection pc(9);
  Weights w(pc);
  const std::vector<CellDef> cs = cells(w);
  Block leaf(pc, "leaf"), inner(pc, "inner");
  for (int which = 0; which < 2; ++which) {
    Block& blk = which == 0 ? leaf : inner;
    std::vector<Expr> in;
    for (size_t j = 0; j < cs[which].inputs.size(); ++j)
      in.push_back(blk.input("in" + std::to_string(j), cs[which].inputs[j]));
    std::vector<uint32_t> slots;
    for (size_t s = 0; s < cs[which].int_limits.size(); ++s) slots.push_back(blk.index("i" + std::to_string(s)));
    Ints ints{[&](Graph&, LookupParameter t, uint32_t s) { return blk.lookup(t, slots[s]); },
              [&](const Expr& x, uint32_t s) { return blk.pick_neg_log_softmax(x, slots[s]); },
              [&](const Expr& x, float p, uint32_t s) { return blk.dropout(x, p, slots[s]); }};
    const std::vector<Expr> outs = cs[which].math(blk.body(), in, ints);
    for (size_t o = 0; o < outs.size(); ++o) blk.output("o" + std::to_string(o), outs[o]);
    blk.freeze();
  }
  std::mt19937_64 rng(17);
  uint64_t gathered_total = 0;  // some layouts must gather, or the accounting check is empty
  for (int trial = 0; trial < 12; ++trial) {
    Graph g(pc);
    std::vector<Expr> losses;
    for (int t = 0; t < 1 + trial % 5; ++t) {
      const Tree tree = edbatch::testing::random_tree(rng, 1 + static_cast<uint32_t>(rng() % 23), V);
      std::vector<Expr> h(tree.nodes.size()), c(tree.nodes.size());
      for (size_t k = 0; k < tree.nodes.size(); ++k) {
        const TreeNode& n = tree.nodes[k];
        std::vector<Expr> out = n.leaf() ? leaf(g, {}, {n.word, n.label})
                                         : inner(g, {h[n.left], c[n.left], h[n.right], c[n.right]}, {n.label});
        h[k] = out[0];
        c[k] = out[1];
        losses.push_back(out[2]);
      }
    }
    const Expr loss = sum_losses(losses);
    for (const char* policy : {"none", "depth", "lb-greedy"})
      for (bool plan : {true, false}) {
        EngineOptions o{policy, "cpu", 1};
        o.order_for_consumers = plan;
        Engine e(pc, o);
        e.forward(g, loss);
        const Schedule& s = e.schedule();
        const MemoryPlan& p = e.plan();
        validate_schedule(g, s);
        // The plan's gather accounting (what the null backend reports) is what the CPU gathered.
        EngineOptions on = o;
        on.device = "null";
        Engine null_engine(pc, on);
        null_engine.forward(g, loss);
        CHECK(null_engine.stats().bytes_copied == e.stats().bytes_copied);
        CHECK(null_engine.stats().kernels == e.stats().kernels);
        gathered_total += e.stats().bytes_copied;
        const float* base = e.value(loss).data - p.node_offset[loss.id];
        for (size_t b = 0; b < s.batches.size(); ++b) {
          const Batch& batch = s.batches[b];
          const BatchPlan& bp = p.batches[b];
          const Node& first = g.node(s.nodes[batch.begin]);
          for (uint32_t i = 0; i < batch.count; ++i) {
            const uint32_t v = s.nodes[batch.begin + i];
            if (first.op != Op::Call) {
              CHECK(e.value(g.expr(v)).data == base + bp.out_offset + i * bp.out_size);
              continue;
            }
            // Each output of the k calls is one contiguous run, in member order.
            const BlockPlan& bpl = (first.aux == leaf.id() ? leaf : inner).plan();
            for (uint32_t o = 0; o < bpl.output_node.size(); ++o) {
              const uint32_t t = bpl.output_node[o];
              CHECK(e.value(g.expr(v + 1 + o)).data ==
                    base + bp.out_offset + batch.count * bpl.base[t] + i * bpl.body->node(t).dim.size());
            }
          }
          if (g.types().is_ragged(first.type)) continue;
          for (uint32_t j = 0; j < bp.operand_count; ++j) {
            const Operand& op = p.operands[bp.operand_begin + j];
            for (uint32_t i = 0; i < batch.count; ++i) {
              const uint32_t arg = g.args(g.node(s.nodes[batch.begin + i]))[j];
              const float* actual = g.node(arg).op == Op::Parameter ? pc.values(g.node(arg).aux)
                                                                    : e.value(g.expr(arg)).data;
              if (op.mode == OperandMode::Contiguous) CHECK(actual == base + op.offset + i * op.stride);
              if (op.mode == OperandMode::Indexed) CHECK(actual == base + p.index[op.index_begin + i]);
              if (op.mode == OperandMode::Shared) CHECK(actual == base + op.offset);
            }
          }
        }
      }
  }
  CHECK(gathered_total > 0);
}

TEST_CASE(
    "blocks: a long concat in a body runs nested; a step of more than 64 operands is refused") {
  // concat builds more than 8 arguments as a concat of concats (what the CUDA kernels read),
  // in a block body as anywhere: 70 rows of i * tanh(x), each where it belongs, and the input's
  // gradient the sum of their derivatives.
  ParameterCollection pc(1);
  Block wide(pc, "wide70");
  const Expr x = wide.input("x", Dim{1, 1});
  std::vector<Expr> parts;
  for (int i = 0; i < 70; ++i) parts.push_back(scalar_affine(tanh(x), static_cast<float>(i), 0));
  wide.output("y", concat(parts));
  wide.freeze();
  Graph g(pc);
  const Expr in = input(g, 0.5f);
  const Expr y = wide(g, {in})[0];
  const Expr loss = column_sum(y);
  Engine engine(pc);
  engine.forward(g, loss);
  const Tensor t = engine.value(y);
  REQUIRE(t.dim.rows == 70);
  for (int i = 0; i < 70; ++i) CHECK(t.data[i] == doctest::Approx(i * std::tanh(0.5)));
  engine.backward(g, loss);
  const double dtanh = 1 - std::tanh(0.5) * std::tanh(0.5);
  CHECK(engine.gradient(in).data[0] == doctest::Approx(dtanh * 69 * 70 / 2).epsilon(1e-5));
  // A sum of 70 arguments is one step of 70 operands: refused when the body is compiled.
  Block many(pc, "sum70");
  const Expr z = many.input("z", Dim{2, 1});
  many.output("s", sum(std::vector<Expr>(70, tanh(z))));
  try {
    many.freeze();
    FAIL("a body step of 70 operands was compiled");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("[Block::freeze] block 'sum70': body node") !=
          std::string::npos);
    CHECK(std::string(e.what()).find("has 70 arguments, and a block step reads at most 64: "
                                     "split it") != std::string::npos);
  }
}

TEST_CASE("blocks: restacking keeps every parameter's values, gradients and views") {
  // Each stack moves its parameters into a new storage and frees the storages nothing reads any
  // more; a parameter left behind in a shared storage (A after B moves on) must survive.
  ParameterCollection pc{3};
  std::vector<Parameter> p;
  for (const char* name : {"A", "B", "C", "D"}) p.push_back(pc.add_parameters(name, Dim{2, 3}));
  const Parameter view = pc.add_view("B_right", p[1], 1, 2);
  std::vector<std::vector<float>> values, grads;
  for (size_t i = 0; i < p.size(); ++i) {
    for (size_t j = 0; j < 6; ++j) pc.grads(p[i].id)[j] = static_cast<float>(10 * i + j);
    values.emplace_back(pc.values(p[i].id), pc.values(p[i].id) + 6);
    grads.emplace_back(pc.grads(p[i].id), pc.grads(p[i].id) + 6);
  }
  REQUIRE(pc.stack({p[0].id, p[1].id}));
  REQUIRE(pc.stack({p[1].id, p[2].id}));
  REQUIRE(pc.stack({p[3].id, p[0].id}));
  CHECK(pc.adjacent(p[1].id, p[2].id));
  CHECK(pc.adjacent(p[3].id, p[0].id));
  for (size_t i = 0; i < p.size(); ++i) {
    CAPTURE(i);
    CHECK(std::vector<float>(pc.values(p[i].id), pc.values(p[i].id) + 6) == values[i]);
    CHECK(std::vector<float>(pc.grads(p[i].id), pc.grads(p[i].id) + 6) == grads[i]);
  }
  // Column-major 2 x 3: the view of B's columns 1..2 starts at its third float.
  CHECK(std::vector<float>(pc.values(view.id), pc.values(view.id) + 4) ==
        std::vector<float>(values[1].begin() + 2, values[1].end()));
}
