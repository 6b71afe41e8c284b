// The closed set of operations. Adding an op: one enum entry, one kOpInfo row, one kernel row per
// backend, one case in the op harness (tests/test_ops.cpp).
#pragma once
#include <cstdint>

namespace edbatch {

enum class Op : uint8_t {
  Input,        // source: values given at construction
  Parameter,    // source: a parameter of the collection
  Lookup,       // column `index` of a lookup table
  Affine,       // b + W1 x1 + W2 x2 + ...   args: b, W1, x1, W2, x2, ...
  MatMul,       // a * b
  Sum,          // variadic sum of same-shaped args (ragged: arity is not part of the type)
  Subtract,     // a - b
  CMult,        // a .* b
  ScalarAffine, // alpha * x + beta (x*a, a-x, x+a)
  Tanh,
  Sigmoid,
  Relu,
  Concat,       // stack args vertically (rows add up, cols equal)
  Pick,         // element `index` of a vector: 1x1
  PickNegLogSoftmax,  // -log softmax(x)[label]: 1x1
  Call,         // an invocation of a block (aux: block id, aux2: its integers in Graph::ints())
  Output,       // output `aux` of the Call that is its only argument: a view, never scheduled
  Reshape,      // its argument's values under another shape of the same size: a view
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

const OpInfo& op_info(Op op);
inline const char* op_name(Op op) { return op_info(op).name; }
// Scheduled nodes run in batches; sources and views do not.
inline bool is_scheduled(Op op) {
  const BatchRule r = op_info(op).rule;
  return r != BatchRule::Source && r != BatchRule::View;
}

}  // namespace edbatch
