// Internal to fsm/: lb-greedy's order on ready types, shared by the policy (fsm/policies.cpp) and
// the trainer's copy of the frontier (fsm/fsm_sim.cpp), so the two always choose alike.
#pragma once
#include <cstdint>

namespace edbatch {

// The running choice over ready types: the largest share of the type's critical nodes ready,
// then the lowest average depth, then the lowest type id.
struct LbGreedyChoice {
  uint32_t type = UINT32_MAX;
  uint32_t id = UINT32_MAX;  // what ties are broken by (the graph's type id)
  double share = -1, depth = 0;

  void offer(uint32_t t, uint32_t t_id, double t_share, double t_depth) {
    if (t_share > share ||
        (t_share == share && (t_depth < depth || (t_depth == depth && t_id < id)))) {
      type = t;
      id = t_id;
      share = t_share;
      depth = t_depth;
    }
  }
};

}  // namespace edbatch
