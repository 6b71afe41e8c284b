// The libtorch adapter's ops for the built-in cells: edbatch::run_cell (schema, CPU and CUDA
// kernels, autograd), prepare, and the cells' weight shapes. Tensors are checked and viewed as the
// torch-free Packed format of cells.h (runtime.h); the work is a Runner's.
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "edbatch/backend.h"
#include "edbatch/schedule.h"
#include "src/torch/runtime.h"

namespace edbatch::torch_adapter {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A call's arguments, with its loss head if any.
CallArgs cell_call(const std::string& cell, const Tensor& x, at::TensorList weights, int64_t hidden,
                   int64_t num_node_types, int64_t num_arc_types, const std::string& policy,
                   int64_t threads, const std::string& loss) {
  CallArgs a = call_args(cell, x, hidden, num_node_types, num_arc_types, policy, threads);
  if (!loss.empty()) set_loss_head(a, loss, head_classes(weights));
  return a;
}

// The forward of run_cell; keeps the runner in `state` when it is given (for backward).
std::vector<Tensor> forward_cell(const std::string& cell, const Tensor& x, const Structure& s,
                                 at::TensorList weights, int64_t hidden, int64_t num_node_types,
                                 int64_t num_arc_types, const std::string& policy, int64_t threads,
                                 const c10::optional<Tensor>& labels, const std::string& loss,
                                 c10::intrusive_ptr<RunState>* state) {
  CallExtras extras;
  extras.labels = labels;
  return run_forward(
      cell_call(cell, x, weights, hidden, num_node_types, num_arc_types, policy, threads, loss), x,
      s, weights.vec(), state, extras);
}

std::vector<Tensor> run_cell(const std::string& cell, const Tensor& x, const Tensor& node_inputs,
                             const Tensor& node_types, const Tensor& pred_ptr,
                             const Tensor& pred_ids, const Tensor& arc_types,
                             const Tensor& arc_inputs, const Tensor& instance_offsets,
                             at::TensorList weights, int64_t hidden, int64_t num_node_types,
                             int64_t num_arc_types, const std::string& policy, int64_t threads,
                             const c10::optional<Tensor>& labels, const std::string& loss) {
  return forward_cell(
      cell, x,
      {node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets},
      weights, hidden, num_node_types, num_arc_types, policy, threads, labels, loss, nullptr);
}

class CellFunction : public torch::autograd::Function<CellFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const std::string& cell, const Tensor& x,
                               const Tensor& node_inputs, const Tensor& node_types,
                               const Tensor& pred_ptr, const Tensor& pred_ids,
                               const Tensor& arc_types, const Tensor& arc_inputs,
                               const Tensor& instance_offsets, at::TensorList weights,
                               int64_t hidden, int64_t num_node_types, int64_t num_arc_types,
                               const std::string& policy, int64_t threads,
                               const c10::optional<Tensor>& labels, const std::string& loss) {
    c10::intrusive_ptr<RunState> state;
    std::vector<Tensor> out = forward_cell(
        cell, x,
        {node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets},
        weights, hidden, num_node_types, num_arc_types, policy, threads, labels, loss, &state);
    keep_input_edges(*state, x, weights);
    ctx->saved_data["state"] = c10::IValue(state);
    ctx->saved_data["x_device"] = c10::IValue(x.device());
    ctx->saved_data["num_weights"] = static_cast<int64_t>(weights.size());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = ctx->saved_data["state"].toCustomClass<RunState>();
    Gradients g = autograd_backward(*state, ctx->saved_data["x_device"].toDevice(), grads);
    // One gradient per forward argument: cell, x, 7 structure tensors, the weights, 5 options,
    // labels and loss.
    variable_list out;
    out.push_back(Tensor());
    out.push_back(g.x);
    for (int i = 0; i < 7; ++i) out.push_back(Tensor());
    for (Tensor& t : g.weights) out.push_back(t);
    for (int i = 0; i < 7; ++i) out.push_back(Tensor());
    return out;
  }
};

std::vector<Tensor> run_cell_autograd(
    const std::string& cell, const Tensor& x, const Tensor& node_inputs, const Tensor& node_types,
    const Tensor& pred_ptr, const Tensor& pred_ids, const Tensor& arc_types,
    const Tensor& arc_inputs, const Tensor& instance_offsets, at::TensorList weights,
    int64_t hidden, int64_t num_node_types, int64_t num_arc_types, const std::string& policy,
    int64_t threads, const c10::optional<Tensor>& labels, const std::string& loss) {
  bool needs_grad = x.requires_grad();
  for (const Tensor& w : weights) needs_grad = needs_grad || w.requires_grad();
  if (!needs_grad || !at::GradMode::is_enabled()) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return run_cell(cell, x, node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
                    instance_offsets, weights, hidden, num_node_types, num_arc_types, policy,
                    threads, labels, loss);
  }
  return CellFunction::apply(cell, x, node_inputs, node_types, pred_ptr, pred_ids, arc_types,
                             arc_inputs, instance_offsets, weights, hidden, num_node_types,
                             num_arc_types, policy, threads, labels, loss);
}

// run_cell with a loss head, and its backward, in one call with no autograd graph (a training
// step, docs/pytorch.md): [loss, x's gradient, each weight's gradient], the weights listed in
// `update` updated in place with lr instead (run_step).
std::vector<Tensor> run_cell_step(const std::string& cell, const Tensor& x,
                                  const Tensor& node_inputs, const Tensor& node_types,
                                  const Tensor& pred_ptr, const Tensor& pred_ids,
                                  const Tensor& arc_types, const Tensor& arc_inputs,
                                  const Tensor& instance_offsets, at::TensorList weights,
                                  int64_t hidden, int64_t num_node_types, int64_t num_arc_types,
                                  const std::string& policy, int64_t threads,
                                  const c10::optional<Tensor>& labels, const std::string& loss,
                                  double lr, at::IntArrayRef update) {
  at::AutoDispatchBelowADInplaceOrView guard;  // the gradients are the op's outputs
  CallExtras extras;
  extras.labels = labels;
  return run_step(
      cell_call(cell, x, weights, hidden, num_node_types, num_arc_types, policy, threads, loss), x,
      {node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets},
      weights.vec(), extras, lr, update);
}

// Prepares a later run_cell call with this structure (and x of num_x rows on `device`) on a
// worker thread: checks, graph build, scheduling and planning (docs/pytorch.md).
void prepare(const std::string& cell, const std::string& device, int64_t input_size, int64_t num_x,
             const Tensor& node_inputs, const Tensor& node_types, const Tensor& pred_ptr,
             const Tensor& pred_ids, const Tensor& arc_types, const Tensor& arc_inputs,
             const Tensor& instance_offsets, int64_t hidden, int64_t num_node_types,
             int64_t num_arc_types, const std::string& policy, int64_t threads,
             const c10::optional<Tensor>& labels, const std::string& loss, int64_t classes) {
  const c10::Device where(device);
  if (num_x < 0)
    fail(fmt::format("[edbatch] the number of x rows must not be negative, got {}", num_x));
  const CallArgs a =
      call_args(cell, where, input_size, hidden, num_node_types, num_arc_types, policy, threads);
  prepare_call(
      a, where,
      {node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets}, num_x,
      input_size, loss, classes, labels);
}

// [prepared, used, failed, dropped, runners, waiting]: RunnerPool::counts.
std::vector<int64_t> prepare_counts() { return RunnerPool::get().counts(); }

std::vector<std::string> list_cells() { return cell_names(); }

std::vector<std::string> list_policies() {
  return policy_names();
}

// [budget in bytes, forward passes on a reused plan so far].
std::vector<int64_t> plan_cache_info() {
  return {plan_cache_bytes(), static_cast<int64_t>(plans_reused_total())};
}

// What this build carries: its backends (edbatch::built_backends) and where CUDA tensors go.
std::tuple<std::vector<std::string>, std::string> build_info() {
  return {built_backends(), cuda_tensor_path()};
}

// Empty when the backend can run here, else why not (edbatch::device_unavailable).
std::string device_status(const std::string& device) { return device_unavailable(device); }

// The weights run_cell expects for a configuration: names and torch shapes (cols 0: a vector).
std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<int64_t>> weight_shapes(
    const std::string& cell, int64_t hidden, int64_t input_size, int64_t num_node_types,
    int64_t num_arc_types) {
  check_sizes(hidden, input_size, num_node_types, num_arc_types);
  ParameterCollection pc;
  std::unique_ptr<Cell> c;
  try {
    c = make_cell({cell,
                   static_cast<uint32_t>(hidden),
                   static_cast<uint32_t>(input_size),
                   static_cast<uint32_t>(num_node_types),
                   static_cast<uint32_t>(num_arc_types),
                   {}},
                  pc);
  } catch (const std::exception&) {
    fail_handled();
  }
  std::vector<std::string> names;
  std::vector<int64_t> rows, cols;
  for (const WeightSpec& w : c->weights()) {
    names.push_back(w.name);
    rows.push_back(w.rows);
    cols.push_back(w.cols);
  }
  return {names, rows, cols};
}

}  // namespace

TORCH_LIBRARY(edbatch, m) {
  m.class_<RunState>("RunState");
  m.def(
      "run_cell(str cell, Tensor x, Tensor node_inputs, Tensor node_types, Tensor pred_ptr, "
      "Tensor pred_ids, Tensor arc_types, Tensor arc_inputs, Tensor instance_offsets, "
      "Tensor[] weights, int hidden, int num_node_types, int num_arc_types, str policy, "
      "int threads, Tensor? labels=None, str loss=\"\") -> Tensor[]");
  m.def(
      "run_cell_step(str cell, Tensor x, Tensor node_inputs, Tensor node_types, Tensor pred_ptr, "
      "Tensor pred_ids, Tensor arc_types, Tensor arc_inputs, Tensor instance_offsets, "
      "Tensor[] weights, int hidden, int num_node_types, int num_arc_types, str policy, "
      "int threads, Tensor? labels, str loss, float lr=0.0, int[] update=[]) -> Tensor[]");
  m.def(
      "prepare(str cell, str device, int input_size, int num_x, Tensor node_inputs, "
      "Tensor node_types, Tensor pred_ptr, Tensor pred_ids, Tensor arc_types, "
      "Tensor arc_inputs, Tensor instance_offsets, int hidden, int num_node_types, "
      "int num_arc_types, str policy, int threads, Tensor? labels=None, str loss=\"\", "
      "int classes=0) -> ()",
      &prepare);
  m.def("prepare_counts() -> int[]", &prepare_counts);
  m.def("cells() -> str[]", &list_cells);
  m.def("policies() -> str[]", &list_policies);
  m.def("set_plan_cache(int bytes) -> int", &set_plan_cache_bytes);
  m.def("set_check_numerics(bool on) -> bool", &set_check_numerics);
  m.def("plan_cache_info() -> int[]", &plan_cache_info);
  m.def("build_info() -> (str[], str)", &build_info);
  m.def("device_status(str device) -> str", &device_status);
  m.def("weight_shapes(str cell, int hidden, int input_size, int num_node_types, "
        "int num_arc_types) -> (str[], int[], int[])",
        &weight_shapes);
}

// The CUDA kernel is the CPU one: the engine takes host-side structures and parameters, and the
// device the Runner was made for ("cuda" for CUDA tensors) does the math.
// run_cell_step records no autograd graph: its Autograd kernel is the op itself.
TORCH_LIBRARY_IMPL(edbatch, CPU, m) {
  m.impl("run_cell", &run_cell);
  m.impl("run_cell_step", &run_cell_step);
}
TORCH_LIBRARY_IMPL(edbatch, CUDA, m) {
  m.impl("run_cell", &run_cell);
  m.impl("run_cell_step", &run_cell_step);
}
TORCH_LIBRARY_IMPL(edbatch, Autograd, m) {
  m.impl("run_cell", &run_cell_autograd);
  m.impl("run_cell_step", &run_cell_step);
}

}  // namespace edbatch::torch_adapter

