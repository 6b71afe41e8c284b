#include "tools/edbatch/interrupt.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include "edbatch/options.h"

namespace edbatch::cli {
namespace {

// Lock-free, so safe in a handler, and seen by every thread (the signal may land on any).
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
// SIGHUP: the terminal closed (an ssh session dropped), which would otherwise lose the run.
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kCount = sizeof kSignals / sizeof kSignals[0];
struct sigaction g_previous[kCount];
bool g_installed[kCount] = {};  // whether the handler took each of kSignals

void on_signal(int sig) {
  if (g_signal.load() != 0) {
    // The second: stop at once, as without a handler.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_signal.store(sig);
  // Only async-signal-safe calls here: write(2) of a constant text.
  static const char kText[] =
      "\nedbatch: interrupted: finishing the current step, then writing the files due at the "
      "end (interrupt again to stop at once)\n";
  const ssize_t ignored = write(STDERR_FILENO, kText, sizeof kText - 1);
  (void)ignored;
}

}  // namespace

InterruptScope::InterruptScope() {
  g_signal.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress go on
  for (int i = 0; i < kCount; ++i) {
    sigaction(kSignals[i], nullptr, &g_previous[i]);
    // A signal the parent ignores (SIGINT in a background job of a non-interactive shell)
    // stays ignored.
    g_installed[i] = g_previous[i].sa_handler != SIG_IGN;
    if (g_installed[i]) sigaction(kSignals[i], &sa, nullptr);
  }
}

InterruptScope::~InterruptScope() {
  for (int i = 0; i < kCount; ++i) {
    sigaction(kSignals[i], &g_previous[i], nullptr);
    g_installed[i] = false;
  }
}

int interrupt_signal() {
  return g_signal.load();
}

const char* interrupt_name() {
  const int sig = g_signal.load();
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "";
}

int interrupt_exit_code() {
  return 128 + g_signal.load();
}

void interrupt_after(uint64_t minibatches_run) {
  static const uint64_t after = interrupt_after_env();
  if (after == 0 || minibatches_run != after) return;
  if (g_installed[0])
    kill(getpid(), SIGINT);  // through the handler, as a Ctrl-C
  else
    on_signal(SIGINT);  // SIGINT ignored (a background job): the same request, by hand
}

}  // namespace edbatch::cli
