// The CUDA runtime's own cost of one decoding step's round trip on this machine, with no engine
// around it: upload a few KiB of metadata from pinned memory, record an event, launch a kernel
// (doing nothing, with a parameter block the size of the chained launch's), record an event,
// download 8 bytes, wait for the stream and read the events' elapsed time: the calls a decoding
// step of lstm_nmt makes (docs/models.md). Also the same queued as one updated CUDA graph.
// Medians over the iterations of each round; one JSON line per round.
//
//   bench_cuda_round_trip [iterations] [rounds]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                     \
  do {                                                                                       \
    const cudaError_t e = (call);                                                            \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "bench_cuda_round_trip: %s: %s\n", #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

struct Params {  // about the size of the chained launch's (DeviceView and Chain)
  const float* pointers[16];
  unsigned values[16];
};

__global__ void step_kernel(const float* meta, float* out, Params p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = meta[0] + static_cast<float>(p.values[0]);
}

using Clock = std::chrono::steady_clock;
double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  if (iterations < 10 || rounds < 1) {
    std::fprintf(stderr, "usage: bench_cuda_round_trip [iterations >= 10] [rounds >= 1]\n");
    return 2;
  }
  constexpr size_t kMeta = 8192;
  float *host_meta = nullptr, *device_meta = nullptr, *device_out = nullptr, *host_out = nullptr;
  CHECK_CUDA(cudaMallocHost(&host_meta, kMeta));
  CHECK_CUDA(cudaMalloc(&device_meta, kMeta));
  CHECK_CUDA(cudaMalloc(&device_out, 64));
  CHECK_CUDA(cudaMallocHost(&host_out, 64));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  Params params{};
  const float* meta_arg = device_meta;
  float* out_arg = device_out;
  void* args[] = {&meta_arg, &out_arg, &params};
  cudaKernelNodeParams kernel{};
  kernel.func = reinterpret_cast<void*>(step_kernel);
  kernel.blockDim = dim3(256);
  kernel.kernelParams = args;

  std::printf("%-9s %5s %12s %12s %12s %12s\n", "queueing", "round", "queue us", "step us",
              "device us", "host us");
  for (int graph = 0; graph < 2; ++graph) {
    for (int round = 0; round < rounds; ++round) {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t exec = nullptr;
      cudaGraphNode_t copy_node, start_node, kernel_node, stop_node;
      if (graph) {
        CHECK_CUDA(cudaGraphCreate(&g, 0));
        CHECK_CUDA(cudaGraphAddMemcpyNode1D(&copy_node, g, nullptr, 0, device_meta, host_meta,
                                            kMeta, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaGraphAddEventRecordNode(&start_node, g, &copy_node, 1, start));
        kernel.gridDim = dim3(4);
        CHECK_CUDA(cudaGraphAddKernelNode(&kernel_node, g, &start_node, 1, &kernel));
        CHECK_CUDA(cudaGraphAddEventRecordNode(&stop_node, g, &kernel_node, 1, stop));
        CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
      }
      std::vector<double> queue, step, device;
      for (int i = 0; i < iterations; ++i) {
        const size_t bytes = 1024 + static_cast<size_t>(i % 7) * 1024;  // as a step's upload varies
        params.values[0] = static_cast<unsigned>(i);
        const unsigned blocks = 4 + static_cast<unsigned>(i % 3);
        const auto t0 = Clock::now();
        if (graph) {
          CHECK_CUDA(cudaGraphExecMemcpyNodeSetParams1D(exec, copy_node, device_meta, host_meta,
                                                        bytes, cudaMemcpyHostToDevice));
          kernel.gridDim = dim3(blocks);
          CHECK_CUDA(cudaGraphExecKernelNodeSetParams(exec, kernel_node, &kernel));
          CHECK_CUDA(cudaGraphLaunch(exec, stream));
        } else {
          CHECK_CUDA(
              cudaMemcpyAsync(device_meta, host_meta, bytes, cudaMemcpyHostToDevice, stream));
          CHECK_CUDA(cudaEventRecord(start, stream));
          step_kernel<<<blocks, 256, 0, stream>>>(device_meta, device_out, params);
          CHECK_CUDA(cudaGetLastError());
          CHECK_CUDA(cudaEventRecord(stop, stream));
        }
        const auto t1 = Clock::now();
        CHECK_CUDA(cudaMemcpyAsync(host_out, device_out, 8, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        const auto t2 = Clock::now();
        if (i < iterations / 10) continue;  // warm-up
        queue.push_back(us_between(t0, t1));
        step.push_back(us_between(t0, t2));
        device.push_back(1e3 * ms);
      }
      if (exec) CHECK_CUDA(cudaGraphExecDestroy(exec));
      if (g) CHECK_CUDA(cudaGraphDestroy(g));
      const double q = median(queue), s = median(step), d = median(device);
      const char* how = graph ? "graph" : "calls";
      std::printf("%-9s %5d %12.2f %12.2f %12.2f %12.2f\n", how, round, q, s, d, s - d);
      std::printf(
          "{\"bench\":\"cuda_round_trip\",\"queueing\":\"%s\",\"round\":%d,"
          "\"iterations\":%d,\"queue_us_median\":%.3f,\"step_us_median\":%.3f,"
          "\"device_us_median\":%.3f}\n",
          how, round, iterations, q, s, d);
    }
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(device_meta));
  CHECK_CUDA(cudaFree(device_out));
  CHECK_CUDA(cudaFreeHost(host_meta));
  CHECK_CUDA(cudaFreeHost(host_out));
  return 0;
}
