#include "edbatch/options.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace edbatch {

namespace {
// `v` as a whole number (strtoull's form, no sign) of at most `max` into `*n`; false otherwise.
bool whole_number(const char* v, uint64_t max, uint64_t* n) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (*end != '\0' || errno != 0 || *v == '-' || x > max) return false;
  *n = x;
  return true;
}
}  // namespace

uint64_t interrupt_after_env() {
  const char* v = std::getenv("EDBATCH_INTERRUPT_AFTER");
  if (v == nullptr || *v == '\0') return 0;
  uint64_t n = 0;
  if (!whole_number(v, UINT64_MAX, &n) || n == 0)
    throw std::invalid_argument(std::string("EDBATCH_INTERRUPT_AFTER='") + v +
                                "': expected a positive number of mini-batches");
  return n;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* on : {"1", "true", "yes", "on"})
    if (s == on) return true;
  for (const char* off : {"0", "false", "no", "off"})
    if (s == off) return false;
  throw std::invalid_argument(std::string(name) + "='" + v +
                              "': expected 1, true, yes or on, or 0, false, no or off");
}

namespace {
[[noreturn]] void bad_value(const char* name, const std::string& value, const char* expected) {
  throw std::invalid_argument(std::string("[apply_debug_env] ") + name + "='" + value +
                              "': expected " + expected);
}

// The variable `name`, when set and not empty, as one of `choices` into `out`; anything else
// is refused, listing what is expected.
template <class T>
void choose(const char* name, std::initializer_list<std::pair<const char*, T>> choices,
            const char* expected, T& out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return;
  for (const auto& [value, choice] : choices)
    if (std::string(v) == value) {
      out = choice;
      return;
    }
  bad_value(name, v, expected);
}
}  // namespace

CudaOptions apply_debug_env(CudaOptions o) {
  using Chain = CudaOptions::Chain;
  using Waits = CudaOptions::StageWaits;
  choose<Chain>(
      "EDBATCH_CUDA_CHAIN",
      {{"0", Chain::None}, {"forward", Chain::Forward}, {"1", Chain::All}, {"all", Chain::All}},
      "0, forward, 1 or all", o.chain);
  choose<bool>("EDBATCH_CUDA_LINEAR", {{"cublas", false}, {"fused", true}}, "cublas or fused",
               o.fused_linear);
  choose<Waits>("EDBATCH_CUDA_STAGE_WAITS",
                {{"0", Waits::InOrder}, {"auto", Waits::Auto}, {"1", Waits::Always}},
                "0, auto or 1", o.stage_waits);
  if (const char* v = std::getenv("EDBATCH_CUDA_LINEAR_BLOCKS"); v != nullptr && *v != '\0') {
    uint64_t n = 0;
    if (!whole_number(v, UINT32_MAX, &n))
      bad_value("EDBATCH_CUDA_LINEAR_BLOCKS", v,
                "a whole number of thread blocks (0: the device's multiprocessors)");
    o.linear_min_blocks = static_cast<uint32_t>(n);
  }
  if (std::getenv("EDBATCH_CUDA_EPILOGUE")) o.gemm_epilogue = env_flag("EDBATCH_CUDA_EPILOGUE");
  if (std::getenv("EDBATCH_CUDA_RUNS")) o.pointwise_runs = env_flag("EDBATCH_CUDA_RUNS");
  if (std::getenv("EDBATCH_CUDA_PREPARE")) o.prepare_ahead = env_flag("EDBATCH_CUDA_PREPARE");
  if (std::getenv("EDBATCH_CUDA_SYNC")) o.sync_each_launch = env_flag("EDBATCH_CUDA_SYNC");
  if (std::getenv("EDBATCH_CUDA_PROFILE")) o.profile = env_flag("EDBATCH_CUDA_PROFILE");
  return o;
}

EngineOptions apply_debug_env(EngineOptions o) {
  o.cuda = apply_debug_env(o.cuda);
  const auto pass = [](const char* name, uint64_t& at) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      uint64_t n = 0;
      if (!whole_number(v, UINT64_MAX, &n))
        bad_value(name, v, "the number of the pass to fail (0: none)");
      at = n;
    }
  };
  pass("EDBATCH_FAIL_FORWARD", o.fail_forward_at);
  pass("EDBATCH_FAIL_BACKWARD", o.fail_backward_at);
  return o;
}

std::string default_policy_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg == '/') return std::string(xdg) + "/edbatch/policies";  // XDG: absolute only
  const char* home = std::getenv("HOME");
  if (home && *home == '/') return std::string(home) + "/.cache/edbatch/policies";
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
