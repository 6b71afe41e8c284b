// The time reward's costs: predicted time of a schedule (a sum over its batches, or its critical
// chain), and measuring per-type costs on a device by regression over forward passes under
// several policies (fsm.h, measure_type_costs), and timing whole policies (measure_policy_times).
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "edbatch/engine.h"
#include "edbatch/fsm.h"
#include "edbatch/graph.h"
#include "edbatch/schedule.h"
#include "edbatch/types.h"

namespace edbatch {

FsmTypeCost FsmCostModel::of(const std::string& type_name) const {
  for (size_t i = 0; i < types.size(); ++i)
    if (types[i] == type_name) return costs[i];
  if (costs.empty()) return {};
  FsmTypeCost mean{0, 0};
  for (const FsmTypeCost& c : costs) {
    mean.launch_us += c.launch_us / costs.size();
    mean.node_us += c.node_us / costs.size();
  }
  return mean;
}

namespace {

// A seeded random order over ready types: schedules unlike the heuristics', so that the
// regression sees batch counts per type vary independently.
class RandomPolicy : public Policy {
 public:
  explicit RandomPolicy(uint64_t seed) : seed_(seed) {}
  const char* name() const override { return "random"; }
  void begin(const Graph&) override { rng_.seed(seed_ + graphs_++); }
  uint32_t choose(const Frontier& f) override {
    return f.ready_types()[rng_() % f.ready_types().size()];
  }

 private:
  uint64_t seed_, graphs_ = 0;
  std::mt19937_64 rng_;
};

// Least squares with non-negative coefficients (a small active-set loop over the normal
// equations, with a tiny ridge so that unused columns stay defined).
std::vector<double> nnls(const std::vector<std::vector<double>>& rows,
                         const std::vector<double>& y) {
  const size_t d = rows.front().size();
  std::vector<bool> zero(d, false);
  std::vector<double> x(d, 0.0);
  for (size_t round = 0; round <= d; ++round) {
    std::vector<std::vector<double>> a(d, std::vector<double>(d + 1, 0.0));
    for (size_t r = 0; r < rows.size(); ++r)
      for (size_t i = 0; i < d; ++i) {
        if (zero[i]) continue;
        for (size_t j = 0; j < d; ++j)
          if (!zero[j]) a[i][j] += rows[r][i] * rows[r][j];
        a[i][d] += rows[r][i] * y[r];
      }
    for (size_t i = 0; i < d; ++i) a[i][i] += zero[i] ? 1.0 : 1e-9 * (1.0 + a[i][i]);
    for (size_t c = 0; c < d; ++c) {  // Gaussian elimination with partial pivoting
      size_t p = c;
      for (size_t r = c + 1; r < d; ++r)
        if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
      std::swap(a[c], a[p]);
      for (size_t r = 0; r < d; ++r) {
        if (r == c || a[c][c] == 0) continue;
        const double f = a[r][c] / a[c][c];
        for (size_t k = c; k <= d; ++k) a[r][k] -= f * a[c][k];
      }
    }
    bool negative = false;
    for (size_t i = 0; i < d; ++i) {
      x[i] = zero[i] || a[i][i] == 0 ? 0.0 : a[i][d] / a[i][i];
      if (x[i] < 0) {
        zero[i] = true;
        negative = true;
      }
    }
    if (!negative) break;
  }
  for (double& v : x) v = std::max(v, 0.0);
  return x;
}

// Per batch of a schedule, the batches of the same schedule it reads from (CSR, each once).
struct BatchInputs {
  std::vector<uint32_t> begin, from;
};

BatchInputs batch_inputs(const Graph& g, const Schedule& s) {
  const uint32_t B = static_cast<uint32_t>(s.batches.size());
  std::vector<uint32_t> batch_of(g.size(), UINT32_MAX), seen(B, UINT32_MAX);
  for (uint32_t b = 0; b < B; ++b)
    for (uint32_t i = 0; i < s.batches[b].count; ++i) batch_of[s.nodes[s.batches[b].begin + i]] = b;
  BatchInputs in;
  in.begin.reserve(B + 1);
  in.begin.push_back(0);
  for (uint32_t b = 0; b < B; ++b) {
    for (uint32_t i = 0; i < s.batches[b].count; ++i) {
      const Node& n = g.node(s.nodes[s.batches[b].begin + i]);
      const uint32_t* a = g.args(n);
      for (uint32_t k = 0; k < n.num_args; ++k) {
        const uint32_t p = scheduled_producer(g, a[k]);
        const uint32_t pb = p == UINT32_MAX ? UINT32_MAX : batch_of[p];
        if (pb == UINT32_MAX || pb == b || seen[pb] == b) continue;
        seen[pb] = b;
        in.from.push_back(pb);
      }
    }
    in.begin.push_back(static_cast<uint32_t>(in.from.size()));
  }
  return in;
}

// The end of the schedule's last batch when each batch starts once those it reads from have
// finished and takes cost[b]; `chain` (when given) gets the batches of the longest chain.
double chain_end(const BatchInputs& in, const std::vector<double>& cost,
                 std::vector<uint32_t>* chain) {
  const size_t B = cost.size();
  std::vector<double> finish(B, 0.0);
  std::vector<uint32_t> via(B, UINT32_MAX);
  uint32_t last = UINT32_MAX;
  for (uint32_t b = 0; b < B; ++b) {
    double start = 0;
    for (uint32_t k = in.begin[b]; k < in.begin[b + 1]; ++k) {
      const uint32_t p = in.from[k];
      if (via[b] != UINT32_MAX && finish[p] <= start) continue;
      start = finish[p];
      via[b] = p;
    }
    finish[b] = start + cost[b];
    if (last == UINT32_MAX || finish[b] > finish[last]) last = b;
  }
  if (chain) {
    chain->clear();
    for (uint32_t b = last; b != UINT32_MAX; b = via[b]) chain->push_back(b);
  }
  return last == UINT32_MAX ? 0.0 : finish[last];
}

// Per-type batch and node counts of a schedule's batches `which` (all when empty), then with
// `chain` all its batches, then 1.
std::vector<double> features(const Schedule& s, const std::vector<uint32_t>& local, size_t T,
                             const std::vector<uint32_t>& which, bool chain) {
  std::vector<double> f(2 * T + 1 + chain, 0.0);
  if (chain) f[2 * T] = static_cast<double>(s.batches.size());
  f.back() = 1.0;
  auto add = [&](const Batch& b) {
    f[local[b.type]] += 1;
    f[T + local[b.type]] += b.count;
  };
  if (which.empty())
    for (const Batch& b : s.batches) add(b);
  for (uint32_t b : which) add(s.batches[b]);
  return f;
}

// One forward pass of a graph's last expression (its summed loss), waited for: the device time
// on a GPU, else the execution time.
double forward_ms(Engine& engine, Graph& g) {
  engine.forward(g, g.expr(g.size() - 1));
  engine.synchronize();
  const Stats& st = engine.stats();
  return st.device_forward_ms > 0 ? st.device_forward_ms : st.execution_ms;
}

double median_of(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

double FsmCostModel::predicted_us(const Graph& g, const Schedule& s) const {
  std::unordered_map<uint32_t, FsmTypeCost> by_type;
  std::vector<double> cost;
  cost.reserve(s.batches.size());
  for (const Batch& b : s.batches) {
    auto it = by_type.find(b.type);
    if (it == by_type.end()) it = by_type.emplace(b.type, of(g.types().name(b.type))).first;
    cost.push_back(it->second.launch_us + it->second.node_us * b.count);
  }
  if (chain) return chain_end(batch_inputs(g, s), cost, nullptr) + batch_us * cost.size();
  double total = 0;
  for (double c : cost) total += c;
  return total;
}

FsmCostModel fit_type_costs(const std::vector<const Graph*>& graphs,
                            const std::vector<Schedule>& schedules,
                            const std::vector<double>& times_us, bool chain) {
  if (graphs.size() != schedules.size() || graphs.size() != times_us.size() || graphs.empty())
    throw std::invalid_argument("[fit_type_costs] needs one graph, schedule and time per sample");
  // The types present, in order of first appearance.
  FsmCostModel model;
  model.chain = chain;
  std::vector<uint32_t> local;
  for (size_t i = 0; i < schedules.size(); ++i)
    for (const Batch& b : schedules[i].batches) {
      if (b.type >= local.size()) local.resize(b.type + 1, UINT32_MAX);
      if (local[b.type] != UINT32_MAX) continue;
      local[b.type] = static_cast<uint32_t>(model.types.size());
      model.types.push_back(graphs[i]->types().name(b.type));
    }
  const size_t T = model.types.size(), n = schedules.size();
  std::vector<std::vector<double>> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = features(schedules[i], local, T, {}, false);
  std::vector<double> x = nnls(rows, times_us);
  if (chain) {
    // The chains depend on the costs: refit on the chains of the last costs until they settle.
    std::vector<BatchInputs> inputs;
    for (size_t i = 0; i < n; ++i) inputs.push_back(batch_inputs(*graphs[i], schedules[i]));
    std::vector<std::vector<uint32_t>> chains(n), before;
    for (int round = 0; round < 8 && chains != before; ++round) {
      before = chains;
      for (size_t i = 0; i < n; ++i) {
        std::vector<double> cost;
        for (const Batch& b : schedules[i].batches)
          cost.push_back(x[local[b.type]] + x[T + local[b.type]] * b.count);
        chain_end(inputs[i], cost, &chains[i]);
        rows[i] = features(schedules[i], local, T, chains[i], true);
      }
      if (chains != before) x = nnls(rows, times_us);
    }
  }
  for (size_t t = 0; t < T; ++t) model.costs.push_back({x[t], x[T + t]});
  // A chain fit has the batches' column before the constant (none when no schedule has a batch).
  if (chain && x.size() == 2 * T + 2) model.batch_us = x[2 * T];
  return model;
}

FsmCostModel measure_type_costs(ParameterCollection& params, const std::vector<Graph*>& graphs,
                                const EngineOptions& device, uint32_t reps, uint64_t seed,
                                bool chain, const std::function<bool()>& stop) {
  if (graphs.size() < 2 || reps == 0)
    throw std::invalid_argument("[measure_type_costs] needs two graphs or more and reps > 0");
  std::vector<std::unique_ptr<Policy>> policies;
  for (const char* p : {"lb-greedy", "agenda", "depth"}) policies.push_back(make_policy(p));
  for (uint64_t i = 0; i < 3; ++i)
    policies.push_back(std::make_unique<RandomPolicy>(seed + 977 * i));
  std::vector<const Graph*> sampled;
  std::vector<Schedule> schedules;
  std::vector<double> times;
  for (auto& policy : policies) {
    Engine engine(params, std::move(policy), device);
    std::vector<std::vector<double>> ms(graphs.size());
    for (uint32_t rep = 0; rep <= reps; ++rep)  // the first round warms up
      for (size_t i = 0; i < graphs.size(); ++i) {
        if (stop && stop()) return FsmCostModel{};
        const double t = forward_ms(engine, *graphs[i]);
        if (rep == 0) {
          sampled.push_back(graphs[i]);
          schedules.push_back(engine.schedule());
          continue;
        }
        ms[i].push_back(t);
      }
    for (auto& m : ms) times.push_back(1e3 * median_of(m));
  }
  FsmCostModel model = fit_type_costs(sampled, schedules, times, chain);
  model.device = device.device;
  return model;
}

std::vector<double> measure_policy_times(ParameterCollection& params,
                                         const std::vector<Graph*>& graphs,
                                         std::vector<std::unique_ptr<Policy>> policies,
                                         const EngineOptions& device, uint32_t reps,
                                         const std::function<bool()>& stop) {
  if (graphs.empty() || policies.empty() || reps == 0)
    throw std::invalid_argument("[measure_policy_times] needs graphs, policies and reps > 0");
  std::vector<std::unique_ptr<Engine>> engines;
  for (auto& policy : policies)
    engines.push_back(std::make_unique<Engine>(params, std::move(policy), device));
  // ms[p][i]: policy p's timed passes of graph i. The policies alternate graph by graph, so
  // that a slow spell of the machine falls on all of them alike.
  std::vector<std::vector<std::vector<double>>> ms(engines.size(),
                                                   std::vector<std::vector<double>>(graphs.size()));
  for (uint32_t rep = 0; rep <= reps; ++rep)  // the first round warms up
    for (size_t i = 0; i < graphs.size(); ++i)
      for (size_t p = 0; p < engines.size(); ++p) {
        if (stop && stop()) return {};
        const double t = forward_ms(*engines[p], *graphs[i]);
        if (rep > 0) ms[p][i].push_back(t);
      }
  std::vector<double> mean_us(engines.size(), 0.0);
  for (size_t p = 0; p < engines.size(); ++p)
    for (auto& m : ms[p]) mean_us[p] += 1e3 * median_of(m) / static_cast<double>(graphs.size());
  return mean_us;
}

}  // namespace edbatch
