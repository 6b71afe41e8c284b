// The scorer's features and choice (fsm/fsm_scorer.h).
#include <algorithm>
#include <cmath>

#include "edbatch/fsm.h"

namespace edbatch {

const char* fsm_feature_name(uint32_t i) {
  static const char* const names[kFsmFeatures] = {
      "share",     "full",  "log_ready", "rel_bound",
      "rel_depth", "slack", "longest",   "full_x_rel_bound"};
  return i < kFsmFeatures ? names[i] : "?";
}

void fsm_features(const ReadyView* v, uint32_t r, double* out) {
  uint32_t max_bound = 1;
  double dmin = 0, dmax = 0;
  for (uint32_t i = 0; i < r; ++i) {
    max_bound = std::max(max_bound, v[i].bound);
    dmin = i == 0 ? v[i].depth : std::min(dmin, v[i].depth);
    dmax = i == 0 ? v[i].depth : std::max(dmax, v[i].depth);
  }
  const double drange = dmax > dmin ? dmax - dmin : 1.0;
  for (uint32_t i = 0; i < r; ++i) {
    const ReadyView& t = v[i];
    double* f = out + static_cast<size_t>(i) * kFsmFeatures;
    const double full = t.critical_ready >= t.critical_total ? 1.0 : 0.0;
    const double rel_bound = static_cast<double>(t.bound) / max_bound;
    f[0] = static_cast<double>(t.critical_ready) / std::max(t.critical_total, 1u);
    f[1] = full;
    f[2] = std::log2(1.0 + t.ready);
    f[3] = rel_bound;
    f[4] = (t.depth - dmin) / drange;
    f[5] = t.ready > t.critical_ready ? double(t.ready - t.critical_ready) / t.ready : 0.0;
    f[6] = t.bound == max_bound ? 1.0 : 0.0;
    f[7] = full * rel_bound;
  }
}

uint32_t fsm_score_choice(const FsmScorer& s, const ReadyView* v, uint32_t r, double* features) {
  fsm_features(v, r, features);
  uint32_t best = 0;
  double best_score = 0;
  for (uint32_t i = 0; i < r; ++i) {
    const double* f = features + static_cast<size_t>(i) * kFsmFeatures;
    double score = v[i].index < s.type_bias.size() ? s.type_bias[v[i].index] : 0.0;
    for (uint32_t k = 0; k < kFsmFeatures; ++k) score += s.weights[k] * f[k];
    if (i == 0 || score > best_score) {
      best = i;
      best_score = score;
      continue;
    }
    if (score < best_score) continue;
    const double* b = features + static_cast<size_t>(best) * kFsmFeatures;
    if (f[0] > b[0] || (f[0] == b[0] && (v[i].depth < v[best].depth ||
                                         (v[i].depth == v[best].depth && v[i].tie < v[best].tie))))
      best = i;
  }
  return best;
}

}  // namespace edbatch
