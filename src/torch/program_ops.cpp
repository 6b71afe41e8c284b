// The op for traced user cells: edbatch::propagate runs a program (docs/programs.md) over a packed
// mini-batch, with autograd into x and the weights. Runners, checks and the backward are the
// built-in cells' (runtime.h).
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "src/torch/program.h"
#include "src/torch/runtime.h"

namespace edbatch::torch_adapter {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

CallArgs program_args(const std::string& program, const c10::Device& device, int64_t input_dim,
                      const std::string& policy, int64_t threads) {
  CallArgs a;
  a.config.cell = kProgramPrefix + program;
  a.config.hidden = 1;
  if (input_dim < 0 || input_dim > INT32_MAX)
    fail(fmt::format("[edbatch.propagate] the input size must be from 0 to {}, got {}", INT32_MAX,
                     input_dim));
  a.config.input_dim = static_cast<uint32_t>(input_dim);
  set_run_options(a, device, policy, threads);
  return a;
}

CallArgs program_args(const std::string& program, const Tensor& x, const Tensor& ids,
                      const std::string& policy, int64_t threads) {
  if (x.dim() != 2)
    fail(fmt::format("[edbatch.propagate] x must be 2-D, got shape {}", shape(x.sizes())));
  if (ids.numel() > 0 && ids.numel() != x.size(0))
    fail(fmt::format("[edbatch.propagate] {} ids for {} input rows", ids.numel(), x.size(0)));
  return program_args(program, x.device(), x.size(1), policy, threads);
}

// A call's arguments (with its loss head, if any) and its extras.
CallArgs program_call(const std::string& program, const Tensor& x, const Tensor& ids,
                      at::TensorList weights, int64_t seed, const std::string& policy,
                      int64_t threads, const c10::optional<Tensor>& labels, const std::string& loss,
                      CallExtras& extras) {
  CallArgs a = program_args(program, x, ids, policy, threads);
  if (!loss.empty()) set_loss_head(a, loss, head_classes(weights));
  extras.ids = ids;
  extras.seed = static_cast<uint64_t>(seed);
  extras.labels = labels;
  return a;
}

std::vector<Tensor> run_program(const std::string& program, const Tensor& x, const Tensor& ids,
                                const Structure& s, at::TensorList weights, int64_t seed,
                                const std::string& policy, int64_t threads,
                                const c10::optional<Tensor>& labels, const std::string& loss,
                                c10::intrusive_ptr<RunState>* state) {
  CallExtras extras;
  const CallArgs a =
      program_call(program, x, ids, weights, seed, policy, threads, labels, loss, extras);
  return run_forward(a, x, s, weights.vec(), state, extras);
}

std::vector<Tensor> propagate(const std::string& program, const Tensor& x, const Tensor& ids,
                              const Tensor& node_inputs, const Tensor& node_types,
                              const Tensor& pred_ptr, const Tensor& pred_ids,
                              const Tensor& arc_types, const Tensor& arc_inputs,
                              const Tensor& instance_offsets, at::TensorList weights, int64_t seed,
                              const std::string& policy, int64_t threads,
                              const c10::optional<Tensor>& labels, const std::string& loss) {
  const Structure s{node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
                    instance_offsets};
  return run_program(program, x, ids, s, weights, seed, policy, threads, labels, loss, nullptr);
}

class ProgramFunction : public torch::autograd::Function<ProgramFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const std::string& program, const Tensor& x,
                               const Tensor& ids, const Tensor& node_inputs,
                               const Tensor& node_types, const Tensor& pred_ptr,
                               const Tensor& pred_ids, const Tensor& arc_types,
                               const Tensor& arc_inputs, const Tensor& instance_offsets,
                               at::TensorList weights, int64_t seed, const std::string& policy,
                               int64_t threads, const c10::optional<Tensor>& labels,
                               const std::string& loss) {
    const Structure s{node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
                      instance_offsets};
    c10::intrusive_ptr<RunState> state;
    std::vector<Tensor> out =
        run_program(program, x, ids, s, weights, seed, policy, threads, labels, loss, &state);
    keep_input_edges(*state, x, weights);
    ctx->saved_data["state"] = c10::IValue(state);
    ctx->saved_data["x_device"] = c10::IValue(x.device());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = ctx->saved_data["state"].toCustomClass<RunState>();
    Gradients g = autograd_backward(*state, ctx->saved_data["x_device"].toDevice(), grads);
    // One gradient per forward argument: program, x, ids, 7 structure tensors, the weights,
    // seed, policy, threads, labels, loss.
    variable_list out{Tensor(), g.x, Tensor()};
    for (int i = 0; i < 7; ++i) out.push_back(Tensor());
    for (Tensor& t : g.weights) out.push_back(t);
    for (int i = 0; i < 5; ++i) out.push_back(Tensor());
    return out;
  }
};

std::vector<Tensor> propagate_autograd(
    const std::string& program, const Tensor& x, const Tensor& ids, const Tensor& node_inputs,
    const Tensor& node_types, const Tensor& pred_ptr, const Tensor& pred_ids,
    const Tensor& arc_types, const Tensor& arc_inputs, const Tensor& instance_offsets,
    at::TensorList weights, int64_t seed, const std::string& policy, int64_t threads,
    const c10::optional<Tensor>& labels, const std::string& loss) {
  bool needs_grad = x.requires_grad();
  for (const Tensor& w : weights) needs_grad = needs_grad || w.requires_grad();
  if (!needs_grad || !at::GradMode::is_enabled()) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return propagate(program, x, ids, node_inputs, node_types, pred_ptr, pred_ids, arc_types,
                     arc_inputs, instance_offsets, weights, seed, policy, threads, labels, loss);
  }
  return ProgramFunction::apply(program, x, ids, node_inputs, node_types, pred_ptr, pred_ids,
                                arc_types, arc_inputs, instance_offsets, weights, seed, policy,
                                threads, labels, loss);
}

// propagate with a loss head, and its backward, in one call with no autograd graph (a training
// step, docs/pytorch.md): [loss, x's gradient, each weight's gradient], the weights listed in
// `update` updated in place with lr instead (run_step).
std::vector<Tensor> propagate_step(const std::string& program, const Tensor& x, const Tensor& ids,
                                   const Tensor& node_inputs, const Tensor& node_types,
                                   const Tensor& pred_ptr, const Tensor& pred_ids,
                                   const Tensor& arc_types, const Tensor& arc_inputs,
                                   const Tensor& instance_offsets, at::TensorList weights,
                                   int64_t seed, const std::string& policy, int64_t threads,
                                   const c10::optional<Tensor>& labels, const std::string& loss,
                                   double lr, at::IntArrayRef update) {
  at::AutoDispatchBelowADInplaceOrView guard;  // the gradients are the op's outputs
  CallExtras extras;
  const CallArgs a =
      program_call(program, x, ids, weights, seed, policy, threads, labels, loss, extras);
  return run_step(
      a, x, {node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets},
      weights.vec(), extras, lr, update);
}

// Prepares a later propagate call with this structure, x of num_x rows of input_size floats on
// `device`, these ids (none: no cell embeds ids) and no dropout, on a worker thread (the built-in
// cells' prepare).
void propagate_prepare(const std::string& program, const std::string& device, int64_t input_size,
                       int64_t num_x, const Tensor& node_inputs, const Tensor& node_types,
                       const Tensor& pred_ptr, const Tensor& pred_ids, const Tensor& arc_types,
                       const Tensor& arc_inputs, const Tensor& instance_offsets,
                       const std::string& policy, int64_t threads,
                       const c10::optional<Tensor>& labels, const std::string& loss,
                       int64_t classes, const c10::optional<Tensor>& ids) {
  const c10::Device where(device);
  if (num_x < 0 || input_size < 0)
    fail(fmt::format("[edbatch.propagate] x rows and input size must not be negative, got {} and {}",
                     num_x, input_size));
  const CallArgs a = program_args(program, where, input_size, policy, threads);
  prepare_call(
      a, where,
      {node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets}, num_x,
      input_size, loss, classes, labels, ids);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(edbatch, m) {
  m.def(
      "propagate(str program, Tensor x, Tensor ids, Tensor node_inputs, Tensor node_types, "
      "Tensor pred_ptr, Tensor pred_ids, Tensor arc_types, Tensor arc_inputs, "
      "Tensor instance_offsets, Tensor[] weights, int seed, str policy, int threads, "
      "Tensor? labels=None, str loss=\"\") -> Tensor[]");
  m.def(
      "propagate_step(str program, Tensor x, Tensor ids, Tensor node_inputs, Tensor node_types, "
      "Tensor pred_ptr, Tensor pred_ids, Tensor arc_types, Tensor arc_inputs, "
      "Tensor instance_offsets, Tensor[] weights, int seed, str policy, int threads, "
      "Tensor? labels, str loss, float lr=0.0, int[] update=[]) -> Tensor[]");
  m.def(
      "propagate_prepare(str program, str device, int input_size, int num_x, Tensor node_inputs, "
      "Tensor node_types, Tensor pred_ptr, Tensor pred_ids, Tensor arc_types, Tensor arc_inputs, "
      "Tensor instance_offsets, str policy, int threads, Tensor? labels=None, str loss=\"\", "
      "int classes=0, Tensor? ids=None) -> ()",
      &propagate_prepare);
}
// propagate_step records no autograd graph: its Autograd kernel is the op itself.
TORCH_LIBRARY_IMPL(edbatch, CPU, m) {
  m.impl("propagate", &propagate);
  m.impl("propagate_step", &propagate_step);
}
TORCH_LIBRARY_IMPL(edbatch, CUDA, m) {
  m.impl("propagate", &propagate);
  m.impl("propagate_step", &propagate_step);
}
TORCH_LIBRARY_IMPL(edbatch, Autograd, m) {
  m.impl("propagate", &propagate_autograd);
  m.impl("propagate_step", &propagate_step);
}

}  // namespace edbatch::torch_adapter
