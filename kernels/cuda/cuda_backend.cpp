// The CUDA backend: one stream, a device arena of values and one of adjoints reused across
// passes, device mirrors of the parameters (uploaded when the collection's version changes,
// gradients downloaded after backward so host code reads them as before), and passes that are
// encoded on the host, uploaded in one copy from pinned staging, then launched. CudaBackend
// coordinates the parts of backend_parts.h; each owns one of these concerns.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "edbatch/params.h"
#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"
#include "src/core/backends.h"

namespace edbatch::cuda {

namespace {

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options)
      : options_(options.cuda),
        queue_(counters_),
        params_(queue_),
        uploads_(queue_),
        staged_(queue_),
        profiler_(options_.profile),
        launcher_(queue_, profiler_, options_, arenas_, counters_),
        interop_(queue_, params_, uploads_, arenas_),
        optim_(queue_, params_, uploads_) {}

  ~CudaBackend() override {
    // Leave the host copies current when the device holds newer parameters or gradients.
    try {
      optim_.release();
      params_.fetch_if_pending();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
    if (options_.profile) print_profile();
    // Destroying the cuBLAS handle waits for the device, so nothing the parts free below is
    // still in use by queued work.
    queue_.release_blas();
  }

  const char* name() const override { return "cuda"; }

  void forward(const PlanRef& p) override {
    std::optional<Profiler::Phase> phase(std::in_place, profiler_, "(host: forward, parameters)");
    params_.sync(p.params);
    phase.emplace(profiler_, "(host: forward, arena)");
    const uint32_t first_batch = first_forward_batch(p);
    if (p.first_segment > 0 && arenas_.graph != &p.graph)
      throw std::invalid_argument("[cuda] incremental forward: the earlier segments ran elsewhere");
    grow_values(p);
    arenas_.graph = &p.graph;
    arenas_.total_floats = p.plan.total_floats;
    if (p.first_segment > 0)
      values_mirror_.extend(arenas_.total_floats, p.plan.segments[p.first_segment].input_offset);
    else
      values_mirror_.reset(arenas_.total_floats);
    adjoints_mirror_.fetched.assign(0, 0);
    phase.reset();
    Pass pass = new_pass(p, true);
    pass.first_batch = first_batch;
    const bool prepared = take_prepared(p, pass);
    if (!prepared) encode_forward(pass, launches_);
    // The pass's device time starts when its upload has been copied.
    DeviceQueue::Timing& timing = queue_.next_timing(true, p.first_segment > 0);
    {
      Profiler::Phase uploading(profiler_, "(host: forward, uploading)");
      uploads_.forward(p, pass, launches_, arenas_, params_.mirror(), timing.start,
                       prepared ? &prepared_.upload : nullptr);
      arenas_.values_zero_from = p.plan.total_floats;
    }
    launcher_.run_pass(pass, "forward", launches_, uploads_.addresses(), timing);
  }

  void prepare_forward(const PlanRef& p) override {
    prepared_.valid = false;
    if (p.first_segment > 0 || !options_.prepare_ahead) return;  // increments: when they run
    params_.sync(p.params);  // lays out the parameters' device copies on first use
    grow_values(p);
    Pass& pass = prepared_.pass;
    pass = new_pass(p, true);
    pass.first_batch = first_forward_batch(p);
    encode_forward(pass, prepared_.launches);
    prepared_.upload = uploads_.prepare_forward(p, pass, prepared_.launches, params_.mirror());
    pass.p = nullptr;  // p is the caller's; forward's takes its place
    prepared_.graph = &p.graph;
    prepared_.generation = p.graph.generation();
    prepared_.version = p.graph.version();
    prepared_.plan = &p.plan;
    prepared_.total_floats = p.plan.total_floats;
    prepared_.valid = true;
  }

  void backward(const PlanRef& p, const BackwardSeed& seed) override {
    if (arenas_.graph != &p.graph || arenas_.total_floats != p.plan.total_floats)
      throw std::invalid_argument("[cuda] backward: run forward on this plan first");
    // Backward reads the parameters as they are now, as on the CPU (they may have changed since
    // forward, e.g. a seed written between the two).
    params_.sync(p.params);
    if (arenas_.adjoints.reserve(std::max<size_t>(p.plan.total_floats, 1) * sizeof(float),
                                 queue_.stream()))
      ++counters_.arena_growths;
    params_.upload_grads_if_changed(p.params);
    adjoints_mirror_.reset(arenas_.total_floats);
    Pass pass = new_pass(p, false);
    pass.skip_batches = seed.skip_batches;
    {
      Profiler::Phase encoding(profiler_, "(host: backward, encoding)");
      encode(pass);
    }
    {
      Profiler::Phase planning(profiler_, "(host: backward, launch plan)");
      launches_.plan(pass, options_);
    }
    DeviceQueue::Timing& timing = queue_.next_timing(false, false);
    uploads_.backward(p.plan, pass, launches_, timing.start);
    EDBATCH_CUDA_CHECK(cudaMemsetAsync(arenas_.adjoints.as(), 0,
                                       p.plan.total_floats * sizeof(float), queue_.stream()));
    if (seed.nodes == nullptr)
      launch_fill(arenas_.adjoints.as() + p.plan.node_offset[seed.loss_node], 1, 1.0f,
                  queue_.stream());
    else
      interop_.add_seeds(p, seed);
    uploads_.set_adjoints(arenas_.adjoints.as());
    launcher_.run_pass(pass, "backward", launches_, uploads_.addresses(), timing);
    // The gradients stay on the device; host code that reads them fetches them first.
    params_.device_wrote(p.params, false, true);
  }

  const float* value(const MemoryPlan& plan, uint32_t node) const override {
    {
      Profiler::Phase waiting(self().profiler_, "(host: value, waiting)");
      self().queue_.wait();
    }
    Profiler::Phase reading(self().profiler_, "(host: value, reading)");
    return values_mirror_.read(arenas_.values.as(), plan.node_offset[node],
                               arenas_.graph->node(node).dim.size(), arenas_.total_floats,
                               self().queue_.stream());
  }
  void fetch(const MemoryPlan& plan, const std::vector<uint32_t>& nodes) const override {
    Profiler::Phase fetching(self().profiler_, "(host: fetch, waiting and reading)");
    // The span the nodes cover where they fill at least half of it; else each node's range.
    size_t begin = SIZE_MAX, end = 0, floats = 0;
    fetch_ranges_.clear();
    for (uint32_t node : nodes) {
      const size_t at = plan.node_offset[node], size = arenas_.graph->node(node).dim.size();
      begin = std::min(begin, at);
      end = std::max(end, at + size);
      floats += size;
      fetch_ranges_.emplace_back(at, at + size);
    }
    if (2 * floats >= end - begin) fetch_ranges_.assign(1, {begin, end});
    // The copies queue behind the pass, and one wait covers both.
    DeviceQueue& queue = self().queue_;
    values_mirror_.fetch(arenas_.values.as(), fetch_ranges_, arenas_.total_floats, queue.stream(),
                         [&queue] {
                           queue.mark_queued();
                           queue.wait();
                         });
  }
  const float* adjoint(const MemoryPlan& plan, uint32_t node) const override {
    self().queue_.wait();
    return adjoints_mirror_.read(arenas_.adjoints.as(), plan.node_offset[node],
                                 arenas_.graph->node(node).dim.size(), arenas_.total_floats,
                                 self().queue_.stream());
  }
  const float* arena(const MemoryPlan&, uint32_t offset, uint32_t floats,
                     bool adjoints) const override {
    self().queue_.wait();
    const cudaStream_t s = self().queue_.stream();
    return adjoints
               ? adjoints_mirror_.read(arenas_.adjoints.as(), offset, floats, arenas_.total_floats,
                                       s)
               : values_mirror_.read(arenas_.values.as(), offset, floats, arenas_.total_floats, s);
  }

  uint64_t stage(const MemoryPlan& plan, uint32_t node, uint32_t floats) override {
    const uint64_t ticket = next_ticket_++;
    staged_.copy(ticket, floats > 0 ? arenas_.values.as() + plan.node_offset[node] : nullptr,
                 floats);
    return ticket;
  }

  const float* staged(uint64_t ticket) override {
    check_ticket(ticket);
    return staged_.host(ticket);
  }

  void sgd_update(ParameterCollection& pc, float lr) override {
    params_.sync(pc);
    params_.upload_grads_if_changed(pc);
    const ParamMirror& m = params_.mirror();
    launch_sgd(m.values.as(), m.grads.as(), m.floats, lr, queue_.stream());
    EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
    queue_.note_queued("sgd update", "the SGD update kernel");
    queue_.mark_queued();
    params_.device_updated(pc);
  }

  void optimizer_step(ParameterCollection& pc, const UpdateRule& rule,
                      OptimizerState& state) override {
    optim_.step(pc, rule, state);
  }

  BatchReads wants_batch_reads() const override {
    switch (options_.stage_waits) {
      case CudaOptions::StageWaits::InOrder:
        return BatchReads::None;
      case CudaOptions::StageWaits::Auto:
        return BatchReads::WholeGraphs;
      case CudaOptions::StageWaits::Always:
        break;
    }
    return BatchReads::Always;
  }
  void synchronize() override { queue_.wait(); }
  DeviceInterop* device_interop() override { return &interop_; }

 private:
  CudaBackend& self() const { return const_cast<CudaBackend&>(*this); }

  // Encodes a forward pass and makes its launch plan into `launches` (forward's own, or the
  // plan kept with a prepared pass).
  void encode_forward(Pass& pass, LaunchPlan& launches) {
    {
      Profiler::Phase encoding(profiler_, "(host: forward, encoding)");
      encode(pass);
    }
    Profiler::Phase planning(profiler_, "(host: forward, launch plan)");
    launches.plan(pass, options_);
  }

  Pass new_pass(const PlanRef& p, bool forward) {
    const ParamMirror& m = params_.mirror();
    Pass pass;
    pass.p = &p;
    pass.forward = forward;
    pass.values = arenas_.values.as();
    pass.adjoints = arenas_.adjoints.as();
    pass.params = m.values.as();
    pass.grads = m.grads.as();
    pass.param_offset = m.offset.data();
    pass.fused_linear = options_.fused_linear;
    pass.pointwise_runs = options_.pointwise_runs;
    pass.linear_min_blocks =
        options_.linear_min_blocks ? options_.linear_min_blocks : queue_.multiprocessors();
    return pass;
  }

  // The values arena at least p's plan large. An incremental forward keeps the values of the
  // segments before it.
  void grow_values(const PlanRef& p) {
    const size_t keep = p.first_segment > 0 ? arenas_.total_floats * sizeof(float) : 0;
    if (arenas_.values.grow_keeping(std::max<size_t>(p.plan.total_floats, 1) * sizeof(float), keep,
                                    queue_.stream())) {
      ++counters_.arena_growths;
      arenas_.values_zero_from = arenas_.values.bytes() / sizeof(float);  // fresh memory
    }
  }

  // The pass prepare_forward encoded for p, if it is p's (same graph, unchanged, same plan) and
  // every address it holds is still `fresh`'s (new_pass for p now) and the arenas': `fresh`
  // becomes it and its launch plan launches_. The prepared pass is used once either way.
  bool take_prepared(const PlanRef& p, Pass& fresh) {
    if (!prepared_.valid) return false;
    prepared_.valid = false;
    const Pass& q = prepared_.pass;
    const bool same =
        p.first_segment == 0 && prepared_.graph == &p.graph &&
        prepared_.generation == p.graph.generation() && prepared_.version == p.graph.version() &&
        prepared_.plan == &p.plan && prepared_.total_floats == p.plan.total_floats &&
        q.first_batch == fresh.first_batch && q.values == fresh.values &&
        q.adjoints == fresh.adjoints && q.params == fresh.params && q.grads == fresh.grads &&
        q.param_offset == fresh.param_offset && q.scratch == arenas_.scratch.as() &&
        q.scratch_floats == arenas_.scratch.bytes() / sizeof(float);
    if (!same) return false;
    fresh = std::move(prepared_.pass);
    fresh.p = &p;
    std::swap(launches_, prepared_.launches);
    ++counters_.prepared_passes;
    return true;
  }

  // Encodes, growing scratch and encoding again when it was too small.
  void encode(Pass& pass) {
    DeviceBuffer& scratch = arenas_.scratch;
    for (;;) {
      pass.scratch = scratch.as();
      pass.scratch_floats = scratch.bytes() / sizeof(float);
      encode_pass(pass);
      if (pass.scratch_need <= pass.scratch_floats) return;
      scratch.reserve(pass.scratch_need * sizeof(float), queue_.stream());
      ++counters_.arena_growths;
    }
  }

  void print_profile() const {
    const ParamMirror& m = params_.mirror();
    profiler_.print({{"values", arenas_.values.grow_ms()},
                     {"adjoints", arenas_.adjoints.grow_ms()},
                     {"scratch", arenas_.scratch.grow_ms()},
                     {"metadata", uploads_.metadata_grow_ms()},
                     {"staging (pinned)", uploads_.staging_grow_ms()},
                     {"parameters", m.values.grow_ms() + m.grads.grow_ms() + m.staging.grow_ms()}});
  }

  CudaOptions options_;
  DeviceQueue queue_;  // first: checks for a device and creates the stream the others use
  Arenas arenas_;
  ParamSync params_;
  Uploads uploads_;
  StagedCopies staged_;
  LaunchPlan launches_;
  // A forward pass encoded ahead (prepare_forward) with its launch plan, for one graph version.
  struct Prepared {
    bool valid = false;
    const Graph* graph = nullptr;
    uint32_t generation = 0;
    uint64_t version = 0;
    const MemoryPlan* plan = nullptr;
    size_t total_floats = 0;
    Pass pass;
    LaunchPlan launches;
    Uploads::PreparedUpload upload;  // its upload, in the forward staging ring's next buffer
  } prepared_;
  Profiler profiler_;
  Launcher launcher_;
  CudaInterop interop_;
  OptimizerSync optim_;
  mutable HostMirror values_mirror_, adjoints_mirror_;
  mutable std::vector<std::pair<size_t, size_t>> fetch_ranges_;
};

}  // namespace

}  // namespace edbatch::cuda

namespace edbatch {

std::string cuda_unavailable() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
  if (devices == 0) return "no CUDA device";
  return "";
}

bool cuda_built() { return true; }

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace edbatch
