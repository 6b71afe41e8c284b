#include "src/torch/cells.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

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
  int64_t instance = 0;
  for (int64_t k = 0; k < p.num_nodes; ++k) {
    while (p.instance_offsets[instance + 1] <= k) ++instance;
    const int64_t first = p.instance_offsets[instance];
    if (p.pred_ptr[k + 1] < p.pred_ptr[k]) fail(fmt::format("pred_ptr decreases at node {}", k));
    if (p.node_inputs[k] < -1 || p.node_inputs[k] >= p.num_x)
      fail(fmt::format("node {} reads x row {}, outside [-1, {})", k, p.node_inputs[k], p.num_x));
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
        fail(fmt::format("arc {} reads x row {}, outside [-1, {})", a, p.arc_inputs[a], p.num_x));
    }
  }
}

Parameter Cell::add(ParameterCollection& pc, const std::string& name, uint32_t rows,
                    uint32_t cols) {
  weights_.push_back({name, rows, cols});
  return pc.add_parameters(name, Dim{rows, std::max(cols, 1u)});
}

Runner::Runner(const CellConfig& config, const RunOptions& options)
    : pc_(1),
      engine_(pc_, EngineOptions{options.policy, options.device, options.threads}),
      graph_(pc_) {
  cell_ = make_cell(config, pc_);
  for (const WeightSpec& w : cell_->weights()) weight_params_.push_back({pc_.find(w.name)});
}

namespace {

// Row-major rows x cols (torch) to column-major rows x cols (edbatch), and back.
void to_column_major(const float* src, uint32_t rows, uint32_t cols, float* dst) {
  if (cols <= 1) {
    std::memcpy(dst, src, sizeof(float) * rows);
    return;
  }
  for (uint32_t i = 0; i < rows; ++i)
    for (uint32_t j = 0; j < cols; ++j) dst[static_cast<size_t>(j) * rows + i] = src[i * cols + j];
}

void to_row_major(const float* src, uint32_t rows, uint32_t cols, float* dst) {
  if (cols <= 1) {
    std::memcpy(dst, src, sizeof(float) * rows);
    return;
  }
  for (uint32_t i = 0; i < rows; ++i)
    for (uint32_t j = 0; j < cols; ++j) dst[i * cols + j] = src[static_cast<size_t>(j) * rows + i];
}

}  // namespace

bool Runner::wait_each_call() {
  static const bool wait = [] {
    const char* v = std::getenv("EDBATCH_TORCH_WAIT");
    return v != nullptr && std::string(v) != "0";
  }();
  return wait;
}

DeviceInterop& Runner::interop(const char* fn) {
  DeviceInterop* io = engine_.device_interop();
  if (!io)
    throw std::invalid_argument(std::string("[") + fn + "] device memory given, but the engine "
                                "runs on " + engine_.options().device);
  return *io;
}

void Runner::forward(const Packed& p, const std::vector<const float*>& weights,
                     const std::vector<float*>& outputs, bool for_backward, bool on_device,
                     void* stream) {
  const char* fn = "edbatch.forward";
  check_packed(p, fn);
  cell_->check(p, fn);
  const std::vector<WeightSpec>& specs = cell_->weights();
  if (on_device) {
    DeviceInterop& io = interop(fn);
    io.use_stream(stream);
    transfers_.clear();
    for (size_t i = 0; i < specs.size(); ++i)
      transfers_.push_back({weight_params_[i].id, const_cast<float*>(weights[i]), specs[i].cols > 1});
    io.write_parameters(pc_, transfers_);
  } else {
    for (size_t i = 0; i < specs.size(); ++i)
      to_column_major(weights[i], specs[i].rows, specs[i].cols, pc_.values(weight_params_[i].id));
    pc_.mark_changed();  // device backends upload the parameters again
  }
  on_device_ = on_device;
  num_nodes_ = p.num_nodes;
  num_x_ = p.num_x;
  have_graph_ = false;
  if (p.num_nodes == 0) return;

  graph_.clear();
  const std::vector<uint32_t> segments = cell_->input_segments();
  x_.clear();
  if (on_device) zeros_.assign(static_cast<size_t>(p.x_dim), 0.0f);
  for (int64_t r = 0; r < p.num_x; ++r) {
    // On the device the x rows are the graph's first input values, filled from p.x there.
    const float* row = on_device ? zeros_.data() : p.x + r * p.x_dim;
    for (uint32_t size : segments) {
      x_.push_back(input(graph_, Dim{size, 1}, row));
      row += size;
    }
  }
  const uint32_t nout = cell_->num_outputs();
  out_.assign(static_cast<size_t>(nout) * p.num_nodes, Expr{});
  cell_->build(graph_, p, x_, out_);

  // Backward seeds the outputs' adjoints directly (Engine::backward from outputs).
  const Expr target = out_[0];
  if (on_device) {
    DeviceInterop& io = interop(fn);
    io.inputs_from_device(p.x, static_cast<size_t>(p.num_x * p.x_dim));
    engine_.submit(graph_, target);  // queued; nothing waits for it
    for (uint32_t o = 0; o < nout; ++o) {
      ids_.clear();
      for (int64_t k = 0; k < p.num_nodes; ++k) ids_.push_back(out_[o * p.num_nodes + k].id);
      io.read_nodes(graph_, engine_.plan(), ids_, outputs[o], false);
    }
    if (wait_each_call()) engine_.synchronize();
    have_graph_ = for_backward;
    return;
  }
  engine_.forward(graph_, target);
  for (uint32_t o = 0; o < nout; ++o) {
    const uint32_t size = cell_->output_size(o);
    for (int64_t k = 0; k < p.num_nodes; ++k) {
      const Tensor t = engine_.value(out_[o * p.num_nodes + k]);
      std::memcpy(outputs[o] + k * size, t.data, sizeof(float) * size);
    }
  }
  have_graph_ = for_backward;
}

void Runner::backward(const float* out_grad, float* grad_x, const std::vector<float*>& grad_weights,
                      void* stream) {
  const std::vector<WeightSpec>& specs = cell_->weights();
  const uint32_t D = cell_->input_dim();
  if (on_device_) {
    backward_on_device(out_grad, grad_x, grad_weights, stream);
    return;
  }
  std::fill(grad_x, grad_x + num_x_ * D, 0.0f);
  if (!have_graph_) {
    for (size_t i = 0; i < specs.size(); ++i)
      std::fill(grad_weights[i], grad_weights[i] + specs[i].rows * std::max(specs[i].cols, 1u),
                0.0f);
    if (num_nodes_ == 0) return;
    throw std::runtime_error("[edbatch.backward] forward was not run for backward");
  }
  pc_.zero_grads();
  engine_.backward(graph_, out_, out_grad);
  const std::vector<uint32_t> segments = cell_->input_segments();
  float* row = grad_x;
  for (size_t i = 0; i < x_.size(); ++i) {
    const uint32_t size = segments[i % segments.size()];
    const Tensor t = engine_.gradient(x_[i]);
    std::memcpy(row, t.data, sizeof(float) * size);
    row += size;
  }
  for (size_t i = 0; i < specs.size(); ++i)
    to_row_major(pc_.grads(weight_params_[i].id), specs[i].rows, specs[i].cols, grad_weights[i]);
}

void Runner::read_gradients(DeviceInterop& io, const std::vector<float*>& grad_weights) {
  const std::vector<WeightSpec>& specs = cell_->weights();
  transfers_.clear();
  for (size_t i = 0; i < specs.size(); ++i)
    transfers_.push_back({weight_params_[i].id, grad_weights[i], specs[i].cols > 1});
  io.read_gradients(pc_, transfers_);
}

// The backward of a forward on device memory: the seeds, the gradients and grad_x move on the
// device; nothing waits.
void Runner::backward_on_device(const float* out_grad, float* grad_x,
                                const std::vector<float*>& grad_weights, void* stream) {
  DeviceInterop& io = interop("edbatch.backward");
  io.use_stream(stream);
  if (!have_graph_) {
    if (num_nodes_ != 0) throw std::runtime_error("[edbatch.backward] forward was not run for backward");
    // No nodes: every gradient is zero.
    io.zero_gradients(pc_);
    read_gradients(io, grad_weights);
    return;
  }
  io.zero_gradients(pc_);
  engine_.backward(graph_, out_, out_grad, true);
  ids_.clear();
  for (const Expr& x : x_) ids_.push_back(x.id);
  io.read_nodes(graph_, engine_.plan(), ids_, grad_x, true);
  read_gradients(io, grad_weights);
  if (wait_each_call()) engine_.synchronize();
}

}  // namespace edbatch::torch_adapter
