// The subcommands of `edbatch`. Each registers its options on the root app and returns what to
// run when it was the one given. The flags and checks they share are in flags.cpp, the output
// files' in outputs.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace edbatch::cli {

// A usage error found after parsing (a bad combination of flags): exit code 2.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // the exit code
};

// Checks `option` (--data, --eval, --eval-data) for `model`: a file name, or synthetic:N with N
// in 1..10^8, load_dataset's range (random DAGs only come synthetic). Throws UsageError.
void check_data_flag(const std::string& model, const std::string& data,
                     const std::string& option = "--data");

// --vocab-size for `model`: lstm_nmt folds ids into [3, vocab), so it needs 4 or more (or 0 where
// it is allowed). Throws UsageError.
void check_vocab_size(const std::string& model, uint32_t vocab);

// Options both subcommands take: --model (required, one of the zoo's), --vocab-size, --batch.
void add_model_option(CLI::App* app, std::string& model);
// With `no_folding`, --vocab-size 0 is allowed (no folding).
void add_size_options(CLI::App* app, uint32_t& vocab, uint32_t& batch, bool no_folding = false);

// The validators of numeric flags, refusing in words that name the flag and the value.
// A number above `low` (at least `low` when `inclusive`) and finite as a float: CLI11's
// PositiveNumber and NonNegativeNumber print the largest double in full.
CLI::Validator number_from(double low, bool inclusive);
// A number in [low, high]; NaN is refused (CLI::Range lets it through: it compares false).
CLI::Validator number_in(double low, double high);
// A seed: decimal digits, at most 2^64 - 1 (CLI11 alone wraps -1 and saturates larger values);
// a transform (Option::transform) that drops leading zeros, which CLI11 would read as octal.
CLI::Validator seed_number();

// Output files are checked before any work, so that a typo does not cost a whole run: throws
// std::runtime_error naming `option` when `path` is a directory, its name is too long, or the
// folder of the file it names (through symbolic links) is missing, not a folder or not writable.
void check_output_file(const std::string& option, const std::string& path);

// The files a command writes when its work is done. add() checks each before any work
// (check_output_file; an empty path: the option was not given), and refuses one file named by two
// options, which would keep only the last. read() names a file the command reads: an output that
// is the same file (by any name) is refused, but for the output option `may_replace`
// (--load-weights w.st --save-weights w.st continues a training run). write() writes one; a
// failure is reported on stderr and the files after it are still written, so that a failed
// --outputs keeps the weights; finish() then throws naming the failed ones.
class OutputFiles {
 public:
  explicit OutputFiles(std::string command) : command_(std::move(command)) {}  // "run", "train"
  void add(const std::string& option, const std::string& path);
  void read(const std::string& option, const std::string& path,
            const std::string& may_replace = "");
  // A data spec's files: the file it names, or the two of SRC,TGT (synthetic:N: none).
  void read_data(const std::string& option, const std::string& spec);
  // Writes one option's file; a failure is printed and remembered (finish() names it), and a
  // later write of the same option that succeeds (--save-best at a later epoch) clears it.
  void write(const std::string& option, const std::function<void()>& write_file);
  void finish() const;
  bool written(const std::string& option) const;  // false while its last write() failed

 private:
  struct Input {
    std::string option, path, may_replace;
  };
  void check_inputs() const;
  std::string command_;
  std::vector<std::pair<std::string, std::string>> files_;  // option, the file it writes
  std::vector<Input> inputs_;
  std::vector<std::string> failed_, written_;
};

// Warns on stderr for each of `flags` given to `app` when it does not apply (`without`: why, e.g.
// "without --train").
void warn_unused(const CLI::App& app, const std::vector<std::string>& flags, bool applies,
                 const std::string& without);
// Refuses (UsageError) output options given (a non-empty path) with `flag`, which exits before
// the files would be written (--write-data, --describe).
void refuse_outputs_after(const std::string& flag,
                          const std::vector<std::pair<std::string, std::string>>& outputs);
// Makes every integer option of `app` decimal: CLI11 reads 010 as 8 and 0x10 as 16; leading
// zeros are dropped and anything but digits (with a sign) is refused naming the value, as is a
// negative count. An option given twice takes its last value.
void decimal_integers(CLI::App& app);
// The message for a count too large for its option (CLI11's own says "Could not convert").
std::string conversion_message(const CLI::App& app, const CLI::ConversionError& e);

// Refuses (UsageError) an option given an empty value, which a shell variable left unset
// gives (--save-weights "$OUT"): the command would run as if the option were not given.
void refuse_empty_values(const CLI::App& app);
// Warns on stderr when --threads asks for more threads than the CPU cores the process may use.
void warn_threads(const std::string& command, uint32_t threads);

// `edbatch run`: runs a model of the zoo (tools/edbatch/run.cpp).
Command add_run_command(CLI::App& root);
// `edbatch train`: learns an FSM batching policy file (tools/edbatch/train.cpp).
Command add_train_command(CLI::App& root);

}  // namespace edbatch::cli
