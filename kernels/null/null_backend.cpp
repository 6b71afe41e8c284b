// The null backend walks the schedule and the plan without math: it counts kernel launches and
// the bytes a real backend would gather, for policy training and scheduling benchmarks.
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"
#include "src/backends.h"

namespace edbatch {

namespace {

class NullBackend : public Backend {
 public:
  const char* name() const override { return "null"; }
  void forward(const PlanRef& p) override {
    counters_.kernels += p.schedule.batches.size();
    counters_.bytes_copied += gather_bytes(p);
    counters_.arena_bytes = static_cast<uint64_t>(p.plan.total_floats) * sizeof(float);
  }
  void backward(const PlanRef& p, uint32_t) override {
    counters_.kernels += p.schedule.batches.size();
    counters_.bytes_copied += 2 * gather_bytes(p);
    counters_.arena_bytes = 2ull * p.plan.total_floats * sizeof(float);
  }
  const float* value(const MemoryPlan&, uint32_t) const override { return nullptr; }
  const float* adjoint(const MemoryPlan&, uint32_t) const override { return nullptr; }

 private:
  // GEMM inputs that are neither shared nor a contiguous view must be gathered.
  static uint64_t gather_bytes(const PlanRef& p) {
    uint64_t bytes = 0;
    for (size_t b = 0; b < p.schedule.batches.size(); ++b) {
      const Batch& batch = p.schedule.batches[b];
      const Node& first = p.graph.node(p.schedule.nodes[batch.begin]);
      if (first.op != Op::Affine && first.op != Op::MatMul) continue;
      const BatchPlan& bp = p.plan.batches[b];
      const Operand* ops = p.plan.operands.data() + bp.operand_begin;
      const uint32_t* args = p.graph.args(first);
      for (uint32_t j = first.op == Op::Affine ? 1 : 0; j + 1 < bp.operand_count; j += 2) {
        const Operand& w = ops[j];
        const Operand& x = ops[j + 1];
        const bool shared_w = w.mode == OperandMode::Param || w.mode == OperandMode::Shared;
        const bool shared_x = x.mode == OperandMode::Param || x.mode == OperandMode::Shared;
        const uint32_t size = p.graph.node(args[j + 1]).dim.size();
        const bool view = x.mode == OperandMode::Contiguous && x.stride == size;
        if (shared_w && !shared_x && !view)
          bytes += static_cast<uint64_t>(batch.count) * size * sizeof(float);
      }
    }
    return bytes;
  }
};

}  // namespace

std::unique_ptr<Backend> make_null_backend() { return std::make_unique<NullBackend>(); }

}  // namespace edbatch
