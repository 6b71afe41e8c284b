#include "tests/engine_run.h"

#include <doctest/doctest.h>

#include "edbatch/engine.h"

namespace edbatch::testing {

EngineRun run_engine(Graph& g, const Expr& loss, const std::string& policy, int threads,
                     const std::vector<Expr>& watch) {
  ParameterCollection& pc = g.params();
  EngineOptions o;
  o.policy = policy;
  o.threads = threads;
  o.min_parallel_work = 1;  // split every kernel that can be split
  Engine e(pc, o);
  EngineRun r;
  r.loss = as_scalar(e.forward(g, loss));
  for (const Expr& x : watch) {
    const Tensor t = e.value(x);
    r.values.emplace_back(t.data, t.data + t.dim.size());
  }
  e.backward(g, loss);
  validate_schedule(g, e.schedule());
  r.batches = e.stats().batches;
  r.lower_bound = e.stats().lower_bound;
  r.split_call_backward = e.stats().split_call_backward;
  CHECK(r.batches >= r.lower_bound);
  r.grads.resize(pc.size());
  for (uint32_t p = 0; p < pc.size(); ++p)
    if (!pc.is_view(p)) r.grads[p].assign(pc.grads(p), pc.grads(p) + pc.dim(p).size());
  pc.zero_grads();
  return r;
}

}  // namespace edbatch::testing
