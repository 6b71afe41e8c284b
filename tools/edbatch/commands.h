// The subcommands of `edbatch`. Each registers its options on the root app and returns what to
// run when it was the one given. The flags and checks they share are in flags.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

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
// std::runtime_error naming `option` when `path` is a directory or its folder is missing, not a
// folder or not writable.
void check_output_file(const std::string& option, const std::string& path);
// Warns on stderr when --threads asks for more threads than the CPU cores the process may use.
void warn_threads(const std::string& command, uint32_t threads);

// `edbatch run`: runs a model of the zoo (tools/edbatch/run.cpp).
Command add_run_command(CLI::App& root);
// `edbatch train`: learns an FSM batching policy file (tools/edbatch/train.cpp).
Command add_train_command(CLI::App& root);

}  // namespace edbatch::cli
