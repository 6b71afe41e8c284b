// Expanding a batch of k block calls into the steps of the block's plan: each step runs over
// member_count * k virtual nodes (member j, invocation i is node j * k + i) whose operands are
// internal values of the call region, the block's inputs (the call batch's operands) or weights.
#include <stdexcept>
#include <string>

#include "edbatch/block_plan.h"
#include "edbatch/graph.h"
#include "memplan/outer_order.h"

namespace edbatch {

namespace {

// Offset of node i's value in an already classified operand (never Param or Ragged).
uint32_t operand_offset(const Operand& o, uint32_t i, const MemoryPlan& out) {
  switch (o.mode) {
    case OperandMode::Shared: return o.offset;
    case OperandMode::Contiguous: return o.offset + i * o.stride;
    default: return out.index[o.index_begin + i];
  }
}

// Operand slot `slot` of a step whose members are `members`.
Operand step_operand(const BlockPlan& b, const uint32_t* members, uint32_t m, uint32_t slot,
                     uint32_t k, const BatchPlan& bp, MemoryPlan& out) {
  const Graph& body = *b.body;
  auto arg = [&](uint32_t j) { return body.args(body.node(members[j]))[slot]; };
  const uint32_t a0 = arg(0);
  const Node& n0 = body.node(a0);
  const uint32_t size = n0.dim.size();
  if (n0.op == Op::Parameter) {
    bool same = true;
    for (uint32_t j = 1; j < m; ++j) same &= body.node(arg(j)).aux == n0.aux;
    if (same) return Operand{OperandMode::Param, n0.aux, 0, 0, 0};
    Operand o{OperandMode::ParamStacked, n0.aux, 0, k, static_cast<uint32_t>(out.index.size())};
    for (uint32_t j = 0; j < m; ++j) out.index.push_back(body.node(arg(j)).aux);
    return o;
  }
  const Operand* inputs = out.operands.data() + bp.operand_begin;
  if (m == 1 && b.input_of[a0] >= 0) {
    Operand o = inputs[b.input_of[a0]];
    if (o.mode == OperandMode::Shared) ++out.shared_operands;
    if (o.mode == OperandMode::Contiguous) ++out.contiguous_operands;
    if (o.mode == OperandMode::Indexed) ++out.indexed_operands;
    return o;
  }
  // Internal values laid out consecutively in member order: one view over all m * k nodes.
  bool view = b.base[a0] != UINT32_MAX;
  for (uint32_t j = 1; j < m && view; ++j) view = b.base[arg(j)] == b.base[a0] + j * size;
  if (view) {
    ++out.contiguous_operands;
    return Operand{OperandMode::Contiguous, 0, bp.out_offset + k * b.base[a0], size, 0};
  }
  thread_local std::vector<uint32_t> offsets;
  offsets.resize(static_cast<size_t>(m) * k);
  for (uint32_t j = 0; j < m; ++j) {
    const uint32_t a = arg(j);
    if (b.input_of[a] >= 0) {
      const Operand& in = inputs[b.input_of[a]];
      if (in.mode == OperandMode::Param)
        throw std::invalid_argument("[plan_memory] block '" + b.name + "': input '" +
                                    b.input_names[b.input_of[a]] +
                                    "' is a parameter, read in a step together with other values;"
                                    " pass it through an op (e.g. x * 1) or as a body parameter");
      for (uint32_t i = 0; i < k; ++i) offsets[j * k + i] = operand_offset(in, i, out);
    } else {
      for (uint32_t i = 0; i < k; ++i) offsets[j * k + i] = bp.out_offset + k * b.base[a] + i * size;
    }
  }
  return classify_offsets(offsets.data(), m * k, size, out);
}

}  // namespace

void expand_call(const Graph& g, const BlockPlan& b, const uint32_t* calls, uint32_t k,
                 BatchPlan& bp, MemoryPlan& out) {
  const Graph& body = *b.body;
  bp.step_begin = static_cast<uint32_t>(out.steps.size());
  bp.step_count = static_cast<uint32_t>(b.steps.size());
  for (const BlockStep& st : b.steps) {
    const uint32_t* members = b.members.data() + st.member_begin;
    const uint32_t m = st.member_count;
    const Node& first = body.node(members[0]);
    BatchPlan sp;
    sp.out_offset = bp.out_offset + k * b.base[members[0]];
    sp.out_size = first.dim.size();
    sp.count = m * k;
    sp.aux_begin = static_cast<uint32_t>(out.aux.size());
    if (first.op == Op::Lookup || first.op == Op::Pick || first.op == Op::PickNegLogSoftmax) {
      for (uint32_t j = 0; j < m; ++j) {
        const uint32_t slot = b.slot[members[j]];
        for (uint32_t i = 0; i < k; ++i)
          out.aux.push_back(slot == UINT32_MAX ? body.node(members[j]).aux2
                                               : g.ints()[g.node(calls[i]).aux2 + slot]);
      }
    }
    sp.operand_begin = static_cast<uint32_t>(out.operands.size());
    for (uint32_t slot = 0; slot < first.num_args; ++slot) {
      const Operand o = step_operand(b, members, m, slot, k, bp, out);
      out.operands.push_back(o);
    }
    sp.operand_count = first.num_args;
    out.steps.push_back(sp);
  }
}

}  // namespace edbatch
