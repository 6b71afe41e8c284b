// The learned policy's generalising part and its rewards: the scorer's features against formulas
// written out here; training on one seed's mini-batches and scheduling another seed's (never
// worse than lb-greedy, strictly better on lattices and random DAGs); the time reward against an
// exhaustive search over schedules by cost; version 1 and 2 policy files; the "auto" policy's
// cache (writes once, reuses, refuses other types, survives a corrupt file).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <tbb/global_control.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <set>

#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "edbatch/options.h"
#include "tests/cli_run.h"

using namespace edbatch;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("edbatch_scorer_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Consecutive mini-batches of a synthetic data set: `train` of them for training, `val` for
// validation, from one seed; different seeds give different instances.
struct Synthetic {
  Synthetic(const std::string& model, uint32_t instances, uint32_t batch, uint64_t seed)
      : data(load_dataset(model_data_kind(model), "synthetic:" + std::to_string(instances), 64,
                          seed)),
        pc(1) {
    ModelOptions mo;
    mo.hidden = 8;
    mo.vocab = 64;
    this->model = make_model(model, pc, data, mo);
    for (uint32_t b = 0; b * batch < this->model->size(); ++b) {
      auto g = std::make_unique<Graph>(pc);
      std::vector<Expr> losses;
      for (uint32_t i = b * batch; i < std::min(this->model->size(), (b + 1) * batch); ++i)
        losses.push_back(this->model->build(*g, i));
      sum_losses(losses);
      graphs.push_back(std::move(g));
    }
  }
  std::vector<const Graph*> range(size_t begin, size_t end) const {
    std::vector<const Graph*> out;
    for (size_t i = begin; i < std::min(end, graphs.size()); ++i) out.push_back(graphs[i].get());
    return out;
  }
  Dataset data;
  ParameterCollection pc;
  std::unique_ptr<Model> model;
  std::vector<std::unique_ptr<Graph>> graphs;
};

uint32_t run_batches(const Graph& g, Policy& p, Schedule* keep = nullptr) {
  Scheduler s;
  Schedule out;
  s.run(g, p, out);
  validate_schedule(g, out);
  if (keep) *keep = out;
  return static_cast<uint32_t>(out.batches.size());
}

// The fewest-cost schedule of a small graph (a batch = every ready node of one type; a batch of
// type t and n nodes costs launch[t] + n * node[t]), by Dijkstra over the sets of nodes run.
double optimum_cost(const Graph& g, const std::map<uint32_t, FsmTypeCost>& cost) {
  std::vector<uint32_t> ids;
  std::vector<int> pos(g.size(), -1);
  for (uint32_t v = 0; v < g.size(); ++v)
    if (is_scheduled(g.node(v).op)) {
      pos[v] = static_cast<int>(ids.size());
      ids.push_back(v);
    }
  const uint32_t n = static_cast<uint32_t>(ids.size()), all = (1u << n) - 1;
  std::vector<uint32_t> needs(n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    const Node& nd = g.node(ids[i]);
    for (uint32_t a = 0; a < nd.num_args; ++a)
      if (pos[g.args(nd)[a]] >= 0) needs[i] |= 1u << pos[g.args(nd)[a]];
  }
  std::vector<double> dist(all + 1, HUGE_VAL);
  using Item = std::pair<double, uint32_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  dist[0] = 0;
  queue.push({0, 0});
  while (!queue.empty()) {
    const auto [d, done] = queue.top();
    queue.pop();
    if (d > dist[done]) continue;
    if (done == all) return d;
    std::map<uint32_t, std::pair<uint32_t, uint32_t>> ready;  // type -> (nodes, count)
    for (uint32_t i = 0; i < n; ++i)
      if (!(done >> i & 1) && (needs[i] & done) == needs[i]) {
        auto& r = ready[g.node(ids[i]).type];
        r.first |= 1u << i;
        ++r.second;
      }
    for (const auto& [type, r] : ready) {
      const FsmTypeCost& c = cost.at(type);
      const double next = d + c.launch_us + c.node_us * r.second;
      if (next < dist[done | r.first]) {
        dist[done | r.first] = next;
        queue.push({next, done | r.first});
      }
    }
  }
  return dist[all];
}

// A random DAG of n nodes of tanh, add and cmult (as tests/test_fsm.cpp builds them).
std::unique_ptr<Graph> random_dag(ParameterCollection& pc, std::mt19937_64& rng, uint32_t n) {
  auto g = std::make_unique<Graph>(pc);
  std::vector<Expr> made;
  auto operand = [&]() {
    if (made.empty() || rng() % 6 == 0) return input(*g, 0.5f);
    return made[made.size() - 1 - rng() % std::min<size_t>(made.size(), 4)];
  };
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t k = rng() % 3;
    if (k == 0)
      made.push_back(tanh(operand()));
    else if (k == 1)
      made.push_back(add(operand(), operand()));
    else
      made.push_back(cmult(operand(), operand()));
  }
  return g;
}

// Chain costs, computed here node by node: a batch starts once the batches holding its nodes'
// scheduled arguments have finished and takes launch + node * count; the schedule takes until
// its last batch ends, plus batch_us per batch.
double chain_time_of(const Graph& g, const Schedule& s, const std::map<uint32_t, FsmTypeCost>& cost,
                     double batch_us) {
  std::vector<double> finish(g.size(), 0.0);
  double end = 0;
  for (const Batch& b : s.batches) {
    double start = 0;
    for (uint32_t i = b.begin; i < b.begin + b.count; ++i) {
      const Node& n = g.node(s.nodes[i]);
      for (uint32_t a = 0; a < n.num_args; ++a) start = std::max(start, finish[g.args(n)[a]]);
    }
    const double done = start + cost.at(b.type).launch_us + cost.at(b.type).node_us * b.count;
    for (uint32_t i = b.begin; i < b.begin + b.count; ++i) finish[s.nodes[i]] = done;
    end = std::max(end, done);
  }
  return end + batch_us * s.batches.size();
}

// The least chain time over every schedule whose batches take every ready node of one type, by
// trying them all (small graphs).
double chain_optimum(const Graph& g, const std::map<uint32_t, FsmTypeCost>& cost, double batch_us) {
  std::vector<uint32_t> ids;
  for (uint32_t v = 0; v < g.size(); ++v)
    if (is_scheduled(g.node(v).op)) ids.push_back(v);
  Schedule s;
  std::vector<bool> done(g.size(), false);
  for (uint32_t v = 0; v < g.size(); ++v) done[v] = !is_scheduled(g.node(v).op);
  double best = HUGE_VAL;
  std::function<void()> visit = [&] {
    std::map<uint32_t, std::vector<uint32_t>> ready;
    for (uint32_t v : ids) {
      if (done[v]) continue;
      const Node& n = g.node(v);
      bool all = true;
      for (uint32_t a = 0; a < n.num_args; ++a) all = all && done[g.args(n)[a]];
      if (all) ready[n.type].push_back(v);
    }
    if (ready.empty()) {
      best = std::min(best, chain_time_of(g, s, cost, batch_us));
      return;
    }
    for (const auto& [type, nodes] : ready) {
      s.batches.push_back(
          {type, static_cast<uint32_t>(s.nodes.size()), static_cast<uint32_t>(nodes.size())});
      for (uint32_t v : nodes) {
        s.nodes.push_back(v);
        done[v] = true;
      }
      visit();
      for (uint32_t v : nodes) done[v] = false;
      s.nodes.resize(s.nodes.size() - nodes.size());
      s.batches.pop_back();
    }
  };
  visit();
  return best;
}

// Random costs for each type g schedules, in order of first appearance, into `costs` (device
// "test") and returned by type id.
std::map<uint32_t, FsmTypeCost> random_costs(const Graph& g, std::mt19937_64& rng,
                                             FsmCostModel& costs) {
  costs.device = "test";
  std::map<uint32_t, FsmTypeCost> by_type;
  for (const Node& n : g.nodes())
    if (is_scheduled(n.op) && !by_type.count(n.type)) {
      const FsmTypeCost c{double(1 + rng() % 9), double(rng() % 3) / 4};
      by_type[n.type] = c;
      costs.types.push_back(g.types().name(n.type));
      costs.costs.push_back(c);
    }
  return by_type;
}

FsmTrainOptions quick_options() {
  FsmTrainOptions o;
  o.episodes = 32;
  o.rollouts_per_round = 8;
  o.refine_states = 200;
  o.scorer_search = 60;
  return o;
}

}  // namespace

TEST_CASE("fsm scorer: features and choice follow their formulas") {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 500; ++trial) {
    const uint32_t r = 1 + rng() % 7;
    std::vector<ReadyView> v(r);
    for (uint32_t i = 0; i < r; ++i) {
      const uint32_t total = 1 + rng() % 5, ready = rng() % 9;
      v[i] = {i,
              uint32_t(rng() % 50),
              uint32_t(rng() % 4),
              ready + 1,
              std::min<uint32_t>(ready + 1, total) * uint32_t(rng() % 2),
              total,
              uint32_t(1 + rng() % 30),
              double(rng() % 11) / 2};
    }
    std::vector<double> f(r * kFsmFeatures);
    fsm_features(v.data(), r, f.data());
    uint32_t max_bound = 0;
    double lo = 1e9, hi = -1e9;
    for (const ReadyView& x : v) {
      max_bound = std::max(max_bound, x.bound);
      lo = std::min(lo, x.depth);
      hi = std::max(hi, x.depth);
    }
    for (uint32_t i = 0; i < r; ++i) {
      const ReadyView& x = v[i];
      const double* g = &f[i * kFsmFeatures];
      const bool full = x.critical_ready == x.critical_total;
      CHECK(g[0] == doctest::Approx(double(x.critical_ready) / x.critical_total));
      CHECK(g[1] == (full ? 1.0 : 0.0));
      CHECK(g[2] == doctest::Approx(std::log2(1.0 + x.ready)));
      CHECK(g[3] == doctest::Approx(double(x.bound) / max_bound));
      CHECK(g[4] == doctest::Approx(hi > lo ? (x.depth - lo) / (hi - lo) : 0.0));
      CHECK(g[5] == doctest::Approx(double(x.ready - x.critical_ready) / x.ready));
      CHECK(g[6] == (x.bound == max_bound ? 1.0 : 0.0));
      CHECK(g[7] == doctest::Approx(full ? double(x.bound) / max_bound : 0.0));
    }
    // One weight on one feature picks the largest value of it; a bias alone, its type.
    FsmScorer s{std::vector<double>(kFsmFeatures, 0.0), std::vector<double>(4, 0.0)};
    s.weights[3] = 1.0;
    const uint32_t c = fsm_score_choice(s, v.data(), r, f.data());
    CHECK(v[c].bound == max_bound);
    s.weights[3] = 0;
    s.type_bias = {0, 0, 0, 0};
    s.type_bias[v[0].index] = 5.0;
    CHECK(v[fsm_score_choice(s, v.data(), r, f.data())].index == v[0].index);
  }
}

TEST_CASE("fsm scorer: trained on one seed, never worse than lb-greedy on another") {
  struct Case {
    const char* model;
    uint32_t instances, batch;
    bool strictly_better;
  };
  for (const Case& c : {Case{"lattice_lstm", 256, 16, true}, Case{"lattice_gru", 256, 16, true},
                        Case{"random_dag", 256, 16, true}, Case{"tree_lstm", 256, 16, false}}) {
    const std::string model = c.model;
    CAPTURE(model);
    const Synthetic train(c.model, c.instances, c.batch, 101);
    const Synthetic held(c.model, c.instances / 2, c.batch, 202);  // other instances
    const FsmTrainResult r =
        train_fsm_policy(train.range(0, 12), train.range(12, 16), quick_options());
    // The trainer's simulation and the scheduler agree on the kept policy.
    FsmPolicy fsm(r.policy);
    CHECK(mean_batches(train.range(12, 16), fsm) ==
          doctest::Approx(r.policy.info.validation_batches));
    auto lb = make_policy("lb-greedy");
    // A policy for this seed's types (with the scorer alone, so no table state is known).
    FsmPolicyData scorer_only = r.policy;
    scorer_only.table = FsmTable();
    FsmPolicy scored(scorer_only);
    uint64_t learned = 0, greedy = 0, scorer = 0;
    for (const Graph* g : held.range(0, 100)) {
      learned += run_batches(*g, fsm);
      scorer += run_batches(*g, scored);
      greedy += run_batches(*g, *lb);
    }
    MESSAGE(model << ": learned " << learned << ", scorer alone " << scorer << ", lb-greedy "
                  << greedy << " batches");
    CHECK(learned <= greedy);
    if (c.strictly_better) {
      CHECK(learned < greedy);
      CHECK(!r.policy.scorer.empty());
      CHECK(scorer < greedy);
    }
  }
}

TEST_CASE("fsm scorer: the time reward finds the cheapest schedule on small DAGs") {
  ParameterCollection pc(1);
  std::mt19937_64 rng(99);
  int differs = 0;
  for (int trial = 0; trial < 250; ++trial) {
    auto g = random_dag(pc, rng, 3 + rng() % 9);
    FsmCostModel costs;
    const std::map<uint32_t, FsmTypeCost> by_type = random_costs(*g, rng, costs);
    const double best = optimum_cost(*g, by_type);
    FsmTrainOptions o = quick_options();
    o.seed = trial;
    o.costs = costs;
    const FsmTrainResult r = train_fsm_policy({g.get()}, {g.get()}, o);
    FsmPolicy fsm(r.policy);
    Schedule s;
    run_batches(*g, fsm, &s);
    // The predicted time, summed here from the costs drawn above.
    double cost = 0;
    for (const Batch& b : s.batches)
      cost += by_type.at(b.type).launch_us + by_type.at(b.type).node_us * b.count;
    CAPTURE(trial);
    CHECK(cost == doctest::Approx(best));
    CHECK(costs.predicted_us(*g, s) == doctest::Approx(cost));
    CHECK(r.validation_cost == doctest::Approx(best));
    // Counting batches instead can miss the cheapest schedule.
    FsmTrainOptions counting = quick_options();
    counting.seed = trial;
    FsmPolicy by_count(train_fsm_policy({g.get()}, {g.get()}, counting).policy);
    Schedule s2;
    run_batches(*g, by_count, &s2);
    differs += costs.predicted_us(*g, s2) > best + 1e-9;
  }
  CHECK(differs >= 3);
}

// x -> tanh -> sigmoid and y -> sigmoid -> tanh, tanh costing 5 + 0.5 n and sigmoid 1 + 0.25 n,
// with the two type-by-type schedules of three batches: tanh first (tanh{x}, sigmoid{both},
// tanh{y's}) and sigmoid first (the mirror image).
struct TwoChains {
  TwoChains() : pc(1), g(pc) {
    const Expr a = sigmoid(tanh(input(g, 0.1f))), b = tanh(sigmoid(input(g, 0.2f)));
    (void)a;
    (void)b;
    t_tanh = g.node(g.size() - 1).type;
    t_sig = g.node(g.size() - 2).type;
    costs.types = {g.types().name(t_tanh), g.types().name(t_sig)};
    costs.costs = {{5.0, 0.5}, {1.0, 0.25}};
    for (uint32_t v = 0; v < g.size(); ++v)
      if (is_scheduled(g.node(v).op))
        (g.node(v).type == t_tanh ? tanh_nodes : sig_nodes).push_back(v);
    REQUIRE(tanh_nodes.size() == 2);
    tanh_first.nodes = {tanh_nodes[0], sig_nodes[0], sig_nodes[1], tanh_nodes[1]};
    tanh_first.batches = {{t_tanh, 0, 1}, {t_sig, 1, 2}, {t_tanh, 3, 1}};
    sig_first.nodes = {sig_nodes[1], tanh_nodes[0], tanh_nodes[1], sig_nodes[0]};
    sig_first.batches = {{t_sig, 0, 1}, {t_tanh, 1, 2}, {t_sig, 3, 1}};
    validate_schedule(g, tanh_first);
    validate_schedule(g, sig_first);
  }
  ParameterCollection pc;
  Graph g;
  uint32_t t_tanh = 0, t_sig = 0;
  FsmCostModel costs;
  std::vector<uint32_t> tanh_nodes, sig_nodes;
  Schedule tanh_first, sig_first;
};

TEST_CASE("fsm scorer: predicted time ranks two schedules with equal counts by their cost") {
  TwoChains c;
  CHECK(c.costs.predicted_us(c.g, c.tanh_first) ==
        doctest::Approx(2 * 5.0 + 2 * 0.5 + 1.0 + 2 * 0.25));
  CHECK(c.costs.predicted_us(c.g, c.sig_first) ==
        doctest::Approx(5.0 + 2 * 0.5 + 2 * 1.0 + 2 * 0.25));
  CHECK(c.costs.predicted_us(c.g, c.sig_first) < c.costs.predicted_us(c.g, c.tanh_first));
  // An unknown type costs the mean of the known ones.
  CHECK(c.costs.of("nothing").launch_us == doctest::Approx(3.0));
}

TEST_CASE("fsm scorer: chain costs rank schedules by their longest chain of batches") {
  // A third schedule runs each chain's nodes as soon as they are ready: more batches, side by
  // side.
  TwoChains c;
  c.costs.chain = true;
  Schedule apart;
  apart.nodes = {c.tanh_nodes[0], c.sig_nodes[1], c.tanh_nodes[1], c.sig_nodes[0]};
  apart.batches = {{c.t_tanh, 0, 1}, {c.t_sig, 1, 1}, {c.t_tanh, 2, 1}, {c.t_sig, 3, 1}};
  validate_schedule(c.g, apart);
  // tanh_first: tanh(x) ends at 5.5, both sigmoids wait for it (7.0), then tanh (12.5).
  CHECK(c.costs.predicted_us(c.g, c.tanh_first) == doctest::Approx(12.5));
  // sig_first: sigmoid(y) ends at 1.25, both tanh wait for it (7.25), then sigmoid (8.5).
  CHECK(c.costs.predicted_us(c.g, c.sig_first) == doctest::Approx(8.5));
  // apart: tanh(x) 0-5.5 beside sigmoid(y) 0-1.25 and tanh 1.25-6.75; sigmoid 5.5-6.75.
  CHECK(c.costs.predicted_us(c.g, apart) == doctest::Approx(6.75));
  c.costs.batch_us = 1.0;  // every batch in series as well
  CHECK(c.costs.predicted_us(c.g, apart) == doctest::Approx(10.75));
  CHECK(c.costs.predicted_us(c.g, c.sig_first) == doctest::Approx(11.5));
  // Summed, the same costs rank the schedule with fewer batches first.
  c.costs.chain = false;
  CHECK(c.costs.predicted_us(c.g, apart) == doctest::Approx(13.5));
  CHECK(c.costs.predicted_us(c.g, c.sig_first) < c.costs.predicted_us(c.g, apart));
}

TEST_CASE("fsm scorer: with chain costs the time reward finds the fastest schedule on small DAGs") {
  ParameterCollection pc(1);
  std::mt19937_64 rng(123);
  int optimal = 0, trials = 0, beats_count = 0;
  for (int trial = 0; trial < 120; ++trial) {
    auto g = random_dag(pc, rng, 3 + rng() % 8);
    FsmCostModel costs;
    costs.chain = true;
    costs.batch_us = (rng() % 3) * 0.5;
    const std::map<uint32_t, FsmTypeCost> by_type = random_costs(*g, rng, costs);
    const double best = chain_optimum(*g, by_type, costs.batch_us);
    FsmTrainOptions o = quick_options();
    o.seed = trial;
    o.costs = costs;
    const FsmTrainResult r = train_fsm_policy({g.get()}, {g.get()}, o);
    FsmPolicy fsm(r.policy);
    Schedule s, greedy;
    run_batches(*g, fsm, &s);
    run_batches(*g, *make_policy("lb-greedy"), &greedy);
    const double got = chain_time_of(*g, s, by_type, costs.batch_us);
    CAPTURE(trial);
    CHECK(costs.predicted_us(*g, s) == doctest::Approx(got));
    CHECK(costs.predicted_us(*g, greedy) ==
          doctest::Approx(chain_time_of(*g, greedy, by_type, costs.batch_us)));
    CHECK(r.validation_cost == doctest::Approx(got));
    CHECK(got >= best - 1e-9);
    CHECK(got <= chain_time_of(*g, greedy, by_type, costs.batch_us) + 1e-9);
    ++trials;
    optimal += got <= best + 1e-9;
    // Counting batches (or summing costs) can miss the fastest schedule.
    FsmTrainOptions counting = quick_options();
    counting.seed = trial;
    FsmPolicy by_count(train_fsm_policy({g.get()}, {g.get()}, counting).policy);
    Schedule s2;
    run_batches(*g, by_count, &s2);
    beats_count += got < chain_time_of(*g, s2, by_type, costs.batch_us) - 1e-9;
  }
  MESSAGE("chain costs: optimal in " << optimal << " of " << trials << ", faster than the "
                                     << "batch-count policy in " << beats_count);
  CHECK(optimal == trials);
  CHECK(beats_count >= 3);
}

TEST_CASE("fsm scorer: the chain fit recovers costs that predict the times it was given") {
  // Times made by a known chain model over schedules of random orders; the fit of the chain
  // model predicts them, the sum model's fit does not.
  const Synthetic s("lattice_lstm", 48, 8, 3);
  FsmCostModel truth;
  truth.chain = true;
  truth.batch_us = 0.7;
  std::mt19937_64 rng(5);
  std::vector<const Graph*> graphs;
  std::vector<Schedule> schedules;
  for (const Graph* g : s.range(0, 6))
    for (const Node& n : g->nodes())
      if (is_scheduled(n.op) && std::find(truth.types.begin(), truth.types.end(),
                                          g->types().name(n.type)) == truth.types.end()) {
        truth.types.push_back(g->types().name(n.type));
        truth.costs.push_back({double(2 + rng() % 9), double(rng() % 4) / 8});
      }
  for (const Graph* g : s.range(0, 6))
    for (const char* p : {"lb-greedy", "depth", "agenda"}) {
      Schedule sch;
      run_batches(*g, *make_policy(p), &sch);
      graphs.push_back(g);
      schedules.push_back(sch);
    }
  std::vector<double> times;
  for (size_t i = 0; i < graphs.size(); ++i)
    times.push_back(truth.predicted_us(*graphs[i], schedules[i]));
  const FsmCostModel chain = fit_type_costs(graphs, schedules, times, true);
  const FsmCostModel sum = fit_type_costs(graphs, schedules, times, false);
  CHECK(chain.chain);
  CHECK(!sum.chain);
  double chain_err = 0, sum_err = 0;
  for (size_t i = 0; i < graphs.size(); ++i) {
    chain_err = std::max(
        chain_err, std::abs(chain.predicted_us(*graphs[i], schedules[i]) - times[i]) / times[i]);
    sum_err = std::max(sum_err,
                       std::abs(sum.predicted_us(*graphs[i], schedules[i]) - times[i]) / times[i]);
  }
  MESSAGE("largest relative error: chain fit " << chain_err << ", sum fit " << sum_err);
  CHECK(chain_err < 0.03);
  CHECK(sum_err > 2 * chain_err);
}

TEST_CASE("fsm scorer: measured costs cover every type, finite and non-negative") {
  const Synthetic s("lattice_lstm", 24, 8, 5);
  std::vector<Graph*> graphs;
  for (auto& g : s.graphs) graphs.push_back(g.get());
  EngineOptions eo;
  eo.device = "cpu";
  const FsmCostModel c = measure_type_costs(const_cast<ParameterCollection&>(s.pc), graphs, eo, 1);
  CHECK(c.device == "cpu");
  std::set<std::string> present;
  for (const Graph* g : s.range(0, 100))
    for (const Node& n : g->nodes())
      if (is_scheduled(n.op)) present.insert(g->types().name(n.type));
  CHECK(std::set<std::string>(c.types.begin(), c.types.end()) == present);
  for (const FsmTypeCost& x : c.costs) {
    CHECK(std::isfinite(x.launch_us));
    CHECK(x.launch_us >= 0);
    CHECK(x.node_us >= 0);
  }
}

TEST_CASE("fsm scorer: version 3 files keep the scorer and costs; versions 1 and 2 still load") {
  const Synthetic s("lattice_lstm", 48, 8, 7);
  FsmTrainOptions o = quick_options();
  o.table = false;
  FsmPolicyData d = train_fsm_policy(s.range(0, 3), s.range(3, 6), o).policy;
  REQUIRE(!d.scorer.empty());
  d.costs.device = "cpu";
  d.costs.types = {d.info.types[0]};
  d.costs.costs = {{3.25, 0.125}};
  const FsmPolicyData back = parse_fsm_policy(fsm_policy_json(d), "mem");
  CHECK(back.scorer.weights == d.scorer.weights);
  CHECK(back.scorer.type_bias == d.scorer.type_bias);
  CHECK(back.costs.types == d.costs.types);
  CHECK(back.costs.costs[0].launch_us == 3.25);
  CHECK(!back.costs.chain);
  nlohmann::json j = nlohmann::json::parse(fsm_policy_json(d));
  CHECK(j["version"] == 3);
  // A version 2 file names block types without their shapes; the graph's match it by name alone
  // and the policy decides as the version 3 one does.
  nlohmann::json v2 = j;
  v2["version"] = 2;
  size_t renamed = 0;
  for (auto& t : v2["types"]) {
    const std::string name = t.get<std::string>();
    if (name.rfind("block:", 0) != 0) continue;
    REQUIRE(name.back() == ')');
    t = name.substr(0, name.rfind('('));
    ++renamed;
  }
  CHECK(renamed >= 2);
  const FsmPolicyData older = parse_fsm_policy(v2.dump(), "v2");
  CHECK(!older.info.block_shapes);
  CHECK(nlohmann::json::parse(fsm_policy_json(older))["version"] == 2);
  for (const Graph* g : s.range(3, 6)) {
    FsmPolicy now(d), before(older);
    Schedule a, b;
    run_batches(*g, now, &a);
    run_batches(*g, before, &b);
    CHECK(a.nodes == b.nodes);
    CHECK(a.batches.size() == b.batches.size());
  }
  // Without the version's rule, the names would not match.
  v2["version"] = 3;
  FsmPolicy unmatched(parse_fsm_policy(v2.dump(), "v2-as-v3"));
  CHECK_THROWS_WITH_AS(run_batches(*s.range(5, 6).at(0), unmatched),
                       doctest::Contains("does not match this graph"), std::invalid_argument);
  // Chain costs keep how they combine and their cost per batch; costs written before these
  // fields existed are summed.
  FsmPolicyData chained = d;
  chained.costs.chain = true;
  chained.costs.batch_us = 0.625;
  const FsmPolicyData chained_back = parse_fsm_policy(fsm_policy_json(chained), "mem");
  CHECK(chained_back.costs.chain);
  CHECK(chained_back.costs.batch_us == 0.625);
  nlohmann::json earlier = nlohmann::json::parse(fsm_policy_json(chained));
  earlier["costs"].erase("combine");
  earlier["costs"].erase("batch_us");
  const FsmPolicyData summed = parse_fsm_policy(earlier.dump(), "earlier");
  CHECK(!summed.costs.chain);
  CHECK(summed.costs.batch_us == 0);
  // A version 1 file: no scorer, no costs.
  nlohmann::json v1 = j;
  v1["version"] = 1;
  v1.erase("scorer");
  v1.erase("costs");
  const FsmPolicyData old = parse_fsm_policy(v1.dump(), "v1");
  CHECK(old.scorer.empty());
  CHECK(old.costs.empty());
  auto error_of = [](const nlohmann::json& x) {
    try {
      parse_fsm_policy(x.dump(), "bad.json");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json bad = j;
  bad["scorer"]["features"][0] = "magic";
  CHECK(error_of(bad).find("scorer feature 'magic' is unknown") != std::string::npos);
  bad = j;
  bad["scorer"]["type_bias"].push_back(1.0);
  CHECK(error_of(bad).find("'type_bias' must be an array of") != std::string::npos);
  bad = j;
  bad["scorer"]["weights"][2] = "x";
  CHECK(error_of(bad).find("must be a finite number") != std::string::npos);
  bad = j;
  bad["costs"]["types"][d.info.types[0]] = {-1.0, 0.0};
  CHECK(error_of(bad).find("must not be negative") != std::string::npos);
  bad = j;
  bad["costs"]["combine"] = "max";
  CHECK(error_of(bad).find("costs 'combine' must be \"sum\" or \"chain\"") != std::string::npos);
  bad = j;
  bad["costs"]["batch_us"] = -2;
  CHECK(error_of(bad).find("costs 'batch_us' must not be negative") != std::string::npos);
  bad = j;
  bad["types"][1] = d.info.types[0];
  CHECK(error_of(bad).find("type '" + d.info.types[0] + "' is listed twice (types 0 and 1)") !=
        std::string::npos);
  bad = j;
  bad["version"] = 4;
  CHECK(error_of(bad).find("format version 4, this build reads versions 1 to 3") !=
        std::string::npos);
}

TEST_CASE("fsm auto: learns once, caches, reuses; refuses other types and corrupt files") {
  const fs::path dir = temp_dir("auto");
  const Synthetic lattices("lattice_lstm", 48, 16, 11);
  const Synthetic trees("random_dag", 32, 16, 12);  // other types, off the bound
  std::vector<std::string> warnings;
  PolicyContext ctx;
  ctx.cache_dir = dir.string();
  ctx.auto_budget_s = 0;  // no limit: the result does not depend on the machine's speed
  ctx.warn = [&](const std::string& w) { warnings.push_back(w); };
  auto files = [&] {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
  };
  AutoPolicy first(ctx);
  std::vector<Schedule> learned;
  for (const Graph* g : lattices.range(0, 3)) {
    learned.emplace_back();
    run_batches(*g, first, &learned.back());
  }
  CHECK(first.trained());
  CHECK(files() == 1);
  CHECK(fs::path(first.cache_path()).parent_path() == dir);
  CHECK(warnings.empty());
  // A second run reuses the cache: no training, the same schedules.
  AutoPolicy second(ctx);
  for (size_t i = 0; i < 3; ++i) {
    Schedule s;
    run_batches(*lattices.graphs[i], second, &s);
    CHECK(s.nodes == learned[i].nodes);
  }
  CHECK(!second.trained());
  CHECK(second.lookups().scored + second.lookups().hits > 0);
  CHECK(warnings.empty());
  // Another model's types: another key and file.
  {
    AutoPolicy tree(ctx);
    run_batches(*trees.graphs[0], tree, nullptr);
    CHECK(tree.trained());
    CHECK(files() == 2);
    // A file of other types in the tree's place is refused with a warning, then replaced.
    fs::copy_file(first.cache_path(), tree.cache_path(), fs::copy_options::overwrite_existing);
    AutoPolicy stale(ctx);
    run_batches(*trees.graphs[0], stale, nullptr);
    CHECK(stale.trained());
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("ignoring the cached policy") != std::string::npos);
    CHECK(load_fsm_policy(tree.cache_path()).info.types !=
          load_fsm_policy(first.cache_path()).info.types);
  }
  // Trees are at the lower bound under lb-greedy: nothing to learn, nothing cached yet.
  {
    const Synthetic at_bound("tree_lstm", 32, 16, 13);
    const size_t before = files();
    AutoPolicy tree(ctx);
    run_batches(*at_bound.graphs[0], tree, nullptr);
    CHECK(!tree.trained());
    CHECK(files() == before);
  }
  // A corrupt entry: a warning, training, and a good file again.
  warnings.clear();
  std::ofstream(first.cache_path()) << "{\"format\": \"edbatch-fsm-pol";
  AutoPolicy third(ctx);
  Schedule s;
  run_batches(*lattices.graphs[0], third, &s);
  CHECK(third.trained());
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("corrupt or truncated") != std::string::npos);
  CHECK(s.nodes == learned[0].nodes);  // training is deterministic without a time limit
  CHECK_NOTHROW(load_fsm_policy(third.cache_path()));
  // A pipe in its place (reading or writing it would wait for the other end for good): it is
  // neither read nor written, each said, and the policy is learned all the same.
  const std::string kept = third.cache_path() + ".kept";
  fs::rename(third.cache_path(), kept);
  REQUIRE(::mkfifo(third.cache_path().c_str(), 0600) == 0);
  warnings.clear();
  AutoPolicy fourth(ctx);
  run_batches(*lattices.graphs[0], fourth, &s);
  CHECK(fourth.trained());
  CHECK(s.nodes == learned[0].nodes);
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0].find("ignoring the cached policy") != std::string::npos);
  CHECK(warnings[1].find("cannot cache the learned policy") != std::string::npos);
  for (const std::string& w : warnings) CHECK(w.find("is not a regular file") != std::string::npos);
  fs::remove(third.cache_path());
  fs::rename(kept, third.cache_path());
  // The engine takes it by name, with the directory in its options.
  EngineOptions eo;
  eo.policy = "auto";
  eo.device = "cpu";  // the device is part of the key: the context's default
  eo.policy_cache_dir = dir.string();
  Engine engine(const_cast<ParameterCollection&>(lattices.pc), eo);
  Graph& g = *lattices.graphs[1];
  engine.forward(g, g.expr(g.size() - 1));
  CHECK(engine.stats().batches == learned[1].batches.size());
  CHECK(!dynamic_cast<const AutoPolicy&>(engine.policy()).trained());
  fs::remove_all(dir);
}

TEST_CASE("fsm auto: what is learned after graphs at the bound is cached under its own types") {
  // One engine may schedule graphs lb-greedy leaves at the lower bound (nothing to learn) before
  // graphs of other types: the entry must be found again by a later run of the same sequence.
  const fs::path dir = temp_dir("auto-later");
  const Synthetic at_bound("tree_lstm", 32, 16, 13);
  const Synthetic dags("random_dag", 32, 16, 12);
  std::vector<std::string> warnings;
  PolicyContext ctx;
  ctx.cache_dir = dir.string();
  ctx.auto_budget_s = 0;
  ctx.warn = [&](const std::string& w) { warnings.push_back(w); };
  auto run = [&](AutoPolicy& p) {
    std::vector<Schedule> out(3);
    run_batches(*at_bound.graphs[0], p, &out[0]);
    run_batches(*dags.graphs[0], p, &out[1]);
    run_batches(*dags.graphs[1], p, &out[2]);
    return out;
  };
  AutoPolicy first(ctx);
  const std::vector<Schedule> learned = run(first);
  CHECK(first.trained());
  const std::string dag_entry =
      (dir / (AutoPolicy::cache_key(*dags.graphs[0], "cpu") + ".json")).string();
  CHECK(first.cache_path() == dag_entry);
  CHECK(fs::exists(dag_entry));
  CHECK(!fs::exists(dir / (AutoPolicy::cache_key(*at_bound.graphs[0], "cpu") + ".json")));
  AutoPolicy second(ctx);
  const std::vector<Schedule> reused = run(second);
  CHECK(!second.trained());
  CHECK(warnings.empty());
  for (size_t i = 0; i < learned.size(); ++i) CHECK(reused[i].nodes == learned[i].nodes);
  fs::remove_all(dir);
}

TEST_CASE("fsm auto: a budget that runs out before anything is learned is not final") {
  // The budget ends before the teacher's search does: lb-greedy schedules, with a warning that
  // names the cache; runs with the same budget reuse the entry without training again, and a run
  // with no limit learns and replaces it.
  const fs::path dir = temp_dir("auto-budget");
  const Synthetic dags("random_dag", 32, 16, 12);
  const Graph& g = *dags.graphs[0];
  std::vector<std::string> warnings;
  PolicyContext ctx;
  ctx.cache_dir = dir.string();
  ctx.auto_budget_s = 1e-9;
  ctx.warn = [&](const std::string& w) { warnings.push_back(w); };
  Schedule greedy;
  std::unique_ptr<Policy> lb = make_policy("lb-greedy");
  run_batches(g, *lb, &greedy);
  AutoPolicy first(ctx);
  Schedule s1;
  run_batches(g, first, &s1);
  CHECK(first.trained());
  CHECK(s1.nodes == greedy.nodes);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("ran out before anything was learned") != std::string::npos);
  CHECK(warnings[0].find(first.cache_path()) != std::string::npos);
  REQUIRE(fs::exists(first.cache_path()));
  const nlohmann::json training =
      nlohmann::json::parse(load_fsm_policy(first.cache_path()).info.training);
  CHECK(training["out_of_time"] == true);
  CHECK(training["best"] == "lb-greedy");
  warnings.clear();
  AutoPolicy same(ctx);
  Schedule s2;
  run_batches(g, same, &s2);
  CHECK(!same.trained());
  CHECK(s2.nodes == greedy.nodes);
  CHECK(warnings.empty());
  ctx.auto_budget_s = 0;  // no limit
  AutoPolicy unlimited(ctx);
  Schedule s3;
  run_batches(g, unlimited, &s3);
  CHECK(unlimited.trained());
  CHECK(warnings.empty());
  CHECK(s3.batches.size() < greedy.batches.size());
  const nlohmann::json now =
      nlohmann::json::parse(load_fsm_policy(unlimited.cache_path()).info.training);
  CHECK(now["out_of_time"] == false);
  AutoPolicy later(ctx);  // and the learned entry is final
  run_batches(g, later, nullptr);
  CHECK(!later.trained());
  fs::remove_all(dir);
}

TEST_CASE("fsm train: a time budget that cuts the teacher short leaves no teacher") {
  const Synthetic dags("random_dag", 32, 16, 12);
  std::vector<const Graph*> graphs;
  for (const auto& g : dags.graphs) graphs.push_back(g.get());
  FsmTrainOptions o;
  o.time_budget_s = 1e-9;
  const FsmTrainResult cut = train_fsm_policy(graphs, graphs, o);
  CHECK(cut.out_of_time);
  CHECK(cut.teacher_batches == 0);
  CHECK(cut.best_source == "lb-greedy");
  o.time_budget_s = 0;
  o.episodes = 0;
  o.refine_passes = 0;
  const FsmTrainResult whole = train_fsm_policy(graphs, graphs, o);
  CHECK(!whole.out_of_time);
  CHECK(whole.teacher_batches > 0);
}

TEST_CASE("fsm auto: the default cache directory follows XDG_CACHE_HOME, then HOME") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg-test", 1);
  CHECK(default_policy_cache_dir() == "/tmp/xdg-test/edbatch/policies");
  ::setenv("XDG_CACHE_HOME", "relative", 1);  // XDG: relative paths are ignored
  ::setenv("HOME", "/home/someone", 1);
  CHECK(default_policy_cache_dir() == "/home/someone/.cache/edbatch/policies");
  ::setenv("HOME", "relhome", 1);  // nor a relative HOME (it would follow the working folder)
  CHECK(default_policy_cache_dir().empty());
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  CHECK(default_policy_cache_dir().empty());
  {  // Nowhere to keep what is learned: said once, and the policy still schedules.
    const Synthetic trees("tree_lstm", 8, 8, 3);
    std::vector<std::string> warnings;
    PolicyContext ctx;
    ctx.warn = [&](const std::string& w) { warnings.push_back(w); };
    AutoPolicy p(ctx);
    for (int i = 0; i < 2; ++i) CHECK(run_batches(*trees.graphs[0], p) > 0);
    CHECK(p.cache_path().empty());
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("no cache directory") != std::string::npos);
  }
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
}
