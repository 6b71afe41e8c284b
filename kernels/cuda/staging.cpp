// Pinned staging: a pass's metadata uploaded in one copy through a ring of buffers (so a pass is
// encoded while earlier copies may still be queued), the interop's descriptor uploads, and the
// values Backend::stage copies out.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

namespace {

template <class T>
size_t put(char* staging, size_t at, const T* v, size_t n) {
  if (n > 0 && staging) std::memcpy(staging + at, v, n * sizeof(T));
  return align_up(at + n * sizeof(T));
}
template <class T>
size_t put(char* staging, size_t at, const std::vector<T>& v) {
  return put(staging, at, v.data(), v.size());
}

// A device address for indices from `base` on: the array at `d` holds the plan's entries from
// `base`, so a kernel reads entry i (i >= base) at the returned address plus i.
template <class T>
const T* based(const char* d, uint32_t base) {
  return reinterpret_cast<const T*>(reinterpret_cast<uintptr_t>(d) - uintptr_t{base} * sizeof(T));
}

const PlanSegment kWholePlan{};  // every entry (all bases 0)

}  // namespace

// The plan's metadata arrays, from segment `from`'s entries on; `w` gets where each starts.
size_t Uploads::put_plan(char* h, size_t at, const MemoryPlan& plan, const PlanSegment& from,
                         PlanAt& w) {
  w.operands = at;
  at = put(h, at, plan.operands.data() + from.operand_begin,
           plan.operands.size() - from.operand_begin);
  w.members = at;
  at = put(h, at, plan.member_operands.data() + from.member_begin,
           plan.member_operands.size() - from.member_begin);
  w.index = at;
  at = put(h, at, plan.index.data() + from.index_begin, plan.index.size() - from.index_begin);
  w.aux = at;
  return put(h, at, plan.aux.data() + from.aux_begin, plan.aux.size() - from.aux_begin);
}

void Uploads::view_plan(const char* d, const PlanAt& w, const PlanSegment& from) {
  DeviceView& view = at_.view;
  view.operands = based<Operand>(d + w.operands, from.operand_begin);
  view.member_operands = based<Operand>(d + w.members, from.member_begin);
  view.index = based<uint32_t>(d + w.index, from.index_begin);
  view.aux = based<uint32_t>(d + w.aux, from.aux_begin);
}

// Where the parts of a forward pass's upload lie: the parameter offsets, the plan's metadata
// (from the first segment that runs: the batches of a segment read only the entries appended for
// them, so an increment uploads its own, not the whole plan's again), the pass's data, then the
// graph's input values from the first segment's on; last, so that those a caller's device
// memory provides stay out of the copy.
Uploads::ForwardUpload Uploads::forward_layout(const PlanRef& p, const Pass& pass,
                                               const LaunchPlan& launches,
                                               const ParamMirror& params) const {
  const PlanSegment& first_seg = p.plan.segments.at(p.first_segment);
  ForwardUpload u;
  u.first_input = first_seg.input_begin;
  size_t at = put(nullptr, 0, params.offset);
  at = put_plan(nullptr, at, p.plan, first_seg, u.plan);
  u.ptrs = at;
  at = put_pass(nullptr, at, pass, launches);
  u.inputs = at;
  u.end = put(nullptr, at, p.graph.input_values().data() + u.first_input,
              p.graph.input_values().size() - u.first_input);
  return u;
}

// Writes the upload laid out as `u` into `h`, input values but those in [skip_begin, skip_end).
void Uploads::put_forward(char* h, const ForwardUpload& u, const PlanRef& p, const Pass& pass,
                          const LaunchPlan& launches, const ParamMirror& params, size_t skip_begin,
                          size_t skip_end) const {
  PlanAt plan_at;
  put(h, 0, params.offset);
  put_plan(h, u.plan.operands, p.plan, p.plan.segments.at(p.first_segment), plan_at);
  put_pass(h, u.ptrs, pass, launches);
  const std::vector<float>& inputs = p.graph.input_values();
  put(h, u.inputs, inputs.data() + u.first_input, skip_begin - u.first_input);
  put(h, u.inputs + (skip_end - u.first_input) * sizeof(float), inputs.data() + skip_end,
      inputs.size() - skip_end);
}

Uploads::PreparedUpload Uploads::prepare_forward(const PlanRef& p, const Pass& pass,
                                                 const LaunchPlan& launches,
                                                 const ParamMirror& params) {
  const ForwardUpload u = forward_layout(p, pass, launches, params);
  PinnedBuffer& staging = acquire(forward_staging_, std::max<size_t>(u.end, 1));
  put_forward(staging.as<char>(), u, p, pass, launches, params, u.first_input, u.first_input);
  return PreparedUpload{u, p.graph.inputs_version()};
}

// The input values [begin, end) that DeviceInterop::inputs_from_device gives this pass (begin =
// end = the first segment's first input when none); throws, dropping them, unless they lie among
// the inputs of the pass's first segment.
std::pair<size_t, size_t> Uploads::device_input_range(const PlanRef& p) {
  const PlanSegment& first_seg = p.plan.segments.at(p.first_segment);
  const size_t seg_begin = first_seg.input_begin, seg_end = seg_begin + first_seg.input_count;
  if (!device_inputs_) return {seg_begin, seg_begin};
  const size_t begin = device_input_first_, end = begin + device_input_floats_;
  const size_t graph_inputs = p.graph.input_values().size();
  std::string why;
  if (end > graph_inputs)
    why = "but the graph has " + std::to_string(graph_inputs);
  else if (begin < seg_begin || end > seg_end)
    why = "but the inputs of the nodes this forward runs first are [" + std::to_string(seg_begin) +
          ", " + std::to_string(seg_end) + ")" +
          (p.first_segment > 0 ? " (an incremental forward: the nodes added since the last)" : "");
  if (!why.empty()) {
    device_inputs_ = nullptr;
    throw std::invalid_argument("[cuda] inputs_from_device: input floats [" +
                                std::to_string(begin) + ", " + std::to_string(end) + "), " + why);
  }
  return {begin, end};
}

void Uploads::forward(const PlanRef& p, const Pass& pass, const LaunchPlan& launches,
                      const Arenas& arenas, const ParamMirror& params, cudaEvent_t start,
                      const PreparedUpload* prepared) {
  const cudaStream_t stream = queue_.stream();
  const MemoryPlan& plan = p.plan;
  const std::vector<float>& inputs = p.graph.input_values();
  // The upload prepare_forward wrote into the ring's next buffer (no forward came between, so
  // the buffer is still the ring's next), unless an input value changed since.
  const bool ready = prepared && prepared->inputs_version == p.graph.inputs_version();
  // Input values the caller's device memory provides, [dev_begin, dev_end), are not uploaded;
  // nor are those of the segments that ran before (an incremental forward runs from
  // p.first_segment).
  const PlanSegment& first_seg = plan.segments.at(p.first_segment);
  const auto [dev_begin, dev_end] = device_input_range(p);
  const ForwardUpload u = ready ? prepared->u : forward_layout(p, pass, launches, params);
  PinnedBuffer& staging = ready ? forward_staging_.buffers[forward_staging_.next]
                                : acquire(forward_staging_, std::max<size_t>(u.end, 1));
  char* h = staging.as<char>();
  if (!ready) put_forward(h, u, p, pass, launches, params, dev_begin, dev_end);
  forward_meta_.reserve(std::max<size_t>(u.end, 1), stream);
  char* d = forward_meta_.as<char>();
  // One copy, or two around the input values the caller's device memory provides.
  const auto byte_of = [&](size_t input) {
    return u.inputs + (input - u.first_input) * sizeof(float);
  };
  const size_t inputs_end = byte_of(inputs.size());
  const size_t head = dev_begin < dev_end ? byte_of(dev_begin) : u.end, tail = byte_of(dev_end);
  EDBATCH_CUDA_CHECK(cudaMemcpyAsync(d, h, head, cudaMemcpyHostToDevice, stream));
  if (dev_begin < dev_end && tail < inputs_end)
    EDBATCH_CUDA_CHECK(
        cudaMemcpyAsync(d + tail, h + tail, inputs_end - tail, cudaMemcpyHostToDevice, stream));
  release(forward_staging_, start);
  float* values = arenas.values.as();
  // Fused GEMM steps add their partial sums into zeroed outputs (the segments that run). The
  // arena is zero from arenas.values_zero_from on, so zeroing up to there leaves it zero from
  // the plan's end on after the pass: an increment that follows queues no memset.
  const size_t zero_from = first_seg.input_offset, zero_to = arenas.values_zero_from;
  if (zero_from < zero_to)
    EDBATCH_CUDA_CHECK(
        cudaMemsetAsync(values + zero_from, 0, (zero_to - zero_from) * sizeof(float), stream));
  // Each segment's inputs move to their place (one block per segment, two around the device's).
  const float* uploaded = reinterpret_cast<const float*>(d + u.inputs);
  const auto move = [&](const PlanSegment& seg, size_t b, size_t e) {
    if (b < e)
      EDBATCH_CUDA_CHECK(cudaMemcpyAsync(values + seg.input_offset + (b - seg.input_begin),
                                         uploaded + (b - u.first_input), (e - b) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream));
  };
  for (size_t s = p.first_segment; s < plan.segments.size(); ++s) {
    const PlanSegment& seg = plan.segments[s];
    const size_t b = seg.input_begin, e = b + seg.input_count;
    move(seg, b, std::min(e, dev_begin));
    move(seg, std::max(b, dev_end), e);
  }
  if (device_inputs_) {  // DeviceInterop::inputs_from_device: the caller's device memory
    const float* src = device_inputs_;
    device_inputs_ = nullptr;
    if (dev_begin < dev_end)
      EDBATCH_CUDA_CHECK(cudaMemcpyAsync(
          values + first_seg.input_offset + (dev_begin - first_seg.input_begin), src,
          (dev_end - dev_begin) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }
  DeviceView& view = at_.view;
  view = DeviceView{};
  view.values = values;
  view.adjoints = arenas.adjoints.as();
  view.params = params.values.as();
  view.grads = params.grads.as();
  view.param_offset = reinterpret_cast<const uint32_t*>(d);
  view_plan(d, u.plan, first_seg);
  plan_partial_ = p.first_segment > 0;
  pass_data_at(d, u.ptrs, pass, launches);
}

void Uploads::backward(const MemoryPlan& plan, const Pass& pass, const LaunchPlan& launches,
                       cudaEvent_t start) {
  // Backward runs over every segment: after an incremental forward, which uploaded only its own
  // segment's metadata, the whole plan's goes up with the pass's data.
  const MemoryPlan* whole = plan_partial_ ? &plan : nullptr;
  PlanAt plan_at;
  const size_t at = whole ? put_plan(nullptr, 0, *whole, kWholePlan, plan_at) : 0;
  const size_t end = put_pass(nullptr, at, pass, launches);
  PinnedBuffer& staging = acquire(backward_staging_, std::max<size_t>(end, 1));
  backward_meta_.reserve(std::max<size_t>(end, 1), queue_.stream());
  char* h = staging.as<char>();
  if (whole) put_plan(h, 0, *whole, kWholePlan, plan_at);
  put_pass(h, at, pass, launches);
  char* d = backward_meta_.as<char>();
  EDBATCH_CUDA_CHECK(cudaMemcpyAsync(d, h, end, cudaMemcpyHostToDevice, queue_.stream()));
  release(backward_staging_, start);
  if (whole) view_plan(d, plan_at, kWholePlan);
  pass_data_at(d, at, pass, launches);
}

// The ring's next buffer, at least `bytes` large, once the copy it last fed is done (known
// without a call when the whole stream was waited for since: a decoding loop waits every step).
PinnedBuffer& Uploads::acquire(StagingRing& ring, size_t bytes) {
  if (ring.queued[ring.next]) {
    const cudaEvent_t copied = ring.copied[ring.next];
    if (ring.syncs[ring.next] == queue_.syncs() && !queue_.done(copied)) queue_.wait_event(copied);
    ring.queued[ring.next] = false;
  }
  PinnedBuffer& b = ring.buffers[ring.next];
  b.reserve(bytes);
  return b;
}

// Copies `bytes` that the caller wrote into the interop ring's current buffer `h` to the
// device (interop_meta_, reused in stream order); returns their device address.
const char* Uploads::upload_interop(const char* h, size_t bytes) {
  interop_meta_.reserve(bytes, queue_.stream());
  EDBATCH_CUDA_CHECK(cudaMemcpyAsync(interop_meta_.as<char>(), h, bytes, cudaMemcpyHostToDevice,
                                     queue_.stream()));
  release(interop_staging_);
  return interop_meta_.as<char>();
}

// A pass's start event may be recorded again by a later pass before the slot comes round: a
// wait on it then waits for that later point of the stream, which is still after the copy.
void Uploads::release(StagingRing& ring, cudaEvent_t done) {
  if (done == nullptr) done = ring.own[ring.next];
  EDBATCH_CUDA_CHECK(cudaEventRecord(done, queue_.stream()));
  ring.copied[ring.next] = done;
  ring.queued[ring.next] = true;
  ring.syncs[ring.next] = queue_.syncs();
  ring.next = (ring.next + 1) % StagingRing::kDepth;
}

// The pass's own data, after the plan's: GEMM pointer arrays, the hoisted lookups, and for
// chained launches the step groups, fused GEMM descriptions, stages, ticket map and zeroed
// counters.
size_t Uploads::put_pass(char* h, size_t at, const Pass& pass, const LaunchPlan& launches) const {
  at = put(h, at, pass.ptrs);
  at = put(h, at, pass.lookups);
  at = put(h, at, pass.lookup_starts);
  if (launches.stages.empty()) return at;
  at = put(h, at, pass.groups);
  at = put(h, at, pass.linears);
  at = put(h, at, launches.stages);
  at = put(h, at, launches.stage_of);
  at = put(h, at, launches.waits);
  if (h) std::memset(h + at, 0, launches.counters_floats * sizeof(uint32_t));
  return align_up(at + launches.counters_floats * sizeof(uint32_t));
}

void Uploads::pass_data_at(char* d, size_t at, const Pass& pass, const LaunchPlan& launches) {
  at_.ptrs = reinterpret_cast<const float* const*>(d + at);
  at = put(nullptr, at, pass.ptrs);
  at_.lookups = reinterpret_cast<const StepDesc*>(d + at);
  at = put(nullptr, at, pass.lookups);
  at_.lookup_starts = reinterpret_cast<const uint32_t*>(d + at);
  at_.lookup_blocks = pass.lookup_starts.empty() ? 0 : pass.lookup_starts.back();
  at = put(nullptr, at, pass.lookup_starts);
  if (launches.stages.empty()) return;
  at_.groups = reinterpret_cast<const StepGroup*>(d + at);
  at = put(nullptr, at, pass.groups);
  at_.linears = reinterpret_cast<const LinearDesc*>(d + at);
  at = put(nullptr, at, pass.linears);
  at_.stages = reinterpret_cast<const Stage*>(d + at);
  at = put(nullptr, at, launches.stages);
  at_.stage_of = reinterpret_cast<const uint16_t*>(d + at);
  at = put(nullptr, at, launches.stage_of);
  at_.waits = reinterpret_cast<const uint32_t*>(d + at);
  at = put(nullptr, at, launches.waits);
  at_.counters = reinterpret_cast<uint32_t*>(d + at);
}

double Uploads::staging_grow_ms() const {
  double ms = 0;
  for (const StagingRing* ring : {&forward_staging_, &backward_staging_, &interop_staging_})
    for (const PinnedBuffer& b : ring->buffers) ms += b.grow_ms();
  return ms;
}

StagedCopies::StagedCopies(DeviceQueue& queue) : queue_(queue) {
  for (Slot& st : slots_)
    EDBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming));
}

StagedCopies::~StagedCopies() {
  for (Slot& st : slots_) cudaEventDestroy(st.copied);
}

void StagedCopies::copy(uint64_t ticket, const float* src, uint32_t floats) {
  Slot& st = slots_[ticket % Backend::kStagedSlots];
  // Growing frees the pinned buffer: the copy of the ticket it held must be done first.
  const size_t bytes = std::max<size_t>(floats, 1) * sizeof(float);
  if (st.queued && bytes > st.host.bytes()) queue_.wait_event(st.copied);
  st.host.reserve(bytes);
  if (floats > 0)
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(st.host.as(), src, floats * sizeof(float),
                                       cudaMemcpyDeviceToHost, queue_.stream()));
  EDBATCH_CUDA_CHECK(cudaEventRecord(st.copied, queue_.stream()));
  st.queued = true;
  queue_.mark_queued();
}

const float* StagedCopies::host(uint64_t ticket) {
  Slot& st = slots_[ticket % Backend::kStagedSlots];
  queue_.wait_event(st.copied);
  return st.host.as();
}

}  // namespace edbatch::cuda
