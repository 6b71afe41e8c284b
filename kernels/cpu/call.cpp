// Block calls on the CPU: a batch of k invocations runs the block's steps over their virtual
// nodes. GEMM steps with per-member weights run one GEMM per member; fused elementwise groups
// run all their steps for one chunk of invocations before the next, so intermediate values stay
// in cache.
#include <algorithm>
#include <array>
#include <atomic>
#include <stdexcept>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/schedule.h"
#include "kernels/cpu/cpu_kernels.h"

namespace edbatch::cpu {

namespace {

constexpr uint32_t kMaxArgs = 64;
constexpr uint32_t kChunk = 16;  // invocations per fused pass

const BlockPlan& plan_of(const PlanRef& p, size_t b) {
  const Node& call = p.graph.node(p.schedule.nodes[p.schedule.batches[b].begin]);
  const Block* block = p.params.block(call.aux);
  if (block == nullptr)
    throw std::invalid_argument("[cpu] block '" + p.params.block_name(call.aux) +
                                "' was destroyed before its calls ran");
  return block->plan();
}

// Nodes [first, first + count) of a step, all belonging to member `member`.
struct Window {
  BatchPlan bp;
  std::array<Operand, kMaxArgs> ops;
  BatchArgs args;
};

// Nodes [first, first + count) of member `member`, whose nodes start at member * k.
void make_window(const Context& c, const BlockPlan& b, const BlockStep& st, const BatchPlan& sp,
                 uint32_t first, uint32_t count, uint32_t member, uint32_t k, Window& w) {
  const Node& node = b.body->node(b.members[st.member_begin]);
  if (sp.operand_count > kMaxArgs)
    throw std::runtime_error("[cpu] block '" + b.name + "': a step has more than 64 operands");
  w.bp = sp;
  w.bp.out_offset = sp.out_offset + first * sp.out_size;
  w.bp.count = count;
  const Operand* src = c.plan->operands.data() + sp.operand_begin;
  for (uint32_t s = 0; s < sp.operand_count; ++s) {
    Operand o = src[s];
    uint32_t shift = first;
    if (o.mode == OperandMode::PerMember) {
      o = c.plan->member_operands[o.index_begin + member];
      shift = first - member * k;
    }
    switch (o.mode) {
      case OperandMode::Contiguous: o.offset += shift * o.stride; break;
      case OperandMode::Indexed: o.index_begin += shift; break;
      default: break;
    }
    w.ops[s] = o;
  }
  BatchArgs& a = w.args;
  a.op = st.op;
  a.out_dim = node.dim;
  a.count = count;
  a.bp = &w.bp;
  a.operands = w.ops.data();
  // No pointer arithmetic on the null data() of an empty list (blocks without integers).
  a.aux = c.plan->aux.empty() ? nullptr : c.plan->aux.data() + sp.aux_begin + first;
  a.table = node.aux;
  a.first_row = node.aux;
  a.alpha = node.alpha;
  a.beta = node.beta;
  a.graph = b.body.get();
  a.first = &node;
}

bool has_per_member(const Context& c, const BatchPlan& sp) {
  for (uint32_t s = 0; s < sp.operand_count; ++s)
    if (c.plan->operands[sp.operand_begin + s].mode == OperandMode::PerMember) return true;
  return false;
}

void run_step(Context& c, const BlockPlan& b, const BlockStep& st, const BatchPlan& sp, uint32_t k,
              bool forward) {
  const KernelRow& row = cpu_kernels(st.op);
  Window w;
  if (has_per_member(c, sp)) {
    for (uint32_t j = 0; j < st.member_count; ++j) {
      make_window(c, b, st, sp, j * k, k, j, k, w);
      (forward ? row.forward : row.backward)(c, w.args);
    }
    return;
  }
  make_window(c, b, st, sp, 0, sp.count, 0, k, w);
  (forward ? row.forward : row.backward)(c, w.args);
}

// Views give every node its own operand; shared, indexed and weight operands may repeat.
bool distinct_rows(const Context& c, const Operand& o, uint32_t members) {
  if (o.mode != OperandMode::PerMember) return o.mode == OperandMode::Contiguous;
  for (uint32_t j = 0; j < members; ++j)
    if (c.plan->member_operands[o.index_begin + j].mode != OperandMode::Contiguous) return false;
  return true;
}

// Backward chunks may run in parallel only when no two invocations share an operand adjoint.
bool chunks_independent(const Context& c, const BlockPlan& b, const BlockGroup& g,
                        uint32_t step_begin) {
  for (uint32_t s = 0; s < g.step_count; ++s) {
    if (b.steps[g.step_begin + s].op == Op::Lookup) return false;  // rows may repeat
    const BatchPlan& sp = c.plan->steps[step_begin + g.step_begin + s];
    for (uint32_t o = 0; o < sp.operand_count; ++o)
      if (!distinct_rows(c, c.plan->operands[sp.operand_begin + o],
                         b.steps[g.step_begin + s].member_count))
        return false;
  }
  return true;
}

void run_fused(Context& c, const BlockPlan& b, const BlockGroup& g, uint32_t step_begin,
               uint32_t k, bool forward) {
  const uint32_t chunks = (k + kChunk - 1) / kChunk;
  double work = 0;
  for (uint32_t s = 0; s < g.step_count; ++s) {
    const BatchPlan& sp = c.plan->steps[step_begin + g.step_begin + s];
    work += static_cast<double>(sp.count) * sp.out_size;
  }
  auto body = [&](uint32_t c0, uint32_t c1) {
    Context one = c;
    one.threads = 1;
    Window w;
    for (uint32_t ch = c0; ch < c1; ++ch) {
      const uint32_t i0 = ch * kChunk, n = std::min(k, i0 + kChunk) - i0;
      for (uint32_t q = 0; q < g.step_count; ++q) {
        const uint32_t s = forward ? q : g.step_count - 1 - q;
        const BlockStep& st = b.steps[g.step_begin + s];
        const BatchPlan& sp = c.plan->steps[step_begin + g.step_begin + s];
        const KernelRow& row = cpu_kernels(st.op);
        for (uint32_t j = 0; j < st.member_count; ++j) {
          make_window(one, b, st, sp, j * k + i0, n, j, k, w);
          (forward ? row.forward : row.backward)(one, w.args);
        }
      }
    }
  };
  if (forward || chunks_independent(c, b, g, step_begin))
    for_chunks(c, chunks, work, body);
  else
    body(0, chunks);
}

// Forward of invocations [i0, i1) through every step of the block, on the calling thread.
void forward_invocations(Context& one, const BlockPlan& b, const BatchPlan& bp, uint32_t i0,
                         uint32_t i1) {
  const uint32_t k = bp.count;
  Window w;
  for (uint32_t s = 0; s < b.steps.size(); ++s) {
    const BlockStep& st = b.steps[s];
    const BatchPlan& sp = one.plan->steps[bp.step_begin + s];
    const KernelRow& row = cpu_kernels(st.op);
    for (uint32_t j = 0; j < st.member_count; ++j) {
      make_window(one, b, st, sp, j * k + i0, i1 - i0, j, k, w);
      row.forward(one, w.args);
    }
  }
}

// The plan group by group (backward: in reverse), each kernel splitting over the threads.
void run_groups(Context& c, const BlockPlan& b, const BatchPlan& bp, bool forward) {
  const size_t n = b.groups.size();
  for (size_t q = 0; q < n; ++q) {
    const BlockGroup& g = b.groups[forward ? q : n - 1 - q];
    if (g.fused) {
      run_fused(c, b, g, bp.step_begin, bp.count, forward);
    } else {
      const uint32_t s = g.step_begin;
      run_step(c, b, b.steps[s], c.plan->steps[bp.step_begin + s], bp.count, forward);
    }
  }
}

}  // namespace

uint32_t call_forward(Context& c, const PlanRef& p, size_t batch) {
  const BlockPlan& b = plan_of(p, batch);
  const BatchPlan& bp = p.plan.batches[batch];
  const uint32_t k = bp.count;
  if (c.threads > 1 && k >= 2) {
    // Calls are independent: each thread runs the whole plan on its share of the invocations,
    // one parallel region per batch instead of one per kernel. Each thread gathers into its own
    // scratch.
    const double work = 2.0 * k * b.floats_per_invocation * b.floats_per_invocation;
    std::atomic<uint64_t> copied{0};
    for_chunks(c, k, work, [&](uint32_t i0, uint32_t i1) {
      thread_local Buffer scratch_x, scratch_dx;
      ExecCounters local;
      Context one = c;
      one.threads = 1;
      one.scratch_x = &scratch_x;
      one.scratch_dx = &scratch_dx;
      one.counters = &local;
      forward_invocations(one, b, bp, i0, i1);
      copied += local.bytes_copied;
    });
    c.counters->bytes_copied += copied;
    return static_cast<uint32_t>(b.groups.size());
  }
  run_groups(c, b, bp, true);
  return static_cast<uint32_t>(b.groups.size());
}

uint32_t call_backward(Context& c, const PlanRef& p, size_t batch) {
  const BlockPlan& b = plan_of(p, batch);
  run_groups(c, b, p.plan.batches[batch], false);
  return static_cast<uint32_t>(b.groups.size());
}

}  // namespace edbatch::cpu
