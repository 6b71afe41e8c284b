// The closed set of operations. Adding an op: docs/architecture.md, "Adding an op" (for an
// elementwise op: the enum entry and kOpInfo row here, its math in kernels/op_math.h, the builder,
// a case in the op harness).
#pragma once
#include <cstddef>
#include <cstdint>

namespace edbatch {

enum class Op : uint8_t {
  Input,         // source: values given at construction
  Parameter,     // source: a parameter of the collection
  Lookup,        // column `index` of a lookup table
  Affine,        // b + W1 x1 + W2 x2 + ...   args: b, W1, x1, W2, x2, ...
  MatMul,        // a * b
  Sum,           // variadic sum of same-shaped args (ragged: arity is not part of the type)
  Average,       // variadic elementwise mean, ragged like Sum
  Maximum,       // variadic elementwise max (NaN where any arg is), ragged like Sum; gradient to
                 // the first maximal arg (the first NaN)
  Subtract,      // a - b
  CMult,         // a .* b
  Divide,        // a ./ b
  ScalarAffine,  // alpha * x + beta (x*a, a-x, x+a)
  ScalarDivide,  // alpha ./ x
  Tanh,
  Sigmoid,
  Relu,
  Softplus,  // log(1 + e^x)
  Exp,
  Log,
  Sqrt,
  Gelu,       // x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), exact
  LeakyRelu,  // x if x > 0, else alpha x
  Elu,        // x if x > 0, else alpha (e^x - 1)
  Abs,        // |x| (gradient 0 at 0)
  Step,       // 1 if x > 0 (alpha 1: x >= 0), else 0 (NaN: 0); gradient 0
  Keep,       // a where b > 0, else 0 (b's gradient 0): a selection, never a * 0
  Sin,
  Cos,
  Erf,
  Atan,
  Sinh,
  Cosh,
  Asinh,
  Atanh,
  Asin,
  Acos,
  Erfc,               // 1 - erf(x), without the loss in the tail
  Lgamma,             // log |Gamma(x)|
  Digamma,            // the derivative of lgamma
  Erfinv,             // the inverse of erf on [-1, 1]
  Floor,              // the largest integer not above x (gradient 0)
  Round,              // the nearest integer, halves to even (gradient 0)
  StopGradient,       // x itself, with gradient 0 (torch's detach)
  Atan2,              // the angle of (b, a) in (-pi, pi]: atan2(a, b), as torch.atan2(a, b)
  Hypot,              // sqrt(a^2 + b^2) without overflow or underflow, as torch.hypot(a, b)
  Fmod,               // a - trunc(a / b) b, of a's sign, as torch.fmod(a, b)
  Remainder,          // a - floor(a / b) b, of b's sign, as torch.remainder(a, b) (Python's %)
  Copysign,           // |a| with b's sign bit, as torch.copysign(a, b)
  Concat,             // stack args vertically (rows add up, cols equal)
  SliceRows,          // rows [aux, aux + rows) of every column of the argument
  Pick,               // element `index` of a vector: 1x1
  PickNegLogSoftmax,  // -log softmax(x)[label]: 1x1
  Softmax,            // over each column's rows
  LogSoftmax,         // over each column's rows
  LayerNorm,          // per column (x - mean) / sqrt(var + alpha), var biased
  Dropout,            // entry i times 1/(1-alpha) if dropout_hash(aux2, i) >= alpha * 2^32, else 0
  MaxIndex,   // per column: its largest value and that value's first row (a float): 2 x cols
  ColumnSum,  // per column: the sum of its rows: 1 x cols
  Broadcast,  // a 1 x cols argument with each column's value repeated over the output's rows
  Call,       // an invocation of a block (aux: block id, aux2: its integers in Graph::ints())
  Output,     // output `aux` of the Call that is its only argument: a view, never scheduled
  Reshape,    // its argument's values under another shape of the same size: a view
  Count
};

// How nodes of one op may batch together.
enum class BatchRule : uint8_t {
  Source,   // never scheduled (inputs, parameters)
  Exact,    // same op, shapes and shared operands
  Ragged,   // as Exact, but the number of args may differ between nodes of a batch
  View,     // never scheduled: a part of another node's value (block outputs)
};

struct OpInfo {
  const char* name;
  int min_args;
  int max_args;  // -1: variadic
  BatchRule rule;
  bool elementwise;  // one pass over the output, operands read through index lists
};

namespace detail {
// One row per Op, in enum order.
inline constexpr OpInfo kOpInfo[] = {
    // name, min args, max args, rule, elementwise
    {"input", 0, 0, BatchRule::Source, false},
    {"parameter", 0, 0, BatchRule::Source, false},
    {"lookup", 0, 0, BatchRule::Exact, true},
    {"affine", 3, -1, BatchRule::Exact, false},
    {"matmul", 2, 2, BatchRule::Exact, false},
    {"sum", 1, -1, BatchRule::Ragged, true},
    {"average", 1, -1, BatchRule::Ragged, true},
    {"maximum", 1, -1, BatchRule::Ragged, true},
    {"subtract", 2, 2, BatchRule::Exact, true},
    {"cmult", 2, 2, BatchRule::Exact, true},
    {"divide", 2, 2, BatchRule::Exact, true},
    {"scalar_affine", 1, 1, BatchRule::Exact, true},
    {"scalar_divide", 1, 1, BatchRule::Exact, true},
    {"tanh", 1, 1, BatchRule::Exact, true},
    {"sigmoid", 1, 1, BatchRule::Exact, true},
    {"relu", 1, 1, BatchRule::Exact, true},
    {"softplus", 1, 1, BatchRule::Exact, true},
    {"exp", 1, 1, BatchRule::Exact, true},
    {"log", 1, 1, BatchRule::Exact, true},
    {"sqrt", 1, 1, BatchRule::Exact, true},
    {"gelu", 1, 1, BatchRule::Exact, true},
    {"leaky_relu", 1, 1, BatchRule::Exact, true},
    {"elu", 1, 1, BatchRule::Exact, true},
    {"abs", 1, 1, BatchRule::Exact, true},
    {"step", 1, 1, BatchRule::Exact, true},
    {"keep", 2, 2, BatchRule::Exact, true},
    {"sin", 1, 1, BatchRule::Exact, true},
    {"cos", 1, 1, BatchRule::Exact, true},
    {"erf", 1, 1, BatchRule::Exact, true},
    {"atan", 1, 1, BatchRule::Exact, true},
    {"sinh", 1, 1, BatchRule::Exact, true},
    {"cosh", 1, 1, BatchRule::Exact, true},
    {"asinh", 1, 1, BatchRule::Exact, true},
    {"atanh", 1, 1, BatchRule::Exact, true},
    {"asin", 1, 1, BatchRule::Exact, true},
    {"acos", 1, 1, BatchRule::Exact, true},
    {"erfc", 1, 1, BatchRule::Exact, true},
    {"lgamma", 1, 1, BatchRule::Exact, true},
    {"digamma", 1, 1, BatchRule::Exact, true},
    {"erfinv", 1, 1, BatchRule::Exact, true},
    {"floor", 1, 1, BatchRule::Exact, true},
    {"round", 1, 1, BatchRule::Exact, true},
    {"stop_gradient", 1, 1, BatchRule::Exact, true},
    {"atan2", 2, 2, BatchRule::Exact, true},
    {"hypot", 2, 2, BatchRule::Exact, true},
    {"fmod", 2, 2, BatchRule::Exact, true},
    {"remainder", 2, 2, BatchRule::Exact, true},
    {"copysign", 2, 2, BatchRule::Exact, true},
    {"concat", 1, -1, BatchRule::Exact, true},
    {"slice_rows", 1, 1, BatchRule::Exact, true},
    {"pick", 1, 1, BatchRule::Exact, true},
    {"pick_neg_log_softmax", 1, 1, BatchRule::Exact, true},
    {"softmax", 1, 1, BatchRule::Exact, true},
    {"log_softmax", 1, 1, BatchRule::Exact, true},
    {"layer_norm", 1, 1, BatchRule::Exact, true},
    {"dropout", 1, 1, BatchRule::Exact, true},
    {"max_index", 1, 1, BatchRule::Exact, true},
    {"column_sum", 1, 1, BatchRule::Exact, true},
    {"broadcast", 1, 1, BatchRule::Exact, true},
    {"call", 0, -1, BatchRule::Exact, false},
    {"output", 1, 1, BatchRule::View, false},
    {"reshape", 1, 1, BatchRule::View, false},
};
static_assert(sizeof(kOpInfo) / sizeof(kOpInfo[0]) == static_cast<size_t>(Op::Count),
              "kOpInfo must have one row per Op");
}  // namespace detail

// Inline: the scheduler, planner and kernels ask per node. Ops come from the enum only.
inline const OpInfo& op_info(Op op) { return detail::kOpInfo[static_cast<size_t>(op)]; }
inline const char* op_name(Op op) { return op_info(op).name; }
// Scheduled nodes run in batches; sources and views do not.
inline bool is_scheduled(Op op) {
  const BatchRule r = op_info(op).rule;
  return r != BatchRule::Source && r != BatchRule::View;
}
// Ops with a per-node integer (Node::aux2: a lookup column, a pick index or label, a dropout
// key), which may differ between the nodes of a batch: the memory plan lists it per node.
inline bool per_node_int(Op op) {
  return op == Op::Lookup || op == Op::Pick || op == Op::PickNegLogSoftmax || op == Op::Dropout;
}
// The most arguments of one concat node (the CUDA kernels keep a concat's argument rows in a
// table of this size); `concat` of more builds a concat of concats, the same values everywhere.
inline constexpr uint32_t kMaxConcatArgs = 8;

}  // namespace edbatch
