#include "src/torch/cells.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "edbatch/options.h"
#include "kernels/transpose.h"

namespace edbatch::torch_adapter {

void check_packed(const Packed& p, const char* fn) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("[{}] {}", fn, what));
  };
  if (p.num_nodes < 0 || p.num_arcs < 0 || p.num_instances < 0)
    fail("negative node, arc or instance count");
  if (p.instance_offsets[0] != 0) fail("instance_offsets[0] must be 0");
  for (int64_t i = 0; i < p.num_instances; ++i)
    if (p.instance_offsets[i + 1] <= p.instance_offsets[i])
      fail(fmt::format("instance {} has no nodes (instance_offsets must increase)", i));
  if (p.instance_offsets[p.num_instances] != p.num_nodes)
    fail(fmt::format("instance_offsets ends at {}, not at the number of nodes {}",
                     p.instance_offsets[p.num_instances], p.num_nodes));
  if (p.pred_ptr[0] != 0) fail("pred_ptr[0] must be 0");
  if (p.pred_ptr[p.num_nodes] != p.num_arcs)
    fail(fmt::format("pred_ptr ends at {}, not at the number of arcs {}", p.pred_ptr[p.num_nodes],
                     p.num_arcs));
  // pred_ptr whole first: no arc is read before every range is known to lie in [0, num_arcs].
  for (int64_t k = 0; k < p.num_nodes; ++k) {
    if (p.pred_ptr[k + 1] < p.pred_ptr[k]) fail(fmt::format("pred_ptr decreases at node {}", k));
    if (p.pred_ptr[k + 1] > p.num_arcs)
      fail(fmt::format("pred_ptr[{}] = {} passes the number of arcs {}", k + 1,
                       p.pred_ptr[k + 1], p.num_arcs));
  }
  int64_t instance = 0;
  for (int64_t k = 0; k < p.num_nodes; ++k) {
    while (p.instance_offsets[instance + 1] <= k) ++instance;
    const int64_t first = p.instance_offsets[instance];
    if (p.node_inputs[k] < -1 || p.node_inputs[k] >= p.num_x)
      fail(fmt::format("node {} reads input row {} (of x or ids), outside [-1, {})", k,
                       p.node_inputs[k], p.num_x));
    if (p.node_types[k] < 0) fail(fmt::format("node {} has negative type", k));
    for (int64_t a = p.pred_ptr[k]; a < p.pred_ptr[k + 1]; ++a) {
      const int64_t j = p.pred_ids[a];
      if (j < first || j >= k)
        fail(
            fmt::format("node {} (instance {}) reads node {}: predecessors must come before it "
                        "in its own instance (nodes {}..{})",
                        k, instance, j, first, k - 1));
      if (p.arc_types[a] < 0) fail(fmt::format("arc {} has negative type", a));
      if (p.arc_inputs[a] < -1 || p.arc_inputs[a] >= p.num_x)
        fail(fmt::format("arc {} reads input row {} (of x or ids), outside [-1, {})", a,
                         p.arc_inputs[a], p.num_x));
    }
  }
}

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// EDBATCH_TORCH_PROFILE=1: the host time of every Runner call by phase, printed at exit (median
// and 90th percentile over the calls of all runners and threads).
class HostProfile {
 public:
  enum Phase { Check, Weights, Build, Schedule, Launch, Read, BackZero, BackLaunch, BackRead, kN };
  // nullptr unless profiling is on.
  static HostProfile* get() {
    static HostProfile* profile = adapter_debug_env().profile ? new HostProfile : nullptr;
    return profile;
  }
  void add(Phase phase, double ms) {
    std::lock_guard<std::mutex> lock(mutex_);
    samples_[phase].push_back(ms);
  }
  // Adds the time since `t` to `phase` and restarts `t`.
  void lap(Phase phase, Clock::time_point& t) {
    add(phase, ms_since(t));
    t = Clock::now();
  }

 private:
  HostProfile() { std::atexit([] { get()->print(); }); }
  void print() const {
    static const char* names[kN] = {"check",        "weights",       "graph build",
                                    "schedule+plan", "encode+launch", "read outputs",
                                    "zero grads",   "backward pass", "read gradients"};
    std::fprintf(stderr, "edbatch adapter host time per call, median (p90) ms over calls:");
    for (int i = 0; i < kN; ++i) {
      std::vector<double> v = samples_[i];
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      std::fprintf(stderr, " %s %.3f (%.3f);", names[i], v[v.size() / 2], v[v.size() * 9 / 10]);
    }
    std::fprintf(stderr, " %zu calls\n", samples_[Check].size());
  }
  std::mutex mutex_;
  std::vector<double> samples_[kN];
};

}  // namespace

bool Cell::step(Graph&, const Expr*, const Expr*, Expr*) { return false; }

Parameter Cell::add(ParameterCollection& pc, const std::string& name, uint32_t rows,
                    uint32_t cols) {
  weights_.push_back({name, rows, cols});
  return pc.add_parameters(name, Dim{rows, std::max(cols, 1u)});
}

namespace {
std::atomic<uint64_t> plans_reused{0};
}  // namespace

uint64_t plans_reused_total() {
  return plans_reused.load(std::memory_order_relaxed);
}

EngineOptions RunOptions::engine_options() const {
  EngineOptions o{policy, device, threads};
  o.plan_cache_bytes = plan_cache_bytes;
  o.check_numerics = check_numerics;
  return apply_debug_env(o);
}

// The loss head's weights, after the cell's: names no cell uses (a cell's have no "loss." prefix).
constexpr const char* kHeadWeight = "loss.weight";
constexpr const char* kHeadBias = "loss.bias";

Runner::Runner(const CellConfig& config, const RunOptions& options)
    : pc_(1), head_(config.head), engine_(pc_, options.engine_options()), graph_(pc_) {
  cell_ = make_cell(config, pc_);
  specs_ = cell_->weights();
  if (head_.classes) {
    const uint32_t h = cell_->output_size(0);
    specs_.push_back({kHeadWeight, head_.classes, h});
    specs_.push_back({kHeadBias, head_.classes, 0});
    pc_.add_parameters(kHeadWeight, Dim{head_.classes, h});
    pc_.add_parameters(kHeadBias, Dim{head_.classes, 1});
  }
  for (const WeightSpec& w : specs_) weight_params_.push_back({pc_.find(w.name)});
}

namespace {

// A weight from torch's row-major rows x cols to the engine's column-major rows x cols
// (into_engine), or back; weights whose memory already is the engine's (WeightSpec::transpose
// false) are copied as they are.
void copy_weight(const float* src, const WeightSpec& w, float* dst, bool into_engine) {
  if (w.cols <= 1 || !w.transpose) {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(w.rows) * std::max(w.cols, 1u));
    return;
  }
  // The engine's column-major rows x cols is torch's matrix transposed, as row-major memory.
  if (into_engine)
    transpose(src, w.rows, w.cols, dst);
  else
    transpose(src, w.cols, w.rows, dst);
}

void to_torch(const float* src, const WeightSpec& w, float* dst) {
  copy_weight(src, w, dst, false);
}

// dst (a weight in torch's memory) += alpha times the engine's src of the same weight: plain SGD
// with alpha = -lr, in one pass instead of a transposed copy out and an update over that copy.
void add_to_torch(const float* src, const WeightSpec& w, float alpha, float* dst) {
  if (w.cols <= 1 || !w.transpose) {
    const size_t n = static_cast<size_t>(w.rows) * std::max(w.cols, 1u);
    for (size_t i = 0; i < n; ++i) dst[i] += alpha * src[i];
    return;
  }
  transpose_add(src, w.cols, w.rows, alpha, dst);
}

// A lookup table's rows at the call's ids only: the lookups read no others, and a table of a
// large vocabulary copied whole would cost more than the cells (its other rows keep what an
// earlier call left).
void copy_rows(const float* src, const WeightSpec& w, const int64_t* ids, int64_t n, float* dst) {
  const size_t cols = w.cols;
  for (int64_t r = 0; r < n; ++r)
    if (ids[r] >= 0 && ids[r] < int64_t{w.rows})
      std::memcpy(dst + ids[r] * cols, src + ids[r] * cols, sizeof(float) * cols);
}

}  // namespace

void to_engine(const float* src, const WeightSpec& w, float* dst) {
  copy_weight(src, w, dst, true);
}

bool Runner::wait_each_call() {
  static const bool wait = adapter_debug_env().wait_each_call;
  return wait;
}

DeviceInterop& device_interop(Engine& engine, const char* fn) {
  DeviceInterop* io = engine.device_interop();
  if (!io)
    throw std::invalid_argument(std::string("[") + fn +
                                "] device memory given, but the engine "
                                "runs on " +
                                engine.options().device);
  return *io;
}

void write_weights_on_device(Engine& engine, ParameterCollection& pc,
                             const std::vector<WeightSpec>& specs,
                             const std::vector<Parameter>& params,
                             const std::vector<const float*>& weights, void* stream,
                             std::vector<DeviceInterop::Transfer>& transfers, const char* fn) {
  DeviceInterop& io = device_interop(engine, fn);
  io.use_stream(stream);
  transfers.clear();
  for (size_t i = 0; i < specs.size(); ++i)
    transfers.push_back({params[i].id, const_cast<float*>(weights[i]), specs[i].row_major(),
                         specs[i].engine_cols()});
  io.write_parameters(pc, transfers);
}

void add_x_inputs(Graph& g, const std::vector<uint32_t>& segments, uint32_t rows, const float* x,
                  std::vector<Expr>& exprs) {
  std::vector<Dim> dims;
  for (uint32_t size : segments) dims.push_back(Dim{size, 1});
  const uint32_t first = g.add_inputs(dims.data(), static_cast<uint32_t>(dims.size()), rows, x);
  const size_t count = dims.size() * rows;
  exprs.clear();
  exprs.reserve(count);
  for (size_t k = 0; k < count; ++k) exprs.push_back(g.expr(first + static_cast<uint32_t>(k)));
}

void read_groups(DeviceInterop& io, const Graph& g, const MemoryPlan& plan,
                 const std::vector<Expr>& targets, size_t per_group,
                 const std::vector<float*>& outputs, std::vector<uint32_t>& ids) {
  ids.clear();
  float* run = nullptr;  // where the groups in ids start
  size_t floats = 0;     // ... and their floats so far
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (run != nullptr && outputs[o] != run + floats) {
      io.read_nodes(g, plan, ids, run, false);
      ids.clear();
    }
    if (ids.empty()) run = outputs[o], floats = 0;
    for (size_t k = o * per_group; k < (o + 1) * per_group; ++k) {
      ids.push_back(targets[k].id);
      floats += g.node(targets[k].id).dim.size();
    }
  }
  if (!ids.empty()) io.read_nodes(g, plan, ids, run, false);
}

void Runner::stage(const Packed& p) {
  prepared_ = false;
  const int64_t N = p.num_nodes, A = p.num_arcs, B = p.num_instances;
  const int64_t L = head_.classes && p.labels ? N : 0;
  const int64_t I = p.ids ? p.num_x : 0;
  staged_.resize(static_cast<size_t>(2 * N + (N + 1) + 3 * A + (B + 1) + L + I));
  int64_t* at = staged_.data();
  auto put = [&at](const int64_t* src, int64_t n) {
    if (n > 0) std::memcpy(at, src, sizeof(int64_t) * static_cast<size_t>(n));
    const int64_t* view = at;
    at += n;
    return view;
  };
  staged_view_ = p;
  staged_view_.x = nullptr;
  staged_view_.node_inputs = put(p.node_inputs, N);
  staged_view_.node_types = put(p.node_types, N);
  staged_view_.pred_ptr = put(p.pred_ptr, N + 1);
  staged_view_.pred_ids = put(p.pred_ids, A);
  staged_view_.arc_types = put(p.arc_types, A);
  staged_view_.arc_inputs = put(p.arc_inputs, A);
  staged_view_.instance_offsets = put(p.instance_offsets, B + 1);
  staged_view_.labels = L > 0 ? put(p.labels, L) : nullptr;
  staged_view_.ids = p.ids ? put(p.ids, I) : nullptr;
}

void Runner::prepare() {
  prepared_ = false;
  const char* fn = "edbatch.prepare";
  check_packed(staged_view_, fn);
  cell_->check(staged_view_, fn);
  check_labels(staged_view_, fn);
  if (staged_view_.num_nodes > 0) {
    build_graph(staged_view_, nullptr);
    engine_.prepare(graph_);
  }
  prepared_ = true;
}

bool Runner::staged_matches(const Packed& p) const {
  const Packed& s = staged_view_;
  if (staged_.empty() || p.num_nodes != s.num_nodes || p.num_arcs != s.num_arcs ||
      p.num_instances != s.num_instances || p.num_x != s.num_x || p.x_dim != s.x_dim ||
      p.seed != s.seed || (p.ids == nullptr) != (s.ids == nullptr) ||
      (head_.classes && p.num_nodes > 0 && (p.labels == nullptr || s.labels == nullptr)))
    return false;  // dropout masks (the seed) and ids are part of a traced cell's graph
  auto same = [](const int64_t* a, const int64_t* b, int64_t n) {
    return n == 0 || std::memcmp(a, b, sizeof(int64_t) * static_cast<size_t>(n)) == 0;
  };
  const int64_t N = p.num_nodes, A = p.num_arcs;
  return same(p.node_inputs, s.node_inputs, N) && same(p.node_types, s.node_types, N) &&
         same(p.pred_ptr, s.pred_ptr, N + 1) && same(p.pred_ids, s.pred_ids, A) &&
         same(p.arc_types, s.arc_types, A) && same(p.arc_inputs, s.arc_inputs, A) &&
         same(p.instance_offsets, s.instance_offsets, p.num_instances + 1) &&
         (!head_.classes || same(p.labels, s.labels, N)) &&
         (p.ids == nullptr || same(p.ids, s.ids, p.num_x));
}

void Runner::check_labels(const Packed& p, const char* fn) const {
  if (!head_.classes) return;
  if (p.labels == nullptr && p.num_nodes > 0)
    throw std::invalid_argument(fmt::format("[{}] a loss head needs labels, one per node", fn));
  for (int64_t k = 0; k < p.num_nodes; ++k)
    if (p.labels[k] < -1 || p.labels[k] >= head_.classes)
      throw std::invalid_argument(
          fmt::format("[{}] node {} has label {}, outside [-1, {}) (-1: no label; {} classes)", fn,
                      k, p.labels[k], head_.classes, head_.classes));
}

namespace {
// The sum of many scalars as sums of chunks, then the sum of those: one Sum of every labelled
// node's loss is one warp's loop on a GPU (each lane adding every 32nd: kernels/cuda/device.h's
// wide_sum), and its backward that many atomic additions; it was one thread's before the wide
// sum (about 0.4 ms of a step at a mini-batch of 128 trees). Chunks of about sqrt(n) (at least
// 32) keep both levels short and parallel.
Expr sum_in_chunks(const std::vector<Expr>& xs) {
  const size_t n = xs.size();
  size_t chunk = 32;
  while (chunk * chunk < n) ++chunk;
  if (n <= chunk) return sum_losses(xs);
  std::vector<Expr> sums, part;
  for (size_t i = 0; i < n; i += chunk) {
    part.assign(xs.begin() + static_cast<std::ptrdiff_t>(i),
                xs.begin() + static_cast<std::ptrdiff_t>(std::min(n, i + chunk)));
    sums.push_back(part.size() == 1 ? part[0] : sum_losses(part));
  }
  return sum_losses(sums);
}
}  // namespace

// -log softmax(W h_k + b)[label_k] for every labelled node k, summed (or averaged): targets_ is
// then the loss alone.
void Runner::add_loss_head(const Packed& p) {
  const size_t n = weight_params_.size();
  const Expr W = parameter(graph_, weight_params_[n - 2]);
  const Expr b = parameter(graph_, weight_params_[n - 1]);
  losses_.clear();
  for (int64_t k = 0; k < p.num_nodes; ++k) {
    if (p.labels[k] < 0) continue;
    const Expr z = affine({b, W, out_[k]});
    losses_.push_back(pick_neg_log_softmax(z, static_cast<uint32_t>(p.labels[k])));
  }
  Expr loss = losses_.empty() ? input(graph_, 0.0f) : sum_in_chunks(losses_);
  // The mean's factor as an input, not an attribute: attributes are part of a node's type, and
  // a type per count of labelled nodes would stay in the collection for good.
  if (head_.mean && losses_.size() > 1)
    loss = cmult(loss, input(graph_, 1.0f / static_cast<float>(losses_.size())));
  targets_.assign(1, loss);
}

// The graph of `p`'s nodes over input nodes for x's rows, holding `x` (nullptr: zeros, written
// later or taken from device memory).
void Runner::build_graph(const Packed& p, const float* x) {
  graph_.clear();
  add_x_inputs(graph_, cell_->input_segments(), static_cast<uint32_t>(p.num_x), x, x_);
  out_.assign(static_cast<size_t>(cell_->num_outputs()) * p.num_nodes, Expr{});
  cell_->build(graph_, p, x_, out_);
  if (head_.classes)
    add_loss_head(p);
  else
    targets_ = out_;
}

template <class F>
void Runner::naming_numerics(const F& pass) const {
  try {
    pass();
  } catch (const NumericsError& e) {
    rethrow_named(e);
  }
}

void Runner::rethrow_named(const NumericsError& e) const {
  std::string where;
  const size_t segs = cell_->input_segments().size();
  for (size_t j = 0; j < x_.size() && where.empty() && e.node != UINT32_MAX; ++j)
    if (x_[j].id == e.node) where = fmt::format("x row {}", j / segs);
  // A node's outputs are views of its cell call (or the cell's own last nodes).
  for (size_t j = 0; j < out_.size() && where.empty() && e.node != UINT32_MAX; ++j) {
    const Node& n = graph_.node(out_[j].id);
    if (out_[j].id == e.node || (n.op == Op::Output && graph_.args(n)[0] == e.node))
      where = fmt::format("node {} of the packed structure (its cell)", j % num_nodes_);
  }
  if (where.empty()) throw e;
  throw NumericsError(fmt::format("[edbatch] {}: {}", where, e.what()), e.node);
}

void Runner::forward(const Packed& p, const std::vector<const float*>& weights,
                     const std::vector<float*>& outputs, bool for_backward, bool on_device,
                     void* stream) {
  const char* fn = "edbatch.forward";
  HostProfile* prof = HostProfile::get();
  Clock::time_point t = prof ? Clock::now() : Clock::time_point{};
  // A prepared graph is this structure's: checked, built, scheduled and planned.
  const bool reuse = prepared_ && staged_matches(p);
  prepared_ = false;
  if (!reuse) {
    check_packed(p, fn);
    cell_->check(p, fn);
    check_labels(p, fn);
  }
  if (prof) prof->lap(HostProfile::Check, t);
  const std::vector<WeightSpec>& specs = specs_;
  if (on_device) {
    write_weights_on_device(engine_, pc_, specs, weight_params_, weights, stream, transfers_, fn);
  } else {
    for (size_t i = 0; i < specs.size(); ++i) {
      float* dst = pc_.values(weight_params_[i].id);
      if (specs[i].lookup && p.ids)
        copy_rows(weights[i], specs[i], p.ids, p.num_x, dst);
      else
        to_engine(weights[i], specs[i], dst);
    }
    pc_.mark_changed();  // device backends upload the parameters again
  }
  if (prof) prof->lap(HostProfile::Weights, t);
  on_device_ = on_device;
  num_nodes_ = p.num_nodes;
  num_x_ = p.num_x;
  have_graph_ = false;
  if (p.num_nodes == 0) return;

  // On the device the x rows are the graph's first input values, filled from p.x there.
  if (!reuse)
    build_graph(p, on_device ? nullptr : p.x);
  else if (!on_device)
    graph_.write_inputs(0, p.x, static_cast<size_t>(p.num_x * p.x_dim));
  if (prof) prof->lap(HostProfile::Build, t);
  const uint32_t nout = num_outputs();
  // Output o's nodes in targets_ (the loss alone with a head).
  const size_t per_output = targets_.size() / nout;

  // Backward seeds the outputs' adjoints directly (Engine::backward from outputs).
  const Expr target = targets_[0];
  if (on_device) {
    DeviceInterop& io = device_interop(engine_, fn);
    io.inputs_from_device(p.x, static_cast<size_t>(p.num_x * p.x_dim), 0);
    naming_numerics([&] { engine_.enqueue(graph_, target); });  // queued; nothing waits for it
    if (engine_.stats().plan_reused) plans_reused.fetch_add(1, std::memory_order_relaxed);
    if (prof) {
      const double scheduling_ms = reuse ? 0.0 : engine_.stats().scheduling_ms;
      prof->add(HostProfile::Schedule, scheduling_ms);
      prof->add(HostProfile::Launch, ms_since(t) - scheduling_ms);
      t = Clock::now();
    }
    read_groups(io, graph_, engine_.plan(), targets_, per_output, outputs, ids_);
    if (wait_each_call()) engine_.synchronize();
    if (prof) prof->lap(HostProfile::Read, t);
    have_graph_ = for_backward;
    return;
  }
  naming_numerics([&] { engine_.forward(graph_, target); });
  if (engine_.stats().plan_reused) plans_reused.fetch_add(1, std::memory_order_relaxed);
  engine_.read(targets_, per_output, outputs.data());
  have_graph_ = for_backward;
}

void Runner::backward(const float* out_grad, float* grad_x, const std::vector<float*>& grad_weights,
                      void* stream, const std::vector<float*>* update, float lr) {
  const std::vector<WeightSpec>& specs = specs_;
  const uint32_t D = cell_->input_dim();
  if (on_device_) {
    backward_on_device(out_grad, grad_x, grad_weights, stream);
    return;
  }
  std::fill(grad_x, grad_x + num_x_ * D, 0.0f);
  if (!have_graph_) {
    if (num_nodes_ != 0)
      throw std::runtime_error("[edbatch.backward] forward was not run for backward");
    // No nodes: every gradient is zero, and no lookup row was touched (lookup_gradient).
    pc_.zero_grads();
    for (size_t i = 0; i < specs.size(); ++i)
      if (grad_weights[i])  // null: updated in place (by nothing), or a lookup table's
        std::fill(grad_weights[i], grad_weights[i] + specs[i].rows * std::max(specs[i].cols, 1u),
                  0.0f);
    return;
  }
  pc_.zero_grads();
  naming_numerics([&] { engine_.backward(graph_, targets_, out_grad); });
  const std::vector<uint32_t> segments = cell_->input_segments();
  float* row = grad_x;
  for (size_t i = 0; i < x_.size(); ++i) {
    const uint32_t size = segments[i % segments.size()];
    const Tensor t = engine_.gradient(x_[i]);
    std::memcpy(row, t.data, sizeof(float) * size);
    row += size;
  }
  std::vector<int64_t> rows;
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint32_t id = weight_params_[i].id;
    const float* grads = pc_.grads(id);
    if (float* target = update ? (*update)[i] : nullptr) {
      if (!specs[i].lookup) {
        add_to_torch(grads, specs[i], -lr, target);
        continue;
      }
      // A lookup table moves at the rows the backward touched (each listed once).
      const size_t cols = specs[i].cols;
      lookup_rows(i, rows);
      for (const int64_t r : rows)
        for (size_t c = 0; c < cols; ++c) target[r * cols + c] += -lr * grads[r * cols + c];
      continue;
    }
    if (!specs[i].lookup) {
      to_torch(grads, specs[i], grad_weights[i]);
      continue;
    }
    if (!grad_weights[i]) continue;  // lookup_gradient
    // A lookup table's gradient is zero but in the rows the backward touched.
    const size_t cols = specs[i].cols;
    std::fill(grad_weights[i], grad_weights[i] + specs[i].rows * cols, 0.0f);
    lookup_rows(i, rows);
    for (const int64_t r : rows)
      std::memcpy(grad_weights[i] + r * cols, grads + r * cols, sizeof(float) * cols);
  }
}

void Runner::lookup_rows(size_t i, std::vector<int64_t>& rows) const {
  const uint32_t table_rows = specs_[i].rows;
  rows.clear();
  for (uint32_t c : pc_.touched_columns(weight_params_[i].id))
    if (c < table_rows) rows.push_back(c);  // columns past the table are the zeros of row -1
}

void Runner::lookup_gradient(size_t i, const std::vector<int64_t>& rows, float* out) const {
  const size_t cols = specs_[i].cols;
  const float* grads = pc_.grads(weight_params_[i].id);
  for (const int64_t r : rows) {
    std::memcpy(out, grads + r * cols, sizeof(float) * cols);
    out += cols;
  }
}

void Runner::read_gradients(DeviceInterop& io, const std::vector<float*>& grad_weights) {
  const std::vector<WeightSpec>& specs = specs_;
  transfers_.clear();
  for (size_t i = 0; i < specs.size(); ++i)
    transfers_.push_back(
        {weight_params_[i].id, grad_weights[i], specs[i].row_major(), specs[i].engine_cols()});
  io.read_gradients(pc_, transfers_);
}

// The backward of a forward on device memory: the seeds, the gradients and grad_x move on the
// device; nothing waits.
void Runner::backward_on_device(const float* out_grad, float* grad_x,
                                const std::vector<float*>& grad_weights, void* stream) {
  DeviceInterop& io = device_interop(engine_, "edbatch.backward");
  io.use_stream(stream);
  if (!have_graph_) {
    if (num_nodes_ != 0)
      throw std::runtime_error("[edbatch.backward] forward was not run for backward");
    // No nodes: every gradient is zero.
    io.zero_gradients(pc_);
    read_gradients(io, grad_weights);
    return;
  }
  HostProfile* prof = HostProfile::get();
  Clock::time_point t = prof ? Clock::now() : Clock::time_point{};
  io.zero_gradients(pc_);
  if (prof) prof->lap(HostProfile::BackZero, t);
  naming_numerics([&] { engine_.backward(graph_, targets_, out_grad, true); });
  if (prof) prof->lap(HostProfile::BackLaunch, t);
  ids_.clear();
  for (const Expr& x : x_) ids_.push_back(x.id);
  io.read_nodes(graph_, engine_.plan(), ids_, grad_x, true);
  read_gradients(io, grad_weights);
  if (wait_each_call()) engine_.synchronize();
  if (prof) prof->lap(HostProfile::BackRead, t);
}

}  // namespace edbatch::torch_adapter
