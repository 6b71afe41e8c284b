#include <stdexcept>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/graph.h"
#include "edbatch/schedule.h"
#include "src/backends.h"

namespace edbatch {

uint64_t kernels_per_pass(const PlanRef& p) {
  uint64_t k = 0;
  for (const Batch& b : p.schedule.batches) {
    const Node& first = p.graph.node(p.schedule.nodes[b.begin]);
    const Block* block = first.op == Op::Call ? p.params.block(first.aux) : nullptr;
    k += block ? block->plan().groups.size() : 1;
  }
  return k;
}

std::string device_unavailable(const std::string& device) {
  if (device == "cpu" || device == "null") return "";
  if (device == "cuda") return cuda_unavailable();
  return "unknown device '" + device + "'";
}

std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& options) {
  if (options.threads < 1)
    throw std::invalid_argument("[make_backend] threads must be at least 1, got " +
                                std::to_string(options.threads));
  if (device == "cpu") return cpu::make_cpu_backend(options);
  if (device == "null") return make_null_backend();
  if (device == "cuda") return make_cuda_backend(options);
  throw std::invalid_argument("[make_backend] unknown device '" + device +
                              "' (expected cpu, null or cuda)");
}

}  // namespace edbatch
