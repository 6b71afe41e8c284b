// Outer planning: order the members of each batch of a mini-batch so that the batches reading
// them find their operands consecutive and in their own order (zero-copy views). Batches are
// visited consumers first, so a consumer's order is final when its producers are ordered.
#include <algorithm>

#include "edbatch/graph.h"
#include "edbatch/schedule.h"
#include "memplan/layout.h"
#include "memplan/outer_order.h"

namespace edbatch {

namespace {

// The scheduled node behind argument `a` and which of its outputs it reads (0 for plain nodes).
struct Source {
  uint32_t node, output;
};
Source source_of(const Graph& g, uint32_t a) {
  while (g.node(a).op == Op::Reshape) a = g.args(g.node(a))[0];
  const Node& n = g.node(a);
  if (n.op == Op::Output) return {g.args(n)[0], n.aux};
  return {a, 0};
}

}  // namespace

void order_for_consumers(const Graph& g, Schedule& s, OuterOrderScratch& scratch,
                         uint32_t first_batch, uint32_t first_node) {
  // Per-node arrays from first_node and per-batch ones from first_batch: an increment costs its
  // own size. Earlier nodes read as inputs (no producer batch here).
  const uint32_t n = g.size() - first_node;
  std::vector<uint32_t>& batch_of = scratch.batch_of;
  std::vector<uint32_t>& pos = scratch.pos;
  batch_of.assign(n, UINT32_MAX);
  pos.assign(n, 0);
  uint32_t widest = 0;
  for (uint32_t b = first_batch; b < s.batches.size(); ++b) {
    widest = std::max(widest, s.batches[b].count);
    for (uint32_t i = 0; i < s.batches[b].count; ++i) {
      const uint32_t v = s.nodes[s.batches[b].begin + i] - first_node;
      batch_of[v] = b - first_batch;
      pos[v] = i;
    }
  }
  std::vector<uint32_t>& seen = scratch.seen;
  if (seen.size() < widest) seen.resize(widest, 0);
  // A fresh stamp per want: positions seen before in it are repeats (no consecutive order).
  const auto next_stamp = [&] {
    if (++scratch.stamp == 0) {
      std::fill(seen.begin(), seen.end(), 0u);
      scratch.stamp = 1;
    }
    return scratch.stamp;
  };
  const auto producer_of = [&](uint32_t v) {
    return v < first_node ? UINT32_MAX : batch_of[v - first_node];
  };
  const auto pos_of = [&](uint32_t v) { return pos[v - first_node]; };
  std::vector<std::vector<SequenceWant>>& wants = scratch.wants;
  wants.resize(s.batches.size() - first_batch);
  for (auto& w : wants) w.clear();
  std::vector<uint32_t>& reordered = scratch.reordered;

  for (uint32_t b = static_cast<uint32_t>(wants.size()); b-- > 0;) {
    const Batch& batch = s.batches[first_batch + b];
    uint32_t* members = s.nodes.data() + batch.begin;
    if (!wants[b].empty()) {
      const GroupOrder o = order_group(batch.count, wants[b]);
      reordered.assign(members, members + batch.count);
      for (uint32_t i = 0; i < batch.count; ++i) members[i] = reordered[o.order[i]];
      for (uint32_t i = 0; i < batch.count; ++i) pos[members[i] - first_node] = i;
    }
    const Node& first = g.node(members[0]);
    if (batch.count < 2 || g.types().is_ragged(first.type)) continue;
    const bool gemm = first.op == Op::Affine || first.op == Op::MatMul || first.op == Op::Call;
    for (uint32_t j = 0; j < first.num_args; ++j) {
      const Source s0 = source_of(g, g.args(first)[j]);
      const uint32_t producer = producer_of(s0.node);
      if (producer == UINT32_MAX) continue;  // inputs and parameters
      std::vector<uint32_t>& elems = scratch.elems;
      elems.clear();
      const uint32_t stamp = next_stamp();
      bool ok = true;
      for (uint32_t i = 0; i < batch.count && ok; ++i) {
        const Source si = source_of(g, g.args(g.node(members[i]))[j]);
        ok = producer_of(si.node) == producer && si.output == s0.output;
        if (!ok) break;
        const uint32_t e = pos_of(si.node);
        ok = seen[e] != stamp;  // each producer member at most once
        seen[e] = stamp;
        elems.push_back(e);
      }
      if (!ok) continue;
      wants[producer].push_back({elems, static_cast<uint64_t>(batch.count) *
                                            g.node(g.args(first)[j]).dim.size() * sizeof(float) *
                                            (gemm ? 2 : 1)});
    }
  }
}

}  // namespace edbatch
