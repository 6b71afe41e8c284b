// The pipelining API on any backend (Engine::submit / result / sgd_update) and the collection's
// device fetch: results equal forward(), tickets run out, the engine's update equals the
// collection's, and a pending fetch runs once before any host access. (tests/test_cuda.cpp checks
// the same API where passes really are asynchronous.)
#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <vector>

#include "edbatch/edbatch.h"
#include "edbatch/zoo.h"
#include "tests/check.h"
#include "tests/models.h"

using namespace edbatch;
using namespace edbatch::testing;

namespace {
Expr random_batch(Graph& g, const TreeLstmOps& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint32_t count = 1 + static_cast<uint32_t>(rng() % 5);
  return random_tree_losses(g, m, rng, count, 13);
}
}  // namespace

TEST_CASE("pipeline: submitted results equal forward, and spent tickets are refused") {
  ParameterCollection pc(3);
  TreeLstmOps model(pc, 11, 7);
  Engine plain(pc, EngineOptions{"agenda", "cpu", 1});
  Engine piped(pc, EngineOptions{"lb-greedy", "cpu", 1});
  Graph g(pc);
  std::vector<float> expected;
  for (uint64_t i = 0; i < 6; ++i) {
    g.clear();
    expected.push_back(as_scalar(plain.forward(g, random_batch(g, model, 40 + i))));
  }
  std::vector<uint64_t> tickets;
  std::vector<std::unique_ptr<Graph>> graphs;
  for (uint64_t i = 0; i < 6; ++i) {
    graphs.push_back(std::make_unique<Graph>(pc));
    Graph& gi = *graphs.back();
    tickets.push_back(piped.submit(gi, random_batch(gi, model, 40 + i)));
    if (i >= 1) {
      const Tensor t = piped.result(tickets[i - 1]);
      CHECK(t.dim == Dim{1, 1});
      CHECK(as_scalar(t) == doctest::Approx(expected[i - 1]).epsilon(1e-5));
    }
  }
  CHECK(as_scalar(piped.result(tickets[5])) == doctest::Approx(expected[5]).epsilon(1e-5));
  // Four results are kept; older tickets are spent, unissued ones refused.
  CHECK(as_scalar(piped.result(tickets[2])) == doctest::Approx(expected[2]).epsilon(1e-5));
  CHECK_THROWS_WITH_AS(piped.result(tickets[1]), doctest::Contains("spent"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(piped.result(99), doctest::Contains("never issued"), std::invalid_argument);
  // After submit the engine is at that graph: backward and value work as after forward.
  Graph& last = *graphs.back();
  const Expr loss = last.expr(last.size() - 1);
  piped.backward(last, loss);
  CHECK(as_scalar(piped.value(loss)) == doctest::Approx(expected[5]).epsilon(1e-5));
  // A parameter's result is its value in the collection.
  Graph h(pc);
  uint32_t id = 0;
  while (pc.is_lookup(id)) ++id;
  const Expr p = parameter(h, Parameter{id});
  const Tensor t = piped.result(piped.submit(h, p));
  CHECK(t.dim == pc.dim(id));
  CHECK(t.data[0] == pc.values(id)[0]);
  // enqueue: the forward without a staged value; the engine is at the graph as after forward.
  Graph q(pc);
  const Expr lq = random_batch(q, model, 43);
  piped.enqueue(q, lq);
  CHECK(as_scalar(piped.value(lq)) == doctest::Approx(expected[3]).epsilon(1e-5));
  piped.backward(q, lq);
}

TEST_CASE("pipeline: Engine::sgd_update equals the collection's update") {
  ParameterCollection a(9), b(9);
  TreeLstmOps ma(a, 11, 5), mb(b, 11, 5);
  Engine ea(a, EngineOptions{"agenda", "cpu", 1}), eb(b, EngineOptions{"agenda", "cpu", 1});
  Graph ga(a), gb(b);
  for (uint64_t step = 0; step < 3; ++step) {
    ga.clear();
    gb.clear();
    const Expr la = random_batch(ga, ma, 70 + step), lb = random_batch(gb, mb, 70 + step);
    ea.forward(ga, la);
    ea.backward(ga, la);
    a.sgd_update(0.2f);
    eb.submit(gb, lb);
    eb.backward(gb, lb);
    eb.sgd_update(0.2f);
  }
  for (uint32_t p = 0; p < a.size(); ++p) {
    check_close(b.values(p), a.values(p), a.dim(p).size(), 0, "values of " + a.name(p));
    check_close(b.grads(p), a.grads(p), a.dim(p).size(), 0, "gradients of " + a.name(p));
  }
}

TEST_CASE("params: a pending device fetch runs once, before any host access") {
  ParameterCollection pc(1);
  const Parameter w = pc.add_parameters("w", Dim{3, 2});
  int fetches = 0;
  const int owner = 0, other = 0;
  // The fetch writes the "device's" numbers into the host copy.
  pc.set_device_fetch(&owner, [&] {
    ++fetches;
    pc.values(w.id)[0] = 42.0f;  // re-entrant host access inside the fetch is allowed
  });
  CHECK(fetches == 0);
  CHECK(pc.device_fetch_owner() == &owner);
  CHECK(pc.values(w.id)[0] == 42.0f);
  CHECK(fetches == 1);
  CHECK(pc.device_fetch_owner() == nullptr);
  pc.grads(w.id);
  CHECK(fetches == 1);

  // Every host access fetches first: gradients, zeroing, updating, adding, the norm.
  auto arm = [&] { pc.set_device_fetch(&owner, [&] { ++fetches; }); };
  arm();
  pc.grads(w.id);
  arm();
  pc.zero_grads();
  arm();
  pc.sgd_update(0.1f);
  arm();
  pc.grad_squared_norm();
  arm();
  pc.add_parameters("v", Dim{2, 2});
  CHECK(fetches == 6);

  // The same owner replaces its own pending fetch; another owner's runs first.
  arm();
  arm();
  CHECK(fetches == 6);
  pc.set_device_fetch(&other, [&] { fetches += 10; });
  CHECK(fetches == 7);
  pc.fetch_from_device();
  CHECK(fetches == 17);

  // An update made on the device: new version, lookup marks cleared, fetch pending.
  const LookupParameter table = pc.add_lookup_parameters("table", 5, 2);
  pc.mark_lookup_row(table.id, 3);
  const uint64_t version = pc.version();
  pc.updated_on_device(&owner, [&] { ++fetches; });
  CHECK(pc.version() > version);
  CHECK(pc.device_fetch_owner() == &owner);
  pc.grads(table.id)[6] = 1.0f;  // fetches (18), then a host-side gradient in row 3 ...
  CHECK(fetches == 18);
  const float before = pc.values(table.id)[6];
  pc.sgd_update(1.0f);  // ... which the host update ignores: row 3 is no longer marked
  CHECK(pc.values(table.id)[6] == before);
}

namespace {
// Chains over input vectors (x_t of 3 floats): h = tanh(W x_t + U h + b), summed squares of h.
Expr input_chains(Graph& g, ParameterCollection& pc, const std::vector<float>& xs) {
  const Parameter W{pc.find("W")}, U{pc.find("U")}, b{pc.find("b")};
  std::vector<Expr> losses;
  size_t at = 0;
  for (uint32_t length : {1u, 4u, 2u, 7u}) {
    Expr h = parameter(g, b);
    for (uint32_t t = 0; t < length; ++t, at += 3) {
      const Expr x = input(g, Dim{3, 1}, xs.data() + at);
      h = tanh(affine({parameter(g, b), parameter(g, W), x, parameter(g, U), h}));
    }
    losses.push_back(matmul(reshape(h, Dim{1, 5}), h));
  }
  return sum_losses(losses);
}
}  // namespace

TEST_CASE("pipeline: a prepared graph runs its plan, and rewritten inputs run it again") {
  ParameterCollection pc(9);
  pc.add_parameters("W", Dim{5, 3});
  pc.add_parameters("U", Dim{5, 5});
  pc.add_parameters("b", Dim{5, 1});
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> xs(14 * 3), ys(14 * 3);
  for (float& v : xs) v = uniform(rng);
  for (float& v : ys) v = uniform(rng);
  Graph a(pc), b(pc);
  const Expr la = input_chains(a, pc, xs);
  Engine prepared(pc, EngineOptions{"lb-greedy", "cpu", 1});
  prepared.prepare(a);
  CHECK_THROWS_WITH_AS(prepared.value(la), doctest::Contains("prepared but not run"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(prepared.backward(a, la), doctest::Contains("run forward()"),
                       std::invalid_argument);
  // The same graph built and run by another engine, first on xs, then on ys.
  Engine fresh(pc, EngineOptions{"agenda", "cpu", 1});
  const Expr lb = input_chains(b, pc, xs);
  const float on_xs = as_scalar(fresh.forward(b, lb));
  CHECK(as_scalar(prepared.forward(a, la)) == doctest::Approx(on_xs).epsilon(1e-6));
  a.write_inputs(0, ys.data(), ys.size());
  CHECK_THROWS_WITH_AS(prepared.backward(a, la), doctest::Contains("run forward()"),
                       std::invalid_argument);
  Graph c(pc);
  const Expr lc = input_chains(c, pc, ys);
  const float on_ys = as_scalar(fresh.forward(c, lc));
  CHECK(on_ys != doctest::Approx(on_xs).epsilon(1e-3));
  CHECK(as_scalar(prepared.forward(a, la)) == doctest::Approx(on_ys).epsilon(1e-6));
  // Backward after the rerun: the inputs' adjoints are those of the graph built on ys.
  prepared.backward(a, la);
  fresh.backward(c, lc);
  for (uint32_t id = 0; id < a.size(); ++id) {
    if (a.node(id).op != Op::Input) continue;
    const std::vector<float> got = as_vector(prepared.gradient(a.expr(id)));
    const std::vector<float> want = as_vector(fresh.gradient(c.expr(id)));
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
  CHECK_THROWS_WITH_AS(a.write_inputs(40, ys.data(), 3), doctest::Contains("outside the graph"),
                       std::invalid_argument);
}
