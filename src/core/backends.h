// Backend factories, one per folder under kernels/. The build picks which CUDA file defines
// make_cuda_backend: the real one or kernels/no_cuda/, which throws.
#pragma once
#include <memory>
#include <string>

#include "edbatch/backend.h"

namespace edbatch {
namespace cpu {
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);
}
std::unique_ptr<Backend> make_null_backend();
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
std::string cuda_unavailable();  // empty when a CUDA device is usable
bool cuda_built();               // false for kernels/no_cuda
}  // namespace edbatch
