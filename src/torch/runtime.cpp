#include "src/torch/runtime.h"

#ifdef EDBATCH_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>

#include <atomic>
#include <cstdlib>

#include "edbatch/options.h"

namespace edbatch::torch_adapter {

void fail(const std::string& what) {
  TORCH_CHECK_VALUE(false, what);
}
void fail_type(const std::string& what) {
  TORCH_CHECK_TYPE(false, what);
}
void fail_handled() {
  try {
    throw;
  } catch (const c10::Error&) {
    throw;
  } catch (const std::logic_error& e) {
    TORCH_CHECK_VALUE(false, std::string(e.what()));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, std::string(e.what()));
  }
  std::abort();  // not reached: every handler throws, and anything else passed as it is
}

std::string shape(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// CUDA tensors stay on the GPU when the extension was built with the CUDA backend: weights,
// inputs, outputs and gradients move on the device, on torch's current stream, and nothing
// waits for the GPU. Otherwise, or with EDBATCH_TORCH_HOST_COPY=1, they make a round trip
// through host memory.
bool device_resident(const Tensor& x) {
#ifdef EDBATCH_TORCH_CUDA
  static const bool host_copy = adapter_debug_env().host_copy;
  return x.is_cuda() && !host_copy;
#else
  (void)x;
  return false;
#endif
}

std::string cuda_tensor_path() {
#ifdef EDBATCH_TORCH_CUDA
  return adapter_debug_env().host_copy ? "host" : "gpu";
#else
  return "host";
#endif
}

void* current_stream(const Tensor& t) {
#ifdef EDBATCH_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  (void)t;
  return nullptr;
#endif
}

void check_storage(const Tensor& t, const char* what) {
  if (t.defined() && t.layout() != at::kStrided) {
    std::ostringstream layout;
    layout << t.layout();
    fail_type(
        fmt::format("[edbatch] {} must be a dense tensor, got layout {} (call .to_dense() "
                    "first)",
                    what, layout.str()));
  }
  // A functorch / torch.func transform's wrapper (grad, vjp, jacrev, vmap; autograd.grad with
  // is_grads_batched=True) holds no storage of its own.
  if (t.defined() && t.layout() == at::kStrided && !t.has_storage())
    fail(fmt::format(
        "[edbatch] {} is a tensor without storage, as torch.func / functorch transforms (grad, "
        "vjp, jacrev, jacfwd, vmap) and autograd.grad(..., is_grads_batched=True) make: edbatch "
        "ops support torch.autograd (backward, torch.autograd.grad) and not these transforms",
        what));
}

void check_index_tensor(const Tensor& t, const char* name, int64_t size) {
  check_storage(t, name);
  if (t.scalar_type() != at::kLong)
    fail_type(
        fmt::format("[edbatch] {} must be int64, got {}", name, c10::toString(t.scalar_type())));
  if (t.dim() != 1)
    fail(fmt::format("[edbatch] {} must be 1-D, got shape {}", name, shape(t.sizes())));
  if (size >= 0 && t.numel() != size)
    fail(fmt::format("[edbatch] {} has {} entries, expected {}", name, t.numel(), size));
}

// Checks the structure tensors' dtypes, devices and sizes and makes them contiguous CPU tensors
// (where the structure is read).
void check_structure(const c10::Device& device, Structure& s) {
  const int64_t N = s.node_inputs.numel();
  Tensor* index[] = {&s.node_inputs, &s.node_types, &s.pred_ptr, &s.pred_ids,
                     &s.arc_types,   &s.arc_inputs, &s.instance_offsets};
  const char* names[] = {"node_inputs", "node_types", "pred_ptr", "pred_ids",
                         "arc_types",   "arc_inputs", "instance_offsets"};
  // Structure tensors may also stay on the CPU when x is on a GPU (they are read on the host).
  for (int i = 0; i < 7; ++i)
    if (index[i]->device() != device && !index[i]->device().is_cpu())
      fail(fmt::format("[edbatch] {} is on {} but x is on {}", names[i], index[i]->device().str(),
                       device.str()));
  check_index_tensor(s.node_inputs, "node_inputs", -1);
  check_index_tensor(s.node_types, "node_types", N);
  check_index_tensor(s.pred_ptr, "pred_ptr", N + 1);
  check_index_tensor(s.pred_ids, "pred_ids", -1);
  check_index_tensor(s.arc_types, "arc_types", s.pred_ids.numel());
  check_index_tensor(s.arc_inputs, "arc_inputs", s.pred_ids.numel());
  check_index_tensor(s.instance_offsets, "instance_offsets", -1);
  if (s.instance_offsets.numel() < 1)
    fail("[edbatch] instance_offsets needs at least one entry (0 for an empty batch)");
  for (int i = 0; i < 7; ++i) *index[i] = index[i]->to(at::kCPU).contiguous();
}

// Checks x as the caller gave it (float32, 2-D: call_args) and the weights against the cell;
// returns contiguous copies of the weights (on the CPU unless they stay on the device).
void check_inputs(const Tensor& x, std::vector<Tensor>& w, const Cell& cell,
                  const std::vector<WeightSpec>& specs, bool on_device) {
  if (x.size(1) != cell.input_dim())
    fail(fmt::format("[edbatch] x has {} columns, the cell's input size is {}", x.size(1),
                     cell.input_dim()));
  if (w.size() != specs.size())
    fail(fmt::format("[edbatch] {} weights expected, got {}", specs.size(), w.size()));
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& spec = specs[i];
    if (w[i].scalar_type() != at::kFloat)
      fail_type(fmt::format("[edbatch] weight {} must be float32, got {}", spec.name,
                            c10::toString(w[i].scalar_type())));
    if (w[i].device() != x.device())
      fail(fmt::format("[edbatch] weight {} is on {} but x is on {}", spec.name,
                       w[i].device().str(), x.device().str()));
    const bool ok = spec.cols == 0
                        ? w[i].dim() == 1 && w[i].size(0) == spec.rows
                        : w[i].dim() == 2 && w[i].size(0) == spec.rows && w[i].size(1) == spec.cols;
    if (!ok)
      fail(fmt::format("[edbatch] weight {} has shape {}, expected {}", spec.name,
                       shape(w[i].sizes()),
                       spec.cols == 0 ? fmt::format("[{}]", spec.rows)
                                      : fmt::format("[{}, {}]", spec.rows, spec.cols)));
  }
  for (Tensor& t : w) t = on_device ? t.contiguous() : t.to(at::kCPU).contiguous();
}

// The structure of `s` for x of num_x rows of x_dim floats at `x` (nullptr: not known yet).
Packed packed_view(const Structure& s, const float* x, int64_t num_x, int64_t x_dim) {
  Packed p;
  p.num_nodes = s.node_inputs.numel();
  p.num_arcs = s.pred_ids.numel();
  p.num_instances = s.instance_offsets.numel() - 1;
  p.node_inputs = s.node_inputs.data_ptr<int64_t>();
  p.node_types = s.node_types.data_ptr<int64_t>();
  p.pred_ptr = s.pred_ptr.data_ptr<int64_t>();
  p.pred_ids = s.pred_ids.data_ptr<int64_t>();
  p.arc_types = s.arc_types.data_ptr<int64_t>();
  p.arc_inputs = s.arc_inputs.data_ptr<int64_t>();
  p.instance_offsets = s.instance_offsets.data_ptr<int64_t>();
  p.x = x;
  p.num_x = num_x;
  p.x_dim = x_dim;
  return p;
}

namespace {
std::atomic<int64_t> plan_cache_budget{static_cast<int64_t>(EngineOptions{}.plan_cache_bytes)};
}  // namespace

int64_t set_plan_cache_bytes(int64_t bytes) {
  if (bytes < 0) fail(fmt::format("[edbatch.set_plan_cache] negative budget {}", bytes));
  return plan_cache_budget.exchange(bytes);
}

int64_t plan_cache_bytes() {
  return plan_cache_budget.load();
}

namespace {
std::atomic<bool> check_numerics_on{false};
}  // namespace

bool set_check_numerics(bool on) {
  return check_numerics_on.exchange(on);
}

bool check_numerics() {
  return check_numerics_on.load();
}

void check_sizes(int64_t hidden, int64_t input_size, int64_t num_node_types,
                 int64_t num_arc_types) {
  // Sizes and counts are 32-bit in the engine, which also doubles some (2 * hidden rows).
  constexpr int64_t kMax = INT32_MAX;
  if (hidden <= 0 || hidden > kMax)
    fail(fmt::format("[edbatch] hidden size must be from 1 to {}, got {}", kMax, hidden));
  if (input_size <= 0 || input_size > kMax)
    fail(fmt::format("[edbatch] the input size must be from 1 to {}, got {}", kMax, input_size));
  if (num_node_types <= 0 || num_arc_types <= 0 || num_node_types > kMax || num_arc_types > kMax)
    fail(fmt::format("[edbatch] type counts must be from 1 to {}, got {} node and {} arc types",
                     kMax, num_node_types, num_arc_types));
}

CallArgs call_args(const std::string& cell, const c10::Device& device, int64_t input_size,
                   int64_t hidden, int64_t num_node_types, int64_t num_arc_types,
                   const std::string& policy, int64_t threads) {
  check_sizes(hidden, input_size, num_node_types, num_arc_types);
  CallArgs a;
  a.config = {cell,
              static_cast<uint32_t>(hidden),
              static_cast<uint32_t>(input_size),
              static_cast<uint32_t>(num_node_types),
              static_cast<uint32_t>(num_arc_types),
              {}};
  set_run_options(a, device, policy, threads);
  return a;
}

void set_run_options(CallArgs& a, const c10::Device& device, const std::string& policy,
                     int64_t threads) {
  a.options.policy = policy;
  a.options.device = device.is_cuda() ? "cuda" : "cpu";
  a.device_index = device.is_cuda() ? device.index() : -1;
  if (threads < 0 || threads > kMaxThreads)
    fail(fmt::format("[edbatch] threads must be from 0 (torch.get_num_threads()) to {}, got {}",
                     kMaxThreads, threads));
  a.options.threads = threads > 0 ? static_cast<int>(threads) : at::get_num_threads();
  a.options.plan_cache_bytes = static_cast<size_t>(plan_cache_budget.load());
  a.options.check_numerics = check_numerics_on.load();
}

void set_loss_head(CallArgs& a, const std::string& loss, int64_t classes) {
  if (loss.empty()) return;
  if (loss != "sum" && loss != "mean")
    fail(fmt::format("[edbatch] loss must be 'sum' or 'mean' (or empty: no loss head), got '{}'",
                     loss));
  if (classes <= 0)
    fail(fmt::format("[edbatch] a loss head needs at least one class, got {}", classes));
  a.config.head.classes = static_cast<uint32_t>(classes);
  a.config.head.mean = loss == "mean";
}

int64_t head_classes(at::TensorList weights) {
  if (weights.size() < 2 || weights.back().dim() != 1)
    fail(
        "[edbatch] a loss head's weight (classes x state size) and bias (classes) must follow "
        "the cell's weights");
  return weights.back().numel();
}

Tensor host_labels(const CallArgs& a, const c10::optional<Tensor>& labels, int64_t num_nodes) {
  if (!a.config.head.classes) return Tensor();
  if (!labels || !labels->defined()) fail("[edbatch] a loss head needs labels, one per node");
  check_index_tensor(*labels, "labels", num_nodes);
  return labels->to(at::kCPU).contiguous();
}

namespace {

// Ids of cells that embed them (one per x row) in host memory; undefined when none are given.
Tensor host_ids(const c10::optional<Tensor>& ids, int64_t num_x) {
  if (!ids || !ids->defined() || ids->numel() == 0) return Tensor();
  check_index_tensor(*ids, "ids", num_x);
  return ids->to(at::kCPU).contiguous();
}

}  // namespace

CallArgs call_args(const std::string& cell, const Tensor& x, int64_t hidden,
                   int64_t num_node_types, int64_t num_arc_types, const std::string& policy,
                   int64_t threads) {
  if (x.dim() != 2 || x.size(1) == 0)
    fail(fmt::format("[edbatch] x must be 2-D with columns, got shape {}", shape(x.sizes())));
  return call_args(cell, x.device(), x.size(1), hidden, num_node_types, num_arc_types, policy,
                   threads);
}

void prepare_call(CallArgs a, const c10::Device& where, Structure s, int64_t num_x,
                  int64_t input_size, const std::string& loss, int64_t classes,
                  const c10::optional<Tensor>& labels, const c10::optional<Tensor>& ids) {
  check_structure(where, s);
  set_loss_head(a, loss, classes);
  const Tensor y = host_labels(a, labels, s.node_inputs.numel());
  const Tensor row_ids = host_ids(ids, num_x);
  const c10::DeviceGuard guard(where);  // a runner's CUDA state is made on its device
  try {
    Packed p = packed_view(s, nullptr, num_x, input_size);
    if (y.defined()) p.labels = y.data_ptr<int64_t>();
    if (row_ids.defined()) p.ids = row_ids.data_ptr<int64_t>();
    RunnerPool::get().prepare(a, p);
  } catch (const std::exception&) {
    fail_handled();
  }
}

// Runs the forward; keeps the runner in `state` when it is given (for backward).
std::vector<Tensor> run_forward(const CallArgs& a, const Tensor& x_in, Structure s,
                                std::vector<Tensor> w, c10::intrusive_ptr<RunState>* state,
                                const CallExtras& extras) {
  const c10::DeviceGuard guard(x_in.device());  // a runner's CUDA state is made on its device
  check_storage(x_in, "x");
  for (const Tensor& t : w) check_storage(t, "a weight");
  if (x_in.scalar_type() != at::kFloat)
    fail_type(
        fmt::format("[edbatch] x must be float32, got {}", c10::toString(x_in.scalar_type())));
  check_structure(x_in.device(), s);
  const bool on_device = device_resident(x_in);
  const Tensor x = on_device ? x_in.contiguous() : x_in.to(at::kCPU).contiguous();
  Packed p = packed_view(s, x.data_ptr<float>(), x.size(0), x.size(1));
  const Tensor ids = host_ids(extras.ids, p.num_x);
  if (ids.defined()) p.ids = ids.data_ptr<int64_t>();
  p.seed = extras.seed;
  const Tensor labels = host_labels(a, extras.labels, p.num_nodes);
  if (labels.defined()) p.labels = labels.data_ptr<int64_t>();
  std::unique_ptr<Runner> runner;
  try {
    runner = RunnerPool::get().take(a, p);
  } catch (const std::exception&) {
    fail_handled();
  }
  try {
    check_inputs(x_in, w, runner->cell(), runner->weights(), on_device);
  } catch (...) {
    RunnerPool::get().give_back(a, std::move(runner));
    throw;
  }
  std::vector<Tensor> out;
  std::vector<float*> out_ptr;
  if (a.config.head.classes) {
    // The forward writes the loss; it stays 0 for an empty batch.
    out.push_back(p.num_nodes > 0 ? at::empty({}, x.options()) : at::zeros({}, x.options()));
    out_ptr.push_back(out.back().data_ptr<float>());
  }
  for (uint32_t o = 0; !a.config.head.classes && o < runner->cell().num_outputs(); ++o) {
    out.push_back(at::empty({p.num_nodes, int64_t{runner->cell().output_size(o)}}, x.options()));
    out_ptr.push_back(out.back().data_ptr<float>());
  }
  std::vector<const float*> w_ptr;
  for (const Tensor& t : w) w_ptr.push_back(t.data_ptr<float>());
  try {
    runner->forward(p, w_ptr, out_ptr, state != nullptr, on_device,
                    on_device ? current_stream(x) : nullptr);
  } catch (const std::exception&) {
    RunnerPool::get().give_back(a, std::move(runner));
    fail_handled();
  }
  if (state) *state = c10::make_intrusive<RunState>(a, std::move(runner), p.num_x, p.num_nodes);
  else RunnerPool::get().give_back(a, std::move(runner));
  if (!on_device)
    for (Tensor& t : out) t = t.to(x_in.device());
  return out;
}

Gradients run_backward(RunState& state, const c10::Device& device,
                       const torch::autograd::variable_list& grads, bool keep, bool sparse_lookups,
                       const StepUpdate* update) {
  TORCH_CHECK(state.runner,
              "[edbatch] backward ran twice through a graph that autograd did not "
              "keep: pass retain_graph=True to the backward before, or run the forward again");
  Runner& runner = *state.runner;
  const Cell& cell = runner.cell();
  const bool on_device = runner.on_device();
  const c10::DeviceGuard guard(device);
  const at::TensorOptions where =
      at::TensorOptions().dtype(at::kFloat).device(on_device ? device : c10::Device(at::kCPU));
  // The outputs' gradients one after another (zeros for an output autograd left undefined).
  std::vector<Tensor> parts;
  const bool head = runner.head().classes != 0;
  for (size_t o = 0; o < grads.size(); ++o) {
    const int64_t n = head ? 1 : state.num_nodes * cell.output_size(static_cast<uint32_t>(o));
    parts.push_back(grads[o].defined() ? grads[o].to(where).reshape({n}) : at::zeros({n}, where));
  }
  // One output (a loss head's, or a one-tensor state) is its own seed vector: no copy.
  const Tensor seeds = parts.empty()       ? at::zeros({0}, where)
                       : parts.size() == 1 ? parts[0].contiguous()
                                           : at::cat(parts).contiguous();
  // Zeros: x rows that no node reads (and an empty batch) get no gradient written.
  Tensor grad_x = on_device ? at::zeros({state.num_x, cell.input_dim()}, where)
                            : at::empty({state.num_x, cell.input_dim()}, where);
  Gradients g;
  std::vector<float*> grad_w_ptr;
  const bool sparse = sparse_lookups && !on_device;
  // The weights updated in place, at their torch memory (none: every gradient is made).
  std::vector<float*> targets;
  if (update && !on_device) {
    for (size_t i = 0; i < update->in_place.size(); ++i)
      targets.push_back(update->in_place[i] ? update->weights[i].data_ptr<float>() : nullptr);
  }
  for (const WeightSpec& w : runner.weights()) {
    if (!targets.empty() && targets[grad_w_ptr.size()]) {  // no gradient made: an empty stand-in
      g.weights.push_back(at::empty({0}, where));
      grad_w_ptr.push_back(nullptr);
      continue;
    }
    if (sparse && w.lookup) {  // made below from the touched rows
      g.weights.emplace_back();
      grad_w_ptr.push_back(nullptr);
      continue;
    }
    g.weights.push_back(w.cols == 0 ? at::empty({w.rows}, where)
                                    : at::empty({w.rows, w.cols}, where));
    grad_w_ptr.push_back(g.weights.back().data_ptr<float>());
  }
  try {
    runner.backward(seeds.data_ptr<float>(), grad_x.data_ptr<float>(), grad_w_ptr,
                    on_device ? current_stream(grad_x) : nullptr,
                    targets.empty() ? nullptr : &targets,
                    static_cast<float>(update ? update->lr : 0));
  } catch (const std::exception&) {
    fail_handled();
  }
  // Written in place as torch's in-place operations are: autograd sees the new version.
  for (size_t i = 0; i < targets.size(); ++i)
    if (targets[i]) update->weights[i].unsafeGetTensorImpl()->bump_version();
  if (sparse) {
    std::vector<int64_t> rows;
    for (size_t i = 0; i < g.weights.size(); ++i) {
      const WeightSpec& w = runner.weights()[i];
      if (!w.lookup || (!targets.empty() && targets[i])) continue;
      runner.lookup_rows(i, rows);
      const int64_t n = static_cast<int64_t>(rows.size());
      Tensor index = at::empty({1, n}, at::kLong), rows_grad = at::empty({n, w.cols}, where);
      std::copy(rows.begin(), rows.end(), index.data_ptr<int64_t>());
      runner.lookup_gradient(i, rows, rows_grad.data_ptr<float>());
      g.weights[i] = at::sparse_coo_tensor(index, rows_grad, {w.rows, w.cols});
    }
  }
  // The graph is spent: give the runner back now rather than when autograd frees the context.
  if (!keep) RunnerPool::get().give_back(state.args, std::move(state.runner));
  g.x = grad_x.to(device);
  for (Tensor& t : g.weights) t = t.to(device);
  return g;
}

namespace {
// Appends to `edges` where the gradients of those of `tensors` that require one go.
void add_edges(torch::autograd::edge_list& edges, at::TensorList tensors) {
  for (const Tensor& t : tensors)
    if (t.defined() && t.requires_grad()) edges.push_back(torch::autograd::impl::gradient_edge(t));
}
}  // namespace

void keep_input_edges(RunState& state, const Tensor& x, at::TensorList weights) {
  state.input_edges.clear();
  add_edges(state.input_edges, x);
  add_edges(state.input_edges, weights);
}

Gradients autograd_backward(RunState& state, const c10::Device& device,
                            const torch::autograd::variable_list& grads) {
  for (const Tensor& t : grads) check_storage(t, "an incoming gradient");
  Gradients g =
      run_backward(state, device, grads, torch::autograd::get_current_graph_task_keep_graph());
  if (!at::GradMode::is_enabled()) return g;
  // create_graph=True: the gradients become outputs of a node that raises if anything
  // differentiates through them. Unlike PyTorch's once_differentiable, also where the incoming
  // gradients need none (the gradient of h.sum()): a penalty on such a gradient would otherwise
  // add nothing to the parameters' gradients, silently. The node leads to the op's inputs and to
  // the incoming gradients, so that differentiating with respect to any of them (autograd.grad
  // of chosen tensors, backward(inputs=...)) reaches it and raises, rather than passing it by.
  torch::autograd::edge_list edges = state.input_edges;
  add_edges(edges, grads);
  auto refuse = std::make_shared<torch::autograd::Error>(
      "[edbatch] the gradients of an edbatch op cannot be differentiated again (double "
      "backward, create_graph=True through the op, is not supported)",
      std::move(edges));
  auto differentiable = [&refuse](Tensor& t) {
    if (t.defined()) t = t.detach();
    torch::autograd::set_history(t, refuse);
  };
  differentiable(g.x);
  for (Tensor& t : g.weights) differentiable(t);
  return g;
}

std::vector<Tensor> run_step(const CallArgs& a, const Tensor& x, Structure s, std::vector<Tensor> w,
                             const CallExtras& extras, double lr, at::IntArrayRef update) {
  if (!a.config.head.classes)
    fail(
        "[edbatch] a training step needs a loss head: loss \"sum\" or \"mean\" with the "
        "head's weight and bias after the cell's weights");
  StepUpdate in_place;
  if (!update.empty()) {
    in_place.lr = lr;
    in_place.in_place.assign(w.size(), false);
    for (const int64_t i : update) {
      if (i < 0 || i >= static_cast<int64_t>(w.size()))
        fail(fmt::format("[edbatch] update: weight index {} out of range (the call has {} weights)",
                         i, w.size()));
      const Tensor& t = w[static_cast<size_t>(i)];
      if (!t.device().is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous())
        fail(
            fmt::format("[edbatch] update: weight {} must be a contiguous float32 tensor in host "
                        "memory to be updated in place, got {} {} on {}",
                        i, t.is_contiguous() ? "contiguous" : "non-contiguous",
                        c10::toString(t.scalar_type()), t.device().str()));
      in_place.in_place[static_cast<size_t>(i)] = true;
    }
    in_place.weights = w;
  }
  c10::intrusive_ptr<RunState> state;
  std::vector<Tensor> out = run_forward(a, x, std::move(s), std::move(w), &state, extras);
  // No autograd: a lookup table's gradient is sparse, its touched rows (apply_gradients updates
  // those, where a dense gradient would cost a table-sized write and update per step).
  Gradients g = run_backward(*state, x.device(), {at::ones_like(out[0])}, false, true,
                             update.empty() ? nullptr : &in_place);
  out.push_back(std::move(g.x));
  for (Tensor& t : g.weights) out.push_back(std::move(t));
  return out;
}

}  // namespace edbatch::torch_adapter
