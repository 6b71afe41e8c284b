// The libtorch half of the adapter, shared by its ops (ops.cpp: the built-in cells; program_ops.cpp:
// traced user cells): argument checks, the pool of runners, and running a forward.
#pragma once
#include <ATen/ATen.h>
#include <pthread.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "src/torch/cells.h"

namespace edbatch::torch_adapter {

using at::Tensor;

// Raises a bad argument as the error torch shows as a Python ValueError. Messages are formatted
// here into one string: streaming integers or shapes through c10's message stream crashed under
// torch 2.11's wheels, while a single string is passed through as it is.
[[noreturn]] void fail(const std::string& what);
// The same for a tensor of the wrong dtype, shown as a Python TypeError (as torch does).
[[noreturn]] void fail_type(const std::string& what);
// Inside a catch block: raises the exception being handled as torch raises its own errors. The
// library's checks of what it was given (std::logic_error: std::invalid_argument and the like)
// become a ValueError; a failure while running (std::runtime_error: a device error, a pass that
// failed, memory that could not be had, a non-finite value found) a RuntimeError, as torch's own
// CUDA errors are; torch's own errors (its allocator inside the op) pass as they are.
[[noreturn]] void fail_handled();

std::string shape(at::IntArrayRef sizes);

// The structure tensors of one call, in schema order.
struct Structure {
  Tensor node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets;
};

// The plan cache budget of the runners made from now on (EngineOptions::plan_cache_bytes);
// returns the one before. edbatch.set_plan_cache in Python.
int64_t set_plan_cache_bytes(int64_t bytes);
int64_t plan_cache_bytes();

// Whether the runners and decoders used from now on check every pass's values and gradients
// (EngineOptions::check_numerics); returns the setting before. edbatch.set_check_numerics.
bool set_check_numerics(bool on);
bool check_numerics();

struct CallArgs {
  CellConfig config;
  RunOptions options;
  int device_index = -1;  // CUDA: the tensors' device (runners are per device)
};

// Whether x's device memory is used in place (CUDA tensors with the CUDA backend), and
// torch's current stream on its device.
bool device_resident(const Tensor& x);
// Where CUDA tensors go: "gpu" (they stay there, as device_resident says) or "host".
std::string cuda_tensor_path();
void* current_stream(const Tensor& t);

// Idle runners by configuration: a call takes one and gives it back after its backward (or at
// once without autograd), so concurrent graphs never share a runner. Runners prepared ahead for a
// structure (prepare) wait here until a call with that structure takes them; worker threads do
// their preparation, started in the order asked: one, and a second (kMaxWorkers) once a
// preparation is queued while no worker is free (prefetching more than one mini-batch ahead, when
// one preparation takes longer than a step). Preparations touch only their own runner.
class RunnerPool {
 public:
  // Never destroyed: autograd graphs that outlive static destruction still give runners back.
  static RunnerPool& get() {
    static RunnerPool* pool = [] {
      auto* p = new RunnerPool;
      ::pthread_atfork(&before_fork, &after_fork_in_parent, &after_fork_in_child);
      return p;
    }();
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
    std::vector<std::unique_ptr<Runner>> evicted;  // destroyed after the lock is let go
    std::lock_guard<std::mutex> lock(mutex_);
    park(key(a), std::move(r), evicted);
  }

  // Stages `p`'s structure on a runner for `a` and queues its preparation. At most kMaxPrepared
  // wait unclaimed: the oldest goes back to the idle runners first.
  void prepare(const CallArgs& a, const Packed& p) {
    auto entry = std::make_unique<Prepared>();
    entry->key = key(a);
    entry->runner = idle_or_new(a, entry->key);
    entry->runner->stage(p);
    std::vector<std::unique_ptr<Runner>> evicted;
    std::unique_lock<std::mutex> lock(mutex_);
    while (prepared_.size() >= kMaxPrepared) {
      std::unique_ptr<Prepared> old = std::move(prepared_.front());
      prepared_.pop_front();
      done_.wait(lock, [&old] { return old->done; });
      ++counts_[kDropped];
      park(old->key, std::move(old->runner), evicted);
    }
    ++counts_[kPrepared];
    queue_.push_back(entry.get());
    prepared_.push_back(std::move(entry));
    if (free_workers_ < queue_.size() && workers_ < kMaxWorkers) {
      std::thread(&RunnerPool::work, this).detach();  // lives as long as the (leaked) pool
      ++workers_;
    }
    work_.notify_one();
  }

  // Preparations asked for, used by a call, failed (bad structure), dropped unused, runners made
  // (each with its engine: on a GPU its stream, cuBLAS handle and arenas); then how many wait now,
  // the worker threads started, and the idle runners kept.
  enum Count { kPrepared, kUsed, kFailed, kDropped, kRunners, kCounts };
  std::vector<int64_t> counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int64_t> c(counts_, counts_ + kCounts);
    c.push_back(static_cast<int64_t>(prepared_.size()));
    c.push_back(static_cast<int64_t>(workers_));
    c.push_back(static_cast<int64_t>(idle_.size()));
    return c;
  }

 private:
  struct Prepared {
    std::string key;
    std::unique_ptr<Runner> runner;
    bool done = false;
  };
  // edbatch.prefetch's deepest window: 8 ahead, and the one its next call is about to take.
  static constexpr size_t kMaxPrepared = 9, kMaxWorkers = 2;

  // An idle runner of configuration `a` (key k), or a new one (made outside the lock).
  std::unique_ptr<Runner> idle_or_new(const CallArgs& a, const std::string& k) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = idle_.rbegin(); it != idle_.rend(); ++it)
        if (it->first == k) {
          std::unique_ptr<Runner> r = std::move(it->second);
          idle_.erase(std::next(it).base());
          return r;
        }
    }
    auto r = std::make_unique<Runner>(a.config, a.options);
    std::lock_guard<std::mutex> lock(mutex_);
    ++counts_[kRunners];
    return r;
  }

  // A worker: prepares queued runners one by one. A failed preparation leaves the runner
  // unprepared, so the call that takes it builds its graph and reports the error itself.
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++free_workers_;
      work_.wait(lock, [this] { return !queue_.empty(); });
      --free_workers_;
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
           "|" + std::to_string(a.device_index) + "|" + std::to_string(a.options.plan_cache_bytes) +
           "|" + std::to_string(c.head.classes) + (c.head.mean ? "m" : "s") +
           (a.options.check_numerics ? "|n" : "");
  }
  std::mutex mutex_;

  // fork(): the pool's lock is held across it, so the child gets the pool between operations.
  // The child has none of the parent's threads: its workers are started anew, and preparations
  // queued or under way (their runners perhaps half made by a worker the child lacks) are left
  // alone, never destroyed or served; their calls build their graphs themselves.
  static void before_fork() { get().mutex_.lock(); }
  static void after_fork_in_parent() { get().mutex_.unlock(); }
  static void after_fork_in_child() {
    RunnerPool& p = get();
    for (std::unique_ptr<Prepared>& e : p.prepared_) (void)e.release();
    p.prepared_.clear();
    p.queue_.clear();
    p.workers_ = p.free_workers_ = 0;
    // Waiters the parent's threads were are not here to wake.
    new (&p.work_) std::condition_variable;
    new (&p.done_) std::condition_variable;
    p.mutex_.unlock();
  }
  // Idle runners, the latest given back last. A runner an autograd graph held (an output kept
  // and dropped later) comes back after the calls went on with others: more than a few per
  // configuration, or many in all, would keep their engines and arenas for good.
  static constexpr size_t kMaxIdlePerKey = 4, kMaxIdle = 16;
  std::list<std::pair<std::string, std::unique_ptr<Runner>>> idle_;

  // Under the lock: `r` joins the idle runners; the ones past the bounds, the oldest first, go to
  // `evicted`.
  void park(const std::string& k, std::unique_ptr<Runner> r,
            std::vector<std::unique_ptr<Runner>>& evicted) {
    idle_.emplace_back(k, std::move(r));
    size_t same = 0;
    for (auto it = idle_.end(); it != idle_.begin();) {
      --it;
      if (it->first == k && ++same > kMaxIdlePerKey) {
        evicted.push_back(std::move(it->second));
        it = idle_.erase(it);
      }
    }
    while (idle_.size() > kMaxIdle) {
      evicted.push_back(std::move(idle_.front().second));
      idle_.pop_front();
    }
  }
  std::list<std::unique_ptr<Prepared>> prepared_;  // oldest first
  std::deque<Prepared*> queue_;                    // waiting for the worker
  std::condition_variable work_, done_;
  size_t workers_ = 0, free_workers_ = 0;  // started, and waiting for work
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
  // Where the gradients of x and of the weights go (keep_input_edges): with create_graph=True,
  // the node that refuses to differentiate the op's gradients leads there (autograd_backward).
  torch::autograd::edge_list input_edges;
};

// Keeps in `state` the autograd edges of x and of the weights that require a gradient.
void keep_input_edges(RunState& state, const Tensor& x, at::TensorList weights);

// Refuses a strided tensor without storage (what torch.func transforms pass), naming it `what`.
void check_storage(const Tensor& t, const char* what);
void check_index_tensor(const Tensor& t, const char* name, int64_t size);
// Checks the structure tensors' dtypes, devices and sizes and makes them contiguous CPU tensors.
void check_structure(const c10::Device& device, Structure& s);
// Checks x (float32, 2-D) and the weights against the cell; makes the weights contiguous.
// (the call's weights: `specs`, Runner::weights()).
void check_inputs(const Tensor& x, std::vector<Tensor>& w, const Cell& cell,
                  const std::vector<WeightSpec>& specs, bool on_device);
// The structure of `s` for x of num_x rows of x_dim floats at `x` (nullptr: not known yet).
Packed packed_view(const Structure& s, const float* x, int64_t num_x, int64_t x_dim);
// Refuses sizes and type counts outside 1 .. 2^31 - 1 (the engine holds them in 32 bits).
void check_sizes(int64_t hidden, int64_t input_size, int64_t num_node_types, int64_t num_arc_types);
CallArgs call_args(const std::string& cell, const c10::Device& device, int64_t input_size,
                   int64_t hidden, int64_t num_node_types, int64_t num_arc_types,
                   const std::string& policy, int64_t threads);
CallArgs call_args(const std::string& cell, const Tensor& x, int64_t hidden,
                   int64_t num_node_types, int64_t num_arc_types, const std::string& policy,
                   int64_t threads);
// The most threads a call may ask for (python/edbatch/head.py checks the same).
constexpr int64_t kMaxThreads = 1024;

// The engine options of a call on `device` (and which device), shared by built-in and user cells:
// the batching policy, threads (0: torch's) and the plan cache budget set now (set_plan_cache).
void set_run_options(CallArgs& a, const c10::Device& device, const std::string& policy,
                     int64_t threads);
// A loss head for the call (LossHead): `loss` "sum" or "mean" ("": none) over `classes` classes.
void set_loss_head(CallArgs& a, const std::string& loss, int64_t classes);
// The classes of the head whose weights end `weights` (the cell's, then the head's matrix and
// bias): the bias's length.
int64_t head_classes(at::TensorList weights);
// With a loss head: the labels checked (int64, one per node) as a contiguous CPU tensor; without
// one, an undefined tensor.
Tensor host_labels(const CallArgs& a, const c10::optional<Tensor>& labels, int64_t num_nodes);
// What a call adds to the structure: per-row integer inputs (traced cells embedding ids; an int64
// tensor, or undefined or empty for none), the seed of its dropout masks, and with a loss head the
// nodes' labels.
struct CallExtras {
  Tensor ids;
  uint64_t seed = 0;
  c10::optional<Tensor> labels;
};
// Checks `s`, sets the loss head (set_loss_head) and checks its labels, and queues the
// preparation of a later call with this structure and x of num_x rows of input_size floats on
// `where` (RunnerPool::prepare); `ids`: the call's integer per x row (traced cells embedding ids),
// or none.
void prepare_call(CallArgs a, const c10::Device& where, Structure s, int64_t num_x,
                  int64_t input_size, const std::string& loss, int64_t classes,
                  const c10::optional<Tensor>& labels, const c10::optional<Tensor>& ids = {});
// Runs the forward; keeps the runner in `state` when it is given (for backward).
std::vector<Tensor> run_forward(const CallArgs& a, const Tensor& x_in, Structure s,
                                std::vector<Tensor> w, c10::intrusive_ptr<RunState>* state,
                                const CallExtras& extras = {});
// The backward of a forward kept in `state`, from the outputs' gradients: the gradients of x
// and of the weights, on x's device. Gives the runner back to the pool unless `keep` (then a
// later backward may run through the same forward again). With `sparse_lookups`, a lookup
// table's gradient computed on the host is a sparse COO tensor of the rows it touched.
struct Gradients {
  Tensor x;
  std::vector<Tensor> weights;
};
// With `update`, the weights it lists are updated in place instead (plain SGD, t -= lr * grad,
// StepUpdate): their gradients come back as empty tensors.
struct StepUpdate {
  double lr = 0;
  std::vector<Tensor> weights;  // the call's weights, or none
  std::vector<bool> in_place;   // per weight: updated here
};
Gradients run_backward(RunState& state, const c10::Device& device,
                       const torch::autograd::variable_list& grads, bool keep = false,
                       bool sparse_lookups = false, const StepUpdate* update = nullptr);
// run_backward inside an autograd Function's backward: the runner kept while autograd keeps the
// graph (retain_graph=True), and with create_graph=True gradients that refuse, when
// differentiated, with a message (the op's backward is not differentiable itself).
Gradients autograd_backward(RunState& state, const c10::Device& device,
                            const torch::autograd::variable_list& grads);
// A training step's forward (with a loss head: `a`'s head set) and backward in one call, with
// no autograd graph: [the loss, x's gradient, each weight's gradient], on x's device. The weights
// at the indices `update` lists (host memory, float32, contiguous) are instead updated in place
// by plain SGD with `lr` (t -= lr * grad; a lookup table at the rows the call touched), the
// gradient they would have had never made: an empty tensor stands in its place.
std::vector<Tensor> run_step(const CallArgs& a, const Tensor& x, Structure s, std::vector<Tensor> w,
                             const CallExtras& extras, double lr = 0, at::IntArrayRef update = {});

}  // namespace edbatch::torch_adapter
