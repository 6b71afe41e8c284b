// An incremental forward that repeats the increment before (repeat_last_segment: a decoding step
// over the same sentences) is planned by shifting that increment's schedule and plan. Against an
// engine that plans every increment (plan reuse off): the same schedule and plan, entry by entry,
// and bitwise the same values and gradients, for lstm_nmt's greedy decoding and for recurrent
// steps that read the step before, two steps before, a fixed earlier value (the step repeats but
// its operands are planned), or every state so far (never repeats), and for a graph built whole
// and run through its equal instances one by one, under several policies.
#include <doctest/doctest.h>

#include <random>

#include "edbatch/block.h"
#include "edbatch/engine.h"
#include "edbatch/models.h"
#include "tests/check.h"
#include "tests/step_net.h"

using namespace edbatch;
using edbatch::testing::bitwise_equal;
using edbatch::testing::StepNet;

namespace {

bool same_operand(const Operand& a, const Operand& b) {
  return a.mode == b.mode && a.param == b.param && a.offset == b.offset && a.stride == b.stride &&
         a.index_begin == b.index_begin;
}

bool same_batch_plan(const BatchPlan& a, const BatchPlan& b) {
  return a.out_offset == b.out_offset && a.out_size == b.out_size &&
         a.operand_begin == b.operand_begin && a.operand_count == b.operand_count &&
         a.aux_begin == b.aux_begin && a.count == b.count && a.step_begin == b.step_begin &&
         a.step_count == b.step_count;
}

bool same_segment(const PlanSegment& a, const PlanSegment& b) {
  return a.batch_begin == b.batch_begin && a.node_begin == b.node_begin &&
         a.gather_bytes == b.gather_bytes && a.input_begin == b.input_begin &&
         a.input_count == b.input_count && a.input_offset == b.input_offset &&
         a.operand_begin == b.operand_begin && a.member_begin == b.member_begin &&
         a.index_begin == b.index_begin && a.aux_begin == b.aux_begin;
}

template <class T, class Same>
void check_all(const std::vector<T>& a, const std::vector<T>& b, Same same, const char* what) {
  const std::string name = what;
  CAPTURE(name);
  REQUIRE(a.size() == b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += !same(a[i], b[i]);
  CHECK(differ == 0);
}

// The schedule and plan of two engines, entry by entry.
void check_same_plan(const Engine& a, const Engine& b) {
  const auto eq = [](auto x, auto y) { return x == y; };
  const Schedule &sa = a.schedule(), &sb = b.schedule();
  check_all(sa.nodes, sb.nodes, eq, "schedule nodes");
  check_all(
      sa.batches, sb.batches,
      [](const Batch& x, const Batch& y) {
        return x.type == y.type && x.begin == y.begin && x.count == y.count;
      },
      "schedule batches");
  CHECK(sa.lower_bound == sb.lower_bound);
  const MemoryPlan &pa = a.plan(), &pb = b.plan();
  check_all(pa.batches, pb.batches, same_batch_plan, "plan batches");
  check_all(pa.steps, pb.steps, same_batch_plan, "plan steps");
  check_all(pa.operands, pb.operands, same_operand, "operands");
  check_all(pa.member_operands, pb.member_operands, same_operand, "member operands");
  check_all(pa.index, pb.index, eq, "index");
  check_all(pa.aux, pb.aux, eq, "aux");
  check_all(pa.aux_source, pb.aux_source, eq, "aux sources");
  check_all(pa.node_offset, pb.node_offset, eq, "node offsets");
  check_all(pa.segments, pb.segments, same_segment, "segments");
  CHECK(pa.input_offset == pb.input_offset);
  CHECK(pa.input_floats == pb.input_floats);
  CHECK(pa.total_floats == pb.total_floats);
  CHECK(pa.shared_operands == pb.shared_operands);
  CHECK(pa.contiguous_operands == pb.contiguous_operands);
  CHECK(pa.indexed_operands == pb.indexed_operands);
  CHECK(pa.ragged_operands == pb.ragged_operands);
  CHECK(pa.gather_bytes == pb.gather_bytes);
  CHECK(pa.member_view_operands == pb.member_view_operands);
  CHECK(pa.per_member_operands == pb.per_member_operands);
  CHECK(a.stats().batches == b.stats().batches);
  CHECK(a.stats().lower_bound == b.stats().lower_bound);
  CHECK(a.stats().nodes == b.stats().nodes);
}

EngineOptions options(const std::string& policy, bool repeat) {
  EngineOptions o;
  o.policy = policy;
  o.plan_cache_bytes = repeat ? size_t{16} << 20 : 0;
  return o;
}

const char* const kPolicies[] = {"lb-greedy", "agenda", "depth", "none"};

}  // namespace

TEST_CASE("increment repeat: lstm_nmt's greedy decoding plans as when every step is planned") {
  for (const bool blocks : {true, false})
    for (const char* policy : kPolicies) {
      CAPTURE(blocks);
      const std::string policy_name = policy;
      CAPTURE(policy_name);
      Dataset data = load_dataset(model_data_kind("lstm_nmt"), "synthetic:9", 11, 5);
      ModelOptions mo;
      mo.hidden = 7;
      mo.vocab = 11;
      mo.blocks = blocks;
      ParameterCollection pa{4}, pb{4};
      const std::unique_ptr<Model> ma = make_model("lstm_nmt", pa, data, mo);
      const std::unique_ptr<Model> mb = make_model("lstm_nmt", pb, data, mo);
      Engine ea(pa, options(policy, true)), eb(pb, options(policy, false));
      Graph ga(pa), gb(pb);
      const std::vector<uint32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8};
      const DecodeOptions d{13};
      const std::vector<Decoded> a = ma->decode(ea, ga, ids, d);
      const std::vector<Decoded> b = mb->decode(eb, gb, ids, d);
      for (size_t i = 0; i < ids.size(); ++i) {
        CAPTURE(i);
        CHECK(a[i].tokens == b[i].tokens);
        CHECK(float_bits(static_cast<float>(a[i].score)) ==
              float_bits(static_cast<float>(b[i].score)));
      }
      CHECK(ea.stats().increments_repeated > 0);
      CHECK(eb.stats().increments_repeated == 0);
      check_same_plan(ea, eb);
    }
}

namespace {

constexpr uint32_t H = 6, V = 9;

// Each step reads: its sequence's previous state, the state two steps back, its first value,
// the sum of all its states, or (Parents) the previous state of a sequence drawn at random for
// each row, repeats allowed, as beam search continues each hypothesis from its parent's.
enum class Reads { Previous, TwoBack, First, All, Parents };

struct Run {
  std::vector<std::vector<float>> values;  // the last step's states, then the loss
  std::vector<std::vector<float>> grads;
};

// `n` sequences stepped together, one incremental forward per step; sequence i stops after
// stops[i] steps. Each step: the cell (through the block or op by op), a sum of two or three
// values, an input scaling it, dropout and a loss. Everything random comes from `seed`, so two
// engines build the same graphs.
Run run_steps(Engine& e, Graph& g, ParameterCollection& pc, const StepNet& net, Reads reads,
              bool blocks, const std::vector<uint32_t>& stops, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  g.clear();
  const size_t n = stops.size();
  std::vector<std::vector<Expr>> h(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> x(H);
    for (float& v : x) v = u(rng);
    h[i].push_back(input(g, Dim{H, 1}, x));
  }
  std::vector<Expr> losses, states;
  uint32_t steps = 0;
  for (uint32_t s : stops) steps = std::max(steps, s);
  std::vector<Expr> last(n);
  for (uint32_t t = 0; t < steps; ++t) {
    states.clear();
    for (size_t i = 0; i < n; ++i) last[i] = h[i].back();
    for (size_t i = 0; i < n; ++i) {
      if (t >= stops[i]) continue;
      const uint32_t word = static_cast<uint32_t>(rng() % V);
      const Expr prev = reads == Reads::Parents ? last[rng() % n] : last[i];
      Expr next;
      if ((reads == Reads::Previous || reads == Reads::Parents) && blocks) {
        net.cell->call(g, &prev, 1, &word, 1, &next);
      } else {
        const Expr other = reads == Reads::Previous || reads == Reads::Parents
                               ? lookup(g, net.E, word)
                           : reads == Reads::TwoBack ? h[i][h[i].size() > 1 ? h[i].size() - 2 : 0]
                           : reads == Reads::First   ? h[i][0]
                                                     : sum(h[i]);  // one more each step
        next = tanh(
            affine({parameter(g, net.b), parameter(g, net.W), prev, parameter(g, net.U), other}));
      }
      // A variadic sum of two or three values (a ragged batch: row starts, then offsets).
      next = i % 2 ? sum({next, prev}) : sum({next, prev, prev});
      std::vector<float> x(H);
      for (float& v : x) v = u(rng);
      next =
          dropout(cmult(next, input(g, Dim{H, 1}, x)), 0.25f, static_cast<uint32_t>(rng() % 1000));
      h[i].push_back(next);
      states.push_back(next);
      losses.push_back(pick_neg_log_softmax(matmul(parameter(g, net.Wo), next),
                                            static_cast<uint32_t>(rng() % V)));
    }
    e.forward_through(g, losses);
  }
  const Expr loss = sum_losses(losses);
  Run r;
  for (const Expr& s : states) r.values.push_back(as_vector(e.value(s)));
  r.values.push_back(as_vector(e.forward(g, loss)));
  e.backward(g, loss);
  for (uint32_t p = 0; p < pc.size(); ++p)
    r.grads.emplace_back(pc.grads(p), pc.grads(p) + pc.dim(p).size());
  pc.zero_grads();
  return r;
}

}  // namespace

TEST_CASE("increment repeat: recurrent steps plan and compute as when every step is planned") {
  struct Case {
    Reads reads;
    bool blocks;
    std::vector<uint32_t> stops;
    bool repeats;
    int replanned;  // increments whose operands were planned afresh (-1: any number)
  };
  const Case cases[] = {
      {Reads::Previous, true, {7, 7, 7}, true, -1},      // every step after the second repeats
      {Reads::Previous, false, {9, 4, 6, 9}, true, -1},  // stops break the run, then it resumes
      {Reads::TwoBack, false, {8, 8}, true, -1},         // reads two steps back: from the fourth
      {Reads::First, false, {6, 6, 6}, true, 4},         // reads a fixed value: operands planned
      {Reads::All, false, {6, 6}, false, 0},             // reads every state so far: never repeats
      // Random parents (beam search after a reorder): the first step reads the inputs (its own
      // segment); from the third on each repeats the schedule and places, operands planned.
      {Reads::Parents, true, {9, 9, 9, 9, 9, 9, 9}, true, 7},
      {Reads::Parents, false, {9, 9, 9, 9, 9, 9, 9}, true, 7},
  };
  for (const char* policy : kPolicies) {
    int k = 0;
    for (const Case& c : cases) {
      const std::string policy_name = policy;
      CAPTURE(policy_name);
      CAPTURE(k++);
      ParameterCollection pa{5}, pb{5};
      const StepNet na(pa, H, V), nb(pb, H, V);
      Engine ea(pa, options(policy, true)), eb(pb, options(policy, false));
      Graph ga(pa), gb(pb);
      const Run a = run_steps(ea, ga, pa, na, c.reads, c.blocks, c.stops, 17);
      const Run b = run_steps(eb, gb, pb, nb, c.reads, c.blocks, c.stops, 17);
      CHECK((ea.stats().increments_repeated > 0) == c.repeats);
      if (c.reads == Reads::Parents)  // every step from the third on
        CHECK(ea.stats().increments_repeated == c.stops[0] - 2);
      if (c.replanned >= 0) CHECK(ea.stats().increments_replanned == uint64_t(c.replanned));
      CHECK(eb.stats().increments_repeated == 0);
      CHECK(ea.plan().ragged_operands > 0);
      check_same_plan(ea, eb);
      REQUIRE(a.values.size() == b.values.size());
      for (size_t i = 0; i < a.values.size(); ++i)
        CHECK(bitwise_equal(a.values[i].data(), b.values[i].data(), a.values[i].size()));
      for (size_t p = 0; p < a.grads.size(); ++p)
        CHECK(bitwise_equal(a.grads[p].data(), b.grads[p].data(), a.grads[p].size()));
    }
  }
}

TEST_CASE("increment repeat: a graph built whole and run through equal instances one by one") {
  // Each instance: an input, three recurrent steps and a loss; run through each instance's loss
  // in turn, so every increment ends before the graph does (its input block ends at its own last
  // input) and the later ones repeat the one before.
  for (const char* policy : kPolicies) {
    const std::string policy_name = policy;
    CAPTURE(policy_name);
    ParameterCollection pa{6}, pb{6};
    const StepNet na(pa, H, V), nb(pb, H, V);
    Engine ea(pa, options(policy, true)), eb(pb, options(policy, false));
    Graph ga(pa), gb(pb);
    Engine* engines[2] = {&ea, &eb};
    Graph* graphs[2] = {&ga, &gb};
    const StepNet* nets[2] = {&na, &nb};
    std::vector<std::vector<float>> values[2];
    for (int k = 0; k < 2; ++k) {
      Graph& g = *graphs[k];
      const StepNet& net = *nets[k];
      std::mt19937_64 rng(23);
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<Expr> losses;
      for (int i = 0; i < 6; ++i) {
        std::vector<float> x(H);
        for (float& v : x) v = u(rng);
        Expr h = input(g, Dim{H, 1}, x);
        for (int t = 0; t < 3; ++t) {
          const uint32_t word = static_cast<uint32_t>(rng() % V);
          Expr next;
          net.cell->call(g, &h, 1, &word, 1, &next);
          h = next;
        }
        losses.push_back(pick_neg_log_softmax(matmul(parameter(g, net.Wo), h),
                                              static_cast<uint32_t>(rng() % V)));
      }
      for (const Expr& l : losses)
        values[k].push_back(as_vector(engines[k]->forward_through(g, l)));
      const Expr loss = sum_losses(losses);
      values[k].push_back(as_vector(engines[k]->forward(g, loss)));
      engines[k]->backward(g, loss);
    }
    CHECK(ea.stats().increments_repeated >= 4);
    CHECK(eb.stats().increments_repeated == 0);
    check_same_plan(ea, eb);
    for (size_t i = 0; i < values[0].size(); ++i)
      CHECK(bitwise_equal(values[0][i].data(), values[1][i].data(), values[0][i].size()));
    for (uint32_t p = 0; p < pa.size(); ++p)
      CHECK(bitwise_equal(pa.grads(p), pb.grads(p), pa.dim(p).size()));
  }
}
