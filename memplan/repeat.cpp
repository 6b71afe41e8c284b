// An increment that repeats the one before (repeat_last_segment, memplan.h): its schedule and
// memory plan are the last segment's, shifted by the nodes, schedule entries, plan entries and
// floats that segment added. A greedy decoding loop adds the same step over the same sentences
// until one of them stops, so most of its steps plan this way, at the cost of one comparison
// and one copy of the step's entries instead of scheduling and laying it out.
#include <algorithm>

#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/op.h"
#include "edbatch/schedule.h"
#include "edbatch/types.h"
#include "memplan/outer_order.h"

namespace edbatch {

namespace {

// How far the new segment lies past the last one, in each array it adds to.
struct Shift {
  uint32_t nodes = 0, floats = 0, inputs = 0;
  uint32_t operands = 0, members = 0, index = 0, aux = 0, steps = 0;
  uint32_t ints = 0;
  bool ints_known = false;  // set by the first block call compared
  // Every value read from before the last segment is the one it read, n nodes on, laid out one
  // segment's floats further (or the same parameter): then the operands shift too.
  bool exact = true;
};

// Whether node `x` (new) is node `y` (of the last segment, `sh.nodes` before it) again: the same
// op, type, shape and attributes, reading the new segment's values where y reads the last
// segment's, and values of the same kind and shape from before where y does.
bool same_node(const Graph& g, const MemoryPlan& p, uint32_t x_id, uint32_t y_id, uint32_t n0,
               Shift& sh) {
  const Node& x = g.node(x_id);
  const Node& y = g.node(y_id);
  if (x.op != y.op || x.type != y.type || x.dim != y.dim || x.num_args != y.num_args ||
      float_bits(x.alpha) != float_bits(y.alpha) || float_bits(x.beta) != float_bits(y.beta))
    return false;
  if (x.aux != (x.op == Op::Input ? y.aux + sh.inputs : y.aux)) return false;
  if (x.op == Op::Call) {
    if (!sh.ints_known) {
      if (x.aux2 < y.aux2) return false;
      sh.ints = x.aux2 - y.aux2;
      sh.ints_known = true;
    }
    if (x.aux2 != y.aux2 + sh.ints) return false;
  } else if (!per_node_int(x.op) && x.aux2 != y.aux2) {
    return false;
  }
  const uint32_t n1 = n0 + sh.nodes;
  const uint32_t* xa = g.args(x);
  const uint32_t* ya = g.args(y);
  for (uint32_t k = 0; k < x.num_args; ++k) {
    const uint32_t a = ya[k], b = xa[k];
    if (a >= n0) {  // the last segment's own value: the new one's, n nodes on
      if (b != a + sh.nodes) return false;
      continue;
    }
    if (b >= n1) return false;  // y reads a value from before, x one of its own segment
    // Planning reads an earlier value's kind, shape and place (a parameter's id).
    const Node& an = g.node(a);
    const Node& bn = g.node(b);
    if (an.op != bn.op || an.dim != bn.dim) return false;
    if (an.op == Op::Parameter) {
      if (an.aux != bn.aux) return false;
      continue;
    }
    if (b != a + sh.nodes || p.node_offset[b] == UINT32_MAX ||
        p.node_offset[b] != p.node_offset[a] + sh.floats)
      sh.exact = false;
  }
  return true;
}

Operand shifted(Operand o, const Shift& sh) {
  switch (o.mode) {
    case OperandMode::Param:
      break;
    case OperandMode::Shared:
    case OperandMode::Contiguous:
      o.offset += sh.floats;
      break;
    case OperandMode::Indexed:  // offset: node 0's (classify_offsets), kept for reference
      o.offset += sh.floats;
      o.index_begin += sh.index;
      break;
    case OperandMode::Ragged:
      o.index_begin += sh.index;
      break;
    case OperandMode::PerMember:
      o.index_begin += sh.members;
      break;
  }
  return o;
}

// Appends entries [from, end) of `v` again, each through f.
template <class T, class F>
void append_shifted(std::vector<T>& v, size_t from, F f) {
  const size_t end = v.size();
  v.resize(end + (end - from));
  T* out = v.data() + end;
  const T* in = v.data() + from;
  for (size_t i = 0; i < end - from; ++i) out[i] = f(in[i]);
}

// The last segment's schedule was appended again; its nodes read values from before laid out
// otherwise (the step before had other sentences): the batches keep the last segment's places,
// shifted, and their operands are planned (finish_segment) as extend_memory_plan plans them.
void repeat_layout(const Graph& g, const Schedule& s, MemoryPlan& p, const PlanSegment& last,
                   size_t b0, size_t b1, uint32_t end, const Shift& sh) {
  const uint32_t n0 = last.node_begin, n1 = n0 + sh.nodes;
  p.node_offset.resize(end, UINT32_MAX);
  begin_segment(g, static_cast<uint32_t>(b1), n1, end, p);
  for (size_t b = b0; b < b1; ++b) {
    const BatchPlan& was = p.batches[b];
    BatchPlan bp{};
    bp.out_offset = was.out_offset + sh.floats;
    bp.out_size = was.out_size;
    bp.count = was.count;
    p.batches.push_back(bp);
  }
  // Batch members and block outputs; finish_segment places inputs and reshapes.
  for (uint32_t i = 0; i < sh.nodes; ++i) {
    const Op op = g.node(n0 + i).op;
    const uint32_t o = p.node_offset[n0 + i];
    if (op != Op::Input && op != Op::Reshape && o != UINT32_MAX)
      p.node_offset[n1 + i] = o + sh.floats;
  }
  p.total_floats += sh.floats;
  finish_segment(g, s, static_cast<uint32_t>(b1), n1, end, p);
}

}  // namespace

SegmentRepeat repeat_last_segment(const Graph& g, Schedule& s, MemoryPlan& p, uint32_t end_node) {
  if (p.segments.empty() || s.batches.size() != p.batches.size()) return SegmentRepeat::None;
  const PlanSegment last = p.segments.back();
  const uint32_t n0 = last.node_begin;
  const uint32_t n1 = static_cast<uint32_t>(p.node_offset.size());
  const uint32_t end = std::min(end_node, g.size());
  Shift sh;
  sh.nodes = n1 - n0;
  if (sh.nodes == 0 || end < n1 || end - n1 != sh.nodes) return SegmentRepeat::None;
  const uint32_t inputs_end = segment_inputs_end(g, p.input_floats, n1, end);
  if (inputs_end < p.input_floats || inputs_end - p.input_floats != last.input_count)
    return SegmentRepeat::None;
  sh.inputs = last.input_count;
  sh.floats = p.total_floats - last.input_offset;  // both aligned: the shift keeps alignment
  for (uint32_t i = 0; i < sh.nodes; ++i)
    if (!same_node(g, p, n1 + i, n0 + i, n0, sh)) return SegmentRepeat::None;

  // The schedule: the last segment's batches and their nodes, n nodes on.
  const size_t b0 = last.batch_begin, b1 = s.batches.size();
  if (b0 < b1) {
    const uint32_t first_entry = s.batches[b0].begin;
    const uint32_t entries = static_cast<uint32_t>(s.nodes.size()) - first_entry;
    append_shifted(s.batches, b0, [&](Batch b) {
      b.begin += entries;
      return b;
    });
    append_shifted(s.nodes, first_entry, [&](uint32_t v) { return v + sh.nodes; });
  }

  if (!sh.exact) {
    repeat_layout(g, s, p, last, b0, b1, end, sh);
    return SegmentRepeat::Replanned;
  }

  // The plan's entries, each array from where the last segment's start.
  uint32_t first_step = static_cast<uint32_t>(p.steps.size());
  for (size_t b = b0; b < b1; ++b)
    if (p.batches[b].step_count > 0) first_step = std::min(first_step, p.batches[b].step_begin);
  sh.operands = static_cast<uint32_t>(p.operands.size()) - last.operand_begin;
  sh.members = static_cast<uint32_t>(p.member_operands.size()) - last.member_begin;
  sh.index = static_cast<uint32_t>(p.index.size()) - last.index_begin;
  sh.aux = static_cast<uint32_t>(p.aux.size()) - last.aux_begin;
  sh.steps = static_cast<uint32_t>(p.steps.size()) - first_step;

  // Operand counts by mode: a batch's operands count by their mode, a block step's as views or
  // per-member operands (as extend_memory_plan counts them).
  for (size_t b = b0; b < b1; ++b) {
    const BatchPlan& bp = p.batches[b];
    for (uint32_t j = 0; j < bp.operand_count; ++j) switch (p.operands[bp.operand_begin + j].mode) {
        case OperandMode::Shared:
          ++p.shared_operands;
          break;
        case OperandMode::Contiguous:
          ++p.contiguous_operands;
          break;
        case OperandMode::Indexed:
          ++p.indexed_operands;
          break;
        case OperandMode::Ragged:
          ++p.ragged_operands;
          break;
        default:
          break;
      }
  }
  for (size_t t = first_step; t < p.steps.size(); ++t) {
    const BatchPlan& sp = p.steps[t];
    for (uint32_t j = 0; j < sp.operand_count; ++j) {
      const OperandMode m = p.operands[sp.operand_begin + j].mode;
      if (m == OperandMode::PerMember)
        ++p.per_member_operands;
      else if (m != OperandMode::Param)
        ++p.member_view_operands;
    }
  }

  // Index entries are arena offsets, except a ragged operand's row starts (its batch's count + 1
  // entries before the offsets).
  const size_t index_end = p.index.size();
  thread_local std::vector<uint8_t> row_start;
  row_start.assign(index_end - last.index_begin, 0);
  for (size_t b = b0; b < b1; ++b) {
    const BatchPlan& bp = p.batches[b];
    if (bp.operand_count == 0 || p.operands[bp.operand_begin].mode != OperandMode::Ragged) continue;
    const uint32_t at = p.operands[bp.operand_begin].index_begin - last.index_begin;
    std::fill(row_start.begin() + at, row_start.begin() + at + bp.count + 1, 1);
  }
  p.index.resize(index_end + sh.index);
  uint32_t* index = p.index.data() + last.index_begin;
  for (size_t i = 0; i < sh.index; ++i)
    index[sh.index + i] = index[i] + (row_start[i] ? 0 : sh.floats);

  append_shifted(p.batches, b0, [&](BatchPlan bp) {
    bp.out_offset += sh.floats;
    bp.operand_begin += sh.operands;
    bp.aux_begin += sh.aux;
    if (bp.step_count > 0) bp.step_begin += sh.steps;
    return bp;
  });
  append_shifted(p.steps, first_step, [&](BatchPlan sp) {
    sp.out_offset += sh.floats;
    sp.operand_begin += sh.operands;
    sp.aux_begin += sh.aux;
    return sp;
  });
  append_shifted(p.operands, last.operand_begin, [&](Operand o) { return shifted(o, sh); });
  append_shifted(p.member_operands, last.member_begin, [&](Operand o) { return shifted(o, sh); });

  // Per-node integers: from the new nodes (or their calls' integers), a block's constants as
  // they were.
  const size_t aux_end = p.aux.size();
  p.aux.resize(aux_end + sh.aux);
  p.aux_source.resize(aux_end + sh.aux);
  for (size_t i = last.aux_begin; i < aux_end; ++i) {
    uint32_t from = p.aux_source[i];
    uint32_t value = p.aux[i];
    if (from != MemoryPlan::kAuxConstant) {
      if (from & MemoryPlan::kAuxFromInts) {
        from = MemoryPlan::kAuxFromInts | ((from & ~MemoryPlan::kAuxFromInts) + sh.ints);
        value = g.ints()[from & ~MemoryPlan::kAuxFromInts];
      } else {
        from += sh.nodes;
        value = g.node(from).aux2;
      }
    }
    p.aux[i + sh.aux] = value;
    p.aux_source[i + sh.aux] = from;
  }

  p.node_offset.resize(end);
  for (uint32_t i = 0; i < sh.nodes; ++i) {
    const uint32_t o = p.node_offset[n0 + i];
    p.node_offset[n1 + i] = o == UINT32_MAX ? o : o + sh.floats;
  }

  PlanSegment seg = last;
  seg.batch_begin = static_cast<uint32_t>(b1);
  seg.node_begin = n1;
  seg.input_begin = p.input_floats;
  seg.input_offset = last.input_offset + sh.floats;
  seg.operand_begin = last.operand_begin + sh.operands;
  seg.member_begin = last.member_begin + sh.members;
  seg.index_begin = last.index_begin + sh.index;
  seg.aux_begin = last.aux_begin + sh.aux;
  p.segments.push_back(seg);
  p.input_floats += seg.input_count;
  p.total_floats += sh.floats;
  p.gather_bytes += seg.gather_bytes;
  return SegmentRepeat::Shifted;
}

}  // namespace edbatch
