#include "edbatch/graph.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "edbatch/types.h"
#include "src/core/graph_types.h"

namespace edbatch {

namespace {
[[noreturn]] void fail(const char* fn, const std::string& msg) {
  graph_fail(fn, msg);
}
}  // namespace

Graph::Graph(ParameterCollection& params) : params_(&params) { clear(); }

void Graph::clear() {
  // Generations are unique across all graphs, so an engine never mistakes a new graph that
  // happens to live at an old one's address for the old one.
  static std::atomic<uint32_t> next_generation{1};
  nodes_.clear();
  args_.clear();
  input_values_.clear();
  ints_.clear();
  param_node_.assign(params_->size(), UINT32_MAX);
  generation_ = next_generation.fetch_add(1, std::memory_order_relaxed);
  ++version_;
  build_start_ = std::chrono::steady_clock::now();
}

const TypeTable& Graph::types() const { return params_->types(); }

double Graph::construction_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start_).count();
}

void Graph::refuse_expr(const Expr& e, const char* fn) const {
  if (e.graph == nullptr) fail(fn, "uninitialised expression");
  if (e.graph != this) fail(fn, "expression belongs to another graph");
  if (e.generation != generation_)
    fail(fn, "expression " + std::to_string(e.id) + " is from before Graph::clear()");
  fail(fn, "expression " + std::to_string(e.id) + " is past the graph's " +
               std::to_string(nodes_.size()) + " nodes (an Expr made by hand?)");
}

uint32_t Graph::add_node(Op op, Dim dim, const uint32_t* args, uint32_t nargs, uint32_t aux,
                         uint32_t aux2, float alpha, float beta) {
  if (static_cast<uint64_t>(dim.rows) * dim.cols > UINT32_MAX)  // Dim::size() would wrap
    fail(op_name(op), "shape " + to_string(dim) + " has more than 2^32 - 1 entries");
  // Filled in place: a Node assembled on the stack field by field and then copied whole reads
  // back stores that have not landed yet (a store-forwarding stall per node).
  Node& n = nodes_.emplace_back();
  n.op = op;
  n.dim = dim;
  n.arg_begin = static_cast<uint32_t>(args_.size());
  n.num_args = nargs;
  n.aux = aux;
  n.aux2 = aux2;
  n.alpha = alpha;
  n.beta = beta;
  try {
    n.type = type_of(n, args);
  } catch (...) {
    nodes_.pop_back();  // the graph stays as it was
    throw;
  }
  args_.insert(args_.end(), args, args + nargs);
  ++version_;
  return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t Graph::add_input(Dim dim, const float* values) {
  if (dim.rows == 0 || dim.cols == 0) fail("input", "empty shape " + to_string(dim));
  if (static_cast<uint64_t>(dim.rows) * dim.cols > UINT32_MAX)
    fail("input", "shape " + to_string(dim) + " has more than 2^32 - 1 entries");
  if (values == nullptr) fail("input", "no values (a null pointer) for shape " + to_string(dim));
  const uint32_t offset = static_cast<uint32_t>(input_values_.size());
  input_values_.insert(input_values_.end(), values, values + dim.size());
  return add_node(Op::Input, dim, nullptr, 0, offset);
}

void Graph::write_inputs(size_t offset, const float* values, size_t n) {
  if (offset > input_values_.size() || n > input_values_.size() - offset)
    fail("Graph::write_inputs",
         "floats [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
             ") are outside the graph's " + std::to_string(input_values_.size()) + " input floats");
  if (n > 0 && values == nullptr) fail("Graph::write_inputs", "values is null");
  if (n > 0) std::memcpy(input_values_.data() + offset, values, n * sizeof(float));
  ++inputs_version_;
}

uint32_t Graph::add_parameter(uint32_t id) {
  if (id >= params_->size())
    fail("parameter", "no parameter with id " + std::to_string(id) + " in the collection");
  if (params_->is_lookup(id))
    fail("parameter", "'" + params_->name(id) + "' is a lookup table: use lookup()");
  if (param_node_.size() < params_->size()) param_node_.resize(params_->size(), UINT32_MAX);
  uint32_t& slot = param_node_[id];
  if (slot == UINT32_MAX) slot = add_node(Op::Parameter, params_->dim(id), nullptr, 0, id);
  return slot;
}

uint32_t Graph::add_call(uint32_t block, Dim dim, const uint32_t* args, uint32_t nargs,
                         const uint32_t* ints, uint32_t nints) {
  const uint32_t start = static_cast<uint32_t>(ints_.size());
  ints_.insert(ints_.end(), ints, ints + nints);
  return add_node(Op::Call, dim, args, nargs, block, start);
}

uint32_t Graph::add_outputs(uint32_t call, uint32_t count, const Dim* dims) {
  // add_node without the type lookup: an Output is a view (no type), and its argument is a call.
  // Through add_node, a block-built Tree-LSTM's construction measured 15-20% slower.
  // Room first, then each node and argument written once (resize would zero them first, out of
  // line).
  const size_t first = nodes_.size(), arg_begin = args_.size();
  reserve_geometric(nodes_, count);
  reserve_geometric(args_, count);
  for (uint32_t o = 0; o < count; ++o) {
    Node& n = nodes_.emplace_back();
    n.op = Op::Output;
    n.type = UINT32_MAX;
    n.dim = dims[o];
    n.arg_begin = static_cast<uint32_t>(arg_begin + o);
    n.num_args = 1;
    n.aux = o;
    args_.push_back(call);
  }
  ++version_;
  return static_cast<uint32_t>(first);
}

void Graph::reserve_more(size_t nodes, size_t args, size_t ints) {
  reserve_geometric(nodes_, nodes);
  reserve_geometric(args_, args);
  reserve_geometric(ints_, ints);
}

void Graph::truncate(uint32_t size) {
  if (size >= nodes_.size()) return;
  size_t ints_end = ints_.size(), inputs_end = input_values_.size();
  for (size_t id = size; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (n.op == Op::Call) ints_end = std::min<size_t>(ints_end, n.aux2);
    if (n.op == Op::Input) inputs_end = std::min<size_t>(inputs_end, n.aux);
    if (n.op == Op::Parameter && n.aux < param_node_.size()) param_node_[n.aux] = UINT32_MAX;
  }
  args_.resize(nodes_[size].arg_begin);
  ints_.resize(ints_end);
  input_values_.resize(inputs_end);
  nodes_.resize(size);
  ++version_;
  ++cuts_;
}

// ---- builders ----

namespace {

// A view of arguments that costs no allocation for the common two-argument calls.
struct Args {
  const Expr* p;
  size_t n;
  Args(const std::vector<Expr>& v) : p(v.data()), n(v.size()) {}
  Args(const Expr* first, size_t count) : p(first), n(count) {}
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  const Expr& operator[](size_t i) const { return p[i]; }
};

Graph& graph_of(Args xs, const char* fn) {
  if (xs.empty()) fail(fn, "needs at least one argument");
  if (xs[0].graph == nullptr) fail(fn, "argument 1 is an uninitialised expression");
  return *xs[0].graph;
}

// Checks every argument belongs to `g` and collects ids and shapes.
void collect(Graph& g, Args xs, const char* fn, std::vector<uint32_t>& ids,
             std::vector<Dim>& dims) {
  ids.clear();
  dims.clear();
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].graph != &g)
      fail(fn, "argument " + std::to_string(i + 1) +
                   (xs[i].graph == nullptr ? " is an uninitialised expression"
                                           : " belongs to another graph"));
    dims.push_back(g.node_of(xs[i], fn).dim);
    ids.push_back(xs[i].id);
  }
}

std::string where(const Graph& g) { return "node " + std::to_string(g.size()) + ": "; }

// `name`: the function the caller called, for errors (add builds a sum).
Expr elementwise(Op op, Args xs, float alpha = 0, float beta = 0, const char* name = nullptr) {
  const char* fn = name != nullptr ? name : op_name(op);
  Graph& g = graph_of(xs, fn);
  thread_local std::vector<uint32_t> ids;
  thread_local std::vector<Dim> dims;
  collect(g, xs, fn, ids, dims);
  for (size_t i = 1; i < dims.size(); ++i)
    if (dims[i] != dims[0])
      fail(fn, where(g) + "argument " + std::to_string(i + 1) + " has shape " +
                   to_string(dims[i]) + " but argument 1 has shape " + to_string(dims[0]));
  return g.expr(g.add_node(op, dims[0], ids.data(), static_cast<uint32_t>(ids.size()), 0, 0,
                           alpha, beta));
}

Expr binary(Op op, const Expr& a, const Expr& b, const char* name = nullptr) {
  const Expr xs[2] = {a, b};
  return elementwise(op, Args(xs, 2), 0, 0, name);
}

}  // namespace

Expr input(Graph& g, Dim dim, const std::vector<float>& values) {
  if (values.size() != dim.size())
    fail("input", where(g) + "shape " + to_string(dim) + " needs " + std::to_string(dim.size()) +
                      " values, got " + std::to_string(values.size()));
  return g.expr(g.add_input(dim, values.data()));
}
Expr input(Graph& g, Dim dim, const float* values) { return g.expr(g.add_input(dim, values)); }
Expr input(Graph& g, float value) { return g.expr(g.add_input(Dim{1, 1}, &value)); }

namespace {

// `what`: "parameter" or "table", as the handle names it.
void check_owner(const Graph& g, uint64_t owner, uint32_t id, const char* fn, const char* what) {
  if (owner != 0 && owner != g.params().uid())
    fail(fn, std::string("the handle of ") + what + " " + std::to_string(id) +
                 " was made by another ParameterCollection than the graph's");
}

}  // namespace

Expr parameter(Graph& g, Parameter p) {
  if (!p.valid()) fail("parameter", "uninitialised Parameter handle");
  check_owner(g, p.owner, p.id, "parameter", "parameter");
  return g.expr(g.add_parameter(p.id));
}

Expr lookup(Graph& g, LookupParameter table, uint32_t index) {
  if (!table.valid()) fail("lookup", "uninitialised LookupParameter handle");
  check_owner(g, table.owner, table.id, "lookup", "table");  // before the id: another's
  if (table.id >= g.params().size()) fail("lookup", "invalid lookup table handle");
  if (!g.params().is_lookup(table.id))
    fail("lookup", "'" + g.params().name(table.id) + "' is not a lookup table");
  const Dim d = g.params().dim(table.id);
  if (index >= d.cols)
    fail("lookup", where(g) + "index " + std::to_string(index) + " out of range for '" +
                       g.params().name(table.id) + "' with " + std::to_string(d.cols) + " entries");
  return g.expr(g.add_node(Op::Lookup, Dim{d.rows, 1}, nullptr, 0, table.id, index));
}

Expr affine(const std::vector<Expr>& xs) {
  const char* fn = "affine";
  Graph& g = graph_of(xs, fn);
  if (xs.size() < 3 || xs.size() % 2 == 0)
    fail(fn, where(g) + "expects {b, W1, x1, W2, x2, ...}, got " + std::to_string(xs.size()) +
                 " arguments");
  thread_local std::vector<uint32_t> ids;
  thread_local std::vector<Dim> dims;
  collect(g, xs, fn, ids, dims);
  const Dim out = dims[0];
  for (size_t i = 1; i < dims.size(); i += 2) {
    const Dim w = dims[i], x = dims[i + 1];
    const std::string k = std::to_string((i + 1) / 2);
    if (w.cols != x.rows)
      fail(fn, where(g) + "W" + k + " is " + to_string(w) + " but x" + k + " is " + to_string(x) +
                   " (needs " + std::to_string(w.cols) + " rows)");
    if (w.rows != out.rows || x.cols != out.cols)
      fail(fn, where(g) + "W" + k + " x" + k + " is " + to_string(Dim{w.rows, x.cols}) +
                   " but b is " + to_string(out));
  }
  return g.expr(g.add_node(Op::Affine, out, ids.data(), static_cast<uint32_t>(ids.size())));
}

Expr matmul(const Expr& a, const Expr& b) {
  const char* fn = "matmul";
  const Expr xs[2] = {a, b};
  Graph& g = graph_of(Args(xs, 2), fn);
  thread_local std::vector<uint32_t> ids;
  thread_local std::vector<Dim> dims;
  collect(g, Args(xs, 2), fn, ids, dims);
  if (dims[0].cols != dims[1].rows)
    fail(fn, where(g) + "cannot multiply " + to_string(dims[0]) + " by " + to_string(dims[1]));
  return g.expr(g.add_node(Op::MatMul, Dim{dims[0].rows, dims[1].cols}, ids.data(), 2));
}

namespace {
// Sum, average, maximum: one argument is returned as is.
Expr variadic(Op op, const std::vector<Expr>& xs) {
  if (xs.size() == 1) {
    graph_of(Args(xs), op_name(op)).node_of(xs[0], op_name(op));
    return xs[0];
  }
  return elementwise(op, xs);
}
}  // namespace

Expr add(const Expr& a, const Expr& b) {
  return binary(Op::Sum, a, b, "add");
}
Expr sum(const std::vector<Expr>& xs) { return variadic(Op::Sum, xs); }
Expr average(const std::vector<Expr>& xs) { return variadic(Op::Average, xs); }
Expr maximum(const std::vector<Expr>& xs) { return variadic(Op::Maximum, xs); }
Expr subtract(const Expr& a, const Expr& b) { return binary(Op::Subtract, a, b); }
Expr cmult(const Expr& a, const Expr& b) { return binary(Op::CMult, a, b); }
Expr divide(const Expr& a, const Expr& b) { return binary(Op::Divide, a, b); }
Expr atan2(const Expr& a, const Expr& b) {
  return binary(Op::Atan2, a, b);
}
Expr hypot(const Expr& a, const Expr& b) {
  return binary(Op::Hypot, a, b);
}
Expr fmod(const Expr& a, const Expr& b) {
  return binary(Op::Fmod, a, b);
}
Expr remainder(const Expr& a, const Expr& b) {
  return binary(Op::Remainder, a, b);
}
Expr copysign(const Expr& a, const Expr& b) {
  return binary(Op::Copysign, a, b);
}
Expr scalar_affine(const Expr& x, float alpha, float beta) {
  return elementwise(Op::ScalarAffine, Args(&x, 1), alpha, beta);
}
Expr scalar_divide(float alpha, const Expr& x) {
  return elementwise(Op::ScalarDivide, Args(&x, 1), alpha);
}
Expr tanh(const Expr& x) { return elementwise(Op::Tanh, Args(&x, 1)); }
Expr sigmoid(const Expr& x) { return elementwise(Op::Sigmoid, Args(&x, 1)); }
Expr relu(const Expr& x) { return elementwise(Op::Relu, Args(&x, 1)); }
Expr softplus(const Expr& x) { return elementwise(Op::Softplus, Args(&x, 1)); }
Expr exp(const Expr& x) { return elementwise(Op::Exp, Args(&x, 1)); }
Expr log(const Expr& x) { return elementwise(Op::Log, Args(&x, 1)); }
Expr sqrt(const Expr& x) { return elementwise(Op::Sqrt, Args(&x, 1)); }
Expr gelu(const Expr& x) { return elementwise(Op::Gelu, Args(&x, 1)); }
namespace {
// A finite attribute (a NaN slope would make every value NaN without a word).
const Expr& finite_attr(const Expr& x, float a, const char* fn, const char* name) {
  Graph& g = graph_of(Args(&x, 1), fn);
  if (!std::isfinite(a))
    fail(fn, where(g) + name + " = " + short_float(a) + " for " + to_string(g.node_of(x, fn).dim) +
                 ": needs a finite number");
  return x;
}
}  // namespace

Expr leaky_relu(const Expr& x, float slope) {
  return elementwise(Op::LeakyRelu, Args(&finite_attr(x, slope, "leaky_relu", "slope"), 1), slope);
}
Expr elu(const Expr& x, float alpha) {
  return elementwise(Op::Elu, Args(&finite_attr(x, alpha, "elu", "alpha"), 1), alpha);
}
Expr abs(const Expr& x) {
  return elementwise(Op::Abs, Args(&x, 1));
}
Expr sin(const Expr& x) {
  return elementwise(Op::Sin, Args(&x, 1));
}
Expr cos(const Expr& x) {
  return elementwise(Op::Cos, Args(&x, 1));
}
Expr erf(const Expr& x) {
  return elementwise(Op::Erf, Args(&x, 1));
}
Expr atan(const Expr& x) {
  return elementwise(Op::Atan, Args(&x, 1));
}
Expr sinh(const Expr& x) {
  return elementwise(Op::Sinh, Args(&x, 1));
}
Expr cosh(const Expr& x) {
  return elementwise(Op::Cosh, Args(&x, 1));
}
Expr asinh(const Expr& x) {
  return elementwise(Op::Asinh, Args(&x, 1));
}
Expr atanh(const Expr& x) {
  return elementwise(Op::Atanh, Args(&x, 1));
}
Expr asin(const Expr& x) {
  return elementwise(Op::Asin, Args(&x, 1));
}
Expr acos(const Expr& x) {
  return elementwise(Op::Acos, Args(&x, 1));
}
Expr erfc(const Expr& x) {
  return elementwise(Op::Erfc, Args(&x, 1));
}
Expr lgamma(const Expr& x) {
  return elementwise(Op::Lgamma, Args(&x, 1));
}
Expr digamma(const Expr& x) {
  return elementwise(Op::Digamma, Args(&x, 1));
}
Expr erfinv(const Expr& x) {
  return elementwise(Op::Erfinv, Args(&x, 1));
}
Expr floor(const Expr& x) {
  return elementwise(Op::Floor, Args(&x, 1));
}
Expr round(const Expr& x) {
  return elementwise(Op::Round, Args(&x, 1));
}
Expr stop_gradient(const Expr& x) {
  return elementwise(Op::StopGradient, Args(&x, 1));
}
Expr step(const Expr& x, bool inclusive) {
  return elementwise(Op::Step, Args(&x, 1), inclusive ? 1.0f : 0.0f);
}
Expr keep(const Expr& a, const Expr& mask) {
  return binary(Op::Keep, a, mask);
}
Expr softmax(const Expr& x) { return elementwise(Op::Softmax, Args(&x, 1)); }
Expr log_softmax(const Expr& x) { return elementwise(Op::LogSoftmax, Args(&x, 1)); }
Expr max_index(const Expr& x) {
  const char* fn = op_name(Op::MaxIndex);
  Graph& g = graph_of(Args(&x, 1), fn);
  const Dim d = g.node_of(x, fn).dim;
  if (d.size() == 0) fail(fn, where(g) + "the argument is empty");
  if (d.rows > (1u << 24))  // the row index must be exact as a float
    fail(fn, where(g) + "columns of " + std::to_string(d.rows) + " rows; at most 16777216");
  return g.expr(g.add_node(Op::MaxIndex, Dim{2, d.cols}, &x.id, 1));
}

Expr column_sum(const Expr& x) {
  const char* fn = op_name(Op::ColumnSum);
  Graph& g = graph_of(Args(&x, 1), fn);
  const Dim d = g.node_of(x, fn).dim;
  if (d.size() == 0) fail(fn, where(g) + "the argument is empty");
  return g.expr(g.add_node(Op::ColumnSum, Dim{1, d.cols}, &x.id, 1));
}

Expr broadcast_rows(const Expr& x, uint32_t rows) {
  const char* fn = op_name(Op::Broadcast);
  Graph& g = graph_of(Args(&x, 1), fn);
  const Dim d = g.node_of(x, fn).dim;
  if (d.rows != 1 || d.cols == 0 || rows == 0)
    fail(fn, where(g) + "broadcasts " + to_string(d) + " to " + std::to_string(rows) +
                 " rows: needs one row and at least one column, to one row or more");
  return g.expr(g.add_node(Op::Broadcast, Dim{rows, d.cols}, &x.id, 1));
}

Expr layer_norm(const Expr& x, float eps) {
  const char* fn = "layer_norm";
  Graph& g = graph_of(Args(&x, 1), fn);
  const Dim d = g.node_of(x, fn).dim;
  if (!(eps >= 0) || std::isinf(eps))
    fail(fn, where(g) + "eps = " + short_float(eps) + " for " + to_string(d) +
                 ": needs a finite eps >= 0");
  return elementwise(Op::LayerNorm, Args(&x, 1), eps);
}

Expr dropout(const Expr& x, float p, uint32_t key) {
  const char* fn = "dropout";
  Graph& g = graph_of(Args(&x, 1), fn);
  const Dim d = g.node_of(x, fn).dim;
  if (!(p >= 0 && p < 1))
    fail(fn, where(g) + "p = " + short_float(p) + " (of a " + to_string(d) +
                 " value) is outside [0, 1)");
  return g.expr(g.add_node(Op::Dropout, d, &x.id, 1, 0, key, p));
}

Expr slice_rows(const Expr& x, uint32_t begin, uint32_t end) {
  const char* fn = "slice_rows";
  Graph& g = graph_of(Args(&x, 1), fn);
  const Dim d = g.node_of(x, fn).dim;
  if (begin >= end || end > d.rows)
    fail(fn, where(g) + "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                 to_string(d) + (begin >= end ? " are empty" : " are out of range"));
  return g.expr(g.add_node(Op::SliceRows, Dim{end - begin, d.cols}, &x.id, 1, begin));
}
Expr sum_losses(const std::vector<Expr>& losses) {
  Graph& g = graph_of(losses, "sum_losses");
  for (size_t i = 0; i < losses.size(); ++i) {
    const Expr& l = losses[i];
    if (l.graph == &g && g.node_of(l, "sum_losses").dim != Dim{1, 1})
      fail("sum_losses", "losses[" + std::to_string(i) + "] (node " + std::to_string(l.id) +
                             ") is " + to_string(g.node(l.id).dim) + ", not a scalar");
  }
  return sum(losses);
}

Expr concat(const std::vector<Expr>& xs) {
  const char* fn = "concat";
  Graph& g = graph_of(xs, fn);
  thread_local std::vector<uint32_t> ids;
  thread_local std::vector<Dim> dims;
  collect(g, xs, fn, ids, dims);
  Dim out{0, dims[0].cols};
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].cols != out.cols)
      fail(fn, where(g) + "argument " + std::to_string(i + 1) + " has " +
                   std::to_string(dims[i].cols) + " columns, argument 1 has " +
                   std::to_string(out.cols));
    out.rows += dims[i].rows;
  }
  if (xs.size() > kMaxConcatArgs) {  // checked whole above, so errors name the caller's arguments
    std::vector<Expr> groups;
    for (size_t i = 0; i < xs.size(); i += kMaxConcatArgs) {
      const auto first = xs.begin() + static_cast<std::ptrdiff_t>(i);
      const auto last =
          first + static_cast<std::ptrdiff_t>(std::min<size_t>(kMaxConcatArgs, xs.size() - i));
      groups.push_back(last - first == 1 ? *first : concat(std::vector<Expr>(first, last)));
    }
    return concat(groups);
  }
  return g.expr(g.add_node(Op::Concat, out, ids.data(), static_cast<uint32_t>(ids.size())));
}

Expr reshape(const Expr& x, Dim dim) {
  const char* fn = "reshape";
  Graph& g = graph_of(Args(&x, 1), fn);
  const Node& n = g.node_of(x, fn);
  if (n.dim.size() != dim.size())
    fail(fn, where(g) + "cannot reshape " + to_string(n.dim) + " (" + std::to_string(n.dim.size()) +
                 " values) to " + to_string(dim));
  if (n.op == Op::Parameter)
    fail(fn, where(g) + "argument is the parameter '" + g.params().name(n.aux) +
                 "': declare the parameter with the shape you need");
  return g.expr(g.add_node(Op::Reshape, dim, &x.id, 1));
}

namespace {
Expr indexed_scalar(Op op, const Expr& x, uint32_t index, const char* what) {
  const char* fn = op_name(op);
  Graph& g = graph_of(Args(&x, 1), fn);
  const Dim d = g.node_of(x, fn).dim;
  if (d.cols != 1) fail(fn, where(g) + "expects a vector, got " + to_string(d));
  if (index >= d.rows)
    fail(fn, where(g) + what + " " + std::to_string(index) + " out of range for a vector of " +
                 std::to_string(d.rows));
  return g.expr(g.add_node(op, Dim{1, 1}, &x.id, 1, 0, index));
}
}  // namespace

Expr pick(const Expr& x, uint32_t index) { return indexed_scalar(Op::Pick, x, index, "index"); }
Expr pick_neg_log_softmax(const Expr& x, uint32_t label) {
  return indexed_scalar(Op::PickNegLogSoftmax, x, label, "label");
}

}  // namespace edbatch
