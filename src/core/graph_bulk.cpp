// Graph's bulk builders: input nodes in bulk (add_inputs) and copies of a range of nodes
// (repeat_nodes), for callers that add many rows of one shape.
#include <algorithm>
#include <string>
#include <vector>

#include "edbatch/graph.h"
#include "src/core/graph_types.h"

namespace edbatch {

uint32_t Graph::add_inputs(const Dim* dims, uint32_t ndims, uint32_t count, const float* values) {
  uint64_t floats = 0;  // per repetition
  for (uint32_t d = 0; d < ndims; ++d) {
    if (dims[d].rows == 0 || dims[d].cols == 0)
      graph_fail("input", "empty shape " + to_string(dims[d]));
    floats += static_cast<uint64_t>(dims[d].rows) * dims[d].cols;
  }
  const uint64_t total = floats * count, offset = input_values_.size();
  if (offset + total > UINT32_MAX)
    graph_fail("input", std::to_string(count) + " x " + std::to_string(floats) +
                            " input floats after the graph's " + std::to_string(offset) +
                            " pass 2^32 - 1 (a graph's input values are indexed by 32 bits)");
  const auto first = static_cast<uint32_t>(nodes_.size());
  if (ndims == 0 || count == 0) return first;
  reserve_geometric(nodes_, static_cast<size_t>(ndims) * count);
  if (values != nullptr)
    input_values_.insert(input_values_.end(), values, values + total);
  else
    input_values_.resize(offset + total, 0.0f);
  // The first repetition through add_node (its types), the others copies of it at their offsets.
  auto at = static_cast<uint32_t>(offset);
  try {
    for (uint32_t d = 0; d < ndims; ++d) {
      add_node(Op::Input, dims[d], nullptr, 0, at);
      at += dims[d].size();
    }
  } catch (...) {
    truncate(first);
    input_values_.resize(offset);
    throw;
  }
  for (uint32_t r = 1; r < count; ++r)
    for (uint32_t d = 0; d < ndims; ++d) {
      Node& n = nodes_.emplace_back(nodes_[first + d]);
      n.arg_begin = static_cast<uint32_t>(args_.size());
      n.aux = at;
      at += n.dim.size();
    }
  ++version_;
  return first;
}

// The integers of call node `id`: they end where the next call's begin (calls add theirs in node
// order), or at the end.
uint32_t Graph::call_ints(uint32_t id) const {
  for (uint32_t j = id + 1; j < nodes_.size(); ++j)
    if (nodes_[j].op == Op::Call) return nodes_[j].aux2 - nodes_[id].aux2;
  return static_cast<uint32_t>(ints_.size()) - nodes_[id].aux2;
}

uint32_t Graph::repeat_nodes(uint32_t begin, uint32_t end, uint32_t copies, const uint32_t* args) {
  const char* fn = "Graph::repeat_nodes";
  const auto first = static_cast<uint32_t>(nodes_.size());
  if (begin > end || end > first)
    graph_fail(fn, "pattern [" + std::to_string(begin) + ", " + std::to_string(end) +
                       ") is not a range of the graph's " + std::to_string(first) + " nodes");
  if (begin == end || copies == 0) return first;
  const uint32_t m = end - begin;
  const uint32_t a0 = nodes_[begin].arg_begin;
  const uint32_t A =
      (end < first ? nodes_[end].arg_begin : static_cast<uint32_t>(args_.size())) - a0;
  uint64_t floats = 0, ints = 0;  // per copy
  std::vector<uint32_t> call_ints_of(m, 0);
  for (uint32_t i = begin; i < end; ++i) {
    const Node& n = nodes_[i];
    if (n.op == Op::Parameter)
      graph_fail(fn,
                 "pattern node " + std::to_string(i) + " is a parameter (a graph holds it once)");
    if (n.op == Op::Input) floats += n.dim.size();
    if (n.op == Op::Call) ints += call_ints_of[i - begin] = call_ints(i);
  }
  if (static_cast<uint64_t>(first) + static_cast<uint64_t>(m) * copies > UINT32_MAX ||
      input_values_.size() + floats * copies > UINT32_MAX)
    graph_fail(fn, std::to_string(copies) + " copies of " + std::to_string(m) +
                       " nodes pass the graph's 32-bit ids or input offsets");
  // Every argument before its node, a parameter where the pattern's is.
  for (uint32_t c = 0; c < copies; ++c) {
    const uint32_t base = first + c * m;
    const uint32_t* ca = args + static_cast<size_t>(c) * A;
    for (uint32_t i = 0; i < m; ++i) {
      const Node& n = nodes_[begin + i];
      for (uint32_t k = 0; k < n.num_args; ++k) {
        const uint32_t j = n.arg_begin - a0 + k, b = ca[j];
        if (b >= base + i)
          graph_fail(fn, "copy " + std::to_string(c) + ", node " + std::to_string(i) +
                             ": argument " + std::to_string(k) + " is node " + std::to_string(b) +
                             ", not one before it");
        const bool was = nodes_[args_[a0 + j]].op == Op::Parameter;
        const bool is = b < first ? nodes_[b].op == Op::Parameter
                                  : nodes_[begin + (b - first) % m].op == Op::Parameter;
        if (was != is)
          graph_fail(fn, "copy " + std::to_string(c) + ", node " + std::to_string(i) +
                             ": argument " + std::to_string(k) +
                             (was ? " is not a parameter where the pattern's is"
                                  : " is a parameter where the pattern's is not"));
      }
    }
  }
  reserve_geometric(nodes_, static_cast<size_t>(m) * copies);
  reserve_geometric(args_, static_cast<size_t>(A) * copies);
  reserve_geometric(ints_, static_cast<size_t>(ints) * copies);
  reserve_geometric(input_values_, static_cast<size_t>(floats) * copies);
  for (uint32_t c = 0; c < copies; ++c) {
    const uint32_t* ca = args + static_cast<size_t>(c) * A;
    for (uint32_t i = 0; i < m; ++i) {
      Node& n = nodes_.emplace_back(nodes_[begin + i]);
      const uint32_t from = n.arg_begin - a0;
      n.arg_begin = static_cast<uint32_t>(args_.size());
      args_.insert(args_.end(), ca + from, ca + from + n.num_args);
      if (n.op == Op::Input) {  // reserved above: the pattern's values stay in place
        const uint32_t at = n.aux, size = n.dim.size();
        n.aux = static_cast<uint32_t>(input_values_.size());
        for (uint32_t k = 0; k < size; ++k) input_values_.push_back(input_values_[at + k]);
      } else if (n.op == Op::Call) {
        const uint32_t at = n.aux2, count = call_ints_of[i];
        n.aux2 = static_cast<uint32_t>(ints_.size());
        for (uint32_t k = 0; k < count; ++k) ints_.push_back(ints_[at + k]);
      }
    }
  }
  ++version_;
  return first;
}

}  // namespace edbatch
