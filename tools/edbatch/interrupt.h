// Ctrl-C (SIGINT), SIGTERM and SIGHUP during `edbatch run` and `edbatch train`: the first asks the
// command to stop where it can (after the current mini-batch; the trainer keeps its best
// candidate so far) and write its files as at a normal end; a second ends the process at once.
#pragma once
#include <cstdint>

namespace edbatch::cli {

// Handlers installed for its lifetime; the ones before are restored after it.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// The signal that asked to stop (SIGINT, SIGTERM or SIGHUP), 0 while none has.
int interrupt_signal();
// "SIGINT", "SIGTERM" or "SIGHUP" for interrupt_signal(); "" while none.
const char* interrupt_name();
// The exit status of a process ended by that signal, as shells report it: 128 + the signal.
int interrupt_exit_code();

// EDBATCH_INTERRUPT_AFTER=N (scripts and tests that try interrupts and resuming): the process
// sends itself SIGINT once N measured mini-batches have run. Reads the variable at the first
// call (interrupt_after_env, which throws for a value that is not a positive integer).
void interrupt_after(uint64_t minibatches_run);

}  // namespace edbatch::cli
