#include <stdexcept>

#include "src/backends.h"

namespace edbatch {

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
