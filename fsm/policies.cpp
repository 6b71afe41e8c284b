// The heuristic policies. Learned policies live beside them and share the Policy interface.
#include <stdexcept>

#include "edbatch/fsm.h"
#include "edbatch/schedule.h"
#include "fsm/lb_greedy.h"

namespace edbatch {

namespace {

class NodeByNodePolicy : public Policy {
 public:
  const char* name() const override { return "none"; }
  Kind kind() const override { return Kind::NodeByNode; }
  uint32_t choose(const Frontier& f) override { return f.ready_types().front(); }
};

// TensorFlow Fold: one batch per (depth, type).
class DepthPolicy : public Policy {
 public:
  const char* name() const override { return "depth"; }
  Kind kind() const override { return Kind::Depth; }
  uint32_t choose(const Frontier& f) override { return f.ready_types().front(); }
};

// DyNet's agenda: the ready type whose nodes lie shallowest on average.
class AgendaPolicy : public Policy {
 public:
  const char* name() const override { return "agenda"; }
  uint32_t choose(const Frontier& f) override {
    uint32_t best = UINT32_MAX;
    double best_depth = 0;
    for (uint32_t t : f.ready_types()) {
      const double d = f.average_depth(t);
      if (best == UINT32_MAX || d < best_depth || (d == best_depth && t < best)) {
        best = t;
        best_depth = d;
      }
    }
    return best;
  }
};

// Prefers the type whose ready nodes cover the largest share of its critical nodes (those on a
// longest remaining chain of that type): a batch covering all of them keeps the type at its bound.
class LowerBoundGreedyPolicy : public Policy {
 public:
  const char* name() const override { return "lb-greedy"; }
  uint32_t choose(const Frontier& f) override {
    LbGreedyChoice best;
    for (uint32_t t : f.ready_types())
      best.offer(t, t, static_cast<double>(f.critical_ready(t)) / f.critical_total(t),
                 f.average_depth(t));
    return best.type;
  }
};

}  // namespace

std::vector<std::string> policy_names() {
  return {"none", "depth", "agenda", "lb-greedy", "auto"};
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyContext& context) {
  if (name == "none") return std::make_unique<NodeByNodePolicy>();
  if (name == "depth") return std::make_unique<DepthPolicy>();
  if (name == "agenda") return std::make_unique<AgendaPolicy>();
  if (name == "lb-greedy") return std::make_unique<LowerBoundGreedyPolicy>();
  if (name == "auto") return std::make_unique<AutoPolicy>(context);
  if (name.rfind("fsm:", 0) == 0 && name.size() > 4) {
    const std::string path = name.substr(4);
    return std::make_unique<FsmPolicy>(load_fsm_policy(path), path);
  }
  std::string known;
  for (const std::string& p : policy_names()) known += p + ", ";
  throw std::invalid_argument("[make_policy] unknown policy '" + name + "' (expected " + known +
                              "or fsm:FILE)");
}

}  // namespace edbatch
