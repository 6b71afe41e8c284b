// A decoding loop on one engine (docs/pytorch.md, "Decoding step by step"): one graph holds every
// step since start(); each running instance keeps its state as the outputs of its last cell call;
// a step adds one cell call (Cell::step) per instance it runs and runs only those new nodes
// (the engine's incremental forward). Torch-free, like cells.h; forward only.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/torch/cells.h"

namespace edbatch::torch_adapter {

class Decoder {
 public:
  Decoder(const CellConfig& config, const RunOptions& options);
  const Cell& cell() const { return *cell_; }

  // Starts a loop of `num_instances` instances on a cleared graph. weights[i] holds the cell's
  // weights()[i] row-major (read now: later changes to them do not reach the loop);
  // states[o] holds num_instances x output_size(o) floats, the initial output o (nullptr or an
  // empty list: zeros). With weights_on_device the weights are device memory of the engine's
  // device, copied into the engine's parameters there, on `stream` (as Runner::forward does).
  // With states_on_device the states are not read here: the first step on the device takes them
  // from device memory ahead of its x (step), or write_start_states gives them before a step
  // through the host.
  void start(int64_t num_instances, const std::vector<const float*>& weights,
             const std::vector<const float*>& states, bool weights_on_device = false,
             void* stream = nullptr, bool states_on_device = false);
  // The floats of start()'s states still to come from device memory (0: none): every output's
  // num_instances x output_size(o), output after output.
  size_t start_states_pending() const { return start_states_pending_; }
  // Those states from host memory, laid out as start_states_pending() says.
  void write_start_states(const float* states);
  // One step for the instances ids[0..n) (distinct, in [0, num_instances)): instance ids[r] reads
  // x row r (x: n x input_dim floats) and its last state; outputs[o] receives n x output_size(o),
  // the new states, which become the instances' states. n = 0 does nothing. With on_device, x and
  // outputs are device memory of the engine's device, read and written on `stream` (a
  // cudaStream_t; the step is queued there, and nothing waits for it); while start's states are
  // pending (start_states_pending()), x holds them first, then the step's rows.
  // A step that throws leaves every instance's state and step count as they were. After a
  // NumericsError (set_check_numerics: the step ran and a value of it is not finite) the loop
  // goes on; after any other error inside the engine (out of memory, a device error: it stopped
  // inside the step), or any error while start's states wait in device memory, step and reorder
  // refuse, naming it, until start() begins a new loop.
  void step(int64_t n, const int64_t* ids, const float* x, const std::vector<float*>& outputs,
            bool on_device = false, void* stream = nullptr);
  // The loop goes on with n instances: instance r (in [0, n)) continues from the state and step
  // count of instance ids[r] (in [0, num_instances); repeats allowed, instances not named end),
  // as beam search continues each new hypothesis from its parent's. Adds and runs no node.
  void reorder(int64_t n, const int64_t* ids);

  // EngineOptions::check_numerics for the steps from now on.
  void set_check_numerics(bool on) { engine_.set_check_numerics(on); }

  int64_t num_instances() const { return num_instances_; }
  int64_t steps() const { return steps_; }            // steps since start() (n > 0 ones)
  int64_t instance_steps(int64_t i) const { return instance_steps_.at(static_cast<size_t>(i)); }
  uint64_t graph_nodes() const { return graph_.size(); }
  const Stats& stats() const { return engine_.stats(); }
  // Steps since start() planned as a repeat of the step before (the engine's repeated increments:
  // as many running instances as the step before, after a reorder too, with plan reuse on).
  uint64_t steps_repeated() const { return engine_.stats().increments_repeated - repeated_before_; }
  // ... of which the operands were planned afresh (rows reading other states than the step
  // before's rows did, a step further on: after a reorder that moved rows).
  uint64_t steps_replanned() const {
    return engine_.stats().increments_replanned - replanned_before_;
  }
  // Steps since start() whose rows from the fourth on were copies of the second's nodes.
  uint64_t steps_copied() const { return steps_copied_; }
  // Kernel launches since start() (the engine counts them over its life).
  uint64_t kernels() const { return engine_.stats().kernels - kernels_before_; }

 private:
  // Throws naming fn unless id is an instance of the loop (in [0, num_instances)).
  void check_instance(const char* fn, int64_t id) const;
  // A step's rows from kBuiltRows on as copies of row 1's nodes (decoder.cpp); false: build them
  // through the cell.
  bool repeat_rows(int64_t n, const int64_t* ids, size_t segs);
  // step()'s work once its arguments are checked.
  void run_step(int64_t n, const int64_t* ids, const float* x, const std::vector<float*>& outputs,
                DeviceInterop* io, void* stream);
  // The states and step counts of instances ids[0..n), row after row, into states and steps.
  void gather_instances(int64_t n, const int64_t* ids, std::vector<Expr>& states,
                        std::vector<int64_t>& steps) const;
  // Throws naming fn when an earlier step failed other than on a non-finite value.
  void check_not_failed(const char* fn) const;
  // The row of the step of n rows that graph node `node` belongs to (its x row, a node of its
  // cell call, or the state it read: start's), or -1.
  int64_t row_of(uint32_t node, int64_t n) const;
  static constexpr int64_t kBuiltRows = 3;

  ParameterCollection pc_;
  std::unique_ptr<Cell> cell_;
  std::vector<Parameter> weight_params_;
  std::vector<DeviceInterop::Transfer> transfers_;  // start()'s weights from device memory
  Engine engine_;
  Graph graph_;
  int64_t num_instances_ = 0, steps_ = 0;
  uint64_t steps_copied_ = 0;
  uint64_t repeated_before_ = 0;  // the engine's increments_repeated at start()
  uint64_t replanned_before_ = 0;  // ... and its increments_replanned
  uint64_t kernels_before_ = 0;   // ... and its kernels
  bool started_ = false;
  std::vector<Expr> state_;  // instance i's output o at [i * num_outputs + o]
  std::vector<int64_t> instance_steps_;
  std::vector<Expr> next_state_;  // reorder()'s, swapped with state_ and instance_steps_
  std::vector<int64_t> next_steps_;
  // The running instances' states and step counts before a step, put back when it fails.
  std::vector<Expr> saved_state_;
  std::vector<int64_t> saved_steps_;
  std::string failed_;  // what stopped the loop inside a step (empty: nothing)
  std::vector<Expr> x_, prev_, out_, fetch_;
  std::vector<uint32_t> node_ids_;
  // The step's rows built through the cell: their first nodes, previous states and outputs
  // (num_outputs per row); repeat_rows' pattern of row 1's arguments and the copies' arguments.
  std::vector<uint32_t> row_begin_, row_prev_, row_out_;
  std::vector<std::pair<uint32_t, uint32_t>> pattern_;
  std::vector<uint32_t> copy_args_;
  uint32_t copies_begin_ = 0, copy_size_ = 0;  // repeat_rows' copies: the first node, nodes each
  size_t start_states_pending_ = 0;
  std::vector<uint8_t> seen_;
};

}  // namespace edbatch::torch_adapter
