// One mini-batch: the nodes of every instance in flat arrays, built through lazy Exprs.
#pragma once
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "edbatch/dim.h"
#include "edbatch/op.h"
#include "edbatch/params.h"

namespace edbatch {

class TypeTable;

struct Node {
  Op op;
  uint32_t type;
  Dim dim;
  uint32_t arg_begin;  // into Graph::args()
  uint32_t num_args;
  uint32_t aux;   // Parameter/Lookup: parameter id; Input: offset into input values;
                  // SliceRows: first row
  uint32_t aux2;  // Lookup, Pick: index; PickNegLogSoftmax: label; Dropout: key
  float alpha, beta;  // ScalarAffine: alpha, beta; ScalarDivide: alpha; LayerNorm: eps;
                      // Dropout: p
};

class Graph;

// A node handle. Cheap to copy; valid until its graph is cleared or destroyed.
struct Expr {
  Graph* graph = nullptr;
  uint32_t id = UINT32_MAX;
  uint32_t generation = 0;
};

class Graph {
 public:
  explicit Graph(ParameterCollection& params);
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Drops all nodes but keeps the storage, so rebuilding costs no allocation.
  void clear();

  uint32_t size() const { return static_cast<uint32_t>(nodes_.size()); }
  const Node& node(uint32_t id) const { return nodes_[id]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const uint32_t* args(const Node& n) const { return args_.data() + n.arg_begin; }
  const std::vector<uint32_t>& all_args() const { return args_; }  // every node's, in order
  const std::vector<float>& input_values() const { return input_values_; }
  // Per-invocation integers of block calls (a Call node's start in aux2).
  const std::vector<uint32_t>& ints() const { return ints_; }
  uint32_t call_ints(uint32_t id) const;  // how many of them call node `id` has
  ParameterCollection& params() const { return *params_; }
  const TypeTable& types() const;
  uint32_t generation() const { return generation_; }
  // Bumps on every change of structure; an engine schedules and plans again when it differs
  // from what it last planned.
  uint64_t version() const { return version_; }
  // Overwrites input values [offset, offset + n): the floats of the graph's inputs, in the order
  // they were added. The structure stays: an engine runs the next forward again on the plan it
  // has, without scheduling or planning.
  void write_inputs(size_t offset, const float* values, size_t n);
  // Bumps on write_inputs(); an engine runs forward again when it differs from what it last ran.
  uint64_t inputs_version() const { return inputs_version_; }
  // Bumps when truncate() drops nodes: an engine that ran some of them plans and runs the graph
  // afresh rather than extending what it ran.
  uint64_t cuts() const { return cuts_; }
  double construction_seconds() const;

  // Checked access for the Expr builders below (inline: it is on every node's path; what is
  // wrong is worked out and named out of line).
  const Node& node_of(const Expr& e, const char* fn) const {
    if (e.graph != this || e.generation != generation_ || e.id >= nodes_.size()) refuse_expr(e, fn);
    return nodes_[e.id];
  }
  uint32_t add_node(Op op, Dim dim, const uint32_t* args, uint32_t nargs, uint32_t aux = 0,
                    uint32_t aux2 = 0, float alpha = 0, float beta = 0);
  uint32_t add_input(Dim dim, const float* values);
  // `count` repetitions of input nodes of the shapes `dims` (count * ndims nodes with consecutive
  // ids), their values one after another from `values`, or zeros when `values` is null
  // (placeholders that write_inputs or a device backend's inputs fill). As many add_input calls
  // would add, at one type lookup per shape and one copy. Returns the first node's id.
  uint32_t add_inputs(const Dim* dims, uint32_t ndims, uint32_t count, const float* values);
  // Appends `copies` copies of the pattern nodes [begin, end): copy c's node i is pattern node
  // begin + i with its arguments args[c * A + j] (A: the pattern's arguments, j over them in
  // node order), a call's integers and an input's values the pattern node's (an input gets its
  // own copy of them). Each argument must come before its node and be a parameter exactly where
  // the pattern's is, so the pattern's types hold; a pattern holding a parameter node is refused
  // (a graph holds each parameter once). Returns the first copy's first node id; a refused copy
  // leaves the graph as it was. For structures that repeat a unit built once (a decoding step's
  // cell call per instance), at the cost of copying its nodes.
  uint32_t repeat_nodes(uint32_t begin, uint32_t end, uint32_t copies, const uint32_t* args);
  uint32_t add_parameter(uint32_t param_id);
  // A call of block `block` (already checked by the caller) and its output views.
  uint32_t add_call(uint32_t block, Dim dim, const uint32_t* args, uint32_t nargs,
                    const uint32_t* ints, uint32_t nints);
  // Views of the call's outputs 0 .. count - 1, of shapes dims[0 .. count - 1], as consecutive
  // nodes; returns the first's id.
  uint32_t add_outputs(uint32_t call, uint32_t count, const Dim* dims);
  // Room for `nodes`, `args` and `ints` more (growing geometrically), for bulk appends.
  void reserve_more(size_t nodes, size_t args, size_t ints);
  // Drops the nodes from id `size` on, with their arguments, integers and input values: undoes a
  // failed bulk append. An engine that ran dropped nodes runs the graph afresh (cuts()).
  void truncate(uint32_t size);
  Expr expr(uint32_t id) { return Expr{this, id, generation_}; }

 private:
  uint32_t type_of(const Node& n, const uint32_t* args);
  // Throws naming why `e` is not a node of this graph (node_of's failure).
  [[noreturn]] void refuse_expr(const Expr& e, const char* fn) const;

  ParameterCollection* params_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> args_;
  std::vector<float> input_values_;
  std::vector<uint32_t> ints_;
  std::vector<uint32_t> param_node_;  // parameter id -> node id in this graph (dedup)
  std::vector<uint32_t> key_;         // scratch for type keys
  std::vector<uint32_t> plain_call_type_;  // block id -> type of its calls without parameter inputs
  uint32_t generation_ = 1;
  uint64_t version_ = 0;
  uint64_t inputs_version_ = 0;
  uint64_t cuts_ = 0;
  std::chrono::steady_clock::time_point build_start_;
};

// ---- building expressions (DyNet style) ----
Expr input(Graph& g, Dim dim, const std::vector<float>& values);
Expr input(Graph& g, Dim dim, const float* values);
Expr input(Graph& g, float value);
Expr parameter(Graph& g, Parameter p);
Expr lookup(Graph& g, LookupParameter table, uint32_t index);
// affine({b, W1, x1, W2, x2, ...}) = b + W1 x1 + W2 x2 + ...
Expr affine(const std::vector<Expr>& xs);
Expr matmul(const Expr& a, const Expr& b);
Expr add(const Expr& a, const Expr& b);
Expr sum(const std::vector<Expr>& xs);
// Elementwise mean and max of same-shaped args; like sum, ragged (nodes of different arity batch
// together) and one argument is returned as is. maximum's gradient goes to the first maximal
// argument of each element.
Expr average(const std::vector<Expr>& xs);
Expr maximum(const std::vector<Expr>& xs);
Expr subtract(const Expr& a, const Expr& b);
Expr cmult(const Expr& a, const Expr& b);
Expr divide(const Expr& a, const Expr& b);  // a ./ b
Expr scalar_affine(const Expr& x, float alpha, float beta);
Expr scalar_divide(float alpha, const Expr& x);  // alpha ./ x
Expr tanh(const Expr& x);
Expr sigmoid(const Expr& x);
Expr relu(const Expr& x);
Expr softplus(const Expr& x);  // log(1 + e^x)
Expr exp(const Expr& x);
Expr log(const Expr& x);
Expr sqrt(const Expr& x);
Expr gelu(const Expr& x);  // exact: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default
Expr leaky_relu(const Expr& x, float slope);  // x if x > 0, else slope x (PyTorch's 0.01)
Expr elu(const Expr& x, float alpha);         // x if x > 0, else alpha (e^x - 1)
Expr abs(const Expr& x);
Expr sin(const Expr& x);
Expr cos(const Expr& x);
Expr erf(const Expr& x);
Expr atan(const Expr& x);
Expr sinh(const Expr& x);
Expr cosh(const Expr& x);
Expr asinh(const Expr& x);
Expr atanh(const Expr& x);
Expr asin(const Expr& x);
Expr acos(const Expr& x);
// 1 - erf(x) without the loss in the tail; log |Gamma(x)| (+inf at the poles); digamma, lgamma's
// derivative; the inverse of erf on [-1, 1]: torch.erfc, lgamma, digamma, erfinv.
Expr erfc(const Expr& x);
Expr lgamma(const Expr& x);
Expr digamma(const Expr& x);
Expr erfinv(const Expr& x);
// The largest integer not above x; the nearest integer, halves to even (torch.round). Their
// gradient is 0.
Expr floor(const Expr& x);
Expr round(const Expr& x);
// x's value, with no gradient passing through it to x (torch's detach).
Expr stop_gradient(const Expr& x);
// The angle of the point (b, a) in (-pi, pi], elementwise: torch.atan2(a, b).
Expr atan2(const Expr& a, const Expr& b);
// sqrt(a^2 + b^2) elementwise, without overflow or underflow in the squares: torch.hypot(a, b).
Expr hypot(const Expr& a, const Expr& b);
// a - trunc(a / b) b, of a's sign (torch.fmod); a - floor(a / b) b, of b's sign (torch.remainder,
// Python's %); |a| with b's sign bit (torch.copysign, whose gradient reaches a only).
Expr fmod(const Expr& a, const Expr& b);
Expr remainder(const Expr& a, const Expr& b);
Expr copysign(const Expr& a, const Expr& b);
// 1 where x > 0 (inclusive: x >= 0), else 0, NaN giving 0: a comparison as a 0/1 mask, with no
// gradient. keep(a, mask): a where mask > 0, else exactly 0 (a selection, so a value not kept may
// be inf or NaN); a's gradient passes where it is kept, mask's is 0. where(c, a, b) is
// keep(a, c) + keep(b, 1 - c).
Expr step(const Expr& x, bool inclusive = false);
Expr keep(const Expr& a, const Expr& mask);
// Rows of xs one after another (the same columns). More than 8 arguments are built as a concat
// of concats of at most 8 (the CUDA kernels read a concat's arguments from a table of 8).
Expr concat(const std::vector<Expr>& xs);
// Rows [begin, end) of every column.
Expr slice_rows(const Expr& x, uint32_t begin, uint32_t end);
// Over the rows of each column: (x - mean) / sqrt(var + eps) with the biased variance (PyTorch's
// layer_norm without weight and bias); softmax; log softmax.
Expr layer_norm(const Expr& x, float eps);
Expr softmax(const Expr& x);
Expr log_softmax(const Expr& x);
// Per column: its largest value (row 0) and the row holding it first, as a float (row 1): a
// 2 x cols value, so a greedy decoder reads two floats per column, not the column. A NaN counts
// as the largest value (the first NaN and its row), as in torch.max and argmax(Tensor). The
// gradient reaches the maximal entry through row 0; the row index has none.
Expr max_index(const Expr& x);
// Per column: the sum of its rows (1 x cols); its gradient reaches every row. With
// broadcast_rows, a reduction over the features that combines with them again (PyTorch's
// x.sum(-1, keepdim=True) * y): broadcast_rows(s, n) repeats each column's single row n times.
Expr column_sum(const Expr& x);
Expr broadcast_rows(const Expr& x, uint32_t rows);
// Training-mode dropout: entry i is kept and scaled by 1 / (1 - p) when
// dropout_hash(key, i) >= p * 2^32 (kernels/op_math.h, docs/programs.md), else 0. p in [0, 1).
Expr dropout(const Expr& x, float p, uint32_t key);
// The same values (column-major) under shape `dim` of the same size; free (a view). The argument
// must be computed by the graph or be an input (parameters have their own shapes).
Expr reshape(const Expr& x, Dim dim);
Expr pick(const Expr& x, uint32_t index);
Expr pick_neg_log_softmax(const Expr& x, uint32_t label);
Expr sum_losses(const std::vector<Expr>& losses);

inline Expr operator+(const Expr& a, const Expr& b) { return add(a, b); }
inline Expr operator-(const Expr& a, const Expr& b) { return subtract(a, b); }
inline Expr operator*(const Expr& a, const Expr& b) { return matmul(a, b); }
inline Expr operator*(const Expr& x, float a) { return scalar_affine(x, a, 0.0f); }
inline Expr operator*(float a, const Expr& x) { return scalar_affine(x, a, 0.0f); }
inline Expr operator+(const Expr& x, float a) { return scalar_affine(x, 1.0f, a); }
inline Expr operator+(float a, const Expr& x) { return scalar_affine(x, 1.0f, a); }
inline Expr operator-(const Expr& x, float a) { return scalar_affine(x, 1.0f, -a); }
inline Expr operator-(float a, const Expr& x) { return scalar_affine(x, -1.0f, a); }
inline Expr operator-(const Expr& x) { return scalar_affine(x, -1.0f, 0.0f); }
inline Expr operator/(const Expr& a, const Expr& b) { return divide(a, b); }
inline Expr operator/(float a, const Expr& x) { return scalar_divide(a, x); }
inline Expr operator/(const Expr& x, float a) { return scalar_affine(x, 1.0f / a, 0.0f); }

}  // namespace edbatch
