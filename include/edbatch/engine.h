// The engine: schedules, plans and runs graphs on one backend with one policy.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "edbatch/backend.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"

namespace edbatch {

struct EngineOptions {
  std::string policy = "agenda";  // none | depth | agenda | lb-greedy | auto | fsm:FILE
  std::string device = "cpu";     // cpu | null | cuda
  int threads = 1;
  double min_parallel_work = 65536;  // see BackendOptions
  bool order_for_consumers = true;    // outer layout planning (see PlanOptions)
  CudaOptions cuda = {};              // device == "cuda" only
  // After every pass, check that every value (forward) or gradient (backward) it computed is
  // finite, in the order the pass computed them, and throw NumericsError naming the first one
  // that is not: its batch, op and node (the block, its body node and call for values inside
  // blocks), or the parameter or input. Reads all values back from a device (so pipelined
  // passes wait); a debugging aid that costs a pass over the arena.
  bool check_numerics = false;
  double auto_policy_budget_s = 2;  // policy "auto": training time allowed at the first graph
  // Plan reuse: a graph whose structure was planned before (the same mini-batch again, a
  // sequence of a length seen before) runs on the kept schedule and memory plan instead of being
  // scheduled and planned; per-node integers (word ids, labels, picked indices, dropout keys,
  // block calls' integers) may differ. A structure is kept at its second planning and reused
  // from its third; graphs that never repeat cost a cheap key per planning and no memory. At most
  // this many bytes of plans are kept; 0 turns reuse off, and with it the repeat of an
  // incremental forward's plan (a decoding step like the one before: repeat_last_segment).
  // Results are bitwise those of planning again (docs/architecture.md, plan reuse).
  size_t plan_cache_bytes = size_t{64} << 20;
  std::string policy_cache_dir = "";  // policy "auto": empty = default_policy_cache_dir()
  // Testing what callers do when a pass fails inside the engine (out of memory, a device error):
  // the engine's forward pass number fail_forward_at (counted from 1 over the engine's life,
  // each increment a pass) throws std::runtime_error before its kernels run, as a backend that
  // fails there would; fail_backward_at the same for backward passes. 0: never.
  // EDBATCH_FAIL_FORWARD and EDBATCH_FAIL_BACKWARD set them (edbatch/options.h).
  uint64_t fail_forward_at = 0, fail_backward_at = 0;
};

// A non-finite value found by EngineOptions::check_numerics. `node`: the graph node it belongs to
// (an input, the node that computed it, or the block call whose body computed it; UINT32_MAX for
// a parameter's value or gradient).
struct NumericsError : std::runtime_error {
  explicit NumericsError(const std::string& what, uint32_t n = UINT32_MAX)
      : std::runtime_error(what), node(n) {}
  uint32_t node;
};

struct Stats {
  double construction_ms = 0;  // graph building, from Graph construction/clear to forward
  // The three below, for a graph run by incremental forwards, sum over its increments.
  double scheduling_ms = 0;    // scheduling + memory planning
  double execution_ms = 0;     // forward kernels (on a device: encoding and queueing them)
  double backward_ms = 0;
  // Device time of the last forward / backward (CUDA events; 0 on the CPU; a forward's sums over
  // its increments): compare with execution_ms / backward_ms to see how busy the GPU was.
  double device_forward_ms = 0, device_backward_ms = 0;
  uint64_t nodes = 0;          // scheduled (non-source) nodes
  uint64_t batches = 0;        // = kernel steps of the forward pass
  uint64_t lower_bound = 0;
  uint64_t policy_hits = 0;    // learned policies: choices from the table ...
  uint64_t policy_misses = 0;  // ... and from the fallback (unseen states)
  uint64_t policy_scored = 0;  // of the misses, those the learned scorer decided
  bool plan_reused = false;    // the last plan came from the plan cache (EngineOptions)
  uint64_t plans_reused = 0;   // ... and how many did, over the engine's life
  // Incremental forwards planned as a repeat of the increment before (repeat_last_segment,
  // memplan.h; on with plan reuse), over the engine's life.
  uint64_t increments_repeated = 0;
  // ... of which the operands were planned afresh (SegmentRepeat::Replanned).
  uint64_t increments_replanned = 0;
  uint64_t kernels = 0;        // launches, forward + backward so far
  uint64_t stages = 0;         // dependent device steps so far (ExecCounters::stages)
  uint64_t bytes_copied = 0;   // gathers, forward + backward so far
  uint64_t split_call_backward = 0;  // ExecCounters::split_call_backward, so far
  uint64_t packed_weights = 0;       // ExecCounters::packed_weights, so far
  uint64_t arena_bytes = 0;
  uint64_t arena_growths = 0;  // cumulative over the engine's life
  uint64_t prepared_passes = 0;  // forwards encoded ahead by prepare(), cumulative
};

// A read-only view of a value owned by the engine, valid until the next forward.
struct Tensor {
  const float* data = nullptr;
  Dim dim;
  float operator[](uint32_t i) const { return data[i]; }
};
float as_scalar(const Tensor& t);
std::vector<float> as_vector(const Tensor& t);
// The index of the first largest value of `t` (as std::max_element, but a NaN counts as the
// largest: the first NaN, as torch.argmax gives), eight values at a time: a greedy decoder's next
// word.
uint32_t argmax(const Tensor& t);

class PlanCache;

class Engine {
 public:
  explicit Engine(ParameterCollection& params, EngineOptions options = {});
  Engine(ParameterCollection& params, std::unique_ptr<Policy> policy, EngineOptions options = {});
  ~Engine();

  // Runs every node of `g` (once per graph version and inputs version) and returns the value of
  // `e`. A graph whose inputs were rewritten (Graph::write_inputs) runs again on the same plan, and
  // so does a graph with no node added since it ran when the parameters' values changed since (an
  // update, loaded weights, mark_changed; not zero_grads), as DyNet's forward computes again after
  // an update.
  //
  // Incremental forward: when nodes were added to the graph of the last forward (same graph,
  // no clear() between), only the new nodes are scheduled (every policy sees their frontier),
  // planned after the values already computed, which keep their place, and run. A program can
  // thus read values, decide what to add, and forward again (greedy decoding); new nodes read the
  // parameters of now, the values before keep theirs. backward() then
  // covers every increment, as for the graph built whole. Tensors read before stay readable
  // through value() (their pointers may move when the arena grows).
  const Tensor& forward(Graph& g, const Expr& e);
  // Incremental forward up to given expressions: runs the nodes of `g` up to and including `e`
  // (the prefix of the graph through it, as DyNet's incremental_forward) and returns e's value.
  // Nodes after it wait for a later forward() or forward_through(), which goes on from here;
  // reading a value past the prefix, or backward() before the whole graph ran, is an error naming
  // the nodes. The vector form runs through the latest of `es`.
  const Tensor& forward_through(Graph& g, const Expr& e);
  void forward_through(Graph& g, const std::vector<Expr>& es);
  // Schedules and plans `g` without running it, so that the next forward() or submit() of `g`
  // only runs the plan. This is host work (a device backend also encodes the forward pass,
  // growing its buffers on its stream: Backend::prepare_forward): it may be done ahead, on
  // another thread, while nothing else uses this engine. Like forward(), it replaces the plan of
  // the graph before (whose backward can no longer run).
  void prepare(Graph& g);
  // Pipelined forward: schedules, plans and queues the forward pass of `g` (once per graph
  // version) and returns a ticket for the value of `e`. A device backend returns as soon as the
  // work is queued; the CPU computes it first. Building and submitting the next mini-batch before
  // reading result(ticket) overlaps its CPU work (construction, scheduling, planning, encoding)
  // with the device's work on this one. After submit the engine is at `g` as after forward():
  // backward(), value() and gradient() work as usual. The last Backend::kStagedSlots results can
  // be read; result() waits for its pass.
  uint64_t submit(Graph& g, const Expr& e);
  Tensor result(uint64_t ticket);
  // submit() without a value to read back: queues the forward pass of `g` (whole) and stages
  // nothing, for callers that read values where they are (device_interop()).
  void enqueue(Graph& g, const Expr& e);
  // values -= lr * grads and the gradients zeroed (ParameterCollection::sgd_update), done where
  // the backend holds the parameters: on a device, without copying them to the host and back.
  void sgd_update(float lr);
  // One optimizer step (edbatch/optim.h; Optimizer::step(engine) calls this) done where the
  // backend holds the parameters, with the optimizer's state kept there too.
  void optimizer_step(const UpdateRule& rule, OptimizerState& state);
  // Waits for everything queued on the device (no-op on the CPU).
  void synchronize() { backend_->synchronize(); }
  // The backend's device memory interop (nullptr on the CPU): see DeviceInterop.
  DeviceInterop* device_interop() { return backend_->device_interop(); }
  // Back-propagates from the scalar `loss`; parameter gradients accumulate in the collection.
  void backward(Graph& g, const Expr& loss);
  // Back-propagates from given adjoints of `outputs` (a vector-Jacobian product): output i's
  // adjoint is its dim.size() floats of `seeds`, after output i-1's; outputs may repeat (their
  // seeds add). `seeds` is host memory, or with `seeds_on_device` device memory of the engine's
  // device (queued on its DeviceInterop stream).
  void backward(Graph& g, const std::vector<Expr>& outputs, const float* seeds,
                bool seeds_on_device = false);
  Tensor value(const Expr& e) const;
  // Reads the values of many expressions of the last forward at once, for value() to return
  // without copying: on a device, the span they cover comes to host memory in one copy where they
  // lie close together (a decoding step's outputs, one per sentence, are one batch's), where
  // value() alone copies on each miss. Checks each expression as value() does.
  void fetch(const std::vector<Expr>& es) const;
  // fetch(), then copies the values out: `es` holds groups of `group` expressions, and group k's
  // values go one after another (each dim.size() floats) to outs[k]. Checks each expression once.
  void read(const std::vector<Expr>& es, size_t group, float* const* outs) const;
  Tensor gradient(const Expr& e) const;  // after backward

  // Device times are those of the latest finished passes (a device runs passes asynchronously).
  const Stats& stats() const {
    sync_counters();
    return stats_;
  }
  const Schedule& schedule() const { return schedule_; }
  const MemoryPlan& plan() const { return plan_; }
  const Policy& policy() const { return *policy_; }
  const EngineOptions& options() const { return options_; }
  // EngineOptions::check_numerics for the passes from now on.
  void set_check_numerics(bool on) { options_.check_numerics = on; }
  ParameterCollection& params() const { return params_; }

 private:
  void check_params(const Graph& g, const char* fn) const;  // built over this collection
  void check_graph(const Graph& g, const Expr& e, const char* fn) const;
  // Whether the plan covers nodes [0, end) of `g` as it is now (end = g.size(): the whole graph,
  // of the version it was made for).
  bool covers(const Graph& g, uint32_t end) const;
  bool is_current(const Graph& g) const { return covers(g, g.size()); }
  // ... and the plan has run on its current inputs.
  bool has_run(const Graph& g, uint32_t end = UINT32_MAX) const;
  // Plans nodes [0, end) of `g` (past its size: all of them).
  void plan_graph(Graph& g, uint32_t end = UINT32_MAX);
  // Incremental forward (src/core/engine_incremental.cpp): whether `g` is the planned graph with
  // nodes added since (up to `end`), and planning those nodes as a new segment.
  bool extends_plan(const Graph& g, uint32_t end) const;
  void extend_plan(Graph& g, uint32_t end);
  uint32_t ran_nodes() const;  // nodes [0, ran_nodes()) have values
  // value() and fetch(): `e` is a node of the last forward's graph that has run.
  void check_ran(const Expr& e, const char* fn) const;
  void fetch_checked(const std::vector<Expr>& es, const char* fn) const;  // fetch(), read()
  const float* values_of(const Node& n, uint32_t id) const;  // unchecked: value(), read()
  void check_ran_all(const Graph& g) const;  // backward: every node of `g` has run
  void sync_counters() const;
  void run_forward(Graph& g, const Expr& e, const char* fn, uint32_t end = UINT32_MAX);
  void run_backward(Graph& g, BackwardSeed seed);
  // EngineOptions::check_numerics after a pass (src/core/numerics.cpp); a forward's check reads
  // the parameters and the segments it ran, from `first_segment` on.
  void check_forward_numerics(const Graph& g, const char* fn, uint32_t first_segment) const;
  void check_backward_numerics(const Graph& g) const;

  ParameterCollection& params_;
  EngineOptions options_;
  std::unique_ptr<Policy> policy_;
  std::unique_ptr<Backend> backend_;
  Scheduler scheduler_;
  std::unique_ptr<PlanCache> plan_cache_;
  Schedule schedule_;
  MemoryPlan plan_;
  std::vector<uint32_t> seed_nodes_;  // backward(outputs, seeds)
  std::vector<uint8_t> live_, skip_batches_;   // backward: nodes the seeds depend on, batches not
  mutable std::vector<uint32_t> fetch_nodes_;  // fetch()
  PlanOptions plan_options_;
  mutable Stats stats_;
  Tensor result_;
  Dim staged_dim_[Backend::kStagedSlots];
  uint32_t staged_param_[Backend::kStagedSlots] = {};  // a parameter's id, or UINT32_MAX
  const Graph* graph_ = nullptr;
  uint32_t graph_generation_ = 0;
  uint64_t graph_version_ = UINT64_MAX;
  uint64_t graph_cuts_ = 0;  // the graph's cuts() when planned: a cut below what ran replans
  // What the last planning added to the schedule's lower bound and the policy's lookups: an
  // increment that repeats it adds the same.
  uint32_t segment_bound_ = 0;
  Policy::Lookups segment_lookups_;
  uint64_t forward_passes_ = 0;      // passes begun (EngineOptions::fail_forward_at) ...
  uint64_t backward_passes_ = 0;     // ... and fail_backward_at
  uint32_t ran_segments_ = 0;        // the plan's segments that have run ...
  uint64_t ran_inputs_version_ = 0;  // ... on these inputs
  uint64_t ran_params_version_ = 0;  // ... and these parameters (ParameterCollection::version)
  bool have_backward_ = false;
};

}  // namespace edbatch
