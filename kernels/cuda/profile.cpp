// CudaOptions::profile: device time by kernel, host enqueue time and device span of every pass,
// printed with the time spent growing buffers when the backend is destroyed.
#include <cstdio>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

namespace {

// What a launch is called in the profile.
const char* launch_name(const Pass& pass, const Launch& l) {
  if (l.stages > 0) return pass.forward ? "chained launch (forward)" : "chained launch (backward)";
  return pass.commands[l.begin].what;
}

}  // namespace

Profiler::~Profiler() {
  for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
}

void Profiler::reserve_events(size_t n) {
  while (events_.size() < n) {
    cudaEvent_t ev;
    EDBATCH_CUDA_CHECK(cudaEventCreate(&ev));
    events_.push_back(ev);
  }
}

void Profiler::add_pass(const Pass& pass, const std::vector<Launch>& launches, double host_ms,
                        float device_ms) {
  for (size_t i = 0; i < launches.size(); ++i) {
    float ms = 0;
    EDBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    Profile& p = profiles_[launch_name(pass, launches[i])];
    p.count += 1;
    p.ms += ms;
  }
  Profile& total = profiles_[pass.forward ? "(forward passes: host enqueue)"
                                          : "(backward passes: host enqueue)"];
  total.count += 1;
  total.ms += host_ms;
  Profile& span = profiles_[pass.forward ? "(forward passes: device span)"
                                         : "(backward passes: device span)"];
  span.count += 1;
  span.ms += device_ms;
}

void Profiler::print(const std::vector<std::pair<const char*, double>>& growth) const {
  for (const auto& [what, ms] : growth)
    std::fprintf(stderr, "[cuda] profile: growing %-26s %12.3f ms\n", what, ms);
  std::fprintf(stderr, "[cuda] profile: %-34s %9s %12s %10s\n", "kernel", "launches", "total ms",
               "mean us");
  for (const auto& [what, p] : profiles_)
    std::fprintf(stderr, "[cuda] profile: %-34s %9llu %12.3f %10.2f\n", what.c_str(),
                 static_cast<unsigned long long>(p.count), p.ms, 1e3 * p.ms / p.count);
}

}  // namespace edbatch::cuda
