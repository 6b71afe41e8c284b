#include "src/torch/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace edbatch::torch_adapter {

Decoder::Decoder(const CellConfig& config, const RunOptions& options)
    : pc_(1), engine_(pc_, options.engine_options()), graph_(pc_) {
  cell_ = make_cell(config, pc_);
  for (const WeightSpec& w : cell_->weights()) weight_params_.push_back({pc_.find(w.name)});
}

void Decoder::check_instance(const char* fn, int64_t id) const {
  if (id < 0 || id >= num_instances_)
    throw std::invalid_argument(
        fmt::format("[{}] instance id {} outside [0, {})", fn, id, num_instances_));
}

void Decoder::start(int64_t num_instances, const std::vector<const float*>& weights,
                    const std::vector<const float*>& states, bool weights_on_device, void* stream,
                    bool states_on_device) {
  const char* fn = "edbatch.Decoder.start";
  const uint32_t S = cell_->num_outputs();
  if (num_instances < 0)
    throw std::invalid_argument(fmt::format("[{}] negative number of instances", fn));
  if (!states.empty() && states.size() != S)
    throw std::invalid_argument(
        fmt::format("[{}] {} initial state tensors given, the cell has {} outputs", fn,
                    states.size(), S));
  const std::vector<WeightSpec>& specs = cell_->weights();
  if (weights_on_device) {
    // One launch on the device, queued on the caller's stream: no round trip through the host
    // and no upload of every parameter at the first step.
    write_weights_on_device(engine_, pc_, specs, weight_params_, weights, stream, transfers_, fn);
  } else {
    for (size_t i = 0; i < specs.size(); ++i)
      to_engine(weights[i], specs[i], pc_.values(weight_params_[i].id));
    pc_.mark_changed();  // device backends upload the parameters again
  }
  graph_.clear();
  started_ = true;
  num_instances_ = num_instances;
  steps_ = 0;
  repeated_before_ = engine_.stats().increments_repeated;
  kernels_before_ = engine_.stats().kernels;
  instance_steps_.assign(static_cast<size_t>(num_instances), 0);
  state_.assign(static_cast<size_t>(num_instances) * S, Expr{});
  // The states are the graph's first input values, output after output (from device memory,
  // placeholders until the first step's forward copies them in).
  start_states_pending_ = 0;
  for (uint32_t o = 0; o < S; ++o) {
    const bool given = !states_on_device && !states.empty() && states[o] != nullptr;
    const Dim dim{cell_->output_size(o), 1};
    const uint32_t first = graph_.add_inputs(&dim, 1, static_cast<uint32_t>(num_instances),
                                             given ? states[o] : nullptr);
    for (int64_t i = 0; i < num_instances; ++i)
      state_[static_cast<size_t>(i) * S + o] = graph_.expr(first + static_cast<uint32_t>(i));
  }
  if (states_on_device) start_states_pending_ = graph_.input_values().size();
}

void Decoder::write_start_states(const float* states) {
  if (start_states_pending_ > 0) graph_.write_inputs(0, states, start_states_pending_);
  start_states_pending_ = 0;
}

void Decoder::step(int64_t n, const int64_t* ids, const float* x,
                   const std::vector<float*>& outputs, bool on_device, void* stream) {
  const char* fn = "edbatch.Decoder.step";
  if (!started_) throw std::invalid_argument(fmt::format("[{}] call start() first", fn));
  if (n < 0 || n > num_instances_)
    throw std::invalid_argument(fmt::format("[{}] {} running instances of {}", fn, n, num_instances_));
  seen_.assign(static_cast<size_t>(num_instances_), 0);
  for (int64_t r = 0; r < n; ++r) {
    check_instance(fn, ids[r]);
    if (seen_[static_cast<size_t>(ids[r])]++)
      throw std::invalid_argument(fmt::format("[{}] instance {} is given twice", fn, ids[r]));
  }
  DeviceInterop* io = on_device ? &device_interop(engine_, fn) : nullptr;
  if (n == 0) return;
  const uint32_t S = cell_->num_outputs(), D = cell_->input_dim();
  const std::vector<uint32_t> segments = cell_->input_segments();
  // The step's x rows are its first input values, one after another as x holds them (from device
  // memory, those inputs are placeholders until the forward copies x in).
  const size_t first_input = graph_.input_values().size();
  add_x_inputs(graph_, segments, static_cast<uint32_t>(n), on_device ? nullptr : x, x_);
  prev_.resize(S);
  out_.resize(S);
  for (int64_t r = 0; r < n; ++r) {
    Expr* state = &state_[static_cast<size_t>(ids[r]) * S];
    std::copy(state, state + S, prev_.begin());
    if (!cell_->step(graph_, &x_[static_cast<size_t>(r) * segments.size()], prev_.data(),
                     out_.data()))
      throw std::invalid_argument(fmt::format(
          "[{}] this cell has no decoding step (a chain of its nodes: the lattice cells, and "
          "user cells reading x rows without dropout)",
          fn));
    std::copy(out_.begin(), out_.end(), state);
    ++instance_steps_[static_cast<size_t>(ids[r])];
  }
  // Run the step's nodes (only those added since the last forward run), then read the new states
  // at once: into host memory, one copy queued behind the step's kernels and one wait; into
  // device memory, copies queued on `stream`, and nothing waits.
  fetch_.clear();  // output by output
  for (uint32_t o = 0; o < S; ++o)
    for (int64_t r = 0; r < n; ++r) fetch_.push_back(state_[static_cast<size_t>(ids[r]) * S + o]);
  if (on_device) {
    io->use_stream(stream);
    // Start's states from device memory are the inputs before the step's (the graph's first).
    const size_t pending = start_states_pending_;
    io->inputs_from_device(x, pending + static_cast<size_t>(n) * D, first_input - pending);
    try {
      engine_.forward_through(graph_, fetch_);
    } catch (...) {
      io->inputs_from_device(nullptr, 0, 0);  // not left for a later forward
      throw;
    }
    start_states_pending_ = 0;
    read_groups(*io, graph_, engine_.plan(), fetch_, static_cast<size_t>(n), outputs, node_ids_);
  } else {
    if (start_states_pending_ > 0)
      throw std::logic_error(
          fmt::format("[{}] start's states are still in device memory (write_start_states)", fn));
    engine_.forward_through(graph_, fetch_);
    engine_.read(fetch_, static_cast<size_t>(n), outputs.data());
  }
  ++steps_;
}

void Decoder::reorder(int64_t n, const int64_t* ids) {
  const char* fn = "edbatch.Decoder.reorder";
  if (!started_) throw std::invalid_argument(fmt::format("[{}] call start() first", fn));
  if (n < 0) throw std::invalid_argument(fmt::format("[{}] negative number of instances", fn));
  for (int64_t r = 0; r < n; ++r) check_instance(fn, ids[r]);
  const uint32_t S = cell_->num_outputs();
  next_state_.resize(static_cast<size_t>(n) * S);
  next_steps_.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const auto from = static_cast<size_t>(ids[r]);
    std::copy_n(&state_[from * S], S, &next_state_[static_cast<size_t>(r) * S]);
    next_steps_[static_cast<size_t>(r)] = instance_steps_[from];
  }
  state_.swap(next_state_);  // the old lists stay as the next reorder's storage
  instance_steps_.swap(next_steps_);
  num_instances_ = n;
}

}  // namespace edbatch::torch_adapter
