// Marking the pointwise runs of a step group (device.h): consecutive block steps of elementwise
// math, fixed-arity sums and slices of a column, of one element size, whose operands are either
// values of the run (through the block body's edges, member by member; not for slices) or
// values no member of the run writes.
#include <algorithm>
#include <utility>

#include "edbatch/block_plan.h"
#include "edbatch/graph.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/op_math.h"

namespace edbatch::cuda {

namespace {

// The node whose storage a body value is: views (slices, reshapes) read their argument's.
uint32_t stored_in(const Graph& body, uint32_t id) {
  while (op_info(body.node(id).op).rule == BatchRule::View) id = body.args(body.node(id))[0];
  return id;
}

class Runs {
 public:
  Runs(StepGroup& g, const RunStep* steps, const MemoryPlan& plan)
      : g_(g), steps_(steps), plan_(plan) {}

  void mark(bool fuse) {
    for (uint32_t q = 0; q < g_.step_count; ++q) {
      StepDesc& s = g_.steps[q];
      s.run_len = 1;
      s.run_slot = 0;
    }
    if (!fuse) return;
    bool open = false;
    uint32_t first = 0;
    for (uint32_t q = 0; q < g_.step_count; ++q) {
      if (open && candidate(q) && joins(first, q)) continue;
      if (open) close(first, q);
      open = candidate(q) && joins(q, q);
      first = q;
    }
    if (open) close(first, g_.step_count);
  }

 private:
  // A step a run may hold: elementwise math, a sum over fixed operand slots or a slice of a
  // column, in a block.
  bool candidate(uint32_t q) const {
    const StepDesc& s = g_.steps[q];
    const Op op = static_cast<Op>(s.op);
    if (steps_[q].step == nullptr || s.k == 0 || s.count % s.k != 0) return false;
    if (op == Op::Sum) {
      if (s.operand_count == 0 || s.operand_count > kMaxRunArgs || s.attr != 0) return false;
      for (uint32_t j = 0; j < s.operand_count; ++j)
        if (plan_.operands[s.operand_begin + j].mode == OperandMode::Ragged) return false;
      return true;
    }
    // A slice reads rows of a value stored before the run (joins checks that).
    if (op == Op::SliceRows) return s.rows == s.out_size && s.operand_count == 1;
    return math::is_unary(op) || math::is_binary(op);
  }

  // Adds step q to the run that starts at `first` (q == first: starts it) when its operands
  // allow: each is the value of a member of the run, or stored where no member of the run
  // writes. Fills run_src, run_step and run_read_begin for q's members and appends their
  // memory operands to the run's reads; on failure leaves the run as it was.
  bool joins(uint32_t first, uint32_t q) {
    const StepDesc& s = g_.steps[q];
    const StepDesc& f = g_.steps[first];
    const RunStep& rs = steps_[q];
    if (rs.block != steps_[first].block || s.k != f.k || s.out_size != f.out_size) return false;
    const uint32_t members = s.count / s.k, base = q == first ? slots_ : f.run_slot;
    if (members != rs.step->member_count || slots_ + members > kMaxRunSlots ||
        slots_ + members - base > kMaxRunLocal)
      return false;
    const Graph& body = *rs.block->body;
    uint32_t reads = q == first ? 0 : reads_;
    uint8_t src[kMaxRunLocal][kMaxRunArgs];
    for (uint32_t m = 0; m < members; ++m) {
      const Node& n = body.node(rs.block->members[rs.step->member_begin + m]);
      if (n.num_args != s.operand_count) return false;
      for (uint32_t j = 0; j < n.num_args; ++j) {
        const uint32_t arg = body.args(n)[j];
        src[m][j] = find(arg);
        if (src[m][j] == kFromMemory && find(stored_in(body, arg)) != kFromMemory) return false;
        if (src[m][j] != kFromMemory && static_cast<Op>(s.op) == Op::SliceRows) return false;
        if (src[m][j] == kFromMemory && ++reads > kMaxRunReads) return false;
      }
    }
    if (q == first) std::fill(g_.run_reads[q], g_.run_reads[q] + kMaxRunReads, kFromMemory);
    uint32_t next = q == first ? 0 : reads_;
    for (uint32_t m = 0; m < members; ++m) {
      const uint32_t at = slots_ + m;
      g_.run_step[at] = static_cast<uint8_t>(q);
      g_.run_read_begin[at] = static_cast<uint8_t>(next);
      for (uint32_t j = 0; j < s.operand_count; ++j) {
        g_.run_src[at][j] = src[m][j];
        if (src[m][j] == kFromMemory)
          g_.run_reads[first][next++] = static_cast<uint8_t>((at - base) * kMaxRunArgs + j);
      }
      nodes_[node_count_++] = {rs.block->members[rs.step->member_begin + m],
                               static_cast<uint8_t>(at)};
    }
    reads_ = next;
    StepDesc& d = g_.steps[q];
    d.run_slot = static_cast<uint8_t>(slots_);
    slots_ += members;
    return true;
  }

  // Ends the run [first, end). The slots of a group's runs are numbered through; a run of one
  // step is a step of its own (as marked), and gives its slots back.
  void close(uint32_t first, uint32_t end) {
    g_.steps[first].run_len = static_cast<uint8_t>(end - first);
    if (end == first + 1) slots_ = g_.steps[first].run_slot;
    node_count_ = 0;
  }

  uint8_t find(uint32_t node) const {
    for (uint32_t i = 0; i < node_count_; ++i)
      if (nodes_[i].first == node) return nodes_[i].second;
    return kFromMemory;
  }

  StepGroup& g_;
  const RunStep* steps_;
  const MemoryPlan& plan_;
  // The open run's members (body node, slot): at most kMaxRunLocal (joins checks that).
  std::pair<uint32_t, uint8_t> nodes_[kMaxRunLocal];
  uint32_t node_count_ = 0;
  uint32_t slots_ = 0;                               // slots taken in the group
  uint32_t reads_ = 0;                               // memory operands of the open run
};

}  // namespace

void mark_pointwise_runs(StepGroup& g, const RunStep* steps, const MemoryPlan& plan, bool fuse) {
  Runs(g, steps, plan).mark(fuse);
}

}  // namespace edbatch::cuda
