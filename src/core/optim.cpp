// Optimizers (edbatch/optim.h): their state, the host update, and the optimizer classes.
#include "edbatch/optim.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>

#include "edbatch/engine.h"
#include "edbatch/params.h"

namespace edbatch {

uint32_t UpdateRule::slots() const {
  switch (kind) {
    case Kind::Sgd:
      return momentum > 0 ? 1 : 0;
    case Kind::Adam:
      return 2;
    case Kind::Adagrad:
      return 1;
  }
  return 0;
}

// ---- OptimizerState ----

namespace {
std::atomic<uint64_t> next_serial{1};
}

OptimizerState::OptimizerState() : serial_(next_serial++) {}

OptimizerState::~OptimizerState() {
  // Backends free their device copies; none of them fetches any more.
  std::vector<std::pair<const void*, std::function<void()>>> attached = std::move(attached_);
  for (auto& a : attached) a.second();
}

void OptimizerState::ensure(const ParameterCollection& pc, uint32_t slots) {
  if (covers(pc, slots)) return;
  fetch_from_device();
  if (slots_ != slots && !floats_.empty() && slots_ != 0)
    throw std::invalid_argument("[OptimizerState] the state holds " + std::to_string(slots_) +
                                " slots per parameter, the step needs " + std::to_string(slots));
  slots_ = slots;
  floats_.resize(pc.size(), 0);
  for (uint32_t k = 0; k < 2; ++k) data_[k].resize(pc.size());
  for (uint32_t id = 0; id < pc.size(); ++id) {
    if (pc.is_view(id)) continue;
    const size_t n = pc.dim(id).size();
    floats_[id] = n;
    for (uint32_t k = 0; k < 2; ++k) data_[k][id].resize(k < slots ? n : 0, 0.0f);
  }
  ++version_;
}

bool OptimizerState::covers(const ParameterCollection& pc, uint32_t slots) const {
  if (floats_.size() != pc.size() || (slots_ != slots && !floats_.empty())) return false;
  for (uint32_t id = 0; id < pc.size(); ++id)
    if (floats_[id] != (pc.is_view(id) ? 0 : pc.dim(id).size())) return false;
  return true;
}

float* OptimizerState::slot(uint32_t k, uint32_t id) {
  return const_cast<float*>(static_cast<const OptimizerState*>(this)->slot(k, id));
}

const float* OptimizerState::slot(uint32_t k, uint32_t id) const {
  fetch_from_device();
  if (k >= slots_ || id >= floats_.size() || floats_[id] == 0)
    throw std::invalid_argument("[OptimizerState] no slot " + std::to_string(k) +
                                " for parameter " + std::to_string(id));
  return data_[k][id].data();
}

void OptimizerState::clear() {
  fetch_from_device();
  for (auto& slot : data_)
    for (auto& v : slot) std::fill(v.begin(), v.end(), 0.0f);
  step_ = 0;
  ++version_;
}

void OptimizerState::set_device_fetch(const void* owner, std::function<void()> fetch) {
  if (fetch_ && fetch_owner_ != owner) fetch_from_device();
  fetch_ = std::move(fetch);
  fetch_owner_ = owner;
}

void OptimizerState::fetch_from_device() const {
  if (!fetch_) return;
  std::function<void()> f = std::move(fetch_);
  fetch_ = nullptr;  // the fetch writes through the host slots
  f();
}

void OptimizerState::attach(const void* owner, std::function<void()> on_destroy) {
  for (auto& a : attached_)
    if (a.first == owner) {
      a.second = std::move(on_destroy);
      return;
    }
  attached_.emplace_back(owner, std::move(on_destroy));
}

void OptimizerState::detach(const void* owner) {
  attached_.erase(std::remove_if(attached_.begin(), attached_.end(),
                                 [owner](const auto& a) { return a.first == owner; }),
                  attached_.end());
  if (fetch_ && fetch_owner_ == owner) fetch_ = nullptr;
}

// ---- The host update ----

namespace {

// The per-element rule over [0, n) of one parameter's floats, with its slots m and v.
struct HostRule {
  UpdateRule::Kind kind;
  float lr, momentum, beta1, beta2, eps, wd, scale, bc1, bc2;

  // One loop per rule (kept free of branches, so the compiler vectorizes it).
  void apply(float* w, const float* grad, float* m, float* v, size_t n) const {
    switch (kind) {
      case UpdateRule::Kind::Sgd:
        if (m) {
          for (size_t i = 0; i < n; ++i) {
            const float g = grad[i] * scale + wd * w[i];
            m[i] = momentum * m[i] + g;
            w[i] -= lr * m[i];
          }
        } else {
          for (size_t i = 0; i < n; ++i) {
            const float g = grad[i] * scale + wd * w[i];
            w[i] -= lr * g;
          }
        }
        break;
      case UpdateRule::Kind::Adam:
        for (size_t i = 0; i < n; ++i) {
          const float g = grad[i] * scale + wd * w[i];
          m[i] = beta1 * m[i] + (1.0f - beta1) * g;
          v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
          w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
        }
        break;
      case UpdateRule::Kind::Adagrad:
        for (size_t i = 0; i < n; ++i) {
          const float g = grad[i] * scale + wd * w[i];
          m[i] += g * g;
          w[i] -= lr * g / (std::sqrt(m[i]) + eps);
        }
        break;
    }
  }
};

double squared(const float* g, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

}  // namespace

void apply_update(ParameterCollection& pc, const UpdateRule& rule, OptimizerState& state) {
  pc.fetch_from_device();
  const uint32_t slots = rule.slots();
  state.ensure(pc, slots);
  state.fetch_from_device();
  // The squared norm of what the step reads: every gradient, or for lazy lookup tables their
  // touched columns (the others are zero).
  float scale = rule.grad_scale;
  if (rule.clip_norm > 0) {
    double sum = 0;
    for (uint32_t id = 0; id < pc.size(); ++id) {
      if (pc.is_view(id)) continue;
      const float* g = pc.grads(id);
      if (pc.is_lookup(id) && rule.sparse_lookups) {
        const uint32_t d = pc.dim(id).rows;
        for (uint32_t c : pc.touched_columns(id)) sum += squared(g + size_t(c) * d, d);
      } else {
        sum += squared(g, pc.dim(id).size());
      }
    }
    scale = clip_scale(rule.grad_scale, rule.clip_norm, sum);
  }
  const HostRule r{rule.kind,
                   rule.lr,
                   rule.momentum,
                   rule.beta1,
                   rule.beta2,
                   rule.eps,
                   rule.weight_decay,
                   scale,
                   bias_correction(rule.beta1, rule.step),
                   bias_correction(rule.beta2, rule.step)};
  for (uint32_t id = 0; id < pc.size(); ++id) {
    if (pc.is_view(id)) continue;  // updated through its base
    float* w = pc.values(id);
    float* g = pc.grads(id);
    float* m = slots > 0 ? state.slot(0, id) : nullptr;
    float* v = slots > 1 ? state.slot(1, id) : nullptr;
    if (pc.is_lookup(id) && rule.sparse_lookups) {
      const uint32_t d = pc.dim(id).rows;
      for (uint32_t c : pc.touched_columns(id)) {
        const size_t at = size_t(c) * d;
        r.apply(w + at, g + at, m ? m + at : nullptr, v ? v + at : nullptr, d);
      }
    } else {
      r.apply(w, g, m, v, pc.dim(id).size());
    }
  }
  if (slots > 0) state.mark_changed();
  pc.mark_changed();
  pc.zero_grads();
}

float clip_scale(float grad_scale, float clip_norm, double squared_norm) {
  const double norm = std::fabs(static_cast<double>(grad_scale)) * std::sqrt(squared_norm);
  if (clip_norm <= 0 || !(norm > clip_norm)) return grad_scale;
  return static_cast<float>(grad_scale * (clip_norm / norm));
}

float bias_correction(float beta, uint64_t step) {
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
}

// ---- Optimizers ----

Optimizer::Optimizer(ParameterCollection& pc, const UpdateRule& rule) : pc_(pc), rule_(rule) {
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("[Optimizer] " + what);
  };
  check(std::isfinite(rule.lr) && rule.lr > 0,
        "lr must be positive, got " + std::to_string(rule.lr));
  check(rule.momentum >= 0 && rule.momentum < 1,
        "momentum must be in [0, 1), got " + std::to_string(rule.momentum));
  check(rule.momentum == 0 || rule.kind == UpdateRule::Kind::Sgd,
        "momentum applies to sgd (heavy-ball momentum), not to adam or adagrad (adam's moments "
        "decay by beta1 and beta2), got " +
            std::to_string(rule.momentum));
  check(rule.beta1 >= 0 && rule.beta1 < 1 && rule.beta2 >= 0 && rule.beta2 < 1,
        "beta1 and beta2 must be in [0, 1)");
  check(std::isfinite(rule.eps) && rule.eps > 0, "eps must be positive");
  check(std::isfinite(rule.weight_decay) && rule.weight_decay >= 0,
        "weight_decay must be at least 0, got " + std::to_string(rule.weight_decay));
  check(std::isfinite(rule.clip_norm) && rule.clip_norm >= 0,
        "clip_norm must be at least 0 (0: no clipping), got " + std::to_string(rule.clip_norm));
  state_.ensure(pc_, rule_.slots());
}

Optimizer::~Optimizer() = default;

UpdateRule Optimizer::next_rule(float grad_scale) const {
  if (!std::isfinite(grad_scale))  // every update, host or device, takes its rule from here
    throw std::invalid_argument("[Optimizer::step] grad_scale = " + std::to_string(grad_scale) +
                                ": needs a finite number (it would make every parameter NaN)");
  UpdateRule r = rule_;
  r.grad_scale = grad_scale;
  r.step = state_.step() + 1;
  return r;
}

void Optimizer::step(float grad_scale) {
  const UpdateRule r = next_rule(grad_scale);
  apply_update(pc_, r, state_);
  state_.set_step(r.step);
}

void Optimizer::step(Engine& engine, float grad_scale) {
  if (&engine.params() != &pc_)
    throw std::invalid_argument(
        "[Optimizer::step] the engine runs over another ParameterCollection");
  const UpdateRule r = next_rule(grad_scale);
  engine.optimizer_step(r, state_);
  state_.set_step(r.step);
}

void Optimizer::set_learning_rate(float lr) {
  if (!std::isfinite(lr) || lr <= 0)
    throw std::invalid_argument("[Optimizer] lr must be positive, got " + std::to_string(lr));
  rule_.lr = lr;
}

void Optimizer::set_clip_norm(float clip) {
  if (!std::isfinite(clip) || clip < 0)
    throw std::invalid_argument("[Optimizer] clip_norm must be at least 0, got " +
                                std::to_string(clip));
  rule_.clip_norm = clip;
}

std::vector<std::string> Optimizer::slot_names() const {
  switch (rule_.kind) {
    case UpdateRule::Kind::Sgd:
      return rule_.slots() ? std::vector<std::string>{"momentum_buffer"}
                           : std::vector<std::string>{};
    case UpdateRule::Kind::Adam:
      return {"exp_avg", "exp_avg_sq"};
    case UpdateRule::Kind::Adagrad:
      return {"sum"};
  }
  return {};
}

namespace {
UpdateRule rule_from(UpdateRule::Kind kind, const char* name, const OptimizerOptions& o,
                     float default_eps) {
  UpdateRule r;
  r.kind = kind;
  r.lr = o.lr != 0 ? o.lr : default_learning_rate(name);
  r.momentum = o.momentum;
  r.beta1 = o.beta1;
  r.beta2 = o.beta2;
  r.eps = o.eps != 0 ? o.eps : default_eps;
  r.weight_decay = o.weight_decay;
  r.clip_norm = o.clip_norm;
  r.sparse_lookups = o.sparse_lookups;
  return r;
}
}  // namespace

SgdOptimizer::SgdOptimizer(ParameterCollection& pc, const OptimizerOptions& o)
    : Optimizer(pc,
                rule_from(UpdateRule::Kind::Sgd, o.momentum > 0 ? "momentum" : "sgd", o, 1e-8f)) {}
AdamOptimizer::AdamOptimizer(ParameterCollection& pc, const OptimizerOptions& o)
    : Optimizer(pc, rule_from(UpdateRule::Kind::Adam, "adam", o, 1e-8f)) {}
AdagradOptimizer::AdagradOptimizer(ParameterCollection& pc, const OptimizerOptions& o)
    : Optimizer(pc, rule_from(UpdateRule::Kind::Adagrad, "adagrad", o, 1e-10f)) {}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "momentum", "adam", "adagrad"};
  return names;
}

float default_learning_rate(const std::string& name) {
  if (name == "sgd") return 0.1f;
  if (name == "momentum") return 0.01f;
  if (name == "adam") return 0.001f;
  if (name == "adagrad") return 0.05f;
  throw std::invalid_argument("[optimizer] unknown optimizer '" + name +
                              "' (expected sgd, momentum, adam or adagrad)");
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, ParameterCollection& pc,
                                          const OptimizerOptions& options) {
  default_learning_rate(name);  // throws for an unknown name
  if (name == "sgd") return std::make_unique<SgdOptimizer>(pc, options);
  if (name == "momentum") {
    OptimizerOptions o = options;
    if (o.momentum == 0) o.momentum = 0.9f;
    if (o.lr == 0) o.lr = default_learning_rate("momentum");
    return std::make_unique<SgdOptimizer>(pc, o);
  }
  if (name == "adam") return std::make_unique<AdamOptimizer>(pc, options);
  return std::make_unique<AdagradOptimizer>(pc, options);
}

}  // namespace edbatch
