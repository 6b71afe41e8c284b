// The libtorch adapter: the edbatch::run_cell op (schema, CPU and CUDA kernels, autograd). Tensors
// are checked and viewed as the torch-free Packed format of cells.h; the work is a Runner's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#ifdef EDBATCH_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "edbatch/options.h"
#include "src/torch/cells.h"

namespace edbatch::torch_adapter {

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Raises the error torch shows as a Python RuntimeError. Messages are formatted here into one
// string: streaming integers or shapes through c10's message stream crashed under torch 2.11's
// wheels, while a single string is passed through as it is.
[[noreturn]] void fail(const std::string& what) { TORCH_CHECK(false, what); }

std::string shape(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// The structure tensors of one call, in schema order.
struct Structure {
  Tensor node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets;
};

struct CallArgs {
  CellConfig config;
  RunOptions options;
  int device_index = -1;  // CUDA: the tensors' device (runners are per device)
};

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

void* current_stream(const Tensor& t) {
#ifdef EDBATCH_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  (void)t;
  return nullptr;
#endif
}

// Idle runners by configuration: a call takes one and gives it back after its backward (or at
// once without autograd), so concurrent graphs never share a runner. Runners prepared ahead for a
// structure (prepare) wait here until a call with that structure takes them; one worker thread
// does their preparation, in the order asked.
class RunnerPool {
 public:
  // Never destroyed: autograd graphs that outlive static destruction still give runners back.
  static RunnerPool& get() {
    static RunnerPool* pool = new RunnerPool;
    return *pool;
  }

  // A runner for `a`: the one prepared for `p`'s structure when there is one (once its
  // preparation is done), else an idle or a new one.
  std::unique_ptr<Runner> take(const CallArgs& a, const Packed& p) {
    const std::string k = key(a);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      for (auto it = prepared_.begin(); it != prepared_.end(); ++it) {
        // The staged structure is written before the entry is listed and never changes after.
        if ((*it)->key != k || !(*it)->runner->staged_matches(p)) continue;
        // Owned here before waiting, so no other thread can take or drop it meanwhile.
        std::unique_ptr<Prepared> e = std::move(*it);
        prepared_.erase(it);
        done_.wait(lock, [&e] { return e->done; });
        ++counts_[e->runner->prepared() ? kUsed : kFailed];
        return std::move(e->runner);
      }
    }
    return idle_or_new(a, k);
  }

  void give_back(const CallArgs& a, std::unique_ptr<Runner> r) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_[key(a)].push_back(std::move(r));
  }

  // Stages `p`'s structure on a runner for `a` and queues its preparation. At most kMaxPrepared
  // wait unclaimed: the oldest goes back to the idle runners first.
  void prepare(const CallArgs& a, const Packed& p) {
    auto entry = std::make_unique<Prepared>();
    entry->key = key(a);
    entry->runner = idle_or_new(a, entry->key);
    entry->runner->stage(p);
    std::unique_lock<std::mutex> lock(mutex_);
    while (prepared_.size() >= kMaxPrepared) {
      std::unique_ptr<Prepared> old = std::move(prepared_.front());
      prepared_.pop_front();
      done_.wait(lock, [&old] { return old->done; });
      ++counts_[kDropped];
      idle_[old->key].push_back(std::move(old->runner));
    }
    ++counts_[kPrepared];
    queue_.push_back(entry.get());
    prepared_.push_back(std::move(entry));
    if (!worker_started_) {
      std::thread(&RunnerPool::work, this).detach();  // lives as long as the (leaked) pool
      worker_started_ = true;
    }
    work_.notify_one();
  }

  // Preparations asked for, used by a call, failed (bad structure), dropped unused; then how
  // many wait now.
  enum Count { kPrepared, kUsed, kFailed, kDropped, kCounts };
  std::vector<int64_t> counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int64_t> c(counts_, counts_ + kCounts);
    c.push_back(static_cast<int64_t>(prepared_.size()));
    return c;
  }

 private:
  struct Prepared {
    std::string key;
    std::unique_ptr<Runner> runner;
    bool done = false;
  };
  static constexpr size_t kMaxPrepared = 8;

  // An idle runner of configuration `a` (key k), or a new one (made outside the lock).
  std::unique_ptr<Runner> idle_or_new(const CallArgs& a, const std::string& k) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& idle = idle_[k];
      if (!idle.empty()) {
        std::unique_ptr<Runner> r = std::move(idle.back());
        idle.pop_back();
        return r;
      }
    }
    return std::make_unique<Runner>(a.config, a.options);
  }

  // The worker: prepares queued runners one by one. A failed preparation leaves the runner
  // unprepared, so the call that takes it builds its graph and reports the error itself.
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_.wait(lock, [this] { return !queue_.empty(); });
      Prepared* e = queue_.front();
      queue_.pop_front();
      lock.unlock();
      try {
        e->runner->prepare();
      } catch (...) {
      }
      lock.lock();
      e->done = true;
      done_.notify_all();
    }
  }

  static std::string key(const CallArgs& a) {
    const CellConfig& c = a.config;
    return c.cell + "|" + std::to_string(c.hidden) + "|" + std::to_string(c.input_dim) + "|" +
           std::to_string(c.node_types) + "|" + std::to_string(c.arc_types) + "|" +
           a.options.policy + "|" + a.options.device + "|" + std::to_string(a.options.threads) +
           "|" + std::to_string(a.device_index);
  }
  std::mutex mutex_;
  std::map<std::string, std::vector<std::unique_ptr<Runner>>> idle_;
  std::list<std::unique_ptr<Prepared>> prepared_;  // oldest first
  std::deque<Prepared*> queue_;                    // waiting for the worker
  std::condition_variable work_, done_;
  bool worker_started_ = false;
  int64_t counts_[kCounts] = {};
};

// A runner kept between forward and backward; returned to the pool when autograd drops it.
class RunState : public torch::CustomClassHolder {
 public:
  RunState(CallArgs args, std::unique_ptr<Runner> runner, int64_t num_x, int64_t num_nodes)
      : args(std::move(args)), runner(std::move(runner)), num_x(num_x), num_nodes(num_nodes) {}
  ~RunState() override {
    if (runner) RunnerPool::get().give_back(args, std::move(runner));
  }
  CallArgs args;
  std::unique_ptr<Runner> runner;
  int64_t num_x, num_nodes;
};

void check_index_tensor(const Tensor& t, const char* name, int64_t size) {
  if (t.scalar_type() != at::kLong)
    fail(fmt::format("[edbatch] {} must be int64, got {}", name, c10::toString(t.scalar_type())));
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
void check_inputs(const Tensor& x, std::vector<Tensor>& w, const Cell& cell, bool on_device) {
  if (x.size(1) != cell.input_dim())
    fail(fmt::format("[edbatch] x has {} columns, the cell's input size is {}", x.size(1),
                     cell.input_dim()));
  const std::vector<WeightSpec>& specs = cell.weights();
  if (w.size() != specs.size())
    fail(fmt::format("[edbatch] {} weights expected, got {}", specs.size(), w.size()));
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& spec = specs[i];
    if (w[i].scalar_type() != at::kFloat)
      fail(fmt::format("[edbatch] weight {} must be float32, got {}", spec.name,
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

CallArgs call_args(const std::string& cell, const c10::Device& device, int64_t input_size,
                   int64_t hidden, int64_t num_node_types, int64_t num_arc_types,
                   const std::string& policy, int64_t threads) {
  if (hidden <= 0) fail(fmt::format("[edbatch] hidden size must be positive, got {}", hidden));
  if (input_size <= 0)
    fail(fmt::format("[edbatch] the input size must be positive, got {}", input_size));
  if (num_node_types <= 0 || num_arc_types <= 0) fail("[edbatch] type counts must be positive");
  CallArgs a;
  a.config = {cell, static_cast<uint32_t>(hidden), static_cast<uint32_t>(input_size),
              static_cast<uint32_t>(num_node_types), static_cast<uint32_t>(num_arc_types)};
  a.options.policy = policy;
  a.options.device = device.is_cuda() ? "cuda" : "cpu";
  a.device_index = device.is_cuda() ? device.index() : -1;
  a.options.threads = threads > 0 ? static_cast<int>(threads) : at::get_num_threads();
  return a;
}

CallArgs call_args(const std::string& cell, const Tensor& x, int64_t hidden,
                   int64_t num_node_types, int64_t num_arc_types, const std::string& policy,
                   int64_t threads) {
  if (x.dim() != 2 || x.size(1) == 0)
    fail(fmt::format("[edbatch] x must be 2-D with columns, got shape {}", shape(x.sizes())));
  return call_args(cell, x.device(), x.size(1), hidden, num_node_types, num_arc_types, policy,
                   threads);
}

// Runs the forward; keeps the runner in `state` when it is given (for backward).
std::vector<Tensor> run_forward(const CallArgs& a, const Tensor& x_in, Structure s,
                                std::vector<Tensor> w, c10::intrusive_ptr<RunState>* state) {
  const c10::DeviceGuard guard(x_in.device());  // a runner's CUDA state is made on its device
  if (x_in.scalar_type() != at::kFloat)
    fail(fmt::format("[edbatch] x must be float32, got {}", c10::toString(x_in.scalar_type())));
  check_structure(x_in.device(), s);
  const bool on_device = device_resident(x_in);
  const Tensor x = on_device ? x_in.contiguous() : x_in.to(at::kCPU).contiguous();
  const Packed p = packed_view(s, x.data_ptr<float>(), x.size(0), x.size(1));
  std::unique_ptr<Runner> runner;
  try {
    runner = RunnerPool::get().take(a, p);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  try {
    check_inputs(x_in, w, runner->cell(), on_device);
  } catch (...) {
    RunnerPool::get().give_back(a, std::move(runner));
    throw;
  }
  std::vector<Tensor> out;
  std::vector<float*> out_ptr;
  for (uint32_t o = 0; o < runner->cell().num_outputs(); ++o) {
    out.push_back(at::empty({p.num_nodes, int64_t{runner->cell().output_size(o)}}, x.options()));
    out_ptr.push_back(out.back().data_ptr<float>());
  }
  std::vector<const float*> w_ptr;
  for (const Tensor& t : w) w_ptr.push_back(t.data_ptr<float>());
  try {
    runner->forward(p, w_ptr, out_ptr, state != nullptr, on_device,
                    on_device ? current_stream(x) : nullptr);
  } catch (const std::exception& e) {
    RunnerPool::get().give_back(a, std::move(runner));
    fail(e.what());
  }
  if (state) *state = c10::make_intrusive<RunState>(a, std::move(runner), p.num_x, p.num_nodes);
  else RunnerPool::get().give_back(a, std::move(runner));
  if (!on_device)
    for (Tensor& t : out) t = t.to(x_in.device());
  return out;
}

std::vector<Tensor> run_cell(const std::string& cell, const Tensor& x, const Tensor& node_inputs,
                             const Tensor& node_types, const Tensor& pred_ptr,
                             const Tensor& pred_ids, const Tensor& arc_types,
                             const Tensor& arc_inputs, const Tensor& instance_offsets,
                             at::TensorList weights, int64_t hidden, int64_t num_node_types,
                             int64_t num_arc_types, const std::string& policy, int64_t threads) {
  const CallArgs a = call_args(cell, x, hidden, num_node_types, num_arc_types, policy, threads);
  const Structure s{node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
                    instance_offsets};
  return run_forward(a, x, s, weights.vec(), nullptr);
}

class CellFunction : public torch::autograd::Function<CellFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const std::string& cell, const Tensor& x,
                               const Tensor& node_inputs, const Tensor& node_types,
                               const Tensor& pred_ptr, const Tensor& pred_ids,
                               const Tensor& arc_types, const Tensor& arc_inputs,
                               const Tensor& instance_offsets, at::TensorList weights,
                               int64_t hidden, int64_t num_node_types, int64_t num_arc_types,
                               const std::string& policy, int64_t threads) {
    const CallArgs a = call_args(cell, x, hidden, num_node_types, num_arc_types, policy, threads);
    const Structure s{node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
                      instance_offsets};
    c10::intrusive_ptr<RunState> state;
    std::vector<Tensor> out = run_forward(a, x, s, weights.vec(), &state);
    ctx->saved_data["state"] = c10::IValue(state);
    ctx->saved_data["x_device"] = c10::IValue(x.device());
    ctx->saved_data["num_weights"] = static_cast<int64_t>(weights.size());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = ctx->saved_data["state"].toCustomClass<RunState>();
    const c10::Device device = ctx->saved_data["x_device"].toDevice();
    TORCH_CHECK(state->runner, "[edbatch] backward ran twice through one graph; pass "
                "retain_graph=False or run the forward again");
    Runner& runner = *state->runner;
    const Cell& cell = runner.cell();
    const bool on_device = runner.on_device();
    const c10::DeviceGuard guard(device);
    const at::TensorOptions where =
        at::TensorOptions().dtype(at::kFloat).device(on_device ? device : c10::Device(at::kCPU));
    // The outputs' gradients one after another (zeros for an output autograd left undefined).
    std::vector<Tensor> parts;
    for (size_t o = 0; o < grads.size(); ++o) {
      const int64_t n = state->num_nodes * cell.output_size(static_cast<uint32_t>(o));
      parts.push_back(grads[o].defined() ? grads[o].to(where).reshape({n}) : at::zeros({n}, where));
    }
    const Tensor seeds = parts.empty() ? at::zeros({0}, where) : at::cat(parts).contiguous();
    // Zeros: x rows that no node reads (and an empty batch) get no gradient written.
    Tensor grad_x = on_device ? at::zeros({state->num_x, cell.input_dim()}, where)
                              : at::empty({state->num_x, cell.input_dim()}, where);
    std::vector<Tensor> grad_w;
    std::vector<float*> grad_w_ptr;
    for (const WeightSpec& w : cell.weights()) {
      grad_w.push_back(w.cols == 0 ? at::empty({w.rows}, where)
                                   : at::empty({w.rows, w.cols}, where));
      grad_w_ptr.push_back(grad_w.back().data_ptr<float>());
    }
    try {
      runner.backward(seeds.data_ptr<float>(), grad_x.data_ptr<float>(), grad_w_ptr,
                      on_device ? current_stream(grad_x) : nullptr);
    } catch (const std::exception& e) {
      fail(e.what());
    }
    // The graph is spent: give the runner back now rather than when autograd frees the context.
    RunnerPool::get().give_back(state->args, std::move(state->runner));
    // One gradient per forward argument: cell, x, 7 structure tensors, the weights, 5 options.
    variable_list out;
    out.push_back(Tensor());
    out.push_back(grad_x.to(device));
    for (int i = 0; i < 7; ++i) out.push_back(Tensor());
    for (Tensor& t : grad_w) out.push_back(t.to(device));
    for (int i = 0; i < 5; ++i) out.push_back(Tensor());
    return out;
  }
};

std::vector<Tensor> run_cell_autograd(const std::string& cell, const Tensor& x,
                                      const Tensor& node_inputs, const Tensor& node_types,
                                      const Tensor& pred_ptr, const Tensor& pred_ids,
                                      const Tensor& arc_types, const Tensor& arc_inputs,
                                      const Tensor& instance_offsets, at::TensorList weights,
                                      int64_t hidden, int64_t num_node_types,
                                      int64_t num_arc_types, const std::string& policy,
                                      int64_t threads) {
  bool needs_grad = x.requires_grad();
  for (const Tensor& w : weights) needs_grad = needs_grad || w.requires_grad();
  if (!needs_grad || !at::GradMode::is_enabled()) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return run_cell(cell, x, node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
                    instance_offsets, weights, hidden, num_node_types, num_arc_types, policy,
                    threads);
  }
  return CellFunction::apply(cell, x, node_inputs, node_types, pred_ptr, pred_ids, arc_types,
                             arc_inputs, instance_offsets, weights, hidden, num_node_types,
                             num_arc_types, policy, threads);
}

// Prepares a later run_cell call with this structure (and x of num_x rows on `device`) on a
// worker thread: checks, graph build, scheduling and planning (docs/pytorch.md).
void prepare(const std::string& cell, const std::string& device, int64_t input_size,
             int64_t num_x, const Tensor& node_inputs, const Tensor& node_types,
             const Tensor& pred_ptr, const Tensor& pred_ids, const Tensor& arc_types,
             const Tensor& arc_inputs, const Tensor& instance_offsets, int64_t hidden,
             int64_t num_node_types, int64_t num_arc_types, const std::string& policy,
             int64_t threads) {
  const c10::Device where(device);
  if (num_x < 0)
    fail(fmt::format("[edbatch] the number of x rows must not be negative, got {}", num_x));
  const CallArgs a =
      call_args(cell, where, input_size, hidden, num_node_types, num_arc_types, policy, threads);
  Structure s{node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
              instance_offsets};
  check_structure(where, s);
  const c10::DeviceGuard guard(where);  // a runner's CUDA state is made on its device
  try {
    RunnerPool::get().prepare(a, packed_view(s, nullptr, num_x, input_size));
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// [prepared, used, failed, dropped, waiting]: RunnerPool::counts.
std::vector<int64_t> prepare_counts() { return RunnerPool::get().counts(); }

std::vector<std::string> list_cells() { return cell_names(); }

// The weights run_cell expects for a configuration: names and torch shapes (cols 0: a vector).
std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<int64_t>> weight_shapes(
    const std::string& cell, int64_t hidden, int64_t input_size, int64_t num_node_types,
    int64_t num_arc_types) {
  TORCH_CHECK(hidden > 0 && input_size > 0 && num_node_types > 0 && num_arc_types > 0,
              "[edbatch] sizes and type counts must be positive");
  ParameterCollection pc;
  std::unique_ptr<Cell> c;
  try {
    c = make_cell({cell, static_cast<uint32_t>(hidden), static_cast<uint32_t>(input_size),
                   static_cast<uint32_t>(num_node_types), static_cast<uint32_t>(num_arc_types)},
                  pc);
  } catch (const std::exception& e) {
    fail(e.what());
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
      "int threads) -> Tensor[]");
  m.def(
      "prepare(str cell, str device, int input_size, int num_x, Tensor node_inputs, "
      "Tensor node_types, Tensor pred_ptr, Tensor pred_ids, Tensor arc_types, "
      "Tensor arc_inputs, Tensor instance_offsets, int hidden, int num_node_types, "
      "int num_arc_types, str policy, int threads) -> ()",
      &prepare);
  m.def("prepare_counts() -> int[]", &prepare_counts);
  m.def("cells() -> str[]", &list_cells);
  m.def("weight_shapes(str cell, int hidden, int input_size, int num_node_types, "
        "int num_arc_types) -> (str[], int[], int[])",
        &weight_shapes);
}

// The CUDA kernel is the CPU one: the engine takes host-side structures and parameters, and the
// device the Runner was made for ("cuda" for CUDA tensors) does the math.
TORCH_LIBRARY_IMPL(edbatch, CPU, m) { m.impl("run_cell", &run_cell); }
TORCH_LIBRARY_IMPL(edbatch, CUDA, m) { m.impl("run_cell", &run_cell); }
TORCH_LIBRARY_IMPL(edbatch, Autograd, m) { m.impl("run_cell", &run_cell_autograd); }

}  // namespace edbatch::torch_adapter
