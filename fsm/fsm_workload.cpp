// Mini-batch graphs of a zoo model for the trainer, and batch counts under a policy.
#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

#include "edbatch/fsm.h"
#include "edbatch/graph.h"
#include "edbatch/models.h"

namespace edbatch {

namespace {
std::vector<const Graph*> pointers(const std::vector<std::unique_ptr<Graph>>& graphs) {
  std::vector<const Graph*> out;
  for (const auto& g : graphs) out.push_back(g.get());
  return out;
}

// The graph `edbatch run` builds for these instances: every loss, summed.
std::unique_ptr<Graph> build(Model& model, const std::vector<uint32_t>& ids) {
  auto g = std::make_unique<Graph>(model.params());
  std::vector<Expr> losses;
  for (uint32_t i : ids) losses.push_back(model.build(*g, i));
  sum_losses(losses);
  return g;
}
}  // namespace

std::vector<const Graph*> FsmWorkload::train_graphs() const { return pointers(train); }
std::vector<const Graph*> FsmWorkload::validation_graphs() const { return pointers(validation); }

FsmWorkload make_fsm_workload(Model& model, uint32_t batch, uint32_t train_batches,
                              uint32_t validation_batches, uint64_t seed) {
  return make_fsm_workload(model, batch, {batch}, train_batches, validation_batches, seed);
}

FsmWorkload make_fsm_workload(Model& model, uint32_t batch,
                              const std::vector<uint32_t>& train_sizes, uint32_t train_batches,
                              uint32_t validation_batches, uint64_t seed) {
  const uint32_t n = model.size();
  if (n == 0 || batch == 0 || train_batches == 0 || validation_batches == 0 || train_sizes.empty())
    throw std::invalid_argument("[make_fsm_workload] empty data set, mini-batch or count");
  for (uint32_t s : train_sizes)
    if (s == 0) throw std::invalid_argument("[make_fsm_workload] a training mini-batch size is 0");
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const uint32_t held = std::max(1u, n / 5);
  const uint32_t pool = n > 1 ? n - held : n;  // one instance serves both
  FsmWorkload w;
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b < validation_batches; ++b) {
    const uint32_t begin = n - held + b * batch;
    if (begin >= n) break;
    ids.assign(order.begin() + begin, order.begin() + std::min(n, begin + batch));
    w.validation.push_back(build(model, ids));
  }
  for (uint32_t b = 0; b < train_batches; ++b) {
    const uint32_t take = std::min(train_sizes[b % train_sizes.size()], pool);
    // A partial Fisher-Yates shuffle of the training pool picks `take` distinct instances.
    for (uint32_t i = 0; i < take; ++i)
      std::swap(order[i], order[i + rng() % (pool - i)]);
    ids.assign(order.begin(), order.begin() + take);
    w.train.push_back(build(model, ids));
  }
  return w;
}

double mean_batches(const std::vector<const Graph*>& graphs, Policy& policy,
                    const FsmCostModel* costs, double* cost_us) {
  Scheduler scheduler;
  Schedule s;
  double total = 0, time = 0;
  for (const Graph* g : graphs) {
    scheduler.run(*g, policy, s);
    total += s.batches.size();
    if (costs) time += costs->predicted_us(*g, s);
  }
  if (cost_us) *cost_us = graphs.empty() ? 0 : time / graphs.size();
  return graphs.empty() ? 0 : total / graphs.size();
}

double mean_lower_bound(const std::vector<const Graph*>& graphs) {
  Scheduler scheduler;
  Schedule s;
  auto policy = make_policy("depth");  // the cheapest run; the bound does not depend on it
  double total = 0;
  for (const Graph* g : graphs) {
    scheduler.run(*g, *policy, s);
    total += s.lower_bound;
  }
  return graphs.empty() ? 0 : total / graphs.size();
}

}  // namespace edbatch
