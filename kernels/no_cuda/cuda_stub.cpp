#include <stdexcept>

#include "src/core/backends.h"

namespace edbatch {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw std::runtime_error("[cuda] edbatch was built without CUDA");
}

std::string cuda_unavailable() { return "edbatch was built without CUDA"; }

bool cuda_built() { return false; }

}  // namespace edbatch
