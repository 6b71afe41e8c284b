// Memory plans: contiguous batch outputs, operand modes that match the real addresses, and an
// arena that stops growing after warm-up.
#include <doctest/doctest.h>

#include <random>

#include "edbatch/edbatch.h"
#include "edbatch/zoo.h"
#include "tests/models.h"

using namespace edbatch;
using namespace edbatch::testing;

namespace {
Expr build_trees(Graph& g, const TreeLstmOps& m, uint64_t seed, uint32_t count) {
  std::mt19937_64 rng(seed);
  return random_tree_losses(g, m, rng, count, 30);
}
}  // namespace

TEST_CASE("memory: batch outputs are contiguous and operand modes match addresses") {
  ParameterCollection pc(3);
  TreeLstmOps model(pc, 11, 6);
  TestModels models(pc, 6, 11);
  Graph g(pc);
  std::mt19937_64 rng(5);
  const Expr loss = build_trees(g, model, 9, 7) + models.lattice(g, rng, 40);
  for (const std::string& policy : policy_names()) {
    CAPTURE(policy);
    Engine e(pc, EngineOptions{policy, "cpu", 1});
    e.forward(g, loss);
    const Schedule& s = e.schedule();
    const MemoryPlan& p = e.plan();
    REQUIRE(p.batches.size() == s.batches.size());
    const float* base = e.value(g.expr(s.nodes[0])).data - p.node_offset[s.nodes[0]];
    for (size_t b = 0; b < s.batches.size(); ++b) {
      const Batch& batch = s.batches[b];
      const BatchPlan& bp = p.batches[b];
      for (uint32_t i = 0; i < batch.count; ++i) {
        const uint32_t v = s.nodes[batch.begin + i];
        CHECK(e.value(g.expr(v)).data == base + bp.out_offset + i * bp.out_size);
      }
      const Node& first = g.node(s.nodes[batch.begin]);
      if (g.types().is_ragged(first.type)) continue;
      for (uint32_t j = 0; j < bp.operand_count; ++j) {
        const Operand& o = p.operands[bp.operand_begin + j];
        for (uint32_t i = 0; i < batch.count; ++i) {
          const Node& n = g.node(s.nodes[batch.begin + i]);
          const uint32_t arg = g.args(n)[j];
          const float* actual = e.value(g.expr(arg)).data;
          switch (o.mode) {
            case OperandMode::Param: CHECK(actual == pc.values(o.param)); break;
            case OperandMode::Shared: CHECK(actual == base + o.offset); break;
            case OperandMode::Contiguous: CHECK(actual == base + o.offset + i * o.stride); break;
            case OperandMode::Indexed: CHECK(actual == base + p.index[o.index_begin + i]); break;
            case OperandMode::Ragged: FAIL("ragged operand on an exact type"); break;
            case OperandMode::PerMember: FAIL("per-member operand outside a block"); break;
          }
        }
      }
    }
  }
}

TEST_CASE("memory: steady-state iterations do not grow the arena") {
  ParameterCollection pc(3);
  TreeLstmOps model(pc, 11, 9);
  Engine e(pc, EngineOptions{"agenda", "cpu", 2});
  Graph g(pc);
  // Warm up on the largest mini-batch shape, then run different, smaller ones.
  uint64_t growths_after_warmup = 0;
  for (int it = 0; it < 8; ++it) {
    g.clear();
    const Expr loss = build_trees(g, model, 100 + it, it == 0 ? 12 : 8);
    e.forward(g, loss);
    e.backward(g, loss);
    pc.sgd_update(0.01f);
    if (it == 0) growths_after_warmup = e.stats().arena_growths;
  }
  CHECK(growths_after_warmup > 0);
  CHECK(e.stats().arena_growths == growths_after_warmup);
}

TEST_CASE("memory: the null backend walks the plan without values") {
  ParameterCollection pc(3);
  TreeLstmOps model(pc, 11, 9);
  Graph g(pc);
  const Expr loss = build_trees(g, model, 4, 5);
  Engine cpu(pc, EngineOptions{"agenda", "cpu", 1});
  Engine null(pc, EngineOptions{"agenda", "null", 1});
  cpu.forward(g, loss);
  cpu.backward(g, loss);
  null.forward(g, loss);
  null.backward(g, loss);
  CHECK(null.stats().batches == cpu.stats().batches);
  CHECK(null.stats().kernels == cpu.stats().kernels);
  CHECK(cpu.stats().stages == cpu.stats().kernels);  // nothing is chained on the CPU
  CHECK(null.stats().stages == cpu.stats().stages);
  CHECK(null.stats().bytes_copied == cpu.stats().bytes_copied);
  CHECK_THROWS_WITH_AS(as_scalar(null.forward(g, loss)), doctest::Contains("null backend"),
                       std::runtime_error);
}

TEST_CASE("memory: a backward pass's adjoints do not depend on what an earlier pass left") {
  // Adjoints accumulate, so the backend must clear what a pass left: a larger pass run first on
  // the same engine leaves its adjoints all over the arena, and a smaller graph of another shape
  // must still get the gradients a fresh engine gives, bitwise, for every node (inputs, a node
  // nothing reads, the loss) and every parameter.
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    ParameterCollection pc(3);
    TreeLstmOps model(pc, 11, 6);
    TestModels models(pc, 6, 11);
    auto small_pass = [&](Engine& e) {
      pc.zero_grads();
      Graph g(pc);
      std::mt19937_64 rng(5);
      // exp: an op nothing else in these models uses, so its batch is read by no batch.
      const Expr unread = exp(input(g, Dim{6, 1}, std::vector<float>(6, 0.5f)));
      const Expr loss =
          build_trees(g, model, 9, 4) + models.lattice(g, rng, 23) + models.dag(g, rng, 17);
      e.forward(g, loss);
      e.backward(g, loss);
      std::vector<std::vector<float>> grads;
      for (uint32_t v = 0; v < g.nodes().size(); ++v)
        if (g.nodes()[v].op != Op::Parameter && g.nodes()[v].op != Op::Lookup)
          grads.push_back(as_vector(e.gradient(g.expr(v))));
      const std::vector<float> unread_grad = as_vector(e.gradient(unread));
      CHECK(unread_grad == std::vector<float>(6, 0.0f));
      for (uint32_t id = 0; id < pc.size(); ++id)
        grads.emplace_back(pc.grads(id), pc.grads(id) + pc.dim(id).size());
      return grads;
    };
    Engine used(pc, EngineOptions{"lb-greedy", "cpu", threads});
    {
      Graph big(pc);
      std::mt19937_64 rng(7);
      const Expr loss =
          build_trees(big, model, 21, 12) + models.lattice(big, rng, 61) + models.dag(big, rng, 40);
      used.forward(big, loss);
      used.backward(big, loss);
    }
    const auto after_big = small_pass(used);
    Engine fresh(pc, EngineOptions{"lb-greedy", "cpu", threads});
    const auto alone = small_pass(fresh);
    REQUIRE(after_big.size() == alone.size());
    for (size_t i = 0; i < alone.size(); ++i) {
      CAPTURE(i);
      CHECK(after_big[i] == alone[i]);
    }
  }
}
