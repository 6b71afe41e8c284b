// CudaOptions::profile: device time by kernel, host enqueue time and device span of every pass,
// each chained stage's time by what it runs, printed with the time spent growing buffers when
// the backend is destroyed (or at exit, without the growth, for a backend still alive then).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

namespace {

// What a launch is called in the profile.
const char* launch_name(const Pass& pass, const Launch& l) {
  if (l.stages > 0) return pass.forward ? "chained launch (forward)" : "chained launch (backward)";
  return pass.commands[l.begin].what;
}

// Enabled profilers not yet destroyed, printed at exit.
std::mutex& live_mutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::vector<const Profiler*>& live() {
  static auto* v = new std::vector<const Profiler*>;
  return *v;
}

}  // namespace

Profiler::Profiler(bool enabled) : enabled_(enabled) {
  if (!enabled) return;
  static const bool registered = [] {
    std::atexit([] {
      const std::lock_guard<std::mutex> lock(live_mutex());
      for (const Profiler* p : live()) p->print({});
    });
    return true;
  }();
  (void)registered;
  const std::lock_guard<std::mutex> lock(live_mutex());
  live().push_back(this);
}

Profiler::~Profiler() {
  if (enabled_) {
    const std::lock_guard<std::mutex> lock(live_mutex());
    live().erase(std::remove(live().begin(), live().end(), this), live().end());
  }
  for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
  if (times_ != nullptr) cudaFree(times_);
}

unsigned long long* Profiler::stage_times(size_t stages, cudaStream_t stream) {
  const size_t n = std::max<size_t>(2 * stages, 2);
  if (n > times_size_) {
    if (times_ != nullptr) EDBATCH_CUDA_CHECK(cudaFree(times_));
    times_ = nullptr;
    EDBATCH_CUDA_CHECK(cudaMalloc(&times_, n * sizeof(unsigned long long)));
    times_size_ = n;
  }
  EDBATCH_CUDA_CHECK(cudaMemsetAsync(times_, 0, n * sizeof(unsigned long long), stream));
  return times_;
}

void Profiler::reserve_events(size_t n) {
  while (events_.size() < n) {
    cudaEvent_t ev;
    EDBATCH_CUDA_CHECK(cudaEventCreate(&ev));
    events_.push_back(ev);
  }
}

void Profiler::add_pass(const Pass& pass, const LaunchPlan& plan, double host_ms, float device_ms) {
  const std::vector<Launch>& launches = plan.launches;
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
  // Each stage from its first thread block past its waits to its last one done, and the time
  // from the end of the stage before it (in launch order) to its start.
  const size_t n = plan.stages.size();
  if (n == 0) return;
  host_times_.resize(2 * n);
  EDBATCH_CUDA_CHECK(cudaMemcpy(host_times_.data(), times_, 2 * n * sizeof(unsigned long long),
                                cudaMemcpyDeviceToHost));
  const std::string dir = pass.forward ? "forward" : "backward";
  for (const Launch& l : launches)
    for (uint32_t s = l.stage_begin; s < l.stage_begin + l.stages; ++s) {
      const double start = static_cast<double>(~host_times_[2 * s]);
      const double end = static_cast<double>(host_times_[2 * s + 1]);
      const Command& c = pass.commands[plan.stage_command[s]];
      const bool dw = plan.stages[s].kind == Stage::LinearBackwardW;
      const bool fused = plan.stages[s].epilogue != kNoOperand;
      const char* of = dw                            ? ", dW stage"
                       : fused                       ? ", block call, with its elementwise steps"
                       : c.block_group == kNoOperand ? ", op batch"
                                                     : ", block call";
      Profile& p = profiles_["stage (" + dir + "): " + c.what + of];
      p.count += 1;
      p.ms += (end - start) * 1e-6;
      // The stage before it in launch order, passing over dW stages (no stage waits for them).
      uint32_t before = s;
      while (before-- > l.stage_begin && plan.stages[before].kind == Stage::LinearBackwardW)
        continue;
      if (dw || before < l.stage_begin || before == UINT32_MAX) continue;
      Profile& gap = profiles_["stage (" + dir + "): from the stage before"];
      gap.count += 1;
      gap.ms += (start - static_cast<double>(host_times_[2 * before + 1])) * 1e-6;
    }
}

void Profiler::print(const std::vector<std::pair<const char*, double>>& growth) const {
  for (const auto& [what, ms] : growth)
    std::fprintf(stderr, "[cuda] profile: growing %-26s %12.3f ms\n", what, ms);
  std::fprintf(stderr, "[cuda] profile: %-52s %9s %12s %10s\n", "kernel", "launches", "total ms",
               "mean us");
  for (const auto& [what, p] : profiles_)
    std::fprintf(stderr, "[cuda] profile: %-52s %9llu %12.3f %10.2f\n", what.c_str(),
                 static_cast<unsigned long long>(p.count), p.ms, 1e3 * p.ms / p.count);
}

}  // namespace edbatch::cuda
