// Internal to the CUDA backend: every CUDA and cuBLAS call goes through these checks, which throw
// std::runtime_error naming the call and where it was made.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cublas_api.h"

namespace edbatch::cuda {

inline void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("[cuda] ") + call + ": " + cudaGetErrorString(e) + " (" +
                             file + ":" + std::to_string(line) + ")");
}

inline void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("[cuda] ") + call + ": " + blas::status_string(s) + " (" +
                             file + ":" + std::to_string(line) + ")");
}

}  // namespace edbatch::cuda

#define EDBATCH_CUDA_CHECK(call) ::edbatch::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define EDBATCH_CUBLAS_CHECK(call) ::edbatch::cuda::check_cublas((call), #call, __FILE__, __LINE__)
