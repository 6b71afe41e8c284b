// Internal to the CUDA backend: cuBLAS, opened when the backend makes its first handle rather
// than when a program starts. Linked, libcublas and libcublasLt (over 600 MB) are mapped into
// every process that links edbatch: a CPU-only run, the command line's --help and the PyTorch
// extension on a machine without a GPU each paid seconds of page faults and about 150 MB of
// memory for them. Every cuBLAS call of the backend goes through these functions.
#pragma once
#include <cublas_v2.h>

namespace edbatch::cuda::blas {

// Loads cuBLAS on first use (once per process; a failed load is tried again at the next call)
// and makes a handle. Throws std::runtime_error naming the library and the directories tried
// when it cannot be loaded.
cublasStatus_t create(cublasHandle_t* handle);
// The rest are called with a handle that create made, so cuBLAS is loaded.
cublasStatus_t destroy(cublasHandle_t handle);
cublasStatus_t set_stream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t sgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                     int n, int k, const float* alpha, const float* a, int lda, const float* b,
                     int ldb, const float* beta, float* c, int ldc);
cublasStatus_t sgemm_batched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                             int m, int n, int k, const float* alpha, const float* const a[],
                             int lda, const float* const b[], int ldb, const float* beta,
                             float* const c[], int ldc, int batch_count);
// cuBLAS's name for a status ("CUBLAS_STATUS_..."), or the number before cuBLAS is loaded.
const char* status_string(cublasStatus_t status);

}  // namespace edbatch::cuda::blas
