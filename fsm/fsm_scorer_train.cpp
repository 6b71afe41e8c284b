// Training the scorer: imitation of the teacher's plans (a softmax over the ready types, fitted
// by full-batch Adam steps), then a seeded (1+1) evolution strategy on the training cost itself,
// which is what the scorer is judged by. Gradients are summed in fixed chunks, in chunk order,
// and the search is sequential, so a seed gives one scorer at any thread count.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "fsm/fsm_sim.h"

namespace edbatch {

namespace {

// The states of the plans with two or more ready types: their feature rows and the position of
// the plan's choice among them.
struct Samples {
  std::vector<double> features;  // rows x kFsmFeatures
  std::vector<uint32_t> index;   // per row: the type index
  std::vector<uint32_t> begin;   // per sample: first row (one past the end: the last entry)
  std::vector<uint32_t> target;  // per sample: the chosen row, relative to begin
};

Samples collect(const std::vector<TrainGraph>& tgs,
                const std::vector<std::vector<uint32_t>>& plans) {
  Samples s;
  std::vector<ReadyView> views;
  std::vector<double> f;
  for (size_t i = 0; i < plans.size(); ++i) {
    SimState st(tgs[i].sim);
    for (uint32_t t : plans[i]) {
      const uint32_t r = static_cast<uint32_t>(st.ready_types.size());
      if (r > 1) {
        views.resize(r);
        f.resize(static_cast<size_t>(r) * kFsmFeatures);
        uint32_t target = 0;
        for (uint32_t j = 0; j < r; ++j) {
          const uint32_t u = st.ready_types[j];
          views[j] = {u,
                      tgs[i].sim.global[u],
                      tgs[i].sim.index[u],
                      static_cast<uint32_t>(st.ready[u].size()),
                      st.critical_ready(u),
                      st.critical_total(u),
                      st.top[u],
                      tgs[i].sim.avg_depth[u]};
          if (u == t) target = j;
          s.index.push_back(tgs[i].sim.index[u]);
        }
        fsm_features(views.data(), r, f.data());
        s.begin.push_back(static_cast<uint32_t>(s.features.size() / kFsmFeatures));
        s.features.insert(s.features.end(), f.begin(), f.end());
        s.target.push_back(target);
      }
      st.run(t);
    }
  }
  s.begin.push_back(static_cast<uint32_t>(s.features.size() / kFsmFeatures));
  return s;
}

// theta = weights (kFsmFeatures) then biases (one per type index).
FsmScorer scorer_of(const std::vector<double>& theta) {
  FsmScorer s;
  s.weights.assign(theta.begin(), theta.begin() + kFsmFeatures);
  s.type_bias.assign(theta.begin() + kFsmFeatures, theta.end());
  return s;
}

// Mean cross-entropy gradient over the samples, plus an L2 term.
void gradient(const Samples& s, const std::vector<double>& theta, std::vector<double>& grad) {
  const size_t n = s.target.size(), dims = theta.size();
  constexpr size_t kChunks = 64;
  std::vector<std::vector<double>> part(kChunks, std::vector<double>(dims, 0.0));
  tbb::parallel_for(size_t(0), kChunks, [&](size_t c) {
    std::vector<double> score;
    std::vector<double>& g = part[c];
    for (size_t i = c * n / kChunks; i < (c + 1) * n / kChunks; ++i) {
      const uint32_t b = s.begin[i], r = s.begin[i + 1] - b;
      score.resize(r);
      double top = -HUGE_VAL;
      for (uint32_t j = 0; j < r; ++j) {
        const double* f = &s.features[size_t(b + j) * kFsmFeatures];
        double v = theta[kFsmFeatures + s.index[b + j]];
        for (uint32_t k = 0; k < kFsmFeatures; ++k) v += theta[k] * f[k];
        score[j] = v;
        top = std::max(top, v);
      }
      double z = 0;
      for (double& v : score) z += (v = std::exp(v - top));
      for (uint32_t j = 0; j < r; ++j) {
        const double p = score[j] / z - (j == s.target[i] ? 1.0 : 0.0);
        const double* f = &s.features[size_t(b + j) * kFsmFeatures];
        for (uint32_t k = 0; k < kFsmFeatures; ++k) g[k] += p * f[k];
        g[kFsmFeatures + s.index[b + j]] += p;
      }
    }
  });
  grad.assign(dims, 0.0);
  for (const auto& g : part)
    for (size_t k = 0; k < dims; ++k) grad[k] += g[k];
  for (size_t k = 0; k < dims; ++k) grad[k] = grad[k] / std::max<size_t>(n, 1) + 1e-3 * theta[k];
}

}  // namespace

FsmScorer train_scorer(const std::vector<TrainGraph>& tgs,
                       const std::vector<std::vector<uint32_t>>& plans, uint32_t num_indices,
                       FsmEncoding encoding, const FsmTrainOptions& o,
                       const std::function<bool()>& out_of_time) {
  // Start from lb-greedy's order: the share of critical nodes ready, then shallower.
  std::vector<double> theta(kFsmFeatures + num_indices, 0.0);
  theta[0] = 4.0;
  theta[4] = -0.5;
  if (!plans.empty() && o.scorer_steps > 0) {
    const Samples s = collect(tgs, plans);
    std::vector<double> m(theta.size(), 0.0), v(theta.size(), 0.0), g;
    const double lr = 0.05, b1 = 0.9, b2 = 0.999;
    double p1 = 1, p2 = 1;
    for (uint32_t step = 0; step < o.scorer_steps && !s.target.empty(); ++step) {
      if (step % 16 == 0 && out_of_time()) break;
      gradient(s, theta, g);
      p1 *= b1;
      p2 *= b2;
      for (size_t k = 0; k < theta.size(); ++k) {
        m[k] = b1 * m[k] + (1 - b1) * g[k];
        v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k];
        theta[k] -= lr * (m[k] / (1 - p1)) / (std::sqrt(v[k] / (1 - p2)) + 1e-8);
      }
    }
  }
  // (1+1) search on the cost: Gaussian steps relative to the weights' size, the one-fifth rule
  // for the step, equal costs accepted (a plateau is crossed, not stuck on).
  FsmScorer best = scorer_of(theta);
  double best_cost = evaluate(tgs, {encoding, nullptr, &best});
  std::mt19937_64 rng(o.seed ^ 0x5c0e5c0e5c0eull);
  std::normal_distribution<double> normal(0.0, 1.0);
  double sigma = 0.3;
  for (uint32_t it = 0; it < o.scorer_search && !out_of_time(); ++it) {
    double norm = 0;
    for (double x : theta) norm += x * x;
    norm = std::sqrt(norm / theta.size()) + 1e-6;
    std::vector<double> trial = theta;
    for (double& x : trial) x += sigma * norm * normal(rng);
    const FsmScorer candidate = scorer_of(trial);
    const double cost = evaluate(tgs, {encoding, nullptr, &candidate});
    if (cost <= best_cost) {
      sigma *= cost < best_cost ? 1.5 : 1.0;
      best_cost = cost;
      best = candidate;
      theta.swap(trial);
    } else {
      sigma *= 0.85;
    }
    sigma = std::clamp(sigma, 0.01, 2.0);
  }
  return best;
}

}  // namespace edbatch
