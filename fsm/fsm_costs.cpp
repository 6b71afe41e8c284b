// The time reward's costs: predicted time of a schedule, and measuring per-type costs on a device
// by regression over forward passes under several policies (fsm.h, measure_type_costs).
#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include "edbatch/engine.h"
#include "edbatch/fsm.h"
#include "edbatch/graph.h"
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

double FsmCostModel::predicted_us(const Graph& g, const Schedule& s) const {
  std::unordered_map<uint32_t, FsmTypeCost> by_type;
  double total = 0;
  for (const Batch& b : s.batches) {
    auto it = by_type.find(b.type);
    if (it == by_type.end()) it = by_type.emplace(b.type, of(g.types().name(b.type))).first;
    total += it->second.launch_us + it->second.node_us * b.count;
  }
  return total;
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

}  // namespace

FsmCostModel measure_type_costs(ParameterCollection& params, const std::vector<Graph*>& graphs,
                                const EngineOptions& device, uint32_t reps, uint64_t seed) {
  if (graphs.size() < 2 || reps == 0)
    throw std::invalid_argument("[measure_type_costs] needs two graphs or more and reps > 0");
  // The types present, and per sample (graph, policy) the batches and nodes of each.
  std::vector<uint32_t> local(graphs.front()->types().size() + 1, UINT32_MAX);
  FsmCostModel model;
  model.device = device.device;
  std::vector<uint32_t> globals;
  for (Graph* g : graphs)
    for (const Node& n : g->nodes())
      if (is_scheduled(n.op)) {
        if (n.type >= local.size()) local.resize(n.type + 1, UINT32_MAX);
        if (local[n.type] == UINT32_MAX) {
          local[n.type] = static_cast<uint32_t>(globals.size());
          globals.push_back(n.type);
          model.types.push_back(g->types().name(n.type));
        }
      }
  const size_t T = globals.size();
  std::vector<std::unique_ptr<Policy>> policies;
  for (const char* p : {"lb-greedy", "agenda", "depth"}) policies.push_back(make_policy(p));
  for (uint64_t i = 0; i < 3; ++i)
    policies.push_back(std::make_unique<RandomPolicy>(seed + 977 * i));
  std::vector<std::vector<double>> rows;
  std::vector<double> times;
  for (auto& policy : policies) {
    Engine engine(params, std::move(policy), device);
    std::vector<std::vector<double>> ms(graphs.size());
    std::vector<std::vector<double>> features(graphs.size());
    for (uint32_t rep = 0; rep <= reps; ++rep)  // the first round warms up
      for (size_t i = 0; i < graphs.size(); ++i) {
        Graph& g = *graphs[i];
        engine.forward(g, g.expr(g.size() - 1));
        engine.synchronize();
        const Stats& st = engine.stats();
        if (rep == 0) {
          std::vector<double>& f = features[i];
          f.assign(2 * T + 1, 0.0);
          f[2 * T] = 1.0;
          for (const Batch& b : engine.schedule().batches) {
            f[local[b.type]] += 1;
            f[T + local[b.type]] += b.count;
          }
          continue;
        }
        ms[i].push_back(st.device_forward_ms > 0 ? st.device_forward_ms : st.execution_ms);
      }
    for (size_t i = 0; i < graphs.size(); ++i) {
      std::sort(ms[i].begin(), ms[i].end());
      rows.push_back(features[i]);
      times.push_back(1e3 * ms[i][ms[i].size() / 2]);
    }
  }
  const std::vector<double> x = nnls(rows, times);
  for (size_t t = 0; t < T; ++t) model.costs.push_back({x[t], x[T + t]});
  return model;
}

}  // namespace edbatch
