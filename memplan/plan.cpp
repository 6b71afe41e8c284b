// Arena layout batch by batch (each batch's outputs contiguous), members ordered for their
// consumers, and operand classification.
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"
#include "memplan/outer_order.h"

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
    case OperandMode::PerMember: return "per-member";
  }
  return "?";
}

void MemoryPlan::clear() {
  batches.clear();
  steps.clear();
  operands.clear();
  member_operands.clear();
  index.clear();
  aux.clear();
  aux_source.clear();
  node_offset.clear();
  segments.clear();
  input_offset = total_floats = input_floats = 0;
  shared_operands = contiguous_operands = indexed_operands = ragged_operands = 0;
  gather_bytes = 0;
  member_view_operands = per_member_operands = 0;
  layout_ms = 0;
}

Operand classify_offsets(const uint32_t* offsets, uint32_t count, uint32_t size, MemoryPlan& out) {
  Operand o{OperandMode::Shared, 0, offsets[0], size, 0};
  bool shared = true, contiguous = true;
  for (uint32_t i = 1; i < count; ++i) {
    shared &= offsets[i] == offsets[0];
    contiguous &= offsets[i] == offsets[0] + i * size;
  }
  if (shared) {
    ++out.shared_operands;
  } else if (contiguous) {
    o.mode = OperandMode::Contiguous;
    ++out.contiguous_operands;
  } else {
    o.mode = OperandMode::Indexed;
    o.index_begin = static_cast<uint32_t>(out.index.size());
    out.index.insert(out.index.end(), offsets, offsets + count);
    ++out.indexed_operands;
  }
  return o;
}

uint64_t gather_bytes(const Graph& g, const Node& first, uint32_t slot, const Operand& x,
                      const Operand& w, uint32_t count) {
  const bool gemm = first.op == Op::Affine || first.op == Op::MatMul;
  // The x of each W x: even slots >= 2 of affine ({b, W1, x1, ...}), slot 1 of matmul. Per-node
  // weights (a computed W) run per-node GEMMs, which never gather.
  if (!gemm || slot == 0 || slot % 2 == (first.op == Op::Affine ? 1u : 0u)) return 0;
  const bool shared_w = w.mode == OperandMode::Param || w.mode == OperandMode::Shared;
  const Dim xd = g.node(g.args(first)[slot]).dim;
  if (!shared_w || x.mode != OperandMode::Indexed || xd.cols >= kDirectGemmCols) return 0;
  return static_cast<uint64_t>(count) * xd.size() * sizeof(float);
}

uint32_t MemoryPlan::max_ragged_args(const BatchPlan& b) const {
  if (b.operand_count == 0 || operands[b.operand_begin].mode != OperandMode::Ragged) return 0;
  const uint32_t* rows = index.data() + operands[b.operand_begin].index_begin;
  uint32_t most = 0;
  for (uint32_t v = 0; v < b.count; ++v) most = std::max(most, rows[v + 1] - rows[v]);
  return most;
}

namespace {

const BlockPlan& block_plan(const Graph& g, const Node& call) {
  const Block* b = g.params().block(call.aux);
  if (b == nullptr)
    throw std::invalid_argument("[plan_memory] block '" + g.params().block_name(call.aux) +
                                "' was destroyed before the graph that calls it ran");
  return b->plan();
}

// Places batch b's outputs at `cursor`; returns the end. Block calls get a region of every
// internal value, and their output views are placed inside it.
uint64_t place_batch(const Graph& g, const Schedule& s, size_t b, uint64_t cursor,
                     MemoryPlan& out) {
  const auto& nodes = g.nodes();
  const Batch& batch = s.batches[b];
  const uint32_t* members = s.nodes.data() + batch.begin;
  const Node& first = nodes[members[0]];
  BatchPlan& bp = out.batches[b];
  bp.out_offset = align_up(cursor);
  bp.count = batch.count;
  bp.step_begin = bp.step_count = 0;
  if (first.op != Op::Call) {
    bp.out_size = first.dim.size();
    for (uint32_t i = 0; i < batch.count; ++i)
      out.node_offset[members[i]] = bp.out_offset + i * bp.out_size;
    return static_cast<uint64_t>(bp.out_offset) + static_cast<uint64_t>(batch.count) * bp.out_size;
  }
  const BlockPlan& plan = block_plan(g, first);
  const uint32_t k = batch.count;
  bp.out_size = plan.floats_per_invocation;
  for (uint32_t i = 0; i < k; ++i) {
    const uint32_t call = members[i];
    out.node_offset[call] = bp.out_offset;
    // Block::call adds a call's output views right after it.
    for (uint32_t o = 0; o < plan.output_node.size(); ++o) {
      const uint32_t v = call + 1 + o;
      const uint32_t t = plan.output_node[o];
      out.node_offset[v] = bp.out_offset + k * plan.base[t] + i * plan.body->node(t).dim.size();
    }
  }
  return static_cast<uint64_t>(bp.out_offset) + static_cast<uint64_t>(k) * bp.out_size;
}

void plan_operands(const Graph& g, const Schedule& s, size_t b, MemoryPlan& out) {
  const auto& nodes = g.nodes();
  const Batch& batch = s.batches[b];
  BatchPlan& bp = out.batches[b];
  const uint32_t* members = s.nodes.data() + batch.begin;
  const Node& first = nodes[members[0]];
  bp.operand_begin = static_cast<uint32_t>(out.operands.size());
  bp.aux_begin = static_cast<uint32_t>(out.aux.size());
  if (per_node_int(first.op))
    for (uint32_t i = 0; i < batch.count; ++i) {
      out.aux.push_back(nodes[members[i]].aux2);
      out.aux_source.push_back(members[i]);
    }

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
    thread_local std::vector<uint32_t> offsets;
    for (uint32_t j = 0; j < first.num_args; ++j) {
      const Node& a0 = nodes[g.args(first)[j]];
      if (a0.op == Op::Parameter) {
        out.operands.push_back(Operand{OperandMode::Param, a0.aux, 0, 0, 0});
        continue;
      }
      offsets.resize(batch.count);
      for (uint32_t i = 0; i < batch.count; ++i)
        offsets[i] = out.node_offset[g.args(nodes[members[i]])[j]];
      out.operands.push_back(classify_offsets(offsets.data(), batch.count, a0.dim.size(), out));
    }
  }
  bp.operand_count = static_cast<uint32_t>(out.operands.size()) - bp.operand_begin;
  if (first.op == Op::Call) expand_call(g, block_plan(g, first), members, batch.count, bp, out);
}

}  // namespace

uint32_t segment_inputs_end(const Graph& g, uint32_t input_floats, uint32_t first_node,
                            uint32_t end_node) {
  // Input values are added in node order: those of nodes [first_node, end_node) end where the
  // last of their Input nodes' values ends (all of them when the plan goes to the graph's end).
  if (end_node >= g.size()) return static_cast<uint32_t>(g.input_values().size());
  for (uint32_t v = end_node; v-- > first_node;)
    if (g.node(v).op == Op::Input) return g.node(v).aux + g.node(v).dim.size();
  return input_floats;
}

void plan_memory(const Graph& g, Schedule& s, MemoryPlan& out, const PlanOptions& options) {
  out.clear();
  extend_memory_plan(g, s, 0, 0, out, options);
}

void extend_memory_plan(const Graph& g, Schedule& s, uint32_t first_batch, uint32_t first_node,
                        MemoryPlan& out, const PlanOptions& options, uint32_t end_node) {
  if (first_batch != out.batches.size() || first_node != out.node_offset.size())
    throw std::invalid_argument("[extend_memory_plan] the plan holds " +
                                std::to_string(out.batches.size()) + " batches and " +
                                std::to_string(out.node_offset.size()) + " nodes, not " +
                                std::to_string(first_batch) + " and " +
                                std::to_string(first_node));
  if (options.order_for_consumers) {
    thread_local OuterOrderScratch scratch;
    const auto t0 = std::chrono::steady_clock::now();
    order_for_consumers(g, s, scratch, first_batch, first_node);
    out.layout_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  const uint32_t n = std::min(end_node, g.size());
  out.node_offset.resize(n, UINT32_MAX);
  uint64_t cursor = begin_segment(g, first_batch, first_node, n, out);
  out.batches.resize(s.batches.size());
  for (size_t b = first_batch; b < s.batches.size(); ++b)
    cursor = place_batch(g, s, b, cursor, out);
  out.total_floats = align_up(cursor);
  finish_segment(g, s, first_batch, first_node, n, out);
}

uint64_t begin_segment(const Graph& g, uint32_t first_batch, uint32_t first_node, uint32_t n,
                       MemoryPlan& out) {
  // The inputs added since the last segment, as one block copied from the graph, then the
  // segment's batches. Earlier values keep their offsets.
  const uint32_t inputs_end = segment_inputs_end(g, out.input_floats, first_node, n);
  PlanSegment seg;
  seg.batch_begin = first_batch;
  seg.node_begin = first_node;
  seg.input_begin = out.input_floats;
  seg.input_count = inputs_end - out.input_floats;
  seg.input_offset = align_up(out.total_floats);
  seg.operand_begin = static_cast<uint32_t>(out.operands.size());
  seg.member_begin = static_cast<uint32_t>(out.member_operands.size());
  seg.index_begin = static_cast<uint32_t>(out.index.size());
  seg.aux_begin = static_cast<uint32_t>(out.aux.size());
  if (first_batch == 0) out.input_offset = seg.input_offset;
  out.input_floats += seg.input_count;
  out.segments.push_back(seg);
  return align_up(static_cast<uint64_t>(seg.input_offset) + seg.input_count);
}

void finish_segment(const Graph& g, const Schedule& s, uint32_t first_batch, uint32_t first_node,
                    uint32_t n, MemoryPlan& out) {
  const auto& nodes = g.nodes();
  const PlanSegment& seg = out.segments.back();
  // Inputs lie in the segment's input block; reshapes alias their argument (ids are
  // topological, so the argument, a batch's member or an input, is placed).
  for (uint32_t v = first_node; v < n; ++v) {
    const Node& nd = nodes[v];
    if (nd.op == Op::Input)
      out.node_offset[v] = seg.input_offset + (nd.aux - seg.input_begin);
    else if (nd.op == Op::Reshape)
      out.node_offset[v] = out.node_offset[g.args(nd)[0]];
  }

  const uint64_t gathers_before = out.gather_bytes;
  for (size_t b = first_batch; b < s.batches.size(); ++b) {
    plan_operands(g, s, b, out);
    const BatchPlan& bp = out.batches[b];
    const Node& first = nodes[s.nodes[s.batches[b].begin]];
    if (!g.types().is_ragged(first.type))
      for (uint32_t j = 1; j < bp.operand_count; ++j)
        out.gather_bytes += gather_bytes(g, first, j, out.operands[bp.operand_begin + j],
                                         out.operands[bp.operand_begin + j - 1], bp.count);
  }
  out.segments.back().gather_bytes = out.gather_bytes - gathers_before;
}

void refresh_plan_aux(const Graph& g, MemoryPlan& plan) {
  const auto& nodes = g.nodes();
  const auto& ints = g.ints();
  for (size_t i = 0; i < plan.aux.size(); ++i) {
    const uint32_t from = plan.aux_source[i];
    if (from == MemoryPlan::kAuxConstant) continue;
    plan.aux[i] =
        from & MemoryPlan::kAuxFromInts ? ints[from & ~MemoryPlan::kAuxFromInts] : nodes[from].aux2;
  }
}

}  // namespace edbatch
