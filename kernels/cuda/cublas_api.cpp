#include "kernels/cuda/cublas_api.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>

namespace edbatch::cuda::blas {
namespace {

struct Api {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasSgemmBatched) sgemm_batched = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

Api g_api;
std::atomic<bool> g_loaded{false};
std::mutex g_load;

std::string last_dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

// The directory of the CUDA runtime this process uses: cuBLAS of the same toolkit lies beside it.
std::string runtime_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) || !info.dli_fname) return {};
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

template <typename F>
void resolve(void* library, const char* symbol, F& out, const std::string& name) {
  out = reinterpret_cast<F>(dlsym(library, symbol));
  if (!out)
    throw std::runtime_error("[cuda] " + name + " lacks " + symbol + ": " + last_dl_error());
}

void load() {
  std::lock_guard<std::mutex> lock(g_load);
  if (g_loaded.load()) return;
  // The soname of the toolkit this build compiled against. The usual search comes first (a
  // process that has it loaded already, PyTorch's, gets that one; then LD_LIBRARY_PATH, the
  // caller's run path, the linker cache), then the toolkit's directory at build time and the
  // CUDA runtime's.
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string tried = name + ": ";
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) tried += last_dl_error();
  for (const std::string& dir : {std::string(EDBATCH_CUDA_LIBRARY_DIR), runtime_directory()}) {
    if (library || dir.empty()) continue;
    const std::string path = dir + "/" + name;
    library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) tried += "; " + path + ": " + last_dl_error();
  }
  if (!library)
    throw std::runtime_error("[cuda] cannot load cuBLAS, which the CUDA backend needs (" + tried +
                             "): install the CUDA toolkit's cuBLAS " +
                             std::to_string(CUBLAS_VER_MAJOR) +
                             " or add its directory to LD_LIBRARY_PATH");
  Api api;
  resolve(library, "cublasCreate_v2", api.create, name);
  resolve(library, "cublasDestroy_v2", api.destroy, name);
  resolve(library, "cublasSetStream_v2", api.set_stream, name);
  resolve(library, "cublasSgemm_v2", api.sgemm, name);
  resolve(library, "cublasSgemmBatched", api.sgemm_batched, name);
  resolve(library, "cublasGetStatusString", api.status_string, name);
  g_api = api;  // the library stays open for the process's life
  g_loaded.store(true);
}

}  // namespace

cublasStatus_t create(cublasHandle_t* handle) {
  if (!g_loaded.load()) load();
  return g_api.create(handle);
}

cublasStatus_t destroy(cublasHandle_t handle) {
  return g_api.destroy(handle);
}

cublasStatus_t set_stream(cublasHandle_t handle, cudaStream_t stream) {
  return g_api.set_stream(handle, stream);
}

cublasStatus_t sgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                     int n, int k, const float* alpha, const float* a, int lda, const float* b,
                     int ldb, const float* beta, float* c, int ldc) {
  return g_api.sgemm(handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

cublasStatus_t sgemm_batched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                             int m, int n, int k, const float* alpha, const float* const a[],
                             int lda, const float* const b[], int ldb, const float* beta,
                             float* const c[], int ldc, int batch_count) {
  return g_api.sgemm_batched(handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                             batch_count);
}

const char* status_string(cublasStatus_t status) {
  if (!g_loaded.load()) {
    thread_local std::string text;
    text = "cuBLAS status " + std::to_string(static_cast<int>(status));
    return text.c_str();
  }
  return g_api.status_string(status);
}

}  // namespace edbatch::cuda::blas
