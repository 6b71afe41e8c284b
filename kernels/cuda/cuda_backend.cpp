// The CUDA backend: one stream, a device arena of values and one of adjoints reused across
// passes, device mirrors of the parameters (uploaded when the collection's version changes,
// gradients downloaded after backward so host code reads them as before), and passes that are
// encoded on the host, uploaded in one copy from pinned staging, then launched.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "edbatch/params.h"
#include "edbatch/schedule.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "src/core/backends.h"

namespace edbatch::cuda {

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

// Growth doubles (from 1 MiB): a run of growing mini-batches pays for few growths (pinned host
// memory in particular costs milliseconds to allocate).
namespace {
size_t grown_size(size_t bytes, size_t old) { return std::max({bytes, 2 * old, size_t{1} << 20}); }
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

bool DeviceBuffer::reserve(size_t bytes, Stream s) {
  if (bytes <= bytes_) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t grown = grown_size(bytes, bytes_);
  if (data_) EDBATCH_CUDA_CHECK(cudaFreeAsync(data_, s));
  data_ = nullptr;
  bytes_ = 0;
  EDBATCH_CUDA_CHECK(cudaMallocAsync(&data_, grown, s));
  bytes_ = grown;
  grow_ms_ += ms_since(t0);
  return true;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

bool PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t grown = grown_size(bytes, bytes_);
  if (data_) EDBATCH_CUDA_CHECK(cudaFreeHost(data_));
  data_ = nullptr;
  bytes_ = 0;
  EDBATCH_CUDA_CHECK(cudaMallocHost(&data_, grown));
  bytes_ = grown;
  grow_ms_ += ms_since(t0);
  return true;
}

void ParamMirror::layout(ParameterCollection& pc, Stream s) {
  ranges.clear();
  for (uint32_t id = 0; id < pc.size(); ++id)
    if (!pc.is_view(id)) ranges.push_back({pc.values(id), pc.grads(id), pc.dim(id).size(), 0});
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.host_values < b.host_values; });
  // Merge storages that lie back to back in both values and gradients (stacked parameters).
  std::vector<Range> merged;
  for (const Range& r : ranges) {
    if (!merged.empty()) {
      Range& last = merged.back();
      if (last.host_values + last.floats == r.host_values &&
          last.host_grads + last.floats == r.host_grads) {
        last.floats += r.floats;
        continue;
      }
    }
    merged.push_back(r);
  }
  ranges = std::move(merged);
  floats = 0;
  for (Range& r : ranges) {
    r.device = floats;
    floats += (r.floats + 31) / 32 * 32;  // 128-byte aligned starts
  }
  offset.assign(pc.size(), 0);
  for (uint32_t id = 0; id < pc.size(); ++id) {
    const float* v = pc.values(id);
    auto it = std::upper_bound(ranges.begin(), ranges.end(), v,
                               [](const float* p, const Range& r) { return p < r.host_values; });
    if (it == ranges.begin() || v >= (it - 1)->host_values + (it - 1)->floats)
      throw std::runtime_error("[cuda] parameter '" + pc.name(id) + "' lies in no storage");
    --it;
    offset[id] = static_cast<uint32_t>(it->device + static_cast<size_t>(v - it->host_values));
  }
  values.reserve(std::max<size_t>(floats, 1) * sizeof(float), s);
  grads.reserve(std::max<size_t>(floats, 1) * sizeof(float), s);
  staging.reserve(std::max<size_t>(floats, 1) * sizeof(float));
}

// Host ranges <-> the device buffer, through the staging (synchronous: the staging is reused at
// once). `grads` picks the gradients' host ranges and buffer instead of the values'.
void ParamMirror::copy(bool grads_, bool to_device, Stream s) {
  float* host = staging.as();
  float* device = grads_ ? grads.as() : values.as();
  auto host_of = [grads_](const Range& r) { return grads_ ? r.host_grads : r.host_values; };
  if (to_device) {
    for (const Range& r : ranges) std::memcpy(host + r.device, host_of(r), r.floats * sizeof(float));
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(device, host, floats * sizeof(float),
                                       cudaMemcpyHostToDevice, s));
    EDBATCH_CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  EDBATCH_CUDA_CHECK(cudaMemcpyAsync(host, device, floats * sizeof(float),
                                     cudaMemcpyDeviceToHost, s));
  EDBATCH_CUDA_CHECK(cudaStreamSynchronize(s));
  for (const Range& r : ranges) std::memcpy(host_of(r), host + r.device, r.floats * sizeof(float));
}

namespace {

constexpr size_t kMirrorChunk = 4096;  // floats fetched together by value() / adjoint()

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Host copies of device values, fetched chunk by chunk on first read after a pass. Ordinary
// memory, left untouched until read: a pass usually reads a few values of a large arena.
struct HostMirror {
  std::unique_ptr<float[]> data;
  size_t capacity = 0;
  std::vector<uint8_t> fetched;

  void reset(size_t floats) {
    if (floats > capacity) {
      capacity = std::max(floats, 2 * capacity);
      data.reset(new float[capacity]);
    }
    fetched.assign((floats + kMirrorChunk - 1) / kMirrorChunk, 0);
  }
  const float* read(const float* device, size_t offset, size_t floats, size_t total) {
    float* host = data.get();
    const size_t c0 = offset / kMirrorChunk, c1 = (offset + std::max<size_t>(floats, 1) - 1) / kMirrorChunk;
    for (size_t c = c0; c <= c1 && c < fetched.size(); ++c) {
      if (fetched[c]) continue;
      const size_t b = c * kMirrorChunk, e = std::min(total, b + kMirrorChunk);
      EDBATCH_CUDA_CHECK(cudaMemcpy(host + b, device + b, (e - b) * sizeof(float),
                                    cudaMemcpyDeviceToHost));
      fetched[c] = 1;
    }
    return host + offset;
  }
};

class CudaBackend : public Backend, public DeviceInterop {
 public:
  explicit CudaBackend(const BackendOptions& options) : options_(options.cuda) {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0)
      throw std::runtime_error(std::string("[cuda] no CUDA device: ") +
                               (e != cudaSuccess ? cudaGetErrorString(e) : "none found"));
    EDBATCH_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
    stream_ = own_stream_;
    EDBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&switch_, cudaEventDisableTiming));
    // The arenas grow through the device's pool: keep what they free for the next growth.
    int device = 0;
    cudaMemPool_t pool;
    EDBATCH_CUDA_CHECK(cudaGetDevice(&device));
    EDBATCH_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    EDBATCH_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    EDBATCH_CUBLAS_CHECK(cublasCreate(&blas_));
    EDBATCH_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    warm_up_cublas();
    for (Timing& t : timings_) {
      EDBATCH_CUDA_CHECK(cudaEventCreate(&t.start));
      EDBATCH_CUDA_CHECK(cudaEventCreate(&t.stop));
    }
    for (StagingRing* ring : rings())
      for (cudaEvent_t& ev : ring->copied)
        EDBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    for (Staged& st : staged_slots_)
      EDBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming));
  }

  ~CudaBackend() override {
    // Leave the host copies current when the device holds newer parameters or gradients.
    try {
      if (pc_ && pc_->device_fetch_owner() == this) pc_->fetch_from_device();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
    if (options_.profile) print_profile();
    for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
    for (Timing& t : timings_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    for (StagingRing* ring : rings())
      for (cudaEvent_t ev : ring->copied) cudaEventDestroy(ev);
    for (Staged& st : staged_slots_) cudaEventDestroy(st.copied);
    cudaEventDestroy(switch_);
    cublasDestroy(blas_);
    if (stream_ != own_stream_) {  // the caller's stream: its later work may free what ours reads
      cudaStreamSynchronize(stream_);
    }
    cudaStreamDestroy(own_stream_);
  }

  const char* name() const override { return "cuda"; }

  void forward(const PlanRef& p) override {
    sync_params(p.params);
    if (values_.reserve(std::max<size_t>(p.plan.total_floats, 1) * sizeof(float), stream_))
      ++counters_.arena_growths;
    graph_ = &p.graph;
    total_floats_ = p.plan.total_floats;
    values_mirror_.reset(total_floats_);
    adjoints_mirror_.fetched.assign(0, 0);
    Pass pass = new_pass(p, true);
    encode(pass);
    plan_launches(pass);
    upload_forward(p, pass);
    run_pass(pass, "forward");
  }

  void backward(const PlanRef& p, const BackwardSeed& seed) override {
    if (graph_ != &p.graph || total_floats_ != p.plan.total_floats)
      throw std::invalid_argument("[cuda] backward: run forward on this plan first");
    // Backward reads the parameters as they are now, as on the CPU (they may have changed since
    // forward, e.g. a seed written between the two).
    sync_params(p.params);
    if (adjoints_.reserve(std::max<size_t>(p.plan.total_floats, 1) * sizeof(float), stream_))
      ++counters_.arena_growths;
    upload_grads_if_changed(p.params);
    adjoints_mirror_.reset(total_floats_);
    Pass pass = new_pass(p, false);
    encode(pass);
    plan_launches(pass);
    upload_pointers(pass, backward_meta_, backward_staging_, 0);
    EDBATCH_CUDA_CHECK(cudaMemsetAsync(adjoints_.as(), 0, p.plan.total_floats * sizeof(float), stream_));
    if (seed.nodes == nullptr)
      launch_fill(adjoints_.as() + p.plan.node_offset[seed.loss_node], 1, 1.0f, stream_);
    else
      add_seeds(p, seed);
    view_.adjoints = adjoints_.as();
    run_pass(pass, "backward");
    // The gradients stay on the device; host code that reads them fetches them first.
    grads_newer_ = true;
    p.params.set_device_fetch(this, [this] { fetch_params(); });
  }

  const float* value(const MemoryPlan& plan, uint32_t node) const override {
    self().wait();
    return values_mirror_.read(values_.as(), plan.node_offset[node], graph_->node(node).dim.size(),
                               total_floats_);
  }
  const float* adjoint(const MemoryPlan& plan, uint32_t node) const override {
    self().wait();
    return adjoints_mirror_.read(adjoints_.as(), plan.node_offset[node],
                                 graph_->node(node).dim.size(), total_floats_);
  }

  uint64_t stage(const MemoryPlan& plan, uint32_t node, uint32_t floats) override {
    const uint64_t ticket = next_ticket_++;
    Staged& st = staged_slots_[ticket % kStagedSlots];
    // Growing frees the pinned buffer: the copy of the ticket it held must be done first.
    const size_t bytes = std::max<size_t>(floats, 1) * sizeof(float);
    if (st.queued && bytes > st.host.bytes()) wait_event(st.copied);
    st.host.reserve(bytes);
    if (floats > 0)
      EDBATCH_CUDA_CHECK(cudaMemcpyAsync(st.host.as(), values_.as() + plan.node_offset[node],
                                         floats * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    EDBATCH_CUDA_CHECK(cudaEventRecord(st.copied, stream_));
    st.queued = true;
    queued_work_ = true;
    return ticket;
  }

  const float* staged(uint64_t ticket) override {
    check_ticket(ticket);
    Staged& st = staged_slots_[ticket % kStagedSlots];
    wait_event(st.copied);
    return st.host.as();
  }

  void sgd_update(ParameterCollection& pc, float lr) override {
    sync_params(pc);
    upload_grads_if_changed(pc);
    launch_sgd(params_.values.as(), params_.grads.as(), params_.floats, lr, stream_);
    EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
    queued_.push_back({"sgd update", "the SGD update kernel"});
    queued_work_ = true;
    values_newer_ = grads_newer_ = true;
    pc.updated_on_device(this, [this] { fetch_params(); });
    params_.values_version = params_.grads_version = pc.version();
  }

  void synchronize() override { wait(); }
  DeviceInterop* device_interop() override { return this; }

  // Adds the seeds of a backward from given adjoints: spans (destination offset, seed offset,
  // floats) into the arena's adjoints, then into the gradients of parameter nodes; host seeds
  // travel with the spans.
  void add_seeds(const PlanRef& p, const BackwardSeed& seed) {
    uint32_t at = 0;
    const uint32_t from_arena = node_spans(p.graph, p.plan, *seed.nodes, &at);
    if (at == 0) return;
    const std::vector<uint32_t>& spans = spans_;
    const size_t span_bytes = spans.size() * sizeof(uint32_t);
    const size_t seed_at = align_up(span_bytes);
    const size_t bytes = seed_at + (seed.on_device ? 0 : size_t{at} * sizeof(float));
    char* h = acquire(interop_staging_, bytes).as<char>();
    std::memcpy(h, spans.data(), span_bytes);
    if (!seed.on_device) std::memcpy(h + seed_at, seed.values, size_t{at} * sizeof(float));
    const char* d = upload_interop(h, bytes);
    const float* src = seed.on_device ? seed.values : reinterpret_cast<const float*>(d + seed_at);
    const uint32_t* d_spans = reinterpret_cast<const uint32_t*>(d);
    if (from_arena > 0) launch_add_spans(src, d_spans, from_arena, adjoints_.as(), stream_);
    const uint32_t from_params = static_cast<uint32_t>(spans.size() / 3) - from_arena;
    if (from_params > 0)
      launch_add_spans(src, d_spans + 3 * from_arena, from_params, params_.grads.as(), stream_);
    EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
  }

  // ---- DeviceInterop ----
  void use_stream(void* stream) override { switch_to(static_cast<cudaStream_t>(stream)); }
  void use_own_stream() override { switch_to(own_stream_); }
  void switch_to(cudaStream_t next) {
    if (next == stream_) return;
    queued_work_ = true;  // the next wait covers the stream we leave too
    EDBATCH_CUDA_CHECK(cudaEventRecord(switch_, stream_));
    EDBATCH_CUDA_CHECK(cudaStreamWaitEvent(next, switch_, 0));
    stream_ = next;
    EDBATCH_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  }

  void write_parameter(ParameterCollection& pc, uint32_t id, const float* src, size_t offset,
                       size_t floats, bool row_major) override {
    sync_params(pc);
    queued_work_ = true;
    const Dim d = pc.dim(id);
    if (offset + floats > d.size())
      throw std::invalid_argument("[cuda] write_parameter: floats " + std::to_string(offset) +
                                  "+" + std::to_string(floats) + " out of range for '" +
                                  pc.name(id) + "' " + to_string(d));
    float* dst = params_.values.as() + params_.offset[id] + offset;
    if (row_major && d.cols > 1) {
      if (offset != 0 || floats != d.size() || !src)
        throw std::invalid_argument("[cuda] write_parameter: a row-major write covers the whole "
                                    "parameter '" + pc.name(id) + "'");
      launch_transpose(src, d.rows, d.cols, dst, stream_);
      EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
    } else if (src) {
      EDBATCH_CUDA_CHECK(cudaMemcpyAsync(dst, src, floats * sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream_));
    } else {
      EDBATCH_CUDA_CHECK(cudaMemsetAsync(dst, 0, floats * sizeof(float), stream_));
    }
    values_newer_ = true;
    pc.set_device_fetch(this, [this] { fetch_params(); });
  }

  void read_gradient(ParameterCollection& pc, uint32_t id, float* dst, bool row_major) override {
    sync_params(pc);
    queued_work_ = true;
    upload_grads_if_changed(pc);
    const Dim d = pc.dim(id);
    const float* src = params_.grads.as() + params_.offset[id];
    if (row_major && d.cols > 1) {
      launch_transpose(src, d.cols, d.rows, dst, stream_);  // column-major = cols x rows row-major
      EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
    } else {
      EDBATCH_CUDA_CHECK(cudaMemcpyAsync(dst, src, d.size() * sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream_));
    }
  }

  void write_parameters(ParameterCollection& pc, const std::vector<Transfer>& t) override {
    sync_params(pc);
    transfers(pc, t, true);
    values_newer_ = true;
    pc.set_device_fetch(this, [this] { fetch_params(); });
  }

  void read_gradients(ParameterCollection& pc, const std::vector<Transfer>& t) override {
    sync_params(pc);
    upload_grads_if_changed(pc);
    transfers(pc, t, false);
  }

  // Descriptors for the transfers kernel, uploaded through the interop staging.
  void transfers(ParameterCollection& pc, const std::vector<Transfer>& t, bool write) {
    if (t.empty()) return;
    queued_work_ = true;
    std::vector<TransferDesc>& descs = transfer_descs_;
    descs.clear();
    uint64_t max_floats = 0;
    for (const Transfer& x : t) {
      const Dim d = pc.dim(x.id);
      float* mirror = (write ? params_.values.as() : params_.grads.as()) + params_.offset[x.id];
      const bool transpose = x.row_major && d.cols > 1;
      TransferDesc desc{};
      desc.src = write ? x.data : mirror;
      desc.dst = write ? mirror : x.data;
      desc.rows = d.rows;
      desc.cols = d.cols;
      desc.mode = !transpose ? 0 : write ? 1 : 2;
      descs.push_back(desc);
      max_floats = std::max<uint64_t>(max_floats, d.size());
    }
    const size_t bytes = descs.size() * sizeof(TransferDesc);
    char* h = acquire(interop_staging_, bytes).as<char>();
    std::memcpy(h, descs.data(), bytes);
    const char* d = upload_interop(h, bytes);
    launch_transfers(reinterpret_cast<const TransferDesc*>(d), static_cast<uint32_t>(descs.size()),
                     max_floats, stream_);
    EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
  }

  void zero_gradients(ParameterCollection& pc) override {
    sync_params(pc);
    queued_work_ = true;
    EDBATCH_CUDA_CHECK(cudaMemsetAsync(params_.grads.as(), 0,
                                       std::max<size_t>(params_.floats, 1) * sizeof(float), stream_));
    params_.grads_version = pc.version();
    grads_newer_ = true;
    pc.set_device_fetch(this, [this] { fetch_params(); });
  }

  void inputs_from_device(const float* src, size_t floats) override {
    device_inputs_ = src;
    device_input_floats_ = floats;
  }

  void read_nodes(const Graph& g, const MemoryPlan& plan, const std::vector<uint32_t>& nodes,
                  float* dst, bool adjoints) override {
    if (nodes.empty()) return;
    queued_work_ = true;
    if (&g != graph_ || plan.total_floats != total_floats_)
      throw std::invalid_argument("[cuda] read_nodes: not the graph of the last forward pass");
    uint32_t to = 0;
    const uint32_t from_arena = node_spans(g, plan, nodes, &to);
    const std::vector<uint32_t>& spans = spans_;
    const size_t bytes = spans.size() * sizeof(uint32_t);
    char* h = acquire(interop_staging_, bytes).as<char>();
    std::memcpy(h, spans.data(), bytes);
    const uint32_t* d_spans = reinterpret_cast<const uint32_t*>(upload_interop(h, bytes));
    if (from_arena > 0)
      launch_gather_spans(adjoints ? adjoints_.as() : values_.as(), d_spans, from_arena, dst,
                          stream_);
    const uint32_t from_params = static_cast<uint32_t>(spans.size() / 3) - from_arena;
    if (from_params > 0)
      launch_gather_spans(adjoints ? params_.grads.as() : params_.values.as(),
                          d_spans + 3 * from_arena, from_params, dst, stream_);
    EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
  }

 private:
  // cuBLAS pays 29-45 ms on its first batched GEMMs (measured on an H100, inside timed
  // mini-batches; not module loading). Pay it here, once, on tiny products of every transpose
  // combination the encoder uses: afterwards those calls took 0.13 ms.
  void warm_up_cublas() {
    constexpr int n = 64, batch = 2;
    float* buf = nullptr;
    const float** ptrs = nullptr;
    EDBATCH_CUDA_CHECK(cudaMalloc(&buf, sizeof(float) * 3 * batch * n * n));
    EDBATCH_CUDA_CHECK(cudaMalloc(&ptrs, sizeof(float*) * 3 * batch));
    EDBATCH_CUDA_CHECK(cudaMemsetAsync(buf, 0, sizeof(float) * 3 * batch * n * n, stream_));
    const float* host[3 * batch];
    for (int i = 0; i < 3 * batch; ++i) host[i] = buf + static_cast<size_t>(i) * n * n;
    EDBATCH_CUDA_CHECK(
        cudaMemcpyAsync(ptrs, host, sizeof(host), cudaMemcpyHostToDevice, stream_));
    const float one = 1.0f;
    const cublasOperation_t ops[3][2] = {
        {CUBLAS_OP_N, CUBLAS_OP_N}, {CUBLAS_OP_N, CUBLAS_OP_T}, {CUBLAS_OP_T, CUBLAS_OP_N}};
    for (const auto& op : ops) {
      EDBATCH_CUBLAS_CHECK(cublasSgemmBatched(blas_, op[0], op[1], n, n, n, &one, ptrs, n,
                                              ptrs + batch, n, &one,
                                              const_cast<float* const*>(ptrs + 2 * batch), n,
                                              batch));
      EDBATCH_CUBLAS_CHECK(cublasSgemm(blas_, op[0], op[1], n, n, n, &one, buf, n, buf + n * n,
                                       n, &one, buf + 2 * n * n, n));
    }
    EDBATCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
    EDBATCH_CUDA_CHECK(cudaFree(ptrs));
    EDBATCH_CUDA_CHECK(cudaFree(buf));
  }
  CudaBackend& self() const { return const_cast<CudaBackend&>(*this); }
  std::array<StagingRing*, 3> rings() {
    return {&forward_staging_, &backward_staging_, &interop_staging_};
  }

  void sync_params(ParameterCollection& pc) {
    pc_ = &pc;
    if (params_.values_version == pc.version()) return;
    // The host copies are the ones to upload: bring them up to date first (a fetch of ours or
    // of another device's is pending when the device updated them).
    pc.fetch_from_device();
    wait();  // the staging may still feed a queued copy
    params_.layout(pc, stream_);
    params_.upload_values(stream_);
    params_.values_version = pc.version();
    params_.grads_version = UINT64_MAX;  // the layout may have moved: upload before backward
    values_newer_ = grads_newer_ = false;
  }

  void upload_grads_if_changed(ParameterCollection& pc) {
    if (params_.grads_version == pc.version()) return;
    wait();
    params_.upload_grads(stream_);
    params_.grads_version = pc.version();
    grads_newer_ = false;
  }

  // The pending fetch left in the collection: host copies of what the device changed.
  void fetch_params() {
    wait();
    if (values_newer_) params_.download_values(stream_);
    if (grads_newer_) params_.download_grads(stream_);
    values_newer_ = grads_newer_ = false;
  }

  // Waits for all queued work. An asynchronous error becomes an exception naming the passes
  // queued since the last wait and their kernel ranges.
  void wait() {
    if (!queued_work_) return;  // value() reads node by node: nothing to wait for after the first
    check_async(cudaStreamSynchronize(stream_));
    collect_timings();
    queued_work_ = false;
  }
  void wait_event(cudaEvent_t ev) {
    check_async(cudaEventSynchronize(ev));
    collect_timings();
  }
  void check_async(cudaError_t e) {
    if (e == cudaSuccess) {
      if (cudaStreamQuery(stream_) == cudaSuccess) queued_.clear();
      return;
    }
    std::string names, where;
    for (const auto& [name, kernels] : queued_) {
      names += (names.empty() ? "" : ", ") + name;
      where += (where.empty() ? "" : "; ") + kernels;
    }
    if (names.empty()) names = "device";
    if (where.empty()) where = "no kernel";
    queued_.clear();
    throw std::runtime_error("[cuda] " + names + ": asynchronous error " + cudaGetErrorString(e) +
                             " in " + where +
                             "; CudaOptions::sync_each_launch (EDBATCH_CUDA_SYNC=1) checks after "
                             "every kernel and names the failing one");
  }

  // Device time of finished passes (CUDA events): the latest finished forward and backward.
  void collect_timings() {
    for (size_t i = 0; i < timings_.size(); ++i) {
      Timing& t = timings_[(next_timing_ + i) % timings_.size()];  // oldest first
      if (!t.queued || cudaEventQuery(t.stop) != cudaSuccess) continue;
      float ms = 0;
      EDBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
      (t.forward ? counters_.device_forward_ms : counters_.device_backward_ms) = ms;
      t.queued = false;
    }
  }

  Pass new_pass(const PlanRef& p, bool forward) {
    Pass pass;
    pass.p = &p;
    pass.forward = forward;
    pass.values = values_.as();
    pass.adjoints = adjoints_.as();
    pass.params = params_.values.as();
    pass.grads = params_.grads.as();
    pass.param_offset = params_.offset.data();
    pass.fused_linear = options_.fused_linear;
    return pass;
  }

  // Encodes, growing scratch and the ones vector and encoding again when they were too small.
  void encode(Pass& pass) {
    for (;;) {
      pass.scratch = scratch_.as();
      pass.scratch_floats = scratch_.bytes() / sizeof(float);
      pass.ones = ones_.as();
      pass.ones_floats = ones_.bytes() / sizeof(float);
      encode_pass(pass);
      bool again = false;
      if (pass.scratch_need > pass.scratch_floats) {
        scratch_.reserve(pass.scratch_need * sizeof(float), stream_);
        ++counters_.arena_growths;
        again = true;
      }
      if (pass.ones_need > pass.ones_floats) {
        ones_.reserve(pass.ones_need * sizeof(float), stream_);
        launch_fill(ones_.as(), ones_.bytes() / sizeof(float), 1.0f, stream_);
        again = true;
      }
      if (!again) return;
    }
  }

  template <class T>
  static size_t put(char* staging, size_t at, const T* v, size_t n) {
    if (n > 0 && staging) std::memcpy(staging + at, v, n * sizeof(T));
    return align_up(at + n * sizeof(T));
  }
  template <class T>
  static size_t put(char* staging, size_t at, const std::vector<T>& v) {
    return put(staging, at, v.data(), v.size());
  }

  // One copy: the plan's operand metadata, the parameter offsets, the pass's GEMM pointer arrays
  // and the graph's input values; then the inputs move to their place in the arena.
  void upload_forward(const PlanRef& p, const Pass& pass) {
    const MemoryPlan& plan = p.plan;
    const std::vector<float>& inputs = p.graph.input_values();
    if (device_inputs_ && device_input_floats_ > inputs.size()) {
      device_inputs_ = nullptr;
      throw std::invalid_argument("[cuda] inputs_from_device: " +
                                  std::to_string(device_input_floats_) +
                                  " floats, but the graph has " + std::to_string(inputs.size()));
    }
    // Input values the caller's device memory provides are not uploaded.
    const size_t skip = device_inputs_ ? device_input_floats_ : 0;
    const float* host_inputs = inputs.data() + skip;
    const size_t host_floats = inputs.size() - skip;
    size_t at = 0;
    const size_t at_offsets = at;
    at = put(nullptr, at, params_.offset);
    const size_t at_operands = at;
    at = put(nullptr, at, plan.operands);
    const size_t at_members = at;
    at = put(nullptr, at, plan.member_operands);
    const size_t at_index = at;
    at = put(nullptr, at, plan.index);
    const size_t at_aux = at;
    at = put(nullptr, at, plan.aux);
    const size_t at_inputs = at;
    at = put(nullptr, at, host_inputs, host_floats);
    const size_t at_ptrs = at;
    at = put_pass(nullptr, at, pass);
    PinnedBuffer& staging = acquire(forward_staging_, std::max<size_t>(at, 1));
    forward_meta_.reserve(std::max<size_t>(at, 1), stream_);
    char* h = staging.as<char>();
    put(h, at_offsets, params_.offset);
    put(h, at_operands, plan.operands);
    put(h, at_members, plan.member_operands);
    put(h, at_index, plan.index);
    put(h, at_aux, plan.aux);
    put(h, at_inputs, host_inputs, host_floats);
    put_pass(h, at_ptrs, pass);
    char* d = forward_meta_.as<char>();
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(d, h, at, cudaMemcpyHostToDevice, stream_));
    release(forward_staging_);
    // Fused GEMM steps add their partial sums into zeroed outputs.
    EDBATCH_CUDA_CHECK(
        cudaMemsetAsync(values_.as(), 0, static_cast<size_t>(plan.total_floats) * sizeof(float), stream_));
    if (host_floats > 0)
      EDBATCH_CUDA_CHECK(cudaMemcpyAsync(values_.as() + plan.input_offset + skip, d + at_inputs,
                                         host_floats * sizeof(float), cudaMemcpyDeviceToDevice,
                                         stream_));
    if (device_inputs_) {  // DeviceInterop::inputs_from_device: the caller's device memory
      const float* src = device_inputs_;
      device_inputs_ = nullptr;
      if (skip > 0)
        EDBATCH_CUDA_CHECK(cudaMemcpyAsync(values_.as() + plan.input_offset, src,
                                           skip * sizeof(float), cudaMemcpyDeviceToDevice,
                                           stream_));
    }
    view_ = DeviceView{};
    view_.values = values_.as();
    view_.adjoints = adjoints_.as();
    view_.params = params_.values.as();
    view_.grads = params_.grads.as();
    view_.param_offset = reinterpret_cast<const uint32_t*>(d + at_offsets);
    view_.operands = reinterpret_cast<const Operand*>(d + at_operands);
    view_.member_operands = reinterpret_cast<const Operand*>(d + at_members);
    view_.index = reinterpret_cast<const uint32_t*>(d + at_index);
    view_.aux = reinterpret_cast<const uint32_t*>(d + at_aux);
    pass_data_at(d, at_ptrs, pass);
  }

  void upload_pointers(const Pass& pass, DeviceBuffer& meta, StagingRing& ring, size_t at) {
    const size_t end = put_pass(nullptr, at, pass);
    PinnedBuffer& staging = acquire(ring, std::max<size_t>(end, 1));
    meta.reserve(std::max<size_t>(end, 1), stream_);
    put_pass(staging.as<char>(), at, pass);
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(meta.as<char>(), staging.as<char>(), end,
                                       cudaMemcpyHostToDevice, stream_));
    release(ring);
    pass_data_at(meta.as<char>(), at, pass);
  }

  // The ring's next buffer, at least `bytes` large, once the copy it last fed is done.
  PinnedBuffer& acquire(StagingRing& ring, size_t bytes) {
    if (ring.queued[ring.next]) {
      wait_event(ring.copied[ring.next]);
      ring.queued[ring.next] = false;
    }
    PinnedBuffer& b = ring.buffers[ring.next];
    b.reserve(bytes);
    return b;
  }
  // spans_ = one span (place of the node's floats, running offset, floats) per node: first those
  // in the arena, then parameters in the mirror (a parameter node has no arena offset; reshape
  // refuses parameters, so no view of one has either; the forward pass laid out the mirror).
  // Returns how many spans are in the arena; *floats gets the sum of the nodes' sizes.
  uint32_t node_spans(const Graph& g, const MemoryPlan& plan, const std::vector<uint32_t>& nodes,
                      uint32_t* floats) {
    std::vector<uint32_t>& spans = spans_;
    std::vector<uint32_t>& param_spans = param_spans_;
    spans.clear();
    param_spans.clear();
    uint32_t at = 0;
    for (uint32_t v : nodes) {
      const Node& n = g.node(v);
      const uint32_t size = n.dim.size();
      if (n.op == Op::Parameter)
        param_spans.insert(param_spans.end(), {params_.offset[n.aux], at, size});
      else
        spans.insert(spans.end(), {plan.node_offset[v], at, size});
      at += size;
    }
    const uint32_t from_arena = static_cast<uint32_t>(spans.size() / 3);
    spans.insert(spans.end(), param_spans.begin(), param_spans.end());
    *floats = at;
    return from_arena;
  }

  // Copies `bytes` that the caller wrote into the interop ring's current buffer `h` to the
  // device (interop_meta_, reused in stream order); returns their device address.
  const char* upload_interop(const char* h, size_t bytes) {
    interop_meta_.reserve(bytes, stream_);
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(interop_meta_.as<char>(), h, bytes, cudaMemcpyHostToDevice,
                                       stream_));
    release(interop_staging_);
    return interop_meta_.as<char>();
  }
  void release(StagingRing& ring) {
    EDBATCH_CUDA_CHECK(cudaEventRecord(ring.copied[ring.next], stream_));
    ring.queued[ring.next] = true;
    ring.next = (ring.next + 1) % StagingRing::kDepth;
  }

  // The pass's own data, after the plan's: GEMM pointer arrays, the hoisted lookups, and for
  // chained launches the step groups, fused GEMM descriptions, stages, ticket map and zeroed
  // counters.
  size_t put_pass(char* h, size_t at, const Pass& pass) const {
    at = put(h, at, pass.ptrs);
    at = put(h, at, pass.lookups);
    at = put(h, at, pass.lookup_starts);
    if (stages_.empty()) return at;
    at = put(h, at, pass.groups);
    at = put(h, at, pass.linears);
    at = put(h, at, stages_);
    at = put(h, at, stage_of_);
    if (h) std::memset(h + at, 0, counters_floats_ * sizeof(uint32_t));
    return align_up(at + counters_floats_ * sizeof(uint32_t));
  }
  void pass_data_at(char* d, size_t at, const Pass& pass) {
    ptrs_ = reinterpret_cast<const float* const*>(d + at);
    at = put(nullptr, at, pass.ptrs);
    lookups_ = reinterpret_cast<const StepDesc*>(d + at);
    at = put(nullptr, at, pass.lookups);
    lookup_starts_ = reinterpret_cast<const uint32_t*>(d + at);
    lookup_blocks_ = pass.lookup_starts.empty() ? 0 : pass.lookup_starts.back();
    at = put(nullptr, at, pass.lookup_starts);
    if (stages_.empty()) return;
    device_groups_ = reinterpret_cast<const StepGroup*>(d + at);
    at = put(nullptr, at, pass.groups);
    device_linears_ = reinterpret_cast<const LinearDesc*>(d + at);
    at = put(nullptr, at, pass.linears);
    device_stages_ = reinterpret_cast<const Stage*>(d + at);
    at = put(nullptr, at, stages_);
    device_stage_of_ = reinterpret_cast<const uint16_t*>(d + at);
    at = put(nullptr, at, stage_of_);
    device_counters_ = reinterpret_cast<uint32_t*>(d + at);
  }

  // The stage a command runs as in a chained launch and its thread blocks, or false when it cannot
  // be chained (cuBLAS, gathers and scatters are launched on their own).
  bool stage_of_command(const Pass& pass, const Command& c, Stage* st, uint32_t* blocks) const {
    *st = Stage{0, c.group, c.group2, 0};
    switch (c.kind) {
      case Command::Kind::Steps:
        st->kind = pass.forward ? Stage::StepsForward : Stage::StepsBackward;
        break;
      case Command::Kind::LinearForward: st->kind = Stage::LinearForward; break;
      case Command::Kind::LinearBackward: st->kind = Stage::LinearBackward; break;
      case Command::Kind::Lookups:
        st->kind = pass.forward ? Stage::LookupsForward : Stage::LookupsBackward;
        st->index = c.count;
        break;
      default: return false;
    }
    *blocks = stage_blocks(*st, pass.groups.data(), pass.linears.data(),
                           pass.lookup_starts.empty() ? 0 : pass.lookup_starts.back());
    return true;
  }

  // Splits the pass into launches: each run of two or more commands that can be chained becomes
  // one chained launch (CudaOptions::chain, not with sync_each_launch); every other command is a
  // launch of its own.
  void plan_launches(const Pass& pass) {
    launches_.clear();
    stages_.clear();
    stage_of_.clear();
    counters_floats_ = 0;
    const uint32_t n = static_cast<uint32_t>(pass.commands.size());
    const bool chain = (options_.chain == CudaOptions::Chain::All ||
                        (options_.chain == CudaOptions::Chain::Forward && pass.forward)) &&
                       !options_.sync_each_launch;
    for (uint32_t i = 0; i < n;) {
      Launch l{i, i};
      l.stage_begin = static_cast<uint32_t>(stages_.size());
      l.map_begin = static_cast<uint32_t>(stage_of_.size());
      l.counter_begin = counters_floats_;
      Stage st{};
      uint32_t blocks = 0;
      while (chain && l.end < n && l.stages < kMaxChainStages &&
             stage_of_command(pass, pass.commands[l.end], &st, &blocks)) {
        if (blocks > 0) {
          st.first = l.blocks;
          stages_.push_back(st);
          stage_of_.insert(stage_of_.end(), blocks, static_cast<uint16_t>(l.stages));
          l.blocks += blocks;
          ++l.stages;
        }
        ++l.end;
      }
      if (l.end - l.begin < 2 || l.stages == 0) {  // command i on its own
        stages_.resize(l.stage_begin);
        stage_of_.resize(l.map_begin);
        launches_.push_back(Launch{i, i + 1});
        ++i;
        continue;
      }
      counters_floats_ += chain_counters(l.stages);
      launches_.push_back(l);
      i = l.end;
    }
  }

  std::string describe(const Command& c, const char* pass) const {
    return std::string("kernel '") + c.what + "' of the " + pass + " pass (batch " +
           std::to_string(c.batch) + ")";
  }

  std::string describe(const Pass& pass, const Launch& l, const char* name) const {
    const Command& c = pass.commands[l.begin];
    if (l.stages == 0) return describe(c, name);
    return "a chained launch of " + std::to_string(l.end - l.begin) + " kernels, from " +
           describe(c, name) + " to " + describe(pass.commands[l.end - 1], name);
  }
  const char* launch_name(const Pass& pass, const Launch& l) const {
    if (l.stages > 0) return forward_ ? "chained launch (forward)" : "chained launch (backward)";
    return pass.commands[l.begin].what;
  }

  const LinearDesc* second_linear(const Command& c) const {
    return c.group2 == kNoOperand ? nullptr : &linears_[c.group2];
  }

  void launch(const Command& c) {
    static const float one = 1.0f;
    switch (c.kind) {
      case Command::Kind::Steps:
        launch_steps(view_, groups_[c.group], forward_, stream_);
        return;
      case Command::Kind::Gather:
        launch_gather(view_, c.operand, c.count, c.k, c.per_node, c.buffer, stream_);
        return;
      case Command::Kind::Scatter:
        launch_scatter_add(view_, c.operand, c.count, c.k, c.per_node, c.buffer, stream_);
        return;
      case Command::Kind::Gemm:
        EDBATCH_CUBLAS_CHECK(cublasSgemm(blas_, c.ta, c.tb, c.m, c.n, c.kk, &c.alpha, c.a, c.lda,
                                         c.b, c.ldb, &c.beta, c.c, c.ldc));
        return;
      case Command::Kind::GemmBatched: {
        const float* const* a = ptrs_ + c.ptr_begin;
        const float* const* b = a + c.batch_count;
        float* const* cc = const_cast<float* const*>(b + c.batch_count);
        EDBATCH_CUBLAS_CHECK(cublasSgemmBatched(blas_, c.ta, c.tb, c.m, c.n, c.kk, &c.alpha, a,
                                                c.lda, b, c.ldb, &c.beta, cc, c.ldc,
                                                c.batch_count));
        return;
      }
      case Command::Kind::LinearForward:
        launch_linear_forward(view_, linears_[c.group], second_linear(c), stream_);
        return;
      case Command::Kind::LinearBackward:
        launch_linear_backward(view_, linears_[c.group], second_linear(c), stream_);
        return;
      case Command::Kind::Lookups:
        launch_lookups(view_, lookups_, lookup_starts_, c.count, lookup_blocks_, forward_, stream_);
        return;
      case Command::Kind::Gemv:
        EDBATCH_CUBLAS_CHECK(cublasSgemv(blas_, CUBLAS_OP_N, c.m, c.n, &one, c.a, c.lda, c.b, 1,
                                         &c.beta, c.c, 1));
        return;
    }
  }

  // Queues the pass's launches; waits only in the debugging modes (sync after every kernel,
  // profile).
  void run_pass(Pass& pass, const char* name) {
    groups_ = std::move(pass.groups);
    linears_ = std::move(pass.linears);
    forward_ = pass.forward;
    if (options_.profile) profile_events(launches_.size() + 1);
    Timing& timing = timings_[next_timing_];
    next_timing_ = (next_timing_ + 1) % timings_.size();
    if (timing.queued) wait_event(timing.stop);
    timing.forward = pass.forward;
    const auto host_start = std::chrono::steady_clock::now();
    EDBATCH_CUDA_CHECK(cudaEventRecord(timing.start, stream_));
    for (size_t i = 0; i < launches_.size(); ++i) {
      const Launch& l = launches_[i];
      if (options_.profile) EDBATCH_CUDA_CHECK(cudaEventRecord(events_[i], stream_));
      try {
        if (l.stages > 0)
          launch_chain(view_,
                       Chain{device_stages_ + l.stage_begin, device_stage_of_ + l.map_begin,
                             device_counters_ + l.counter_begin,
                             device_groups_, device_linears_, lookups_, lookup_starts_, l.blocks},
                       stream_);
        else
          launch(pass.commands[l.begin]);
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(std::string(e.what()) + " in " + describe(pass, l, name));
      }
      cudaError_t e = cudaPeekAtLastError();
      if (e == cudaSuccess && options_.sync_each_launch) e = cudaStreamSynchronize(stream_);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw std::runtime_error(std::string("[cuda] ") + cudaGetErrorString(e) + " in " +
                                 describe(pass, l, name));
      }
    }
    if (options_.profile) EDBATCH_CUDA_CHECK(cudaEventRecord(events_[launches_.size()], stream_));
    EDBATCH_CUDA_CHECK(cudaEventRecord(timing.stop, stream_));
    timing.queued = true;
    const double host_ms = std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - host_start).count();
    std::string where = "no kernel";
    if (!pass.commands.empty())
      where = std::string(stages_.empty() ? "" : "chained launches running ") + "kernels from " +
              describe(pass.commands.front(), name) + " to " + describe(pass.commands.back(), name);
    queued_.push_back({name, where});
    if (queued_.size() > 8) queued_.erase(queued_.begin());
    queued_work_ = true;
    if (options_.profile) {
      wait();
      float ms = 0;
      EDBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, timing.start, timing.stop));
      profile_pass(pass, host_ms, ms);
    }
    counters_.kernels += launches_.size();
    for (const Launch& l : launches_) {  // a bias gradient that needs its own launch
      const Command& c = pass.commands[l.begin];
      if (l.stages == 0 && c.kind == Command::Kind::LinearBackward)
        for (uint32_t g : {c.group, c.group2})
          if (g != kNoOperand) counters_.kernels += linear_backward_launches(linears_[g]) - 1;
    }
    counters_.bytes_copied += pass.bytes_copied;
    counters_.arena_bytes = values_.bytes() + adjoints_.bytes() + scratch_.bytes();
  }

  // CudaOptions::profile: events around every launch; the totals by kernel go to stderr when the
  // backend is destroyed.
  void profile_events(size_t n) {
    while (events_.size() < n) {
      cudaEvent_t ev;
      EDBATCH_CUDA_CHECK(cudaEventCreate(&ev));
      events_.push_back(ev);
    }
  }

  void profile_pass(const Pass& pass, double host_ms, float device_ms) {
    for (size_t i = 0; i < launches_.size(); ++i) {
      float ms = 0;
      EDBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
      Profile& p = profiles_[launch_name(pass, launches_[i])];
      p.count += 1;
      p.ms += ms;
    }
    Profile& total = profiles_[pass.forward ? "(forward passes: host enqueue)" : "(backward passes: host enqueue)"];
    total.count += 1;
    total.ms += host_ms;
    Profile& span = profiles_[pass.forward ? "(forward passes: device span)" : "(backward passes: device span)"];
    span.count += 1;
    span.ms += device_ms;
  }

  double staging_grow_ms() const {
    double ms = 0;
    for (const StagingRing* ring : {&forward_staging_, &backward_staging_, &interop_staging_})
      for (const PinnedBuffer& b : ring->buffers) ms += b.grow_ms();
    return ms;
  }

  void print_profile() const {
    const std::pair<const char*, double> growth[] = {
        {"values", values_.grow_ms()},         {"adjoints", adjoints_.grow_ms()},
        {"scratch", scratch_.grow_ms()},       {"metadata", forward_meta_.grow_ms() + backward_meta_.grow_ms()},
        {"staging (pinned)", staging_grow_ms()},
        {"parameters", params_.values.grow_ms() + params_.grads.grow_ms() + params_.staging.grow_ms()}};
    for (const auto& [what, ms] : growth)
      std::fprintf(stderr, "[cuda] profile: growing %-26s %12.3f ms\n", what, ms);
    std::fprintf(stderr, "[cuda] profile: %-34s %9s %12s %10s\n", "kernel", "launches", "total ms",
                 "mean us");
    for (const auto& [what, p] : profiles_)
      std::fprintf(stderr, "[cuda] profile: %-34s %9llu %12.3f %10.2f\n", what.c_str(),
                   static_cast<unsigned long long>(p.count), p.ms, 1e3 * p.ms / p.count);
  }

  struct Profile {
    uint64_t count = 0;
    double ms = 0;
  };
  CudaOptions options_;
  std::vector<cudaEvent_t> events_;
  std::map<std::string, Profile> profiles_;

  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;  // own_stream_, or a caller's (DeviceInterop::use_stream)
  cudaEvent_t switch_ = nullptr;   // orders work across a stream switch
  cublasHandle_t blas_ = nullptr;
  const float* device_inputs_ = nullptr;  // DeviceInterop::inputs_from_device, for the next forward
  size_t device_input_floats_ = 0;
  std::vector<uint32_t> spans_, param_spans_;  // node_spans' lists
  std::vector<TransferDesc> transfer_descs_;
  DeviceBuffer interop_meta_;
  StagingRing interop_staging_;
  // Events around each queued pass, for its device time (read once it has finished).
  struct Timing {
    cudaEvent_t start = nullptr, stop = nullptr;
    bool forward = true, queued = false;
  };
  std::array<Timing, 16> timings_;
  size_t next_timing_ = 0;
  // Passes queued since the last wait: name and kernel range, for asynchronous errors.
  std::vector<std::pair<std::string, std::string>> queued_;
  // Values copied out by stage(), one slot per ticket modulo kStagedSlots.
  struct Staged {
    PinnedBuffer host;
    cudaEvent_t copied = nullptr;
    bool queued = false;
  };
  Staged staged_slots_[kStagedSlots];
  ParameterCollection* pc_ = nullptr;  // the collection mirrored (set at each pass)
  bool values_newer_ = false, grads_newer_ = false;  // the device's copies are ahead of the host
  bool queued_work_ = false;  // work queued since the last wait (interop copies count too)
  bool forward_ = true;  // the pass being launched
  std::vector<Launch> launches_;
  std::vector<Stage> stages_;       // every chained launch's stages
  std::vector<uint16_t> stage_of_;  // per ticket of each chained launch: its stage
  uint32_t counters_floats_ = 0;
  const Stage* device_stages_ = nullptr;
  const uint16_t* device_stage_of_ = nullptr;
  uint32_t* device_counters_ = nullptr;
  const StepGroup* device_groups_ = nullptr;
  const LinearDesc* device_linears_ = nullptr;
  DeviceBuffer values_, adjoints_, scratch_, ones_, forward_meta_, backward_meta_;
  StagingRing forward_staging_, backward_staging_;
  ParamMirror params_;
  DeviceView view_;
  const float* const* ptrs_ = nullptr;
  const StepDesc* lookups_ = nullptr;  // the pass's hoisted lookups (uploaded)
  const uint32_t* lookup_starts_ = nullptr;
  uint32_t lookup_blocks_ = 0;
  std::vector<StepGroup> groups_;
  std::vector<LinearDesc> linears_;
  const Graph* graph_ = nullptr;
  size_t total_floats_ = 0;
  mutable HostMirror values_mirror_, adjoints_mirror_;
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

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace edbatch
