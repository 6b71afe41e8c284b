// Schedule::reads against a walk of every argument: for every zoo model (blocks and op by op)
// under several policies, for graphs scheduled in increments, and for schedules a scheduler did
// not make itself (a copy, as the plan cache serves, extended by another scheduler).
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "edbatch/op.h"
#include "edbatch/schedule.h"

using namespace edbatch;

namespace {

constexpr uint32_t kWhole = Schedule::kWholeBatch;

// The reference: per batch, the set of (producer batch, output read or kWhole) over every
// argument of its nodes, each view chain followed by hand.
std::vector<std::set<std::pair<uint32_t, uint32_t>>> walk_reads(const Graph& g, const Schedule& s) {
  std::vector<uint32_t> batch_of(g.size(), UINT32_MAX);
  for (uint32_t b = 0; b < s.batches.size(); ++b)
    for (uint32_t i = 0; i < s.batches[b].count; ++i) batch_of[s.nodes[s.batches[b].begin + i]] = b;
  std::vector<std::set<std::pair<uint32_t, uint32_t>>> reads(s.batches.size());
  for (uint32_t b = 0; b < s.batches.size(); ++b)
    for (uint32_t i = 0; i < s.batches[b].count; ++i) {
      const Node& n = g.node(s.nodes[s.batches[b].begin + i]);
      for (uint32_t k = 0; k < n.num_args; ++k) {
        uint32_t v = g.args(n)[k], output = kWhole;
        while (!is_scheduled(g.node(v).op) && g.node(v).num_args > 0 &&
               op_info(g.node(v).op).rule == BatchRule::View) {
          if (g.node(v).op == Op::Output) output = std::min(g.node(v).aux, kWhole);
          v = g.args(g.node(v))[0];
        }
        if (batch_of[v] == UINT32_MAX) continue;  // an input or a parameter
        reads[b].insert({batch_of[v], output});
      }
    }
  return reads;
}

// The schedule's lists say the same: each pair once, from an earlier batch, every pair of the
// walk there or covered by its batch's kWhole pair, nothing else, a kWhole pair never before a
// single output of its batch.
void check_reads(const Graph& g, const Schedule& s, const std::string& what) {
  CAPTURE(what);
  REQUIRE(s.read_begin.size() == s.batches.size() + 1);
  REQUIRE(s.read_begin.back() * 2 == s.reads.size());
  const auto expected = walk_reads(g, s);
  for (uint32_t b = 0; b < s.batches.size(); ++b) {
    CAPTURE(b);
    std::set<std::pair<uint32_t, uint32_t>> got;
    std::set<uint32_t> whole;
    for (uint32_t r = s.read_begin[b]; r < s.read_begin[b + 1]; ++r) {
      const uint32_t pb = s.reads[2 * r], output = s.reads[2 * r + 1];
      CHECK(pb < b);
      CHECK(output <= kWhole);
      CHECK(got.insert({pb, output}).second);
      CHECK(expected[b].count({pb, output}) == 1);
      if (output == kWhole)
        whole.insert(pb);
      else
        CHECK(whole.count(pb) == 0);
    }
    for (const auto& [pb, output] : expected[b]) {
      CAPTURE(pb);
      CAPTURE(output);
      CHECK((got.count({pb, output}) == 1 || whole.count(pb) == 1));
    }
  }
}

Dataset small(const std::string& model, uint32_t n) {
  return load_dataset(model_data_kind(model), "synthetic:" + std::to_string(n), 23, 5);
}

}  // namespace

TEST_CASE("schedule reads: every zoo model, blocks and op by op, several policies") {
  for (const std::string& name : model_names()) {
    for (const bool blocks : {true, false}) {
      ParameterCollection pc(3);
      ModelOptions o;
      o.hidden = 5;
      o.vocab = 23;
      o.blocks = blocks;
      o.seed = 3;
      const Dataset data = small(name, 6);  // the model reads it while building
      const auto m = make_model(name, pc, data, o);
      Graph g(pc);
      std::vector<Expr> losses;
      for (uint32_t i = 0; i < m->size(); ++i) losses.push_back(m->build(g, i));
      sum_losses(losses);
      for (const std::string policy : {"none", "depth", "lb-greedy"}) {
        Scheduler sc;
        sc.set_reads(BatchReads::Always);
        Schedule s;
        sc.run(g, *make_policy(policy), s);
        validate_schedule(g, s);
        check_reads(g, s, name + (blocks ? " blocks " : " ops ") + policy);
        Scheduler plain;  // without reads: none, and the same batches
        Schedule p;
        plain.run(g, *make_policy(policy), p);
        CHECK(p.read_begin.empty());
        CHECK(p.reads.empty());
        CHECK(p.nodes == s.nodes);
      }
    }
  }
}

TEST_CASE("schedule reads: increments read what earlier increments computed") {
  ParameterCollection pc(4);
  ModelOptions o;
  o.hidden = 6;
  o.vocab = 23;
  o.seed = 4;
  const Dataset data = small("tree_lstm", 7);
  const auto m = make_model("tree_lstm", pc, data, o);
  Graph g(pc);
  Scheduler sc, other;
  sc.set_reads(BatchReads::Always);
  other.set_reads(BatchReads::Always);
  auto policy = make_policy("lb-greedy");
  Schedule s;
  std::vector<Expr> losses;
  uint32_t first = 0;
  for (uint32_t i = 0; i < m->size(); ++i) {
    losses.push_back(m->build(g, i));
    // Every other increment sums the losses so far: it reads batches of earlier increments.
    if (i % 2 == 1) losses.push_back(sum_losses(losses));
    sc.extend(g, *policy, s, first);
    first = g.size();
    check_reads(g, s, "increment " + std::to_string(i));
  }
  // Lists for whole graphs only: a run has them, an increment after it leaves its own out (and
  // so the schedule no longer covers every batch).
  {
    Scheduler whole;
    whole.set_reads(BatchReads::WholeGraphs);
    Schedule w;
    Graph part(pc);
    m->build(part, 0);
    whole.run(part, *policy, w);
    check_reads(part, w, "a whole graph");
    const size_t lists = w.read_begin.size();
    const uint32_t from = part.size();
    m->build(part, 1);
    whole.extend(part, *policy, w, from);
    CHECK(w.read_begin.size() == lists);
    CHECK(w.read_begin.size() < w.batches.size() + 1);
  }
  // A copy of the schedule (as the plan cache serves) extended by the scheduler that made it,
  // after it scheduled, in the same increments, the same graph with every node one id later (an
  // input first): as many batches, other node ids. It finds the earlier batches again rather
  // than trusting what it kept.
  Graph h(pc);
  input(h, 1.0f);
  Schedule t;
  std::vector<Expr> others;
  uint32_t from = h.size();
  for (uint32_t i = 0; i < m->size(); ++i) {
    others.push_back(m->build(h, i));
    if (i % 2 == 1) others.push_back(sum_losses(others));
    sc.extend(h, *policy, t, from);
    from = h.size();
  }
  REQUIRE(t.batches.size() == s.batches.size());
  REQUIRE(t.nodes != s.nodes);
  Schedule copy = s;
  losses.push_back(sum_losses(losses));
  sc.extend(g, *policy, copy, first);
  check_reads(g, copy, "a copy, extended after another graph");
  other.extend(g, *policy, s, first);
  check_reads(g, s, "extended by another scheduler");
}
