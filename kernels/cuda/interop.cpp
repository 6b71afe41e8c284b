// DeviceInterop: parameters, gradients, inputs, node values and backward seeds between a caller's
// device memory and the backend's, on the backend's (or the caller's) stream.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

void CudaInterop::use_stream(void* stream) { queue_.switch_to(static_cast<cudaStream_t>(stream)); }

void CudaInterop::use_own_stream() { queue_.switch_to(queue_.own_stream()); }

void CudaInterop::write_parameter(ParameterCollection& pc, uint32_t id, const float* src,
                                  size_t offset, size_t floats, bool row_major) {
  params_.sync(pc);
  queue_.mark_queued();
  const Dim d = pc.dim(id);
  if (offset + floats > d.size())
    throw std::invalid_argument("[cuda] write_parameter: floats " + std::to_string(offset) +
                                "+" + std::to_string(floats) + " out of range for '" +
                                pc.name(id) + "' " + to_string(d));
  const ParamMirror& m = params_.mirror();
  float* dst = m.values.as() + m.offset[id] + offset;
  if (row_major && d.cols > 1) {
    if (offset != 0 || floats != d.size() || !src)
      throw std::invalid_argument("[cuda] write_parameter: a row-major write covers the whole "
                                  "parameter '" + pc.name(id) + "'");
    launch_transpose(src, d.rows, d.cols, dst, queue_.stream());
    EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
  } else if (src) {
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(dst, src, floats * sizeof(float),
                                       cudaMemcpyDeviceToDevice, queue_.stream()));
  } else {
    EDBATCH_CUDA_CHECK(cudaMemsetAsync(dst, 0, floats * sizeof(float), queue_.stream()));
  }
  params_.device_wrote(pc, true, false);
}

void CudaInterop::read_gradient(ParameterCollection& pc, uint32_t id, float* dst, bool row_major) {
  params_.sync(pc);
  queue_.mark_queued();
  params_.upload_grads_if_changed(pc);
  const Dim d = pc.dim(id);
  const ParamMirror& m = params_.mirror();
  const float* src = m.grads.as() + m.offset[id];
  if (row_major && d.cols > 1) {
    // column-major = cols x rows row-major
    launch_transpose(src, d.cols, d.rows, dst, queue_.stream());
    EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
  } else {
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(dst, src, d.size() * sizeof(float),
                                       cudaMemcpyDeviceToDevice, queue_.stream()));
  }
}

void CudaInterop::write_parameters(ParameterCollection& pc, const std::vector<Transfer>& t) {
  params_.sync(pc);
  transfers(pc, t, true);
  params_.device_wrote(pc, true, false);
}

void CudaInterop::read_gradients(ParameterCollection& pc, const std::vector<Transfer>& t) {
  params_.sync(pc);
  params_.upload_grads_if_changed(pc);
  transfers(pc, t, false);
}

// Descriptors for the transfers kernel, uploaded through the interop staging.
void CudaInterop::transfers(ParameterCollection& pc, const std::vector<Transfer>& t, bool write) {
  if (t.empty()) return;
  queue_.mark_queued();
  std::vector<TransferDesc>& descs = transfer_descs_;
  descs.clear();
  uint64_t max_floats = 0;
  const ParamMirror& m = params_.mirror();
  for (const Transfer& x : t) {
    Dim d = pc.dim(x.id);
    if (x.cols != 0 && x.cols < d.cols) d.cols = x.cols;
    float* mirror = (write ? m.values.as() : m.grads.as()) + m.offset[x.id];
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
  char* h = uploads_.interop_staging(bytes).as<char>();
  std::memcpy(h, descs.data(), bytes);
  const char* d = uploads_.upload_interop(h, bytes);
  launch_transfers(reinterpret_cast<const TransferDesc*>(d), static_cast<uint32_t>(descs.size()),
                   max_floats, queue_.stream());
  EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
}

void CudaInterop::zero_gradients(ParameterCollection& pc) {
  params_.sync(pc);
  queue_.mark_queued();
  ParamMirror& m = params_.mirror();
  EDBATCH_CUDA_CHECK(cudaMemsetAsync(m.grads.as(), 0,
                                     std::max<size_t>(m.floats, 1) * sizeof(float),
                                     queue_.stream()));
  m.grads_version = pc.version();
  params_.device_wrote(pc, false, true);
}

void CudaInterop::inputs_from_device(const float* src, size_t floats, size_t first_input) {
  uploads_.inputs_from_device(src, floats, first_input);
}

void CudaInterop::read_nodes(const Graph& g, const MemoryPlan& plan,
                             const std::vector<uint32_t>& nodes, float* dst, bool adjoints) {
  if (nodes.empty()) return;
  queue_.mark_queued();
  if (&g != arenas_.graph || plan.total_floats != arenas_.total_floats)
    throw std::invalid_argument("[cuda] read_nodes: not the graph of the last forward pass");
  uint32_t to = 0;
  const uint32_t from_arena = node_spans(g, plan, nodes, &to);
  const std::vector<uint32_t>& spans = spans_;
  const size_t bytes = spans.size() * sizeof(uint32_t);
  char* h = uploads_.interop_staging(bytes).as<char>();
  std::memcpy(h, spans.data(), bytes);
  const uint32_t* d_spans = reinterpret_cast<const uint32_t*>(uploads_.upload_interop(h, bytes));
  if (from_arena > 0)
    launch_gather_spans(adjoints ? arenas_.adjoints.as() : arenas_.values.as(), d_spans,
                        from_arena, dst, queue_.stream());
  const uint32_t from_params = static_cast<uint32_t>(spans.size() / 3) - from_arena;
  const ParamMirror& m = params_.mirror();
  if (from_params > 0)
    launch_gather_spans(adjoints ? m.grads.as() : m.values.as(), d_spans + 3 * from_arena,
                        from_params, dst, queue_.stream());
  EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
}

// Spans (destination offset, seed offset, floats) into the arena's adjoints, then into the
// gradients of parameter nodes; host seeds travel with the spans.
void CudaInterop::add_seeds(const PlanRef& p, const BackwardSeed& seed) {
  uint32_t at = 0;
  const uint32_t from_arena = node_spans(p.graph, p.plan, *seed.nodes, &at);
  if (at == 0) return;
  const std::vector<uint32_t>& spans = spans_;
  const size_t span_bytes = spans.size() * sizeof(uint32_t);
  const size_t seed_at = align_up(span_bytes);
  const size_t bytes = seed_at + (seed.on_device ? 0 : size_t{at} * sizeof(float));
  char* h = uploads_.interop_staging(bytes).as<char>();
  std::memcpy(h, spans.data(), span_bytes);
  if (!seed.on_device) std::memcpy(h + seed_at, seed.values, size_t{at} * sizeof(float));
  const char* d = uploads_.upload_interop(h, bytes);
  const float* src = seed.on_device ? seed.values : reinterpret_cast<const float*>(d + seed_at);
  const uint32_t* d_spans = reinterpret_cast<const uint32_t*>(d);
  if (from_arena > 0)
    launch_add_spans(src, d_spans, from_arena, arenas_.adjoints.as(), queue_.stream());
  const uint32_t from_params = static_cast<uint32_t>(spans.size() / 3) - from_arena;
  if (from_params > 0)
    launch_add_spans(src, d_spans + 3 * from_arena, from_params, params_.mirror().grads.as(),
                     queue_.stream());
  EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
}

// spans_ = one span (place of the node's floats, running offset, floats) per node: first those
// in the arena, then parameters in the mirror (a parameter node has no arena offset; reshape
// refuses parameters, so no view of one has either; the forward pass laid out the mirror).
// Returns how many spans are in the arena; *floats gets the sum of the nodes' sizes.
uint32_t CudaInterop::node_spans(const Graph& g, const MemoryPlan& plan,
                                 const std::vector<uint32_t>& nodes, uint32_t* floats) {
  std::vector<uint32_t>& spans = spans_;
  std::vector<uint32_t>& param_spans = param_spans_;
  spans.clear();
  param_spans.clear();
  const std::vector<uint32_t>& param_offset = params_.mirror().offset;
  uint32_t at = 0;
  for (uint32_t v : nodes) {
    const Node& n = g.node(v);
    const uint32_t size = n.dim.size();
    if (n.op == Op::Parameter)
      param_spans.insert(param_spans.end(), {param_offset[n.aux], at, size});
    else
      spans.insert(spans.end(), {plan.node_offset[v], at, size});
    at += size;
  }
  const uint32_t from_arena = static_cast<uint32_t>(spans.size() / 3);
  spans.insert(spans.end(), param_spans.begin(), param_spans.end());
  *floats = at;
  return from_arena;
}

}  // namespace edbatch::cuda
