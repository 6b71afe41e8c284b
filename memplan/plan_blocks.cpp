// Expanding a batch of k block calls into the steps of the block's plan: each step runs over
// member_count * k virtual nodes (member j, invocation i is node j * k + i) whose operands are
// internal values of the call region, the block's inputs (the call batch's operands) or weights.

#include "edbatch/block_plan.h"
#include "edbatch/graph.h"
#include "memplan/outer_order.h"

namespace edbatch {

namespace {

// Member j's operand over the k invocations: a weight, a block input (the call batch's operand)
// or an internal value of the call region.
Operand member_operand(const BlockPlan& b, uint32_t a, uint32_t k, const BatchPlan& bp,
                       const MemoryPlan& out) {
  const Node& n = b.body->node(a);
  if (n.op == Op::Parameter) return Operand{OperandMode::Param, n.aux, 0, 0, 0};
  if (b.input_of[a] >= 0) return out.operands[bp.operand_begin + b.input_of[a]];
  return Operand{OperandMode::Contiguous, 0, bp.out_offset + k * b.base[a], n.dim.size(), 0};
}

// Operand slot `slot` of a step whose members are `members`: one operand over all m * k nodes
// when it can be (a shared weight, one input, or internal values laid out consecutively in member
// order), else one operand per member.
Operand step_operand(const BlockPlan& b, const uint32_t* members, uint32_t m, uint32_t slot,
                     uint32_t k, const BatchPlan& bp, MemoryPlan& out) {
  const Graph& body = *b.body;
  auto arg = [&](uint32_t j) { return body.args(body.node(members[j]))[slot]; };
  const Node& first = body.node(members[0]);
  const uint32_t a0 = arg(0);
  const Node& n0 = body.node(a0);
  const uint32_t size = n0.dim.size();
  bool same_param = n0.op == Op::Parameter, view = b.base[a0] != UINT32_MAX;
  for (uint32_t j = 1; j < m; ++j) {
    same_param = same_param && body.node(arg(j)).aux == n0.aux && body.node(arg(j)).op == Op::Parameter;
    view = view && b.base[arg(j)] == b.base[a0] + j * size;
  }
  // The step's previous operand (slot - 1, already appended): the weight when this is a GEMM x.
  const Operand* w = slot > 0 ? &out.operands.back() : nullptr;
  auto weight_of = [&](uint32_t j) {
    return w->mode == OperandMode::PerMember ? out.member_operands[w->index_begin + j] : *w;
  };
  if (m == 1 || same_param || view) {
    const Operand o = member_operand(b, a0, k, bp, out);
    if (o.mode != OperandMode::Param) ++out.member_view_operands;
    if (w) out.gather_bytes += gather_bytes(body, first, slot, o, weight_of(0), m * k);
    return o;
  }
  Operand o{OperandMode::PerMember, 0, 0, 0, static_cast<uint32_t>(out.member_operands.size())};
  for (uint32_t j = 0; j < m; ++j) {
    const Operand x = member_operand(b, arg(j), k, bp, out);
    if (w) out.gather_bytes += gather_bytes(body, first, slot, x, weight_of(j), k);
    out.member_operands.push_back(x);
  }
  ++out.per_member_operands;
  return o;
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
    if (per_node_int(first.op)) {
      for (uint32_t j = 0; j < m; ++j) {
        const uint32_t slot = b.slot[members[j]];
        for (uint32_t i = 0; i < k; ++i) {
          if (slot == UINT32_MAX) {
            out.aux.push_back(body.node(members[j]).aux2);
            out.aux_source.push_back(MemoryPlan::kAuxConstant);
          } else {
            const uint32_t at = g.node(calls[i]).aux2 + slot;
            out.aux.push_back(g.ints()[at]);
            out.aux_source.push_back(MemoryPlan::kAuxFromInts | at);
          }
        }
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
