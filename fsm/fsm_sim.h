// Internal to fsm/: a copyable replica of the Scheduler's frontier for training rollouts and
// search. Same readiness, chain heights, lower bound and lb-greedy choice as fsm/scheduler.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
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
  std::vector<double> launch_cost, node_cost;   // per local type: the reward's costs (1, 0)
  // Costs that combine along the critical chain (FsmCostModel::chain).
  bool chain = false;
  double batch_cost = 0;  // chain: added for every batch (FsmCostModel::batch_us)
  // sum of top * launch_cost; chain: the longest path of single-node batches from a source to a
  // sink, plus batch_cost * lower_bound
  double bound_cost = 0;
  double fixed_cost = 0;  // sum over nodes of node_cost: in every schedule (chain: 0, in tails)
  void set_costs(const FsmCostModel& costs, const std::vector<std::string>& names);
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
  double cost = 0, bound_cost_left = 0;            // predicted cost so far; sum of top * launch
  // With chain costs: per node, when its batch can start at the earliest (its producers'
  // batches finished); the end of the last batch so far; `cost` is then end + batch_cost *
  // batches.
  std::vector<double> start_at;
  double end = 0;

  bool finished() const { return ready_types.empty(); }
  uint32_t critical_total(uint32_t t) const { return remaining_at[g->level_base[t] + top[t]]; }
  uint32_t critical_ready(uint32_t t) const { return ready_at[g->level_base[t] + top[t]]; }
  double coverage(uint32_t t) const {
    return static_cast<double>(critical_ready(t)) / critical_total(t);
  }
  // Runs every ready node of local type t; returns how many.
  uint32_t run(uint32_t t);
  // With summed costs, the cost of any schedule that continues from here, at least: the cost so
  // far plus the launch costs of the remaining chain bound. (Chain costs have no such bound
  // that tells candidates apart; beam_search ranks them by lb-greedy's completion.)
  double least_cost() const;
  uint32_t lb_greedy() const;  // local type, as LowerBoundGreedyPolicy chooses
  // Local type, as FsmPolicy's scorer chooses; `index` gives the scorer's type index.
  uint32_t scored(const FsmScorer& s, std::vector<ReadyView>& views,
                  std::vector<double>& features) const;
  FsmKey key(FsmEncoding e, KeyScratch& k) const;
};

// ---- What the trainer's stages share (fsm_train.cpp, fsm_scorer_train.cpp) ----

struct TrainGraph {
  TrainGraph(const Graph& g, const std::vector<uint32_t>& index_of, uint32_t num_indices)
      : sim(g, index_of), local_of_index(num_indices, UINT32_MAX) {
    for (uint32_t t = 0; t < sim.num_types; ++t) local_of_index[sim.index[t]] = t;
  }
  SimGraph sim;
  std::vector<uint32_t> local_of_index;
};

// How a candidate policy decides: the table first, then the scorer (when set) or lb-greedy.
struct SimPolicy {
  FsmEncoding encoding;
  const FsmTable* table = nullptr;
  const FsmScorer* scorer = nullptr;
};

struct SimScratch {
  KeyScratch keys;
  std::vector<ReadyView> views;
  std::vector<double> features;
};

// The fallback's choice in `s` (the scorer's, else lb-greedy's), and the policy's.
uint32_t fallback_choice(const SimState& s, const SimPolicy& p, SimScratch& k);
uint32_t policy_choice(const TrainGraph& tg, const SimState& s, const SimPolicy& p,
                       SimScratch& k);
// Runs a graph under the policy; returns its predicted cost (batches without costs).
double run_policy(const TrainGraph& tg, const SimPolicy& p);
// Sum of costs over graphs, in parallel; summed in graph order, so the thread count does not
// change it.
double evaluate(const std::vector<TrainGraph>& graphs, const SimPolicy& p);
// A beam search over schedules ranked by SimState::least_cost (with chain costs: by the cost of
// finishing each with lb-greedy); returns the local types in order (lb-greedy's plan when that
// is cheaper). When `stop` returns true (checked for each entry of the beam), it gives up and
// returns an empty plan.
std::vector<uint32_t> beam_search(const TrainGraph& tg, uint32_t width,
                                  const std::function<bool()>& stop = {});

// The scorer (fsm_scorer_train.cpp): imitation of the plans (when given), then a (1+1) search
// over its weights on the training cost, until options.scorer_search evaluations or out of time.
FsmScorer train_scorer(const std::vector<TrainGraph>& train,
                       const std::vector<std::vector<uint32_t>>& plans, uint32_t num_indices,
                       FsmEncoding encoding, const FsmTrainOptions& options,
                       const std::function<bool()>& out_of_time);

}  // namespace edbatch
