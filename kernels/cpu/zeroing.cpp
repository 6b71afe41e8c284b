#include "kernels/cpu/zeroing.h"

#include <algorithm>
#include <cstring>

#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"

namespace edbatch::cpu {

namespace {

// The batch whose region holds arena offset `off`, or -1 (an input, or padding).
int64_t owner(const MemoryPlan& plan, uint32_t off) {
  const auto& bs = plan.batches;
  // Regions are placed in batch order, so their offsets increase with the batch index.
  auto it = std::upper_bound(bs.begin(), bs.end(), off,
                             [](uint32_t o, const BatchPlan& bp) { return o < bp.out_offset; });
  if (it == bs.begin()) return -1;
  --it;
  const uint64_t end = uint64_t{it->out_offset} + uint64_t{it->count} * it->out_size;
  return off < end ? it - bs.begin() : -1;
}

}  // namespace

void AdjointZeroing::plan(const PlanRef& p, const BackwardSeed& seed) {
  const MemoryPlan& plan = p.plan;
  const Schedule& s = p.schedule;
  const Graph& g = p.graph;
  const size_t nb = s.batches.size();
  last_reader_.assign(nb, -1);
  seeded_.assign(nb, 0);
  for (size_t b = 0; b < nb; ++b) {
    const Batch& batch = s.batches[b];
    for (uint32_t i = 0; i < batch.count; ++i) {
      const Node& n = g.node(s.nodes[batch.begin + i]);
      const uint32_t* args = g.args(n);
      for (uint32_t j = 0; j < n.num_args; ++j) {
        const uint32_t off = plan.node_offset[args[j]];
        if (off == UINT32_MAX) continue;
        const int64_t a = owner(plan, off);
        if (a >= 0) last_reader_[a] = std::max<int64_t>(last_reader_[a], static_cast<int64_t>(b));
      }
    }
  }
  auto seed_node = [&](uint32_t node) {
    const uint32_t off = plan.node_offset[node];
    if (off == UINT32_MAX) return;
    const int64_t a = owner(plan, off);
    if (a >= 0) seeded_[a] = 1;
  };
  if (seed.nodes == nullptr) {
    seed_node(seed.loss_node);
  } else {
    for (uint32_t node : *seed.nodes) seed_node(node);
  }
  // Every region with its slot, then bucketed by slot (a stable counting sort).
  regions_.clear();
  for (const PlanSegment& seg : plan.segments)
    if (seg.input_count > 0) regions_.push_back({0, {seg.input_offset, seg.input_count}});
  for (size_t a = 0; a < nb; ++a) {
    const BatchPlan& bp = plan.batches[a];
    const uint32_t floats = bp.count * bp.out_size;
    if (floats == 0) continue;
    const uint32_t slot = seeded_[a]             ? 0
                          : last_reader_[a] >= 0 ? static_cast<uint32_t>(last_reader_[a] + 1)
                                                 : static_cast<uint32_t>(a + 1);
    regions_.push_back({slot, {bp.out_offset, floats}});
  }
  slot_begin_.assign(nb + 2, 0);
  for (const auto& r : regions_) ++slot_begin_[r.first + 1];
  for (size_t k = 1; k < nb + 2; ++k) slot_begin_[k] += slot_begin_[k - 1];
  fill_.assign(slot_begin_.begin(), slot_begin_.end() - 1);
  ranges_.resize(regions_.size());
  for (const auto& r : regions_) ranges_[fill_[r.first]++] = r.second;
}

void AdjointZeroing::zero(size_t slot, float* adjoints) const {
  if (slot + 1 >= slot_begin_.size()) return;
  for (uint32_t k = slot_begin_[slot]; k < slot_begin_[slot + 1]; ++k)
    std::memset(adjoints + ranges_[k].first, 0, size_t{ranges_[k].second} * sizeof(float));
}

}  // namespace edbatch::cpu
