#include "edbatch/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/op_math.h"
#include "src/core/plan_cache.h"

namespace edbatch {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
}  // namespace

float as_scalar(const Tensor& t) {
  if (t.data == nullptr)
    throw std::runtime_error("[as_scalar] no value: the null backend computes no values");
  if (t.dim.size() != 1)
    throw std::invalid_argument("[as_scalar] tensor has shape " + to_string(t.dim) +
                                ", not a scalar");
  return t.data[0];
}

std::vector<float> as_vector(const Tensor& t) {
  if (t.data == nullptr)
    throw std::runtime_error("[as_vector] no value: the null backend computes no values");
  return std::vector<float>(t.data, t.data + t.dim.size());
}

uint32_t argmax(const Tensor& t) {
  if (t.data == nullptr)
    throw std::runtime_error("[argmax] no value: the null backend computes no values");
  if (t.dim.size() == 0) throw std::invalid_argument("[argmax] the tensor is empty");
  return math::first_max_row(t.data, t.dim.size());
}

Engine::Engine(ParameterCollection& params, EngineOptions options)
    : Engine(params,
             make_policy(options.policy, PolicyContext{options.device, options.auto_policy_budget_s,
                                                       options.policy_cache_dir, {}}),
             options) {}

Engine::Engine(ParameterCollection& params, std::unique_ptr<Policy> policy, EngineOptions options)
    : params_(params), options_(std::move(options)), policy_(std::move(policy)) {
  if (!policy_) throw std::invalid_argument("[Engine] null policy");
  options_.policy = policy_->name();
  plan_options_.order_for_consumers = options_.order_for_consumers;
  backend_ = make_backend(options_.device,
                          {options_.threads, options_.min_parallel_work, options_.cuda});
  scheduler_.set_reads(backend_->wants_batch_reads());
  plan_cache_ = std::make_unique<PlanCache>(options_.plan_cache_bytes);
}

Engine::~Engine() = default;

void Engine::check_params(const Graph& g, const char* fn) const {
  if (&g.params() != &params_)
    throw std::invalid_argument(std::string("[") + fn +
                                "] graph was built over another ParameterCollection");
}

void Engine::check_graph(const Graph& g, const Expr& e, const char* fn) const {
  g.node_of(e, fn);
  check_params(g, fn);
}

bool Engine::covers(const Graph& g, uint32_t end) const {
  if (graph_ != &g || graph_generation_ != g.generation() || graph_cuts_ != g.cuts()) return false;
  // Within a generation (and without cuts) a graph only grows: a plan of its first nodes stays
  // theirs.
  const size_t covered = plan_.node_offset.size();
  if (covered == g.size()) return graph_version_ == g.version();
  return covered < g.size() && covered >= end && !plan_.segments.empty();
}

bool Engine::has_run(const Graph& g, uint32_t end) const {
  return covers(g, std::min(end, g.size())) && ran_segments_ == plan_.segments.size() &&
         ran_inputs_version_ == g.inputs_version();
}

void Engine::sync_counters() const {
  const ExecCounters& k = backend_->counters();
  stats_.kernels = k.kernels;
  stats_.stages = k.stages;
  stats_.bytes_copied = k.bytes_copied;
  stats_.split_call_backward = k.split_call_backward;
  stats_.packed_weights = k.packed_weights;
  stats_.arena_bytes = k.arena_bytes;
  stats_.arena_growths = k.arena_growths;
  stats_.prepared_passes = k.prepared_passes;
  stats_.device_forward_ms = k.device_forward_ms;
  stats_.device_backward_ms = k.device_backward_ms;
}

void Engine::plan_graph(Graph& g, uint32_t end) {
  end = std::min(end, g.size());
  if (covers(g, end)) return;
  if (extends_plan(g, end)) return extend_plan(g, end);  // src/core/engine_incremental.cpp
  stats_.construction_ms = g.construction_seconds() * 1e3;
  const auto t0 = Clock::now();
  Policy::Lookups lookups;
  // Only whole graphs are kept and served by the plan cache.
  const bool whole = end == g.size();
  stats_.plan_reused = whole && plan_cache_->find(g, schedule_, plan_, lookups);
  if (stats_.plan_reused) {
    ++stats_.plans_reused;
  } else {
    schedule_.clear();
    scheduler_.extend(g, *policy_, schedule_, 0, end);
    plan_.clear();
    extend_memory_plan(g, schedule_, 0, 0, plan_, plan_options_, end);
    lookups = policy_->lookups();
    if (whole) plan_cache_->offer(g, schedule_, plan_, lookups);
  }
  stats_.scheduling_ms = ms_since(t0);
  stats_.nodes = schedule_.nodes.size();
  stats_.batches = schedule_.batches.size();
  stats_.lower_bound = schedule_.lower_bound;
  stats_.policy_hits = lookups.hits;
  stats_.policy_misses = lookups.misses;
  stats_.policy_scored = lookups.scored;
  segment_bound_ = schedule_.lower_bound;
  segment_lookups_ = lookups;
  graph_ = &g;
  graph_generation_ = g.generation();
  graph_version_ = g.version();
  graph_cuts_ = g.cuts();
  ran_segments_ = 0;
  have_backward_ = false;
}

void Engine::prepare(Graph& g) {
  check_params(g, "Engine::prepare");
  plan_graph(g);
  if (g.size() > 0) backend_->prepare_forward(PlanRef{g, schedule_, plan_, params_});
}

void Engine::run_forward(Graph& g, const Expr& e, const char* fn, uint32_t end) {
  check_graph(g, e, fn);
  plan_graph(g, end);
  // Input values that device memory gives (DeviceInterop::inputs_from_device) are new inputs,
  // unless they are those of the nodes that have not run (an increment's).
  const DeviceInterop* io = backend_->device_interop();
  const size_t device_inputs = io ? io->pending_inputs_begin() : SIZE_MAX;
  const size_t unran_inputs =
      ran_segments_ < plan_.segments.size() ? plan_.segments[ran_segments_].input_begin : SIZE_MAX;
  const bool new_inputs = ran_inputs_version_ != g.inputs_version() ||
                          (device_inputs != SIZE_MAX && device_inputs < unran_inputs);
  // A forward over nodes that all ran, after the parameters changed (an update), computes them
  // again, as DyNet's forward does; an increment's new nodes alone read the new parameters (the
  // values before keep theirs, as DyNet's incremental_forward).
  const bool ran = has_run(g, end);
  const bool new_params = ran && ran_params_version_ != params_.values_version();
  if (!new_inputs && !new_params && ran) return;
  // Only the segments added since the last forward run, unless the inputs or parameters changed.
  const uint32_t first = new_inputs || new_params ? 0 : ran_segments_;
  if (++forward_passes_ == options_.fail_forward_at)
    throw std::runtime_error(std::string("[") + fn + "] forward pass " +
                             std::to_string(forward_passes_) +
                             " failed: injected (EngineOptions::fail_forward_at)");
  const auto t0 = Clock::now();
  backend_->forward(PlanRef{g, schedule_, plan_, params_, first});
  stats_.execution_ms = (first > 0 ? stats_.execution_ms : 0) + ms_since(t0);
  stats_.backward_ms = 0;
  ran_segments_ = static_cast<uint32_t>(plan_.segments.size());
  ran_inputs_version_ = g.inputs_version();
  ran_params_version_ = params_.values_version();
  have_backward_ = false;
  if (options_.check_numerics) check_forward_numerics(g, fn, first);
}

const Tensor& Engine::forward(Graph& g, const Expr& e) {
  run_forward(g, e, "Engine::forward");
  result_ = value(e);  // waits for a device
  sync_counters();
  return result_;
}

const Tensor& Engine::forward_through(Graph& g, const Expr& e) {
  run_forward(g, e, "Engine::forward_through", e.id + 1);
  result_ = value(e);
  sync_counters();
  return result_;
}

void Engine::forward_through(Graph& g, const std::vector<Expr>& es) {
  if (es.empty()) return;
  const Expr* last = &es[0];
  for (const Expr& e : es) {
    check_graph(g, e, "Engine::forward_through");
    if (e.id > last->id) last = &e;
  }
  run_forward(g, *last, "Engine::forward_through", last->id + 1);
  sync_counters();
}

uint64_t Engine::submit(Graph& g, const Expr& e) {
  run_forward(g, e, "Engine::submit");
  const Node& n = g.node(e.id);
  // A parameter is not in the arena: its result is read from the collection.
  const bool param = n.op == Op::Parameter;
  const uint64_t ticket = backend_->stage(plan_, e.id, param ? 0 : n.dim.size());
  staged_dim_[ticket % Backend::kStagedSlots] = n.dim;
  staged_param_[ticket % Backend::kStagedSlots] = param ? n.aux : UINT32_MAX;
  sync_counters();
  return ticket;
}

void Engine::enqueue(Graph& g, const Expr& e) {
  run_forward(g, e, "Engine::enqueue");
  sync_counters();
}

Tensor Engine::result(uint64_t ticket) {
  const float* data = backend_->staged(ticket);
  sync_counters();
  const size_t slot = ticket % Backend::kStagedSlots;
  if (staged_param_[slot] != UINT32_MAX) data = params_.values(staged_param_[slot]);
  return Tensor{data, staged_dim_[slot]};
}

void Engine::sgd_update(float lr) {
  backend_->sgd_update(params_, lr);
  sync_counters();
}

void Engine::optimizer_step(const UpdateRule& rule, OptimizerState& state) {
  backend_->optimizer_step(params_, rule, state);
  sync_counters();
}

void Engine::backward(Graph& g, const Expr& loss) {
  check_graph(g, loss, "Engine::backward");
  check_ran_all(g);
  const Node& n = g.node(loss.id);
  if (n.dim.size() != 1)
    throw std::invalid_argument("[Engine::backward] loss (node " + std::to_string(loss.id) +
                                ") has shape " + to_string(n.dim) + ", not a scalar");
  if (op_info(n.op).rule == BatchRule::Source)
    throw std::invalid_argument("[Engine::backward] loss (node " + std::to_string(loss.id) +
                                ") is an input or parameter, not a computed value");
  BackwardSeed seed;
  seed.loss_node = loss.id;
  run_backward(g, seed);
}

void Engine::backward(Graph& g, const std::vector<Expr>& outputs, const float* seeds,
                      bool seeds_on_device) {
  check_params(g, "Engine::backward");
  check_ran_all(g);
  seed_nodes_.clear();
  for (const Expr& e : outputs) {
    check_graph(g, e, "Engine::backward");
    seed_nodes_.push_back(e.id);
  }
  if (seeds == nullptr && !outputs.empty())
    throw std::invalid_argument("[Engine::backward] seeds is null");
  BackwardSeed seed;
  seed.nodes = &seed_nodes_;
  seed.values = seeds;
  seed.on_device = seeds_on_device;
  run_backward(g, seed);
}

void Engine::run_backward(Graph& g, BackwardSeed seed) {
  const auto t0 = Clock::now();
  // Nodes no seed depends on (a value computed only to be read, such as exp of the loss) are not
  // differentiated: their adjoint is 0, and 0 times an infinite derivative there (exp
  // overflowed, sqrt or log at 0) would put NaN into the gradients of everything they read.
  // Batches of such nodes alone are skipped; a batch that also holds needed nodes runs whole,
  // which is exact while the values of its unneeded nodes are finite.
  live_.assign(g.size(), 0);
  if (seed.nodes == nullptr)
    live_[seed.loss_node] = 1;
  else
    for (uint32_t node : *seed.nodes) live_[node] = 1;
  for (uint32_t id = g.size(); id-- > 0;) {
    if (!live_[id]) continue;
    const Node& n = g.node(id);
    const uint32_t* args = g.args(n);
    for (uint32_t k = 0; k < n.num_args; ++k) live_[args[k]] = 1;
  }
  skip_batches_.assign(schedule_.batches.size(), 0);
  bool skipping = false;
  for (size_t b = 0; b < schedule_.batches.size(); ++b) {
    const Batch& batch = schedule_.batches[b];
    bool dead = true;
    for (uint32_t k = 0; k < batch.count && dead; ++k)
      dead = !live_[schedule_.nodes[batch.begin + k]];
    skip_batches_[b] = dead;
    skipping = skipping || dead;
  }
  if (skipping) seed.skip_batches = &skip_batches_;
  // A backward changes gradients, not the values the forward read: unless they changed before
  // it, the forward's values stay current.
  const bool current = ran_params_version_ == params_.values_version();
  if (++backward_passes_ == options_.fail_backward_at)
    throw std::runtime_error("[Engine::backward] backward pass " +
                             std::to_string(backward_passes_) +
                             " failed: injected (EngineOptions::fail_backward_at)");
  backend_->backward(PlanRef{g, schedule_, plan_, params_}, seed);
  if (current) ran_params_version_ = params_.values_version();
  stats_.backward_ms = ms_since(t0);
  sync_counters();
  have_backward_ = true;
  if (options_.check_numerics) check_backward_numerics(g);
}

Tensor Engine::value(const Expr& e) const {
  check_ran(e, "Engine::value");
  const Node& n = graph_->node(e.id);
  return Tensor{values_of(n, e.id), n.dim};
}

const float* Engine::values_of(const Node& n, uint32_t id) const {
  return n.op == Op::Parameter ? params_.values(n.aux) : backend_->value(plan_, id);
}

void Engine::fetch(const std::vector<Expr>& es) const {
  fetch_checked(es, "Engine::fetch");
}

void Engine::fetch_checked(const std::vector<Expr>& es, const char* fn) const {
  fetch_nodes_.clear();
  for (const Expr& e : es) {
    check_ran(e, fn);
    if (graph_->node(e.id).op != Op::Parameter) fetch_nodes_.push_back(e.id);
  }
  if (!fetch_nodes_.empty()) backend_->fetch(plan_, fetch_nodes_);
}

void Engine::read(const std::vector<Expr>& es, size_t group, float* const* outs) const {
  if (group == 0 ? !es.empty() : es.size() % group != 0)
    throw std::invalid_argument("[Engine::read] " + std::to_string(es.size()) +
                                " expressions are not groups of " + std::to_string(group));
  fetch_checked(es, "Engine::read");
  for (size_t i = 0, k = 0; i < es.size(); ++k) {
    float* out = outs[k];
    for (const size_t end = i + group; i < end; ++i) {
      const Node& n = graph_->node(es[i].id);
      const size_t size = n.dim.size();
      std::memcpy(out, values_of(n, es[i].id), sizeof(float) * size);
      out += size;
    }
  }
}

Tensor Engine::gradient(const Expr& e) const {
  if (!have_backward_) throw std::invalid_argument("[Engine::gradient] run backward() first");
  if (e.graph != graph_ || e.generation != graph_generation_)
    throw std::invalid_argument("[Engine::gradient] expression is not from the last graph");
  graph_->node_of(e, "Engine::gradient");
  const Node& n = graph_->node(e.id);
  if (n.op == Op::Parameter) return Tensor{params_.grads(n.aux), n.dim};
  // A node added since, or inputs rewritten since: the backward did not see it.
  check_ran(e, "Engine::gradient");
  return Tensor{backend_->adjoint(plan_, e.id), n.dim};
}

}  // namespace edbatch
