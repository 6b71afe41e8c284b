#include "src/core/plan_cache.h"

#include <algorithm>

#include "edbatch/op.h"
#include "edbatch/types.h"

namespace edbatch {

namespace {

constexpr size_t kSeenSlots = 4096;

uint64_t mix(uint64_t h) {  // a 64-bit finaliser: every input bit reaches every output bit
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

// A node's aux2 is structure unless it is a per-node integer the plan copies (refresh_plan_aux).
uint32_t structural_aux2(const Node& n) {
  return per_node_int(n.op) ? 0 : n.aux2;
}

}  // namespace

bool PlanCache::same_structure(const Graph& g, const Entry& e) {
  if (g.size() != e.nodes.size() || g.all_args().size() != e.args.size() ||
      g.ints().size() != e.ints || g.input_values().size() != e.inputs)
    return false;
  const Node* a = g.nodes().data();
  const Node* b = e.nodes.data();
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    const Node& x = a[i];
    const Node& y = b[i];
    if (x.op != y.op || x.type != y.type || x.dim != y.dim || x.arg_begin != y.arg_begin ||
        x.num_args != y.num_args || x.aux != y.aux || structural_aux2(x) != y.aux2 ||
        float_bits(x.alpha) != float_bits(y.alpha) || float_bits(x.beta) != float_bits(y.beta))
      return false;
  }
  return std::equal(e.args.begin(), e.args.end(), g.all_args().begin());
}

size_t PlanCache::plan_bytes(const MemoryPlan& p) {
  return p.batches.size() * sizeof(BatchPlan) + p.steps.size() * sizeof(BatchPlan) +
         (p.operands.size() + p.member_operands.size()) * sizeof(Operand) +
         (p.index.size() + p.aux.size() + p.aux_source.size() + p.node_offset.size()) * 4 +
         p.segments.size() * sizeof(PlanSegment);
}

uint64_t PlanCache::key(const Graph& g) {
  // A sum of each argument mixed with its position: a plain sum is the same for every tree of a
  // node count (each node but the root is an argument once, wherever it sits), so trees that
  // never repeat shared keys and filled the budget with plans never served, and a sum weighted
  // linearly by position still let one tree in seven collide. In 32 bits, so it vectorises.
  const std::vector<uint32_t>& args = g.all_args();
  uint32_t arg_sum = 0;
  const auto n = static_cast<uint32_t>(args.size());  // a graph's arguments fit 32 bits
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t v = args[i] * 0x9E3779B1u + i;
    v ^= v >> 16;
    v *= 0x7FEB352Du;
    v ^= v >> 15;
    v *= 0x846CA68Bu;
    arg_sum += v ^ (v >> 16);
  }
  uint64_t type_sum = 0;
  for (const Node& n : g.nodes()) type_sum += n.type;
  return mix(mix(g.size() ^ (uint64_t{g.all_args().size()} << 32)) ^ g.ints().size() ^
             (uint64_t{g.input_values().size()} << 32) ^ mix(arg_sum) ^ mix(type_sum + 1));
}

bool PlanCache::find(const Graph& g, Schedule& s, MemoryPlan& p, Policy::Lookups& lookups) {
  ++clock_;  // one tick per planning
  repeat_ = false;
  if (budget_ == 0) return false;
  if (seen_.empty()) seen_.assign(kSeenSlots, 0);
  key_ = key(g);
  uint64_t& seen = seen_[key_ % kSeenSlots];
  repeat_ = seen == key_;
  seen = key_;
  if (!repeat_) return false;
  for (Entry& e : entries_) {
    if (e.key != key_ || !same_structure(g, e)) continue;
    e.last_use = clock_;
    s = e.schedule;
    p = e.plan;
    refresh_plan_aux(g, p);
    lookups = e.lookups;
    return true;
  }
  return false;
}

void PlanCache::offer(const Graph& g, const Schedule& s, const MemoryPlan& p,
                      const Policy::Lookups& lookups) {
  if (!repeat_) return;  // a key seen for the first time (or its table slot was taken since)
  const size_t bytes = sizeof(Entry) + g.size() * sizeof(Node) + g.all_args().size() * 4 +
                       (s.nodes.size() + s.read_begin.size() + s.reads.size()) * 4 +
                       s.batches.size() * sizeof(Batch) + plan_bytes(p);
  if (bytes > budget_) return;
  // Room is made from entries unused for a while only: structures that come back in a cycle
  // longer than the budget holds (the evaluation set, epoch after epoch) keep the part that fits
  // instead of each evicting the next one to come back.
  const uint64_t idle = 4 * entries_.size() + 64;
  while (used_ + bytes > budget_) {
    const auto oldest =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
    if (oldest == entries_.end() || clock_ - oldest->last_use < idle) return;
    used_ -= oldest->bytes;
    entries_.erase(oldest);
  }
  Entry& e = entries_.emplace_back();
  e.key = key_;
  e.last_use = clock_;
  e.nodes.assign(g.nodes().begin(), g.nodes().end());
  for (Node& n : e.nodes) n.aux2 = structural_aux2(n);
  e.args.assign(g.all_args().begin(), g.all_args().end());
  e.ints = g.ints().size();
  e.inputs = g.input_values().size();
  e.schedule = s;
  e.plan = p;
  e.lookups = lookups;
  e.bytes = bytes;
  used_ += bytes;
}

}  // namespace edbatch
