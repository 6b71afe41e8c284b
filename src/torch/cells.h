// The torch-free half of the PyTorch adapter: the packed mini-batch format, the cells the ops run
// (as blocks over a ParameterCollection), and a Runner that builds one mini-batch graph, runs it
// forward and back-propagates gradients given for every node's outputs.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/engine.h"
#include "edbatch/graph.h"
#include "edbatch/params.h"

namespace edbatch::torch_adapter {

// A mini-batch of structures (docs/pytorch.md). Nodes of an instance are contiguous and in
// topological order; the predecessors (children, arc sources) of node k are
// pred_ids[pred_ptr[k] .. pred_ptr[k+1]), each with an arc type and an arc input (x row or -1).
struct Packed {
  int64_t num_nodes = 0, num_arcs = 0, num_instances = 0;
  const int64_t* node_inputs = nullptr;  // x row per node, or -1
  const int64_t* node_types = nullptr;   // cell type per node
  const int64_t* pred_ptr = nullptr;     // num_nodes + 1
  const int64_t* pred_ids = nullptr;     // num_arcs, global node ids
  const int64_t* arc_types = nullptr;    // num_arcs
  const int64_t* arc_inputs = nullptr;   // num_arcs, x row or -1
  const int64_t* instance_offsets = nullptr;  // num_instances + 1
  const float* x = nullptr;  // num_x rows of x_dim floats
  int64_t num_x = 0, x_dim = 0;
  const int64_t* ids = nullptr;  // traced cells that embed ids: one per row (x_dim is then 0)
  uint64_t seed = 0;             // traced cells: the seed of the call's dropout masks
  const int64_t* labels = nullptr;  // with a loss head (LossHead): a class per node, or -1
};

// A weight as the torch side holds it: rows x cols row-major (cols == 0: a vector of rows). With
// `transpose` the engine's parameter is the same matrix, column-major; without it the torch
// memory is taken as it is (an `x @ W` matrix: the engine's cols x rows; an embedding table).
struct WeightSpec {
  std::string name;
  uint32_t rows = 0, cols = 0;
  bool transpose = true;
  bool lookup = false;  // a lookup table (rows: ids), read only at the ids of a call
  // Whether a device copy transposes it (DeviceInterop::Transfer::row_major).
  bool row_major() const { return transpose && cols > 1; }
  // The engine parameter's columns that hold it (a lookup table may have more: zero columns).
  uint32_t engine_cols() const { return transpose ? std::max(cols, 1u) : rows; }
};

// Copies a weight from torch's row-major memory `src` into the engine's layout `dst`.
void to_engine(const float* src, const WeightSpec& w, float* dst);

// Throws std::invalid_argument naming the first inconsistency (offsets, ranges, order).
void check_packed(const Packed& p, const char* fn);

class Cell {
 public:
  virtual ~Cell() = default;
  const std::vector<WeightSpec>& weights() const { return weights_; }
  // Per-node outputs (h, and c for the LSTMs), each output_size(o) floats.
  virtual uint32_t num_outputs() const = 0;
  virtual uint32_t output_size(uint32_t) const { return hidden_; }
  // A row of x is read as Input nodes of these sizes (summing to input_dim()).
  virtual std::vector<uint32_t> input_segments() const { return {input_dim_}; }
  uint32_t hidden() const { return hidden_; }
  uint32_t input_dim() const { return input_dim_; }
  // Throws std::invalid_argument for structures this cell cannot run (arity, types, inputs).
  virtual void check(const Packed& p, const char* fn) const = 0;
  // Adds every node of `p` to `g`; out[o * num_nodes + k] is output o of node k, a column of
  // output_size(o). x[row * S + s] is segment s of row `row` of p.x (S segments).
  virtual void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
                     std::vector<Expr>& out) = 0;
  // One step of a chain (the decoding loop of decoder.h): adds the outputs `out` of a node whose
  // one predecessor has outputs `prev` and whose x row has segments `x`. Cells without such a
  // step return false (the default) and add nothing.
  virtual bool step(Graph& g, const Expr* x, const Expr* prev, Expr* out);

 protected:
  Cell(uint32_t hidden, uint32_t input_dim) : hidden_(hidden), input_dim_(input_dim) {}
  Parameter add(ParameterCollection& pc, const std::string& name, uint32_t rows, uint32_t cols);
  std::vector<WeightSpec> weights_;

 private:
  uint32_t hidden_, input_dim_;
};

// A per-node classification loss on output 0, run inside the engine (docs/pytorch.md, "The loss
// inside the engine"): for every node k with a label, -log softmax(W h_k + b)[label_k], summed
// (or averaged over the labelled nodes). W (classes x output_size(0)) and b (classes) follow the
// cell's weights; the call's one output is then the loss.
struct LossHead {
  uint32_t classes = 0;  // 0: no head (the call returns every node's outputs)
  bool mean = false;
};

struct CellConfig {
  std::string cell;  // tree_lstm | tree_gru | lattice_lstm | lattice_gru | random_dag | mvrnn
  uint32_t hidden = 0, input_dim = 0;
  uint32_t node_types = 1, arc_types = 1;  // random_dag: state and arc types
  LossHead head;
};

const std::vector<std::string>& cell_names();
// Adds the cell's weights (names of weights()) and frozen blocks to `pc`.
std::unique_ptr<Cell> make_cell(const CellConfig& config, ParameterCollection& pc);

struct RunOptions {
  std::string policy = "lb-greedy";
  std::string device = "cpu";
  int threads = 1;
  size_t plan_cache_bytes = EngineOptions{}.plan_cache_bytes;  // EngineOptions::plan_cache_bytes
  bool check_numerics = false;                                 // EngineOptions::check_numerics
  EngineOptions engine_options() const;
};

// Forward passes of every Runner in the process that ran on a reused plan (Stats::plan_reused).
uint64_t plans_reused_total();

// The engine's device interop; throws naming fn when the engine runs on the CPU (device memory
// was given for an engine that cannot read it).
DeviceInterop& device_interop(Engine& engine, const char* fn);

// Writes weights[i] (device memory, torch's layout as specs[i] says) into parameter params[i] of
// pc on the engine's device, in one launch queued on `stream` (transfers: the caller's scratch).
void write_weights_on_device(Engine& engine, ParameterCollection& pc,
                             const std::vector<WeightSpec>& specs,
                             const std::vector<Parameter>& params,
                             const std::vector<const float*>& weights, void* stream,
                             std::vector<DeviceInterop::Transfer>& transfers, const char* fn);

// Appends the input nodes of `rows` rows of x to g, each row's segments one after another (an
// input node per segment, as the cell reads x), into `exprs` (cleared first): values from x, one
// row after another, or zeros when x is null (placeholders a device forward fills).
void add_x_inputs(Graph& g, const std::vector<uint32_t>& segments, uint32_t rows, const float* x,
                  std::vector<Expr>& exprs);

// Reads the values of targets, group by group, into device memory on io's stream: group o,
// targets[o * per_group, (o + 1) * per_group), one node after another into outputs[o]. Groups
// whose outputs follow one another in memory (outputs[o + 1] right after group o's floats) are
// read at once: one upload of their spans and one gather launch. ids: scratch.
void read_groups(DeviceInterop& io, const Graph& g, const MemoryPlan& plan,
                 const std::vector<Expr>& targets, size_t per_group,
                 const std::vector<float*>& outputs, std::vector<uint32_t>& ids);

// One cell on one engine; reused across mini-batches (its graph, arena and blocks are kept).
class Runner {
 public:
  Runner(const CellConfig& config, const RunOptions& options);
  const Cell& cell() const { return *cell_; }
  // The call's weights: the cell's, then the loss head's (head.weight, head.bias) when it has one.
  const std::vector<WeightSpec>& weights() const { return specs_; }
  const LossHead& head() const { return head_; }
  // What a call returns: the loss (one float) with a head, else the cell's outputs.
  uint32_t num_outputs() const { return head_.classes ? 1 : cell_->num_outputs(); }

  // weights[i] holds weights()[i] row-major. outputs[o] receives num_nodes x output_size(o), or
  // with a loss head outputs[0] the loss. With `for_backward` the graph is kept for backward().
  // With `on_device`, p.x, the weights and the outputs are device memory of the engine's device
  // (the structure arrays stay host memory), and all work is queued on `stream` (a
  // cudaStream_t; nullptr: the default stream) without waiting for it: nothing passes through
  // the host. The backward after such a forward takes and fills device memory too.
  void forward(const Packed& p, const std::vector<const float*>& weights,
               const std::vector<float*>& outputs, bool for_backward, bool on_device = false,
               void* stream = nullptr);
  // out_grad: the outputs' gradients one after another (output 0 of every node, num_nodes x
  // output_size(0) floats, then output 1, ...; with a loss head the loss's one float). grad_x:
  // num_x x x_dim floats; grad_weights[i]: as weights()[i]; all overwritten. After a forward on
  // device memory, all of these are device memory and the work is queued on `stream`.
  // On the host, a lookup table's entry may be nullptr: its gradient is then left for
  // lookup_gradient (its touched rows only).
  // On the host, `update` (one entry per weight, or none) names weights to update in place
  // instead, plain SGD from the engine's gradient: update[i] is weight i's torch memory (row-major
  // as weights() has it), updated by -lr times its gradient (a lookup table at its touched rows);
  // grad_weights[i] is then not written.
  void backward(const float* out_grad, float* grad_x, const std::vector<float*>& grad_weights,
                void* stream = nullptr, const std::vector<float*>* update = nullptr, float lr = 0);
  // After a host backward: the rows of lookup weight i with a gradient (ids, in the order the
  // backward touched them), and those rows' gradients copied to `out` (cols floats each, one
  // after another, rows.size() x cols in all): straight from the engine's gradient, so a step
  // whose batch touches most of a table moves each row once, into memory the caller holds.
  void lookup_rows(size_t i, std::vector<int64_t>& rows) const;
  void lookup_gradient(size_t i, const std::vector<int64_t>& rows, float* out) const;
  // Whether the last forward ran on device memory (so its backward does too).
  bool on_device() const { return on_device_; }

  // The structure-only work of a forward, done ahead (docs/pytorch.md, "Preparing mini-batches
  // ahead"): stage() copies the structure of `p` (p.x is not read: p.num_x and p.x_dim are the
  // rows the forward will get); prepare() then checks it, builds the graph and schedules and
  // plans it, on any thread, while nothing else uses this runner. The next forward() whose
  // structure equals the staged one (staged_matches) only runs the plan; any other builds anew.
  // prepare() throws what forward() would for a bad structure (the forward then fails alike).
  void stage(const Packed& p);
  void prepare();
  bool staged_matches(const Packed& p) const;
  bool prepared() const { return prepared_; }

 private:
  ParameterCollection pc_;
  std::unique_ptr<Cell> cell_;
  LossHead head_;
  std::vector<WeightSpec> specs_;
  std::vector<Parameter> weight_params_;
  Engine engine_;
  Graph graph_;
  std::vector<Expr> x_, out_;
  std::vector<Expr> losses_, targets_;  // the head's per-node losses; what forward runs to
  int64_t num_nodes_ = 0, num_x_ = 0;
  bool have_graph_ = false;
  bool on_device_ = false;  // the last forward's memory
  std::vector<uint32_t> ids_;
  std::vector<DeviceInterop::Transfer> transfers_;

  // The staged structure: its arrays back to back in staged_, viewed by staged_view_.
  std::vector<int64_t> staged_;
  Packed staged_view_;
  bool prepared_ = false;  // graph_ and the engine's plan are the staged structure's

  void build_graph(const Packed& p, const float* x);
  void add_loss_head(const Packed& p);
  void check_labels(const Packed& p, const char* fn) const;
  // e again, its message led by the x row or packed node its value belongs to when it is one.
  [[noreturn]] void rethrow_named(const NumericsError& e) const;
  // Runs pass (an engine pass), its NumericsError through rethrow_named.
  template <class F>
  void naming_numerics(const F& pass) const;
  static bool wait_each_call();
  void read_gradients(DeviceInterop& io, const std::vector<float*>& grad_weights);
  void backward_on_device(const float* out_grad, float* grad_x,
                          const std::vector<float*>& grad_weights, void* stream);
};

}  // namespace edbatch::torch_adapter
