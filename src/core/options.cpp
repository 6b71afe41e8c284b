#include "edbatch/options.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace edbatch {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

namespace {
[[noreturn]] void bad_value(const char* name, const std::string& value, const char* expected) {
  throw std::invalid_argument(std::string("[apply_debug_env] ") + name + "='" + value +
                              "': expected " + expected);
}
}  // namespace

CudaOptions apply_debug_env(CudaOptions o) {
  if (const char* v = std::getenv("EDBATCH_CUDA_CHAIN")) {
    const std::string s = v;
    if (s == "0") o.chain = CudaOptions::Chain::None;
    else if (s == "forward") o.chain = CudaOptions::Chain::Forward;
    else if (s == "1" || s == "all") o.chain = CudaOptions::Chain::All;
    else if (!s.empty()) bad_value("EDBATCH_CUDA_CHAIN", s, "0, forward, 1 or all");
  }
  if (const char* v = std::getenv("EDBATCH_CUDA_LINEAR")) {
    const std::string s = v;
    if (s == "cublas") o.fused_linear = false;
    else if (s == "fused") o.fused_linear = true;
    else if (!s.empty()) bad_value("EDBATCH_CUDA_LINEAR", s, "cublas or fused");
  }
  if (const char* v = std::getenv("EDBATCH_CUDA_STAGE_WAITS")) {
    const std::string s = v;
    if (s == "0")
      o.stage_waits = CudaOptions::StageWaits::InOrder;
    else if (s == "auto")
      o.stage_waits = CudaOptions::StageWaits::Auto;
    else if (s == "1")
      o.stage_waits = CudaOptions::StageWaits::Always;
    else if (!s.empty())
      bad_value("EDBATCH_CUDA_STAGE_WAITS", s, "0, auto or 1");
  }
  if (std::getenv("EDBATCH_CUDA_SYNC")) o.sync_each_launch = env_flag("EDBATCH_CUDA_SYNC");
  if (std::getenv("EDBATCH_CUDA_PROFILE")) o.profile = env_flag("EDBATCH_CUDA_PROFILE");
  return o;
}

std::string default_policy_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg == '/') return std::string(xdg) + "/edbatch/policies";  // XDG: absolute only
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/edbatch/policies";
  return {};
}

AdapterDebugOptions adapter_debug_env() {
  AdapterDebugOptions o;
  o.profile = env_flag("EDBATCH_TORCH_PROFILE");
  o.host_copy = env_flag("EDBATCH_TORCH_HOST_COPY");
  o.wait_each_call = env_flag("EDBATCH_TORCH_WAIT");
  return o;
}

}  // namespace edbatch
