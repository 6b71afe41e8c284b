// Internal to the CUDA backend: the parts CudaBackend (cuda_backend.cpp) owns and coordinates,
// one concern each. Every part queues its work on the one DeviceQueue, so work stays in order.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "edbatch/backend.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/optim.h"
#include "edbatch/params.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"

namespace edbatch {
struct BlockPlan;
}  // namespace edbatch

namespace edbatch::cuda {

inline size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The value and adjoint arenas (of the graph of the last forward pass), and the scratch its GEMM
// commands use. Grow-only, reused across passes.
struct Arenas {
  DeviceBuffer values, adjoints, scratch;
  const Graph* graph = nullptr;
  size_t total_floats = 0;
  // values holds zeros from here to its end (fused GEMMs accumulate into zeroed outputs): a
  // forward zeroes from its first segment up to here, and after it this is the plan's end, so an
  // increment that follows queues no memset.
  size_t values_zero_from = 0;
};

// A command's name in error messages: "kernel 'WHAT' of the PASS pass (batch N)" (launcher.cpp).
std::string describe_kernel(const char* what, uint32_t batch, const char* pass);

// ---- device_queue.cpp ----

// The stream every part queues work on (the backend's own, or a caller's: DeviceInterop), the
// cuBLAS handle bound to it, and the waits: an asynchronous error surfaces at a wait as an
// exception naming the passes queued since the last one. Also the device time of each pass.
class DeviceQueue {
 public:
  // Throws when there is no device; warms cuBLAS up.
  explicit DeviceQueue(ExecCounters& counters);
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;
  ~DeviceQueue();

  cudaStream_t stream() const { return stream_; }
  cudaStream_t own_stream() const { return own_stream_; }
  cublasHandle_t blas() const { return blas_; }
  uint32_t multiprocessors() const { return multiprocessors_; }
  // Queues all further work on `next`, after everything queued on the current stream.
  void switch_to(cudaStream_t next);
  // Work was queued that the next wait must cover (interop copies count too).
  void mark_queued() { queued_work_ = true; }
  // Completed waits for the whole stream (wait()): work queued before a wait that has since
  // completed is done, with no event to query.
  uint64_t syncs() const { return syncs_; }
  // Names queued work for an asynchronous error: `name` and a fixed description of its kernels
  // (both static strings).
  void note_queued(const char* name, const char* kernels);
  // ... or a pass of `commands`, described by its first and last command only when an error
  // needs the message (a decoding step queues a pass every few tens of microseconds).
  void note_pass(const char* name, const std::vector<Command>& commands, bool chained);
  // Waits for all queued work. An asynchronous error becomes an exception naming the passes
  // queued since the last wait and their kernel ranges.
  void wait();
  void wait_event(cudaEvent_t ev);
  // Whether the work before `ev` has finished, by one query (a staging slot's copy is most often
  // long done when the slot comes round); an asynchronous error throws as wait() does.
  bool done(cudaEvent_t ev);

  // Events around one queued pass, for its device time (read once it has finished). An
  // increment of a forward (`adds`) adds its time to that of the forward it continues.
  struct Timing {
    cudaEvent_t start = nullptr, stop = nullptr;
    bool forward = true, adds = false, queued = false;
  };
  // The next pair of the ring, once the pass it last timed has finished.
  Timing& next_timing(bool forward, bool adds);

  // Destroys the cuBLAS handle now; cublasDestroy waits for the whole device.
  void release_blas();

 private:
  void warm_up_cublas();
  void check_async(cudaError_t e);
  // all_done: the stream was just synchronised, so every pass queued on it (or on a stream it
  // switched from, which it waits for) has finished and no event needs a query.
  void collect_timings(bool all_done = false);
  // Adds a finished pass's device time to the counters.
  void add_time(Timing& t);

  ExecCounters& counters_;
  uint32_t multiprocessors_ = 1;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;  // own_stream_, or a caller's (DeviceInterop::use_stream)
  cudaEvent_t switch_ = nullptr;   // orders work across a stream switch
  cublasHandle_t blas_ = nullptr;
  std::array<Timing, 16> timings_;
  size_t next_timing_ = 0;
  // Work queued since the last wait, for asynchronous errors: the latest kQueuedKept.
  struct Queued {
    const char* name = nullptr;
    const char* kernels = nullptr;  // a fixed description, or null: the pass's commands below
    const char *first = nullptr, *last = nullptr;  // Command::what; null: no kernel
    uint32_t first_batch = 0, last_batch = 0;
    bool chained = false;
    std::string where() const;
  };
  static constexpr size_t kQueuedKept = 8;
  std::array<Queued, kQueuedKept> queued_{};
  size_t queued_count_ = 0;   // noted since the last wait (the ring holds the latest)
  bool queued_work_ = false;  // work queued since the last wait
  uint64_t syncs_ = 0;
};

// ---- param_mirror.cpp ----

// The device copy of the collection in use and which side is newer: values are uploaded when
// the collection's version moves; what the device changed is fetched when host code reads it.
class ParamSync {
 public:
  explicit ParamSync(DeviceQueue& queue) : queue_(queue) {}
  ParamMirror& mirror() { return mirror_; }
  const ParamMirror& mirror() const { return mirror_; }
  // Lays out and uploads the values when the collection changed since the last upload.
  void sync(ParameterCollection& pc);
  void upload_grads_if_changed(ParameterCollection& pc);
  // The device wrote values and/or gradients: host reads fetch them first.
  void device_wrote(ParameterCollection& pc, bool values, bool grads);
  // Backend::sgd_update ran on the device: both are newer there, at the collection's version.
  void device_updated(ParameterCollection& pc);
  // Leaves the host copies current if a fetch of ours is pending (at destruction).
  void fetch_if_pending();

 private:
  void fetch();

  DeviceQueue& queue_;
  ParamMirror mirror_;
  ParameterCollection* pc_ = nullptr;  // the collection mirrored (set at each pass)
  bool values_newer_ = false, grads_newer_ = false;  // the device's copies are ahead of the host
};

// ---- optim_sync.cpp ----

class Uploads;

// Optimizer steps on the device (Backend::optimizer_step): each optimizer state's slots in device
// buffers laid out as the parameter mirror, uploaded when the state's version moves (or the
// mirror's layout did), fetched back when host code reads them (OptimizerState's fetch).
class OptimizerSync {
 public:
  OptimizerSync(DeviceQueue& queue, ParamSync& params, Uploads& uploads)
      : queue_(queue), params_(params), uploads_(uploads) {}
  OptimizerSync(const OptimizerSync&) = delete;
  OptimizerSync& operator=(const OptimizerSync&) = delete;
  ~OptimizerSync() { release(); }
  void step(ParameterCollection& pc, const UpdateRule& rule, OptimizerState& state);
  // Leaves every state's host copy current and detaches from them (at destruction).
  void release();

 private:
  struct Slots {
    OptimizerState* state = nullptr;
    DeviceBuffer buffers[2];
    std::vector<uint32_t> offset;  // the mirror layout the slots use, per parameter id
    size_t floats = 0;
    uint32_t slots = 0;
    uint64_t version = UINT64_MAX;  // the state's version the device copy started from
  };
  Slots& record(OptimizerState& state);
  void upload(Slots& s, const ParamMirror& m, uint32_t slots);
  void fetch(uint64_t serial);
  void segments(const ParameterCollection& pc, const ParamMirror& m, const UpdateRule& rule);

  DeviceQueue& queue_;
  ParamSync& params_;
  Uploads& uploads_;
  std::map<uint64_t, std::unique_ptr<Slots>> states_;  // by OptimizerState::serial
  PinnedBuffer staging_;
  DeviceBuffer norm_;  // the squared gradient norm, for clipping
  std::vector<UpdateSegment> segments_;
};

// ---- staging.cpp ----

// Device addresses of a pass's uploaded data, which its launches read.
struct PassAddresses {
  DeviceView view;
  const float* const* ptrs = nullptr;
  const StepDesc* lookups = nullptr;  // the pass's hoisted lookups
  const uint32_t* lookup_starts = nullptr;
  uint32_t lookup_blocks = 0;
  const StepGroup* groups = nullptr;  // chained launches only, like the rest
  const LinearDesc* linears = nullptr;
  const Stage* stages = nullptr;
  const uint16_t* stage_of = nullptr;
  const uint32_t* waits = nullptr;
  uint32_t* counters = nullptr;
};

struct LaunchPlan;

// Uploads through pinned staging rings: a pass's metadata in one copy (and the forward pass's
// inputs), and the interop's small descriptor uploads.
class Uploads {
 public:
  struct PlanAt {  // byte offsets of the plan's arrays in an upload
    size_t operands = 0, members = 0, index = 0, aux = 0;
  };
  // A forward pass's upload: parameter offsets at 0, the plan's arrays, the pass's data at ptrs,
  // the input values from the graph's input first_input on at inputs, the end.
  struct ForwardUpload {
    PlanAt plan;
    size_t ptrs = 0, inputs = 0, end = 0, first_input = 0;
  };
  // What prepare_forward wrote into the forward ring's next buffer: the upload's layout, with
  // the graph's input values as they were at `inputs_version`.
  struct PreparedUpload {
    ForwardUpload u;
    uint64_t inputs_version = 0;
  };

  explicit Uploads(DeviceQueue& queue) : queue_(queue) {}
  // One copy: the plan's operand metadata (an incremental forward: its segments' entries), the
  // parameter offsets, the pass's GEMM pointer arrays and the graph's input values; then the
  // inputs move to their place in the arena. `start` (the pass's timing event) is recorded right
  // after the copy and tells when its staging buffer is free again: one event for both.
  // `prepared` (or null): the pass is the one prepare_forward was given last, with no forward
  // between, and this is what it wrote. It is copied as it is, unless the graph's input values
  // changed since.
  void forward(const PlanRef& p, const Pass& pass, const LaunchPlan& launches, const Arenas& arenas,
               const ParamMirror& params, cudaEvent_t start, const PreparedUpload* prepared);
  // Engine::prepare's forward pass (a whole graph): writes its upload into the forward ring's
  // next buffer ahead, for forward() to copy, so that host work leaves the forward's path.
  PreparedUpload prepare_forward(const PlanRef& p, const Pass& pass, const LaunchPlan& launches,
                                 const ParamMirror& params);
  // The backward pass's own data (the plan's metadata is the forward's, unless that forward
  // was an increment: then the whole plan's goes up too); `start` as for forward.
  void backward(const MemoryPlan& plan, const Pass& pass, const LaunchPlan& launches,
                cudaEvent_t start);
  const PassAddresses& addresses() const { return at_; }
  void set_adjoints(float* adjoints) { at_.view.adjoints = adjoints; }

  // DeviceInterop::inputs_from_device: the next forward takes input values [first_input,
  // first_input + floats) from `src`.
  void inputs_from_device(const float* src, size_t floats, size_t first_input) {
    device_inputs_ = src;
    device_input_floats_ = floats;
    device_input_first_ = first_input;
  }
  size_t pending_inputs_begin() const { return device_inputs_ ? device_input_first_ : SIZE_MAX; }
  // The interop ring's next buffer, then its upload; returns the bytes' device address.
  PinnedBuffer& interop_staging(size_t bytes) { return acquire(interop_staging_, bytes); }
  const char* upload_interop(const char* h, size_t bytes);

  double staging_grow_ms() const;
  double metadata_grow_ms() const { return forward_meta_.grow_ms() + backward_meta_.grow_ms(); }

 private:
  ForwardUpload forward_layout(const PlanRef& p, const Pass& pass, const LaunchPlan& launches,
                               const ParamMirror& params) const;
  void put_forward(char* h, const ForwardUpload& u, const PlanRef& p, const Pass& pass,
                   const LaunchPlan& launches, const ParamMirror& params, size_t skip_begin,
                   size_t skip_end) const;
  std::pair<size_t, size_t> device_input_range(const PlanRef& p);
  static size_t put_plan(char* h, size_t at, const MemoryPlan& plan, const PlanSegment& from,
                         PlanAt& w);
  void view_plan(const char* d, const PlanAt& w, const PlanSegment& from);
  PinnedBuffer& acquire(StagingRing& ring, size_t bytes);
  // Records `done` (the ring's own event when null) after the copy from the ring's current
  // buffer, and moves to the next buffer.
  void release(StagingRing& ring, cudaEvent_t done = nullptr);
  size_t put_pass(char* h, size_t at, const Pass& pass, const LaunchPlan& launches) const;
  void pass_data_at(char* d, size_t at, const Pass& pass, const LaunchPlan& launches);

  DeviceQueue& queue_;
  StagingRing forward_staging_, backward_staging_, interop_staging_;
  DeviceBuffer forward_meta_, backward_meta_, interop_meta_;
  const float* device_inputs_ = nullptr;  // DeviceInterop::inputs_from_device, for the next forward
  size_t device_input_floats_ = 0, device_input_first_ = 0;
  PassAddresses at_;
  bool plan_partial_ = false;  // at_.view holds only the last increment's plan metadata
};

// Values copied out by Backend::stage, one pinned slot per ticket modulo kStagedSlots.
class StagedCopies {
 public:
  explicit StagedCopies(DeviceQueue& queue);
  StagedCopies(const StagedCopies&) = delete;
  StagedCopies& operator=(const StagedCopies&) = delete;
  ~StagedCopies();
  // Queues a copy of `floats` floats from device `src` into the ticket's slot.
  void copy(uint64_t ticket, const float* src, uint32_t floats);
  // The ticket's host copy, once it is done.
  const float* host(uint64_t ticket);

 private:
  struct Slot {
    PinnedBuffer host;
    cudaEvent_t copied = nullptr;
    bool queued = false;
  };
  DeviceQueue& queue_;
  Slot slots_[Backend::kStagedSlots];
};

// ---- launch_plan.cpp ----

// A pass's commands as launches: each run of two or more commands that can be chained becomes one
// chained launch (CudaOptions::chain, not with sync_each_launch); every other command is a launch
// of its own.
struct LaunchPlan {
  std::vector<Launch> launches;
  std::vector<Stage> stages;       // every chained launch's stages
  std::vector<uint16_t> stage_of;  // per ticket of each chained launch: its stage
  std::vector<uint32_t> waits;     // pairs (stage, its thread blocks) each stage waits for
  std::vector<uint32_t> stage_command;  // per stage: the command it runs
  uint32_t counters_floats = 0;

  void plan(const Pass& pass, const CudaOptions& options);

 private:
  // Each stage waits for the stage before it (CudaOptions::stage_waits).
  void wait_in_order();
  // Each stage waits only for the stages that write what it reads, less those it is known to
  // follow already. Forward: the earlier stages of its batch or block group, those of the
  // batches and groups producing its arguments, the pass's lookups. Backward (every write is
  // an atomic addition): the stages adding into the adjoints of its outputs, those of the
  // groups and batches that read them; the lookups' table gradients wait for every stage.
  void wait_for_producers(const Pass& pass);
  // Per batch of the pass: the (batch, group) pairs it reads, producers_ by producer_begin_;
  // backward also the reverse, consumers_ by consumer_begin_.
  void collect_producers(const Pass& pass);
  // Each stage's waits from those lists, in launch order.
  void choose_waits(const Pass& pass);

  // A block's groups: which groups each reads, which read the call's inputs, each output's.
  struct BlockDeps {
    const BlockPlan* plan = nullptr;
    std::vector<uint32_t> group_of;         // per body node: its group, or kNoOperand
    std::vector<uint32_t> dep_begin, deps;  // per group: the groups it reads (CSR)
    std::vector<uint32_t> rdep_begin, rdeps;  // per group: the groups that read it (CSR)
    std::vector<uint8_t> reads_inputs;      // per group
    std::vector<uint32_t> output_group;     // per output: its group, or kNoOperand
  };
  const BlockDeps& block_deps(const BlockPlan& bp);
  // The stage producer entry (batch, group) finished last so far (group kNoOperand: the whole
  // batch) added to candidates_, if it is in launch l before stage s.
  void add_producer(const Launch& l, uint32_t s, uint32_t batch, uint32_t group);
  // Stage t as a candidate for stage s to wait for (once), if it is in launch l before s.
  void candidate(const Launch& l, uint32_t s, uint32_t t);
  // Backward: readers_ = pairs (group of `batch` read or kNoOperand, stage) of the latest stages
  // of the batches reading `batch` that add into its outputs' adjoints.
  void readers_of(uint32_t batch);

  std::vector<uint32_t> command_stage_;    // per command: its stage in the pass, or UINT32_MAX
  std::vector<uint32_t> last_stage_;       // per batch: its latest stage so far, or UINT32_MAX
  std::vector<const BlockDeps*> call_of_;  // per batch: its block's groups (call batches)
  std::vector<uint32_t> group_base_, group_stage_;  // call batches: latest stage per group
  std::vector<uint32_t> producers_;                 // pairs (batch, group) each batch reads
  std::vector<uint32_t> producer_begin_;
  std::vector<uint32_t> seen_;    // per batch: the batch whose producers last met it
  std::vector<uint32_t> cursor_;  // fill positions while grouping pairs by batch
  std::vector<uint32_t> consumer_begin_, consumers_;  // backward: pairs (batch, group) per batch
  std::vector<uint32_t> readers_;
  std::vector<uint64_t> seen_mask_;
  uint32_t readers_batch_ = UINT32_MAX;
  std::deque<BlockDeps> blocks_;  // deque: call_of_ keeps pointers into it
  size_t blocks_used_ = 0;
  std::vector<int64_t> prefix_;  // per stage: every stage up to this one has finished
  std::vector<uint64_t> known_;  // per stage: bit j, stage s - 1 - j has finished
  std::vector<uint32_t> depth_;
  std::vector<uint64_t> candidates_;  // the current stage's candidates, a bit per stage
  uint32_t candidate_low_ = UINT32_MAX, candidate_high_ = 0;  // ... the lowest and highest set
};

// ---- profile.cpp ----

// CudaOptions::profile: events around every launch; the totals by kernel go to stderr when the
// backend is destroyed.
class Profiler {
 public:
  // An enabled profiler whose backend is still alive when the process exits (the PyTorch
  // adapter keeps its engines) prints its table then.
  explicit Profiler(bool enabled);
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  ~Profiler();
  bool enabled() const { return enabled_; }
  // At least `n` events.
  void reserve_events(size_t n);
  cudaEvent_t event(size_t i) const { return events_[i]; }
  // Adds a finished pass: each launch's device time, the host enqueue time and the device span,
  // and each chained stage's time by the command it runs (stage_times, read back).
  void add_pass(const Pass& pass, const LaunchPlan& plan, double host_ms, float device_ms);
  // Device memory for the stage times of a pass of `stages` stages (Chain::times), zeroed on
  // `stream`.
  unsigned long long* stage_times(size_t stages, cudaStream_t stream);
  // The time each kind of buffer spent growing, then the totals by kernel and host phase.
  void print(const std::vector<std::pair<const char*, double>>& growth) const;

  // Host time of one phase of the backend's work (encoding a pass, uploading it, waiting for
  // the device, reading values back), added to its total when the scope ends.
  class Phase {
   public:
    Phase(Profiler& p, const char* what)
        : p_(p),
          what_(what),
          t0_(p.enabled_ ? std::chrono::steady_clock::now()
                         : std::chrono::steady_clock::time_point{}) {}
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;
    ~Phase() {
      if (!p_.enabled_) return;
      Profile& total = p_.profiles_[what_];
      total.count += 1;
      total.ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    }

   private:
    Profiler& p_;
    const char* what_;
    std::chrono::steady_clock::time_point t0_;
  };

 private:
  struct Profile {
    uint64_t count = 0;
    double ms = 0;
  };
  bool enabled_ = false;
  std::vector<cudaEvent_t> events_;
  std::map<std::string, Profile> profiles_;
  unsigned long long* times_ = nullptr;  // stage_times
  size_t times_size_ = 0;
  std::vector<unsigned long long> host_times_;
};

// ---- launcher.cpp ----

// Queues a planned pass's launches and counts them. A launch error names the kernel and batch
// (with sync_each_launch, an asynchronous one too).
class Launcher {
 public:
  Launcher(DeviceQueue& queue, Profiler& profiler, const CudaOptions& options,
           const Arenas& arenas, ExecCounters& counters)
      : queue_(queue), profiler_(profiler), options_(options), arenas_(arenas),
        counters_(counters) {}
  // Queues the pass's launches; waits only in the debugging modes (sync after every kernel,
  // profile).
  void run_pass(Pass& pass, const char* name, const LaunchPlan& launches, const PassAddresses& at,
                DeviceQueue::Timing& timing);

 private:
  void launch(const Command& c, const PassAddresses& at);
  const LinearDesc* second_linear(const Command& c) const;

  DeviceQueue& queue_;
  Profiler& profiler_;
  const CudaOptions& options_;
  const Arenas& arenas_;
  ExecCounters& counters_;
  std::vector<StepGroup> groups_;  // the pass being launched
  std::vector<LinearDesc> linears_;
  bool forward_ = true;
};

// ---- interop.cpp ----

// DeviceInterop on the backend's parts: a caller's device memory to and from the parameter
// mirror and the arenas, queued on the queue's stream in order with the passes.
class CudaInterop : public DeviceInterop {
 public:
  CudaInterop(DeviceQueue& queue, ParamSync& params, Uploads& uploads, const Arenas& arenas)
      : queue_(queue), params_(params), uploads_(uploads), arenas_(arenas) {}

  void use_stream(void* stream) override;
  void use_own_stream() override;
  void write_parameter(ParameterCollection& pc, uint32_t id, const float* src, size_t offset,
                       size_t floats, bool row_major) override;
  void read_gradient(ParameterCollection& pc, uint32_t id, float* dst, bool row_major) override;
  void write_parameters(ParameterCollection& pc, const std::vector<Transfer>& t) override;
  void read_gradients(ParameterCollection& pc, const std::vector<Transfer>& t) override;
  void zero_gradients(ParameterCollection& pc) override;
  void inputs_from_device(const float* src, size_t floats, size_t first_input) override;
  size_t pending_inputs_begin() const override { return uploads_.pending_inputs_begin(); }
  void read_nodes(const Graph& g, const MemoryPlan& plan, const std::vector<uint32_t>& nodes,
                  float* dst, bool adjoints) override;

  // Adds the seeds of a backward from given adjoints (BackwardSeed::nodes) into the arena's
  // adjoints and the gradients of parameter nodes.
  void add_seeds(const PlanRef& p, const BackwardSeed& seed);

 private:
  void transfers(ParameterCollection& pc, const std::vector<Transfer>& t, bool write);
  uint32_t node_spans(const Graph& g, const MemoryPlan& plan, const std::vector<uint32_t>& nodes,
                      uint32_t* floats);

  DeviceQueue& queue_;
  ParamSync& params_;
  Uploads& uploads_;
  const Arenas& arenas_;
  std::vector<uint32_t> spans_, param_spans_;  // node_spans' lists
  std::vector<TransferDesc> transfer_descs_;
};

}  // namespace edbatch::cuda
