// Block calls on the CPU: a batch of k invocations runs the block's steps over their virtual
// nodes. GEMM steps with per-member weights run one GEMM per member; fused elementwise groups
// run all their steps for one chunk of invocations before the next, so intermediate values stay
// in cache.
#include <algorithm>
#include <array>
#include <atomic>
#include <stdexcept>
#include <utility>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/schedule.h"
#include "kernels/cpu/cpu_kernels.h"

namespace edbatch::cpu {

namespace {

constexpr uint32_t kMaxArgs = kMaxStepOperands;
constexpr uint32_t kChunk = 16;  // invocations per fused pass
// A block call's forward splits over the threads only when each gets at least this many
// invocations (docs/performance.md, "Two threads"): narrower halves, each reading the cell's
// weights whole, ran slower side by side than the whole batch on one thread. Its backward, about
// twice the arithmetic per invocation, gains from splitting at any width.
constexpr uint32_t kMinSplitInvocations = 8;

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

// Runs fn(one, t0, t1) over chunks of [0, n) on the context's threads, each with a one-thread
// context of its own: scratch buffers (thread_local, kept), counters (the gathered bytes added
// to c's afterwards), and `param_grads_later` (Context::param_grads_later).
template <class F>
void on_threads(Context& c, uint32_t n, double work, bool param_grads_later, const F& fn) {
  std::atomic<uint64_t> copied{0};
  for_chunks(c, n, work, [&](uint32_t t0, uint32_t t1) {
    thread_local Buffer scratch_x, scratch_dx;
    ExecCounters local;
    Context one = c;
    one.threads = 1;
    one.scratch_x = &scratch_x;
    one.scratch_dx = &scratch_dx;
    one.counters = &local;
    one.param_grads_later = param_grads_later;
    fn(one, t0, t1);
    copied += local.bytes_copied;
  });
  c.counters->bytes_copied += copied;
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

// Invocations [i0, i1) through the block (backward: in reverse) on the calling thread, in
// run_groups' order: group by group, a fused group in chunks of kChunk invocations through all
// its steps, so that a thread's share keeps the fused groups' locality.
void run_invocations(Context& one, const BlockPlan& b, const BatchPlan& bp, uint32_t i0,
                     uint32_t i1, bool forward) {
  const uint32_t k = bp.count;
  if (i0 == 0 && i1 == k) {
    run_groups(one, b, bp, forward);
    return;
  }
  const size_t n = b.groups.size();
  Window w;
  auto steps = [&](const BlockGroup& g, uint32_t first, uint32_t count) {
    for (uint32_t q = 0; q < g.step_count; ++q) {
      const uint32_t s = g.step_begin + (forward ? q : g.step_count - 1 - q);
      const BlockStep& st = b.steps[s];
      const BatchPlan& sp = one.plan->steps[bp.step_begin + s];
      const KernelRow& row = cpu_kernels(st.op);
      for (uint32_t j = 0; j < st.member_count; ++j) {
        make_window(one, b, st, sp, j * k + first, count, j, k, w);
        (forward ? row.forward : row.backward)(one, w.args);
      }
    }
  };
  for (size_t q = 0; q < n; ++q) {
    const BlockGroup& g = b.groups[forward ? q : n - 1 - q];
    if (!g.fused) {
      steps(g, i0, i1 - i0);
      continue;
    }
    for (uint32_t c0 = i0; c0 < i1; c0 += kChunk) steps(g, c0, std::min(i1, c0 + kChunk) - c0);
  }
}

// Scratch of backward_split.
struct SplitScratch {
  std::vector<std::pair<uint32_t, uint32_t>> rows;  // (input row's offset, invocation)
  std::vector<int32_t> cover;
  std::vector<uint32_t> bounds;
};

// Whether the batch's invocations may run backward in `parts` ranges on separate threads, each
// range writing adjoints no other range writes, and where: the ranges are [bounds[t],
// bounds[t+1]). Parameters may only be an affine's bias or a product's weight outside fused
// groups (their gradients, and lookup tables' rows, are formed afterwards for the whole batch:
// param_grads_after), and no operand may be shared or ragged. A block input read by several
// invocations (a lattice node read by two arcs, a node by two parents) keeps them in one range:
// the bounds are the even split's, moved to the nearest place no such input spans.
bool backward_split(const Context& c, const BlockPlan& b, const BatchPlan& bp, uint32_t parts,
                    SplitScratch& sc) {
  std::vector<std::pair<uint32_t, uint32_t>>& rows = sc.rows;
  const uint32_t k = bp.count;
  rows.clear();
  for (const BlockGroup& g : b.groups) {
    for (uint32_t s = g.step_begin; s < g.step_begin + g.step_count; ++s) {
      const BlockStep& st = b.steps[s];
      const BatchPlan& sp = c.plan->steps[bp.step_begin + s];
      for (uint32_t o = 0; o < sp.operand_count; ++o) {
        const Operand& op = c.plan->operands[sp.operand_begin + o];
        const bool weight_slot =
            (st.op == Op::Affine && (o == 0 || o % 2 == 1)) || (st.op == Op::MatMul && o == 0);
        for (uint32_t j = 0; j < st.member_count; ++j) {
          const bool per_member = op.mode == OperandMode::PerMember;
          const Operand& r = per_member ? c.plan->member_operands[op.index_begin + j] : op;
          if (r.mode == OperandMode::Param) {
            if (!weight_slot || g.fused) return false;
            continue;
          }
          if (r.mode != OperandMode::Contiguous && r.mode != OperandMode::Indexed) return false;
          if (r.mode == OperandMode::Contiguous && r.stride == 0) return false;
          // A body node's values are the invocation's own; only the block's inputs (and views
          // of them) may repeat.
          const Node& member = b.body->node(b.members[st.member_begin + j]);
          uint32_t arg = b.body->args(member)[o];
          while (b.body->node(arg).op == Op::Reshape) arg = b.body->args(b.body->node(arg))[0];
          if (b.input_of[arg] < 0) continue;
          for (uint32_t i = 0; i < k; ++i) {
            const uint32_t e = per_member ? i : j * k + i;
            rows.emplace_back(r.mode == OperandMode::Contiguous ? r.offset + e * r.stride
                                                                : c.plan->index[r.index_begin + e],
                              i);
          }
        }
      }
    }
  }
  // cover[p] > 0: some input is read by invocations on both sides of the place before p.
  std::sort(rows.begin(), rows.end());
  sc.cover.assign(k + 1, 0);
  for (size_t i = 0, j = 0; i < rows.size(); i = j) {
    while (j < rows.size() && rows[j].first == rows[i].first) ++j;
    const uint32_t lo = rows[i].second, hi = rows[j - 1].second;
    if (lo == hi) continue;
    ++sc.cover[lo + 1];
    --sc.cover[hi + 1];
  }
  for (uint32_t q = 1; q <= k; ++q) sc.cover[q] += sc.cover[q - 1];
  sc.bounds.assign(1, 0);
  for (uint32_t t = 1; t < parts; ++t) {
    const uint32_t even = static_cast<uint32_t>(static_cast<uint64_t>(k) * t / parts);
    uint32_t place = 0;
    for (uint32_t d = 0; d < k && place == 0; ++d) {
      if (even + d < k && even + d > sc.bounds.back() && sc.cover[even + d] == 0)
        place = even + d;
      else if (even >= d && even - d > sc.bounds.back() && sc.cover[even - d] == 0)
        place = even - d;
    }
    if (place == 0) return false;  // no free place left: the batch runs whole
    sc.bounds.push_back(place);
  }
  sc.bounds.push_back(k);
  return true;
}

bool is_linear(Op op) {
  return op == Op::Affine || op == Op::MatMul;
}

// W^T of every weight the batch's backward multiplies by, made before threads read the cache.
void transposes_before(Context& c, const BlockPlan& b, const BatchPlan& bp) {
  Window w;
  for (uint32_t s = 0; s < b.steps.size(); ++s) {
    const BlockStep& st = b.steps[s];
    if (!is_linear(st.op)) continue;
    for (uint32_t j = 0; j < st.member_count; ++j) {
      make_window(c, b, st, c.plan->steps[bp.step_begin + s], j * bp.count, bp.count, j, bp.count,
                  w);
      linear_transposes(c, w.args);
    }
  }
}

// The parameter gradients the threads left out (Context::param_grads_later), in the order
// run_groups adds them: steps in reverse; an affine's or matmul's over the windows run_step makes
// (linear_param_grads), a lookup's rows member by member (each table row then sums its
// invocations in order, as in a fused group's chunks).
void param_grads_after(Context& c, const BlockPlan& b, const BatchPlan& bp) {
  const uint32_t k = bp.count;
  Window w;
  for (size_t s = b.steps.size(); s-- > 0;) {
    const BlockStep& st = b.steps[s];
    const BatchPlan& sp = c.plan->steps[bp.step_begin + s];
    if (st.op == Op::Lookup) {
      for (uint32_t j = 0; j < st.member_count; ++j) {
        make_window(c, b, st, sp, j * k, k, j, k, w);
        cpu_kernels(Op::Lookup).backward(c, w.args);
      }
    } else if (is_linear(st.op)) {
      if (!has_per_member(c, sp)) {
        make_window(c, b, st, sp, 0, sp.count, 0, k, w);
        linear_param_grads(c, w.args);
        continue;
      }
      for (uint32_t j = 0; j < st.member_count; ++j) {
        make_window(c, b, st, sp, j * k, k, j, k, w);
        linear_param_grads(c, w.args);
      }
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
    const bool wide = k >= kMinSplitInvocations * static_cast<uint32_t>(c.threads);
    const double work = wide ? 2.0 * k * b.floats_per_invocation * b.floats_per_invocation : 0.0;
    on_threads(c, k, work, false, [&](Context& one, uint32_t i0, uint32_t i1) {
      run_invocations(one, b, bp, i0, i1, true);
    });
    return static_cast<uint32_t>(b.groups.size());
  }
  run_groups(c, b, bp, true);
  return static_cast<uint32_t>(b.groups.size());
}

uint32_t call_backward(Context& c, const PlanRef& p, size_t batch) {
  const BlockPlan& b = plan_of(p, batch);
  const BatchPlan& bp = p.plan.batches[batch];
  thread_local SplitScratch split;
  const uint32_t parts = std::min<uint32_t>(static_cast<uint32_t>(c.threads), bp.count);
  if (parts > 1 && !c.param_grads_later && backward_split(c, b, bp, parts, split)) {
    // As forward: each thread runs the whole block backward on its range of the invocations, one
    // parallel region per batch. The parameters' gradients, which every invocation adds to, are
    // formed afterwards for the whole batch in run_groups' order, so they equal its bitwise.
    transposes_before(c, b, bp);
    const double work = 4.0 * bp.count * b.floats_per_invocation * b.floats_per_invocation;
    const std::vector<uint32_t>& bounds = split.bounds;
    on_threads(c, parts, work, true, [&](Context& one, uint32_t t0, uint32_t t1) {
      for (uint32_t t = t0; t < t1; ++t)
        run_invocations(one, b, bp, bounds[t], bounds[t + 1], false);
    });
    ++c.counters->split_call_backward;
    param_grads_after(c, b, bp);
    return static_cast<uint32_t>(b.groups.size());
  }
  run_groups(c, b, bp, false);
  return static_cast<uint32_t>(b.groups.size());
}

}  // namespace edbatch::cpu
