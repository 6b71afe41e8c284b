// Internal to fsm/: a copyable replica of the Scheduler's frontier for training rollouts and
// search. Same readiness, chain heights, lower bound and lb-greedy choice as fsm/scheduler.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "edbatch/fsm.h"

namespace edbatch {

class Graph;

// The immutable part: one graph's scheduled nodes in compact ids, local types 0..L-1.
struct SimGraph {
  // `index_of` maps graph type ids to the trainer's type indices (the ids in state keys).
  SimGraph(const Graph& g, const std::vector<uint32_t>& index_of);
  uint32_t num_nodes = 0, num_types = 0, lower_bound = 0;
  std::vector<uint32_t> type, height;           // per node: local type, own-type chain height
  std::vector<uint32_t> consumer_begin, consumers;
  std::vector<uint32_t> pending;                // per node: scheduled inputs
  std::vector<uint32_t> global, index;          // per local type: graph type id, trainer index
  std::vector<double> avg_depth;                // per local type
  std::vector<uint32_t> level_base, top, remaining_at;  // per local type / (type, height)
  std::vector<uint64_t> zobrist;                // per node: a random word (state hashing)
};

// Per-thread buffers for computing keys.
struct KeyScratch {
  std::vector<uint32_t> ids, counts, levels, order;
};

// The mutable part: one partial schedule.
struct SimState {
  explicit SimState(const SimGraph& g);
  const SimGraph* g;
  std::vector<uint32_t> pending;
  std::vector<std::vector<uint32_t>> ready;  // per local type
  std::vector<uint32_t> ready_types;         // local types with ready nodes
  std::vector<uint32_t> ready_at, remaining_at, top;
  uint32_t batches = 0, done = 0, bound_left = 0;  // bound_left = sum of top
  uint64_t hash = 0;                               // xor of the scheduled nodes' words

  bool finished() const { return ready_types.empty(); }
  uint32_t critical_total(uint32_t t) const { return remaining_at[g->level_base[t] + top[t]]; }
  uint32_t critical_ready(uint32_t t) const { return ready_at[g->level_base[t] + top[t]]; }
  double coverage(uint32_t t) const {
    return static_cast<double>(critical_ready(t)) / critical_total(t);
  }
  // Runs every ready node of local type t; returns how many.
  uint32_t run(uint32_t t);
  uint32_t lb_greedy() const;  // local type, as LowerBoundGreedyPolicy chooses
  FsmKey key(FsmEncoding e, KeyScratch& k) const;
};

}  // namespace edbatch
