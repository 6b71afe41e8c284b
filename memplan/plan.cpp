// Arena layout in schedule order (each batch's outputs contiguous) and operand classification.
#include <stdexcept>
#include <string>

#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"

namespace edbatch {

namespace {
constexpr uint32_t kAlign = 16;  // floats: batch outputs start on 64-byte boundaries
uint32_t align_up(uint64_t x) {
  const uint64_t r = (x + kAlign - 1) / kAlign * kAlign;
  if (r > UINT32_MAX) throw std::runtime_error("[plan_memory] graph needs more than 16 GiB of values");
  return static_cast<uint32_t>(r);
}
}  // namespace

const char* operand_mode_name(OperandMode m) {
  switch (m) {
    case OperandMode::Param: return "param";
    case OperandMode::Shared: return "shared";
    case OperandMode::Contiguous: return "contiguous";
    case OperandMode::Indexed: return "indexed";
    case OperandMode::Ragged: return "ragged";
  }
  return "?";
}

void MemoryPlan::clear() {
  batches.clear();
  operands.clear();
  index.clear();
  aux.clear();
  node_offset.clear();
  input_offset = total_floats = 0;
  shared_operands = contiguous_operands = indexed_operands = ragged_operands = 0;
}

void plan_memory(const Graph& g, const Schedule& s, MemoryPlan& out) {
  out.clear();
  const auto& nodes = g.nodes();
  out.node_offset.assign(g.size(), UINT32_MAX);

  // Inputs first, as one block copied from the graph.
  for (uint32_t v = 0; v < g.size(); ++v)
    if (nodes[v].op == Op::Input) out.node_offset[v] = out.input_offset + nodes[v].aux;
  uint64_t cursor = align_up(g.input_values().size());

  // Outputs, batch by batch.
  out.batches.resize(s.batches.size());
  for (size_t b = 0; b < s.batches.size(); ++b) {
    const Batch& batch = s.batches[b];
    BatchPlan& bp = out.batches[b];
    bp.out_offset = align_up(cursor);
    bp.out_size = nodes[s.nodes[batch.begin]].dim.size();
    for (uint32_t i = 0; i < batch.count; ++i)
      out.node_offset[s.nodes[batch.begin + i]] = bp.out_offset + i * bp.out_size;
    cursor = static_cast<uint64_t>(bp.out_offset) + static_cast<uint64_t>(batch.count) * bp.out_size;
  }
  out.total_floats = align_up(cursor);

  // Operands.
  for (size_t b = 0; b < s.batches.size(); ++b) {
    const Batch& batch = s.batches[b];
    BatchPlan& bp = out.batches[b];
    const uint32_t* members = s.nodes.data() + batch.begin;
    const Node& first = nodes[members[0]];
    bp.operand_begin = static_cast<uint32_t>(out.operands.size());
    bp.aux_begin = static_cast<uint32_t>(out.aux.size());
    if (first.op == Op::Lookup || first.op == Op::Pick || first.op == Op::PickNegLogSoftmax)
      for (uint32_t i = 0; i < batch.count; ++i) out.aux.push_back(nodes[members[i]].aux2);

    if (g.types().is_ragged(first.type)) {
      Operand o{OperandMode::Ragged, 0, 0, 0, static_cast<uint32_t>(out.index.size())};
      const size_t rows = out.index.size();
      out.index.resize(rows + batch.count + 1);
      uint32_t total = 0;
      for (uint32_t i = 0; i < batch.count; ++i) {
        const Node& nd = nodes[members[i]];
        out.index[rows + i] = total;
        const uint32_t* a = g.args(nd);
        for (uint32_t k = 0; k < nd.num_args; ++k) out.index.push_back(out.node_offset[a[k]]);
        total += nd.num_args;
      }
      out.index[rows + batch.count] = total;
      out.operands.push_back(o);
      ++out.ragged_operands;
    } else {
      for (uint32_t j = 0; j < first.num_args; ++j) {
        const Node& a0 = nodes[g.args(first)[j]];
        Operand o{OperandMode::Param, 0, 0, 0, 0};
        if (a0.op == Op::Parameter) {
          o.param = a0.aux;
        } else {
          const uint32_t base = out.node_offset[g.args(first)[j]];
          const uint32_t size = a0.dim.size();
          bool shared = true, contiguous = true;
          for (uint32_t i = 1; i < batch.count; ++i) {
            const uint32_t off = out.node_offset[g.args(nodes[members[i]])[j]];
            shared &= off == base;
            contiguous &= off == base + i * size;
          }
          o.offset = base;
          o.stride = size;
          if (shared) {
            o.mode = OperandMode::Shared;
            ++out.shared_operands;
          } else if (contiguous) {
            o.mode = OperandMode::Contiguous;
            ++out.contiguous_operands;
          } else {
            o.mode = OperandMode::Indexed;
            o.index_begin = static_cast<uint32_t>(out.index.size());
            for (uint32_t i = 0; i < batch.count; ++i)
              out.index.push_back(out.node_offset[g.args(nodes[members[i]])[j]]);
            ++out.indexed_operands;
          }
        }
        out.operands.push_back(o);
      }
    }
    bp.operand_count = static_cast<uint32_t>(out.operands.size()) - bp.operand_begin;
  }
}

}  // namespace edbatch
