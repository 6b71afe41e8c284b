// Internal to the CUDA backend: device buffers, the parameter mirror, and the command list a
// pass is encoded into before it is uploaded and launched. The parts that use them are in
// backend_parts.h.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "edbatch/backend.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "kernels/cuda/device.h"

namespace edbatch {
struct BlockPlan;
struct BlockStep;
}  // namespace edbatch

namespace edbatch::cuda {

// Grow-only device memory. Growth happens only at the start of a pass, when nothing in the
// buffer is live, so contents are not kept (except by grow_keeping); it is counted by the caller.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  // True when it had to grow. Stream-ordered (the pool keeps freed memory), so growing neither
  // waits for the device nor returns memory to the driver.
  bool reserve(size_t bytes, Stream s);
  // As reserve, but the first `keep` bytes move to the new memory (an incremental forward's
  // earlier values).
  bool grow_keeping(size_t bytes, size_t keep, Stream s);
  template <class T = float>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  double grow_ms() const { return grow_ms_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  double grow_ms_ = 0;  // host time spent growing
};

// Grow-only page-locked host memory (staging for uploads, mirrors for downloads).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  bool reserve(size_t bytes);
  template <class T = float>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  double grow_ms() const { return grow_ms_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  double grow_ms_ = 0;
};

// Device copies of a collection's values and gradients. Host storages that lie back to back
// (stacked parameters) stay back to back on the device, and views point into their base.
struct ParamMirror {
  struct Range {
    float* host_values;
    float* host_grads;
    size_t floats;
    size_t device;  // float offset in the device buffers
  };
  std::vector<Range> ranges;
  std::vector<uint32_t> offset;  // per parameter id
  size_t floats = 0;
  DeviceBuffer values, grads;
  PinnedBuffer staging;
  uint64_t values_version = UINT64_MAX, grads_version = UINT64_MAX;

  void layout(ParameterCollection& pc, Stream s);
  void upload_values(Stream s) { copy(false, true, s); }
  void upload_grads(Stream s) { copy(true, true, s); }
  void download_values(Stream s) { copy(false, false, s); }
  void download_grads(Stream s) { copy(true, false, s); }
  void copy(bool grads, bool to_device, Stream s);
};

// Pinned staging for one kind of upload, kDepth deep: an upload fills one buffer while the
// copies from the others may still be queued behind earlier work. A buffer is reused once its
// copy is done, so the host waits for the device only when it runs kDepth uploads ahead (the
// PyTorch adapter makes about 6 interop uploads per training step; with 2 buffers writing its
// weights waited for earlier GPU work, 0.21 ms per call against 0.04 ms with 8).
struct StagingRing {
  static constexpr int kDepth = 8;
  StagingRing();  // creates the events
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  ~StagingRing();
  PinnedBuffer buffers[kDepth];
  cudaEvent_t own[kDepth] = {};     // the ring's events, for copies no pass's event follows
  cudaEvent_t copied[kDepth] = {};  // completes after the slot's copy: own[i] or a pass's start
  bool queued[kDepth] = {};
  uint64_t syncs[kDepth] = {};  // DeviceQueue::syncs() when the copy was queued
  int next = 0;
};

constexpr size_t kMirrorChunk = 4096;  // floats fetched together by value() / adjoint()
constexpr size_t kMirrorMaxSpan = 64;  // chunks of one copy at most (1 MiB)

// Host copies of device values, fetched chunk by chunk on first read after a pass. Ordinary
// memory, left untouched until read: a pass usually reads a few values of a large arena. Each
// miss after a pass copies twice the chunks of the one before (up to kMirrorMaxSpan, stopping at
// a chunk already fetched), so a program that reads many values of a pass (a decoding step's
// outputs, one per sentence) makes a few copies, and one that reads a loss makes one small copy.
// An incremental forward keeps what was fetched before its segment, and the span: a decoding
// loop reads the same values of every step, so after the first steps it makes one copy a step.
// Copies land in pinned memory first (at most kMirrorMaxSpan chunks at a time): on the H100
// machine a copy of tens of KiB into ordinary memory took several times as long. A span that
// fetch() brings is copied into pinned memory of its own and read there until the next pass,
// with no second copy (9 us of a decoding step's 32 KiB on the H100 machine).
struct HostMirror {
  std::unique_ptr<float[]> data;
  size_t capacity = 0;
  std::vector<uint8_t> fetched;
  size_t span = 1;  // chunks the next miss copies
  PinnedBuffer bounce;

  void reset(size_t floats);
  // `floats` in all, of which those before `from` are unchanged since they were fetched.
  void extend(size_t floats, size_t from);
  // The host copy of device[offset, offset + floats) of an arena of `total` floats; copies on
  // stream `s`, which has nothing queued.
  const float* read(const float* device, size_t offset, size_t floats, size_t total, Stream s);
  // Copies what is not here yet of the float ranges [begin, end) of device memory, queued on `s`
  // behind the work there; then `wait` waits for it all once (a read right after a pass costs one
  // round trip, not two). One range of at most kHeldFloats: into a pinned buffer of its own (up
  // to kMaxHeld per pass). Else each run of missing chunks (more than kMirrorMaxSpan chunks:
  // after waiting).
  void fetch(const float* device, const std::vector<std::pair<size_t, size_t>>& ranges,
             size_t total, Stream s, const std::function<void()>& wait);

 private:
  static constexpr size_t kHeldFloats = size_t{1} << 20;  // 4 MiB
  static constexpr size_t kMaxHeld = 4;
  struct Held {  // a span fetch() copied, valid until the next pass
    PinnedBuffer buffer;
    size_t begin = 0, end = 0;
  };
  void copy_run(const float* device, size_t c, size_t end, size_t total, Stream s);
  std::vector<std::pair<size_t, size_t>> runs_;  // fetch(): chunk runs to copy
  std::vector<std::unique_ptr<Held>> held_;      // reused from pass to pass
  size_t held_used_ = 0;                         // those holding this pass's spans
};

// One launch of a pass. Pointers into the pass's uploaded metadata are kept as offsets until the
// upload's device address is known.
struct Command {
  enum class Kind : uint8_t {
    Steps,
    Gather,
    Scatter,
    Gemm,
    GemmBatched,
    SumColumns,
    LinearForward,
    LinearBackward,
    Lookups
  };
  Kind kind;
  const char* what;  // for error messages
  uint32_t batch;
  // Steps: StepGroup index; Linear*: LinearDesc index. Gather, Scatter: the operand and buffer.
  uint32_t group = 0;
  // LinearForward, LinearBackward: a second, independent GEMM step of the same block call run
  // in the same launch (a LinearDesc index), or kNoOperand.
  uint32_t group2 = kNoOperand;
  // A block call's command: the block's group it runs (BlockPlan::groups) and, for a second
  // GEMM step in the same launch, that step's group; kNoOperand otherwise.
  uint32_t block_group = kNoOperand, block_group2 = kNoOperand;
  // LinearBackward: every weight (and a bias whose gradient the dW thread blocks reduce) is a
  // parameter, whose gradient nothing later in the pass reads, so in a chained launch the dW
  // thread blocks run as a stage of their own that no stage waits for (Stage::LinearBackwardW).
  bool params_only = false;
  Operand operand{};
  uint32_t count = 0, k = 0, per_node = 0;
  float* buffer = nullptr;
  // Gemm, GemmBatched (column-major, as cuBLAS); SumColumns: c[i] += sum over j < n of
  // a[j * lda + i], i < m.
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 0, n = 0, kk = 0, lda = 0, ldb = 0, ldc = 0, batch_count = 0;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  float alpha = 1, beta = 0;
  uint32_t ptr_begin = 0;  // GemmBatched: A, B and C pointer arrays at ptrs[ptr_begin + ...]
};

// One launch of a pass: commands [begin, end) as one chained launch of `stages` stages (from
// stage_begin in the pass's stage list, tickets mapped from map_begin, counters from
// counter_begin), or one command launched alone (stages 0).
struct Launch {
  uint32_t begin = 0, end = 0;
  uint32_t stage_begin = 0, stages = 0, map_begin = 0, counter_begin = 0, blocks = 0;
  uint32_t critical = 0;  // chained: the longest chain of stages waiting one for another
};

}  // namespace edbatch::cuda

namespace edbatch::cuda {

// A pass being encoded: the device addresses known before the upload, and what it launches.
struct Pass {
  const PlanRef* p = nullptr;
  bool forward = true;
  uint32_t first_batch = 0;        // forward: the batches run start here (an incremental forward)
  const std::vector<uint8_t>* skip_batches = nullptr;  // backward: BackwardSeed::skip_batches
  bool fused_linear = true;        // GEMM steps through the fused kernel where it applies
  bool pointwise_runs = true;      // CudaOptions::pointwise_runs
  uint32_t linear_min_blocks = 1;  // linear_chunk_sizes (CudaOptions::linear_min_blocks)
  float* values = nullptr;
  float* adjoints = nullptr;
  float* params = nullptr;
  float* grads = nullptr;
  const uint32_t* param_offset = nullptr;  // host copy, per parameter id
  float* scratch = nullptr;                // GEMM operand gathers and input-gradient staging
  size_t scratch_floats = 0, scratch_need = 0;
  std::vector<Command> commands;
  std::vector<StepGroup> groups;
  std::vector<LinearDesc> linears;
  std::vector<const float*> ptrs;
  // Lookup steps run together (Command::Kind::Lookups): first in forward, last in backward.
  std::vector<StepDesc> lookups;
  std::vector<uint32_t> lookup_starts;  // thread blocks of each (launch_lookups), then the total
  uint64_t bytes_copied = 0;

  void clear_output() {
    commands.clear();
    groups.clear();
    linears.clear();
    ptrs.clear();
    lookups.clear();
    lookup_starts.assign(1, 0);
    bytes_copied = 0;
    scratch_need = 0;
  }
};

// Encodes every batch of the plan (backward: in reverse). Sets scratch_need; when it exceeds
// what the pass has, the caller grows scratch and encodes again. Backward also
// marks the lookup rows it will touch in the collection.
void encode_pass(Pass& pass);

// A step of a group as mark_pointwise_runs sees it: its block and block step (null for a batch
// of the graph itself, which runs on its own).
struct RunStep {
  const BlockPlan* block = nullptr;
  const BlockStep* step = nullptr;
};
// Sets the pointwise runs of g's steps (device.h: StepDesc::run_len, run_slot and
// StepGroup::run_src); steps[q] is g.steps[q]'s block step.
// With `fuse` false every step runs on its own.
void mark_pointwise_runs(StepGroup& g, const RunStep* steps, const MemoryPlan& plan, bool fuse);

}  // namespace edbatch::cuda
