// The null backend walks the schedule and the plan without math: it counts kernel launches and
// the bytes a real backend would gather, for policy training and scheduling benchmarks.
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"
#include "src/core/backends.h"

namespace edbatch {

namespace {

class NullBackend : public Backend {
 public:
  const char* name() const override { return "null"; }
  void forward(const PlanRef& p) override {
    counters_.kernels += kernels_per_pass(p, first_forward_batch(p));
    counters_.stages = counters_.kernels;
    for (size_t s = p.first_segment; s < p.plan.segments.size(); ++s)
      counters_.bytes_copied += p.plan.segments[s].gather_bytes;
    counters_.arena_bytes = static_cast<uint64_t>(p.plan.total_floats) * sizeof(float);
  }
  void backward(const PlanRef& p, const BackwardSeed&) override {
    counters_.kernels += kernels_per_pass(p);
    counters_.stages = counters_.kernels;
    counters_.bytes_copied += 2 * p.plan.gather_bytes;  // gather and scatter back
    counters_.arena_bytes = 2ull * p.plan.total_floats * sizeof(float);
  }
  const float* value(const MemoryPlan&, uint32_t) const override { return nullptr; }
  const float* adjoint(const MemoryPlan&, uint32_t) const override { return nullptr; }
};

}  // namespace

std::unique_ptr<Backend> make_null_backend() { return std::make_unique<NullBackend>(); }

}  // namespace edbatch
