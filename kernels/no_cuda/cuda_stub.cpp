#include <stdexcept>

#include "src/backends.h"

namespace edbatch {

std::unique_ptr<Backend> make_cuda_backend(int) {
  throw std::runtime_error("[cuda] edbatch was built without CUDA");
}

}  // namespace edbatch
