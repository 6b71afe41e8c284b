// Optimizers: SGD (with momentum), Adam and AdaGrad, with L2 weight decay and gradient clipping by
// global norm. They update a ParameterCollection where its parameters live: on the host, or
// through an Engine on its backend (on a CUDA device the update and the optimizer's state stay on
// the device). State (step count, moments) saves and loads with save_optimizer_state /
// load_optimizer_state (edbatch/safetensors.h).
//
//   AdamOptimizer opt(pc, {/*lr=*/1e-3f});
//   ... engine.forward(g, loss); engine.backward(g, loss);
//   opt.step(engine, 1.0f / batch);   // gradients of the mean loss; then they are zeroed
//
// Every rule sees, per element, the gradient
//   g = s * grad + weight_decay * w,     s = grad_scale * min(1, clip_norm / ||grad_scale * grad||)
// (the clipping factor only with clip_norm > 0; the norm is the L2 norm over every gradient the
// step reads, computed before weight decay, as torch.nn.utils.clip_grad_norm_ before a PyTorch
// optimizer's step, though exact: without its 1e-6 added to the norm). Then, with t the step
// number from 1:
//   sgd       w -= lr * g;  with momentum mu > 0: b = mu * b + g (b = g at first); w -= lr * b
//   adam      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//             w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//   adagrad   G += g^2;  w -= lr * g / (sqrt(G) + eps)
// which are PyTorch's SGD (dampening 0, not Nesterov), Adam (not AdamW) and Adagrad (no learning
// rate decay, initial accumulator 0) for the same hyperparameters. Then the gradients are zeroed,
// as ParameterCollection::sgd_update does.
//
// Lookup tables are lazy (sparse_lookups, the default, as DyNet's trainers and PyTorch's
// SparseAdam): a step reads and updates only the columns the backward passes since the last step
// touched, so the moments, momentum and weight decay of a word not in the mini-batch stay as they
// were, and Adam's bias correction uses the global step t. With sparse_lookups = false a lookup
// table is updated like any parameter, every column every step (PyTorch's Adam on a dense
// nn.Embedding gradient). Views are updated through their base, stacked parameters once each.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace edbatch {

class Engine;
class ParameterCollection;

// One step as the backends apply it (see the formulas above).
struct UpdateRule {
  enum class Kind : uint8_t { Sgd, Adam, Adagrad };
  Kind kind = Kind::Sgd;
  float lr = 0.1f;
  float momentum = 0;                  // sgd
  float beta1 = 0.9f, beta2 = 0.999f;  // adam
  float eps = 1e-8f;                   // adam, adagrad
  float weight_decay = 0;
  float grad_scale = 1;  // gradients are multiplied by this first (1 / mini-batch for a mean loss)
  float clip_norm = 0;   // > 0: the gradients' global norm (after grad_scale) is at most this
  bool sparse_lookups = true;
  uint64_t step = 1;  // t, from 1

  // State floats per parameter float: sgd 0 (1 with momentum), adam 2 (m, v), adagrad 1 (G).
  uint32_t slots() const;
};

// An optimizer's per-parameter state: `slots()` arrays of each parameter's size (views have
// none), and the number of steps taken. A backend that keeps a device copy leaves a fetch here as
// ParameterCollection does: every host access of a slot runs it first.
class OptimizerState {
 public:
  OptimizerState();
  ~OptimizerState();
  OptimizerState(const OptimizerState&) = delete;
  OptimizerState& operator=(const OptimizerState&) = delete;

  uint32_t slots() const { return slots_; }
  uint64_t step() const { return step_; }
  void set_step(uint64_t step) { step_ = step; }
  // Zero slots for every parameter of `pc` (not views) that has none yet, `slots` per float;
  // throws if the state already holds another number of slots per parameter.
  void ensure(const ParameterCollection& pc, uint32_t slots);
  // True when ensure(pc, slots) would change nothing.
  bool covers(const ParameterCollection& pc, uint32_t slots) const;
  // Parameter ids with slots are those below ids() that are not views.
  uint32_t ids() const { return static_cast<uint32_t>(floats_.size()); }
  size_t floats(uint32_t id) const { return id < floats_.size() ? floats_[id] : 0; }
  // Slot k of parameter `id` (floats(id) floats, column-major as the parameter).
  float* slot(uint32_t k, uint32_t id);
  const float* slot(uint32_t k, uint32_t id) const;
  // Sets every slot to zero and the step count to 0.
  void clear();

  // Changes when host code changes the slots (loading, ensure, clear, a host step): a device copy
  // is uploaded again. Code that writes through slot() calls mark_changed().
  uint64_t version() const { return version_; }
  void mark_changed() { ++version_; }
  // As ParameterCollection::set_device_fetch / fetch_from_device.
  void set_device_fetch(const void* owner, std::function<void()> fetch);
  void fetch_from_device() const;
  const void* device_fetch_owner() const { return fetch_ ? fetch_owner_ : nullptr; }
  // A backend holding a device copy registers a call for when the state is destroyed (to free
  // it); a backend destroyed first fetches what it holds and detaches.
  void attach(const void* owner, std::function<void()> on_destroy);
  void detach(const void* owner);
  // Identifies this state among all states of the process (never reused).
  uint64_t serial() const { return serial_; }

 private:
  uint32_t slots_ = 0;
  uint64_t step_ = 0;
  uint64_t version_ = 0;
  uint64_t serial_;
  std::vector<size_t> floats_;               // per parameter id; 0 for views
  std::vector<std::vector<float>> data_[2];  // [slot][id]
  mutable std::function<void()> fetch_;
  const void* fetch_owner_ = nullptr;
  std::vector<std::pair<const void*, std::function<void()>>> attached_;
};

// One step on the host: the rule over pc's values and gradients, then pc.zero_grads(). What
// Backend::optimizer_step does on backends whose parameters live on the host.
void apply_update(ParameterCollection& pc, const UpdateRule& rule, OptimizerState& state);
// The factor s of the formulas above: grad_scale, times clip_norm / norm when clip_norm > 0 and
// norm = |grad_scale| * sqrt(squared_norm) (squared_norm: the raw gradients') exceeds it.
float clip_scale(float grad_scale, float clip_norm, double squared_norm);
// 1 - beta^step (Adam's bias correction), computed in double.
float bias_correction(float beta, uint64_t step);

// Hyperparameters; a zero lr or eps means the optimizer's default.
struct OptimizerOptions {
  float lr = 0;        // defaults: default_learning_rate(name)
  float momentum = 0;  // sgd only: heavy-ball momentum ("momentum" defaults to 0.9); adam and
                       // adagrad refuse any other than 0
  float beta1 = 0.9f, beta2 = 0.999f;  // adam
  float eps = 0;                       // adam 1e-8, adagrad 1e-10
  float weight_decay = 0;
  float clip_norm = 0;  // 0: no clipping
  bool sparse_lookups = true;
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "sgd", "adam" or "adagrad".
  virtual const char* name() const = 0;

  // One step on the host (ParameterCollection's values; a device copy is fetched first and
  // uploaded again by its backend's next pass). The gradients are multiplied by `grad_scale`
  // first: 1 / mini-batch size for the mean of a summed loss.
  void step(float grad_scale = 1.0f);
  // One step where `engine`'s backend holds the parameters: on a CUDA device, without copying
  // parameters, gradients or state to the host. The engine must be over this optimizer's
  // collection.
  void step(Engine& engine, float grad_scale = 1.0f);
  // The rule the next step applies.
  UpdateRule next_rule(float grad_scale = 1.0f) const;

  float learning_rate() const { return rule_.lr; }
  void set_learning_rate(float lr);
  float clip_norm() const { return rule_.clip_norm; }
  void set_clip_norm(float clip);
  const UpdateRule& hyperparameters() const { return rule_; }  // step and grad_scale unused
  uint64_t steps() const { return state_.step(); }
  OptimizerState& state() { return state_; }
  const OptimizerState& state() const { return state_; }
  ParameterCollection& params() const { return pc_; }
  // Names of the slots in saved state files, slots() of them: sgd "momentum_buffer", adam
  // "exp_avg" and "exp_avg_sq", adagrad "sum" (PyTorch's state keys).
  std::vector<std::string> slot_names() const;

 protected:
  Optimizer(ParameterCollection& pc, const UpdateRule& rule);

 private:
  ParameterCollection& pc_;
  UpdateRule rule_;
  OptimizerState state_;
};

class SgdOptimizer : public Optimizer {
 public:
  explicit SgdOptimizer(ParameterCollection& pc, const OptimizerOptions& o = {});
  const char* name() const override { return "sgd"; }
};

class AdamOptimizer : public Optimizer {
 public:
  explicit AdamOptimizer(ParameterCollection& pc, const OptimizerOptions& o = {});
  const char* name() const override { return "adam"; }
};

class AdagradOptimizer : public Optimizer {
 public:
  explicit AdagradOptimizer(ParameterCollection& pc, const OptimizerOptions& o = {});
  const char* name() const override { return "adagrad"; }
};

// "sgd", "momentum" (SGD with momentum 0.9 unless options.momentum says otherwise), "adam",
// "adagrad". Throws std::invalid_argument for another name or a bad hyperparameter.
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, ParameterCollection& pc,
                                          const OptimizerOptions& options = {});
const std::vector<std::string>& optimizer_names();
// The learning rate `name` uses when options.lr is 0 (sgd 0.1, momentum 0.01, adam 0.001,
// adagrad 0.05): see docs/models.md for how they were chosen.
float default_learning_rate(const std::string& name);

}  // namespace edbatch
