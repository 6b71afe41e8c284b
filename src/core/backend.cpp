#include <stdexcept>
#include <string>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/optim.h"
#include "edbatch/params.h"
#include "edbatch/schedule.h"
#include "src/core/backends.h"

namespace edbatch {

uint32_t first_forward_batch(const PlanRef& p) {
  if (p.first_segment == 0) return 0;
  if (p.first_segment >= p.plan.segments.size())
    throw std::invalid_argument("[Backend::forward] segment " + std::to_string(p.first_segment) +
                                " of a plan of " + std::to_string(p.plan.segments.size()));
  return p.plan.segments[p.first_segment].batch_begin;
}

uint64_t kernels_per_pass(const PlanRef& p, uint32_t first_batch) {
  uint64_t k = 0;
  for (size_t i = first_batch; i < p.schedule.batches.size(); ++i) {
    const Batch& b = p.schedule.batches[i];
    const Node& first = p.graph.node(p.schedule.nodes[b.begin]);
    const Block* block = first.op == Op::Call ? p.params.block(first.aux) : nullptr;
    k += block ? block->plan().groups.size() : 1;
  }
  return k;
}

void Backend::check_ticket(uint64_t ticket) const {
  if (ticket >= next_ticket_)
    throw std::invalid_argument("[Backend::staged] ticket " + std::to_string(ticket) +
                                " was never issued");
  if (ticket + kStagedSlots < next_ticket_)
    throw std::invalid_argument("[Backend::staged] ticket " + std::to_string(ticket) +
                                " is spent: only the last " + std::to_string(kStagedSlots) +
                                " staged values are kept");
}

const float* Backend::arena(const MemoryPlan&, uint32_t, uint32_t, bool) const {
  return nullptr;
}

void Backend::fetch(const MemoryPlan&, const std::vector<uint32_t>&) const {}

uint64_t Backend::stage(const MemoryPlan& plan, uint32_t node, uint32_t floats) {
  const uint64_t ticket = next_ticket_++;
  const float* v = value(plan, node);
  const size_t slot = ticket % kStagedSlots;
  staged_null_[slot] = v == nullptr;
  if (v) staged_[slot].assign(v, v + floats);
  return ticket;
}

const float* Backend::staged(uint64_t ticket) {
  check_ticket(ticket);
  const size_t slot = ticket % kStagedSlots;
  return staged_null_[slot] ? nullptr : staged_[slot].data();
}

void Backend::sgd_update(ParameterCollection& params, float lr) { params.sgd_update(lr); }

std::vector<std::string> built_backends() {
  std::vector<std::string> names = {"cpu", "null"};
  if (cuda_built()) names.push_back("cuda");
  return names;
}

void Backend::optimizer_step(ParameterCollection& params, const UpdateRule& rule,
                             OptimizerState& state) {
  apply_update(params, rule, state);
}

std::string device_unavailable(const std::string& device) {
  if (device == "cpu" || device == "null") return "";
  if (device == "cuda") return cuda_unavailable();
  return "unknown device '" + device + "'";
}

std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& options) {
  // TBB's arenas take at most about 2^16 threads (more crashed at destruction); more than a few
  // thousand is a mistake on any machine.
  constexpr int kMaxThreads = 4096;
  if (options.threads < 1 || options.threads > kMaxThreads)
    throw std::invalid_argument("[make_backend] threads must be in 1.." +
                                std::to_string(kMaxThreads) + ", got " +
                                std::to_string(options.threads));
  if (device == "cpu") return cpu::make_cpu_backend(options);
  if (device == "null") return make_null_backend();
  if (device == "cuda") return make_cuda_backend(options);
  throw std::invalid_argument("[make_backend] unknown device '" + device +
                              "' (expected cpu, null or cuda)");
}

}  // namespace edbatch
