// The compiled form of a block: plain data that the memory planner expands for a batch of k
// invocations and that backends run.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edbatch/dim.h"
#include "edbatch/graph.h"
#include "edbatch/op.h"

namespace edbatch {

// One internal batch: `member_count` body nodes of one internal type, run over k invocations as
// member_count * k virtual nodes (member j, invocation i is virtual node j * k + i).
struct BlockStep {
  Op op;
  uint32_t member_begin;  // into BlockPlan::members, in layout order
  uint32_t member_count;
  uint32_t group;         // into BlockPlan::groups
  bool stacked;           // GEMM weights differ per member (stored stacked where possible)
};

// Consecutive steps that run as one pass per chunk of invocations (fused elementwise chains), or
// a single step.
struct BlockGroup {
  uint32_t step_begin, step_count;
  bool fused;
};

// The most operands one step of a compiled body reads (the CPU kernels' operand table);
// Block::freeze refuses a body node with more.
constexpr uint32_t kMaxStepOperands = 64;
constexpr uint32_t kNoLimit = UINT32_MAX;  // an integer slot that takes any value (dropout keys)

struct BlockPlan {
  std::string name;
  uint32_t id = 0;
  ParameterCollection* params = nullptr;
  bool frozen = false;
  double freeze_ms = 0;

  // Declaration.
  std::unique_ptr<Graph> source;  // the body as written
  std::vector<std::string> input_names, index_names, output_names;
  std::vector<Dim> input_dims;
  std::vector<uint32_t> source_inputs, source_outputs;  // node ids in `source`
  std::vector<uint32_t> source_slot;  // per source node: its per-invocation slot, or UINT32_MAX

  // Compilation (ids below are nodes of `body`).
  std::unique_ptr<Graph> body;   // the body after rewrites (W [a; b] -> W_a a + W_b b), dead
                                 // nodes dropped
  std::vector<uint32_t> input_node;   // per input: its Input node
  std::vector<uint32_t> output_node;  // per output
  std::vector<Dim> output_dims;       // per output: its node's shape
  std::vector<uint32_t> slot;         // per body node: per-invocation slot or UINT32_MAX
  std::vector<int32_t> input_of;      // per body node: the input it is, or -1
  std::vector<uint32_t> members;
  std::vector<BlockStep> steps;
  std::vector<BlockGroup> groups;
  std::vector<uint32_t> base;         // per body node: floats per invocation before its value
                                      // (a batch of k holds it at k * base), UINT32_MAX if none
  uint32_t floats_per_invocation = 0;
  uint32_t output_floats = 0;         // sum of output sizes (the call node's shape)
  uint32_t lower_bound = 0;           // per-type chain bound of the internal schedule
  bool exact = false;                 // internal schedule from the exact search
  std::vector<uint32_t> index_limit;  // per slot: values must be below this (kNoLimit: any)
  // Internal operands (over all steps and slots): one view over all members, or one view per
  // member (members' values not consecutive in member order).
  uint32_t internal_views = 0, internal_per_member = 0;
};

// What a call of `p` must satisfy (Block::call, PackedGraph::append): input k has the shape
// dim_of(k) the block declared, integer k is below its slot's limit. Returns what is wrong,
// naming the input or integer, or "" (the message is made only on a failure).
template <class DimOf>
std::string call_mismatch(const BlockPlan& p, DimOf dim_of, const uint32_t* ints) {
  for (uint32_t k = 0; k < p.input_dims.size(); ++k) {
    const Dim d = dim_of(k);
    if (d != p.input_dims[k])
      return "input '" + p.input_names[k] + "' has shape " + to_string(d) + ", expected " +
             to_string(p.input_dims[k]);
  }
  for (uint32_t k = 0; k < p.index_names.size(); ++k)
    if (p.index_limit[k] != kNoLimit && ints[k] >= p.index_limit[k])
      return "integer '" + p.index_names[k] + "' = " + std::to_string(ints[k]) +
             " is out of range (must be below " + std::to_string(p.index_limit[k]) + ")";
  return {};
}

// The nodes of a checked call of `p` on input node ids and integers: the call, then its outputs
// (output o is node call + 1 + o). Returns the call's id.
inline uint32_t add_call_nodes(Graph& g, const BlockPlan& p, const uint32_t* inputs,
                               const uint32_t* ints) {
  const uint32_t call =
      g.add_call(p.id, Dim{p.output_floats, 1}, inputs, static_cast<uint32_t>(p.input_dims.size()),
                 ints, static_cast<uint32_t>(p.index_names.size()));
  g.add_outputs(call, static_cast<uint32_t>(p.output_dims.size()), p.output_dims.data());
  return call;
}

}  // namespace edbatch
