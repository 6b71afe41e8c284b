#include "src/torch/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace edbatch::torch_adapter {

namespace {
// The message of the exception being handled (called inside a catch block).
std::string handled_what() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown error";
  }
}
}  // namespace

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
  failed_.clear();
  num_instances_ = num_instances;
  steps_ = 0;
  steps_copied_ = 0;
  repeated_before_ = engine_.stats().increments_repeated;
  replanned_before_ = engine_.stats().increments_replanned;
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

void Decoder::check_not_failed(const char* fn) const {
  if (!failed_.empty())
    throw std::runtime_error(
        fmt::format("[{}] an earlier step failed inside the engine ({}); this loop cannot go on: "
                    "start() begins a new one",
                    fn, failed_));
}

void Decoder::step(int64_t n, const int64_t* ids, const float* x,
                   const std::vector<float*>& outputs, bool on_device, void* stream) {
  const char* fn = "edbatch.Decoder.step";
  if (!started_) throw std::invalid_argument(fmt::format("[{}] call start() first", fn));
  check_not_failed(fn);
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
  // What the step changes, kept to be put back when it fails.
  const uint32_t S = cell_->num_outputs();
  gather_instances(n, ids, saved_state_, saved_steps_);
  const uint64_t copied = steps_copied_;
  const auto put_back = [&] {
    for (int64_t r = 0; r < n; ++r) {
      const auto i = static_cast<size_t>(ids[r]);
      std::copy_n(&saved_state_[static_cast<size_t>(r) * S], S, &state_[i * S]);
      instance_steps_[i] = saved_steps_[static_cast<size_t>(r)];
    }
    steps_copied_ = copied;
  };
  try {
    run_step(n, ids, x, outputs, io, stream);
  } catch (const NumericsError& e) {
    // The step ran (start's states with it) and a value it computed is not finite: its nodes
    // stay in the graph, read by no instance, as a dropped hypothesis's do. The error names the
    // row, which the caller can stop.
    put_back();
    start_states_pending_ = 0;
    const int64_t r = row_of(e.node, n);
    if (r < 0) throw;
    throw NumericsError(
        fmt::format("[{}] row {} of the step (instance {}): {}", fn, r, ids[r], e.what()), e.node);
  } catch (...) {
    // Inside the engine, run_step stopped the loop. Before it, the step's nodes stay in the graph
    // unread and the next forward runs them along, unless start's states wait in device memory:
    // they and the next step's x would no longer be one range of inputs (the failed step's lie
    // between).
    put_back();
    if (failed_.empty() && io != nullptr && start_states_pending_ > 0) failed_ = handled_what();
    throw;
  }
  ++steps_;
}

int64_t Decoder::row_of(uint32_t node, int64_t n) const {
  if (node == UINT32_MAX || n <= 0) return -1;
  const size_t segs = cell_->input_segments().size();
  for (size_t j = 0; j < static_cast<size_t>(n) * segs && j < x_.size(); ++j)
    if (x_[j].id == node) return static_cast<int64_t>(j / segs);
  if (!row_begin_.empty() && node >= row_begin_[0]) {
    const auto built = static_cast<int64_t>(row_begin_.size());
    if (copy_size_ > 0 && node >= copies_begin_) {
      const int64_t r = built + (node - copies_begin_) / copy_size_;
      return r < n ? r : -1;
    }
    int64_t r = built - 1;
    while (r > 0 && node < row_begin_[static_cast<size_t>(r)]) --r;
    return r;
  }
  // A state the row read (start's, which the step's forward checks with its own inputs).
  const size_t S = cell_->num_outputs();
  for (size_t j = 0; j < static_cast<size_t>(n) * S && j < saved_state_.size(); ++j)
    if (saved_state_[j].id == node) return static_cast<int64_t>(j / S);
  return -1;
}

void Decoder::run_step(int64_t n, const int64_t* ids, const float* x,
                       const std::vector<float*>& outputs, DeviceInterop* io, void* stream) {
  const char* fn = "edbatch.Decoder.step";
  const uint32_t S = cell_->num_outputs(), D = cell_->input_dim();
  const std::vector<uint32_t> segments = cell_->input_segments();
  // The step's x rows are its first input values, one after another as x holds them (from device
  // memory, those inputs are placeholders until the forward copies x in).
  const size_t first_input = graph_.input_values().size();
  add_x_inputs(graph_, segments, static_cast<uint32_t>(n), io != nullptr ? nullptr : x, x_);
  prev_.resize(S);
  out_.resize(S);
  // The first rows through the cell; from the fourth on, copies of the second row's nodes when
  // the third row came out as such a copy (repeat_rows).
  row_begin_.clear();
  row_prev_.clear();
  row_out_.clear();
  copy_size_ = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (r == kBuiltRows && repeat_rows(n, ids, segments.size())) break;
    Expr* state = &state_[static_cast<size_t>(ids[r]) * S];
    std::copy(state, state + S, prev_.begin());
    row_begin_.push_back(graph_.size());
    if (!cell_->step(graph_, &x_[static_cast<size_t>(r) * segments.size()], prev_.data(),
                     out_.data()))
      throw std::invalid_argument(fmt::format(
          "[{}] this cell has no decoding step (a chain of its nodes: the lattice cells, and "
          "user cells reading x rows without dropout)",
          fn));
    for (uint32_t o = 0; o < S; ++o) {
      row_prev_.push_back(prev_[o].id);
      row_out_.push_back(out_[o].id);
    }
    std::copy(out_.begin(), out_.end(), state);
    ++instance_steps_[static_cast<size_t>(ids[r])];
  }
  // Run the step's nodes (only those added since the last forward run), then read the new states
  // at once: into host memory, one copy queued behind the step's kernels and one wait; into
  // device memory, copies queued on `stream`, and nothing waits.
  fetch_.clear();  // output by output
  for (uint32_t o = 0; o < S; ++o)
    for (int64_t r = 0; r < n; ++r) fetch_.push_back(state_[static_cast<size_t>(ids[r]) * S + o]);
  if (io == nullptr && start_states_pending_ > 0)
    throw std::logic_error(
        fmt::format("[{}] start's states are still in device memory (write_start_states)", fn));
  try {
    if (io != nullptr) {
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
      engine_.forward_through(graph_, fetch_);
      engine_.read(fetch_, static_cast<size_t>(n), outputs.data());
    }
  } catch (const NumericsError&) {
    throw;  // the step ran: the loop goes on (step)
  } catch (...) {
    failed_ = handled_what();  // the engine may have stopped half way through the step
    throw;
  }
}

// Rows kBuiltRows.. of a step as copies of row 1's nodes (Graph::repeat_nodes), when row 2 is
// exactly the copy that row 1 predicts for it: every node the same, reading row 2's own nodes, x
// rows and previous states where row 1 reads its own, and the same other nodes (parameters,
// constants). Row 0 may differ (it adds the loop's parameter nodes at the first step). A row's
// graph building is then a copy of integers. Returns false, adding nothing, when row 2 differs.
bool Decoder::repeat_rows(int64_t n, const int64_t* ids, size_t segs) {
  const uint32_t S = cell_->num_outputs();
  const uint32_t b0 = row_begin_[1], b1 = row_begin_[2], b2 = graph_.size();
  const uint32_t m = b1 - b0;
  if (m == 0 || b2 - b1 != m) return false;
  const uint32_t* prev1 = &row_prev_[S];
  for (uint32_t o = 0; o < S; ++o)
    for (uint32_t q = 0; q < o; ++q)
      if (prev1[o] == prev1[q]) return false;  // a state read twice: its role is ambiguous
  // Where row 1's arguments (and outputs) come from: its own nodes, an x row's input (by
  // segment), a previous state (by output), or another node every row shares.
  enum : uint32_t { kOwn, kX, kPrev, kShared };
  const auto classify = [&](uint32_t a) -> std::pair<uint32_t, uint32_t> {
    if (a >= b0 && a < b1) return {kOwn, a - b0};
    for (size_t k = 0; k < segs; ++k)
      if (a == x_[segs + k].id) return {kX, static_cast<uint32_t>(k)};
    for (uint32_t o = 0; o < S; ++o)
      if (a == prev1[o]) return {kPrev, o};
    return {kShared, a};
  };
  // That source for row r, whose previous states are prev.
  const auto mapped = [&](std::pair<uint32_t, uint32_t> c, int64_t r, const uint32_t* prev) {
    switch (c.first) {
      case kOwn:
        return b0 + static_cast<uint32_t>(r - 1) * m + c.second;
      case kX:
        return x_[static_cast<size_t>(r) * segs + c.second].id;
      case kPrev:
        return prev[c.second];
      default:
        return c.second;
    }
  };
  const uint32_t a0 = graph_.node(b0).arg_begin, A = graph_.node(b1).arg_begin - a0;
  pattern_.clear();
  for (uint32_t j = 0; j < A; ++j) pattern_.push_back(classify(graph_.all_args()[a0 + j]));
  // Row 2 against the copy that row 1 predicts for it.
  const uint32_t* prev2 = &row_prev_[2 * static_cast<size_t>(S)];
  const std::vector<float>& values = graph_.input_values();
  const std::vector<uint32_t>& ints = graph_.ints();
  for (uint32_t i = 0; i < m; ++i) {
    const Node &p = graph_.node(b0 + i), &q = graph_.node(b1 + i);
    if (p.op != q.op || p.type != q.type || p.dim != q.dim || p.num_args != q.num_args ||
        float_bits(p.alpha) != float_bits(q.alpha) || float_bits(p.beta) != float_bits(q.beta))
      return false;
    if (p.op == Op::Input) {  // an input the cell adds (a constant): the same values
      if (!std::equal(values.begin() + p.aux, values.begin() + p.aux + p.dim.size(),
                      values.begin() + q.aux))
        return false;
    } else if (p.op == Op::Call) {  // the same block and integers
      const uint32_t count = graph_.call_ints(b0 + i);
      if (p.aux != q.aux || graph_.call_ints(b1 + i) != count ||
          !std::equal(ints.begin() + p.aux2, ints.begin() + p.aux2 + count, ints.begin() + q.aux2))
        return false;
    } else if (p.aux != q.aux || p.aux2 != q.aux2) {
      return false;
    }
    for (uint32_t k = 0; k < p.num_args; ++k)
      if (graph_.args(q)[k] != mapped(pattern_[p.arg_begin - a0 + k], 2, prev2)) return false;
  }
  for (uint32_t o = 0; o < S; ++o)
    if (row_out_[2 * S + o] != mapped(classify(row_out_[S + o]), 2, prev2)) return false;
  // The other rows as copies of row 1, each reading its own x rows and previous states.
  const auto copies = static_cast<uint32_t>(n - kBuiltRows);
  copy_args_.resize(static_cast<size_t>(A) * copies);
  row_prev_.resize(static_cast<size_t>(S) * 3 + S);
  uint32_t* prev = &row_prev_[3 * static_cast<size_t>(S)];
  for (uint32_t c = 0; c < copies; ++c) {
    const int64_t r = kBuiltRows + c;
    for (uint32_t o = 0; o < S; ++o) prev[o] = state_[static_cast<size_t>(ids[r]) * S + o].id;
    uint32_t* args = &copy_args_[static_cast<size_t>(c) * A];
    for (uint32_t j = 0; j < A; ++j) args[j] = mapped(pattern_[j], r, prev);
  }
  copies_begin_ = graph_.repeat_nodes(b0, b1, copies, copy_args_.data());
  copy_size_ = m;
  for (uint32_t c = 0; c < copies; ++c) {
    const int64_t r = kBuiltRows + c;
    Expr* state = &state_[static_cast<size_t>(ids[r]) * S];
    for (uint32_t o = 0; o < S; ++o) prev[o] = state[o].id;
    for (uint32_t o = 0; o < S; ++o)
      state[o] = graph_.expr(mapped(classify(row_out_[S + o]), r, prev));
    ++instance_steps_[static_cast<size_t>(ids[r])];
  }
  ++steps_copied_;
  return true;
}

void Decoder::gather_instances(int64_t n, const int64_t* ids, std::vector<Expr>& states,
                               std::vector<int64_t>& steps) const {
  const uint32_t S = cell_->num_outputs();
  states.resize(static_cast<size_t>(n) * S);
  steps.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const auto from = static_cast<size_t>(ids[r]);
    std::copy_n(&state_[from * S], S, &states[static_cast<size_t>(r) * S]);
    steps[static_cast<size_t>(r)] = instance_steps_[from];
  }
}

void Decoder::reorder(int64_t n, const int64_t* ids) {
  const char* fn = "edbatch.Decoder.reorder";
  if (!started_) throw std::invalid_argument(fmt::format("[{}] call start() first", fn));
  check_not_failed(fn);
  if (n < 0) throw std::invalid_argument(fmt::format("[{}] negative number of instances", fn));
  for (int64_t r = 0; r < n; ++r) check_instance(fn, ids[r]);
  gather_instances(n, ids, next_state_, next_steps_);
  state_.swap(next_state_);  // the old lists stay as the next reorder's storage
  instance_steps_.swap(next_steps_);
  num_instances_ = n;
}

}  // namespace edbatch::torch_adapter
