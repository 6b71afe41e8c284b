// Reuse of a schedule and memory plan when a graph's structure repeats (the same mini-batches
// evaluated every epoch, sequences of equal lengths, a fixed structure trained on new values).
// A structure is everything planning reads: every node's op, type, shape, arguments and
// attributes, block calls' integer counts and the input floats' count; not the per-node integers
// (lookup indices, labels, picked indices, dropout keys, block calls' integers), which the plan
// copies and which are rewritten on reuse. A plan is served only after an exact comparison of the
// structure; the key only finds the candidate.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"

namespace edbatch {

class PlanCache {
 public:
  // At most `budget_bytes` of copies kept; when full, the least recently used entry makes room
  // only once it has been idle for a while (see offer). 0 keeps none.
  explicit PlanCache(size_t budget_bytes) : budget_(budget_bytes) {}

  // When a plan made for exactly `g`'s structure is kept: copies it into `s` and `p` (their
  // storage reused) with `g`'s per-node integers, and sets `lookups` to what the policy reported
  // when it scheduled it. Called once per planning of a whole graph, before offer().
  bool find(const Graph& g, Schedule& s, MemoryPlan& p, Policy::Lookups& lookups);
  // After find() missed and `g` was planned: keeps a copy when a graph of the same key was
  // planned before (a key seen for the first time is only remembered), so graphs that never
  // repeat cost the key and no copy. A structure is kept at its second planning and reused from
  // its third.
  void offer(const Graph& g, const Schedule& s, const MemoryPlan& p,
             const Policy::Lookups& lookups);
  // The structure's key: counts of nodes, arguments, block-call integers and input floats, a
  // sum of the arguments each mixed with its position, and a sum of the types. Cheap (the
  // argument sum vectorises) and different for nearly all graphs that differ, trees of one size
  // among them; equality is then checked exactly.
  static uint64_t key(const Graph& g);
  size_t bytes() const { return used_; }
  size_t entries() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t key = 0;
    uint64_t last_use = 0;
    std::vector<Node> nodes;
    std::vector<uint32_t> args;
    size_t ints = 0, inputs = 0;
    Schedule schedule;
    MemoryPlan plan;
    Policy::Lookups lookups;
    size_t bytes = 0;
  };
  static bool same_structure(const Graph& g, const Entry& e);
  static size_t plan_bytes(const MemoryPlan& p);

  size_t budget_;
  size_t used_ = 0;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
  std::vector<uint64_t> seen_;  // keys of graphs planned before, direct-mapped
  bool repeat_ = false;         // the last find()'s key was seen before ...
  uint64_t key_ = 0;            // ... and is this
};

}  // namespace edbatch
