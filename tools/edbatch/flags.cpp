// Flags and checks both subcommands share (tools/edbatch/commands.h).
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "edbatch/files.h"
#include "edbatch/models.h"
#include "tools/edbatch/commands.h"

namespace edbatch::cli {

namespace {

// A bound as people write it: "1000000", not "1e+06".
std::string bound_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return CLI::detail::to_string(v);
}

}  // namespace

void check_data_flag(const std::string& model, const std::string& data, const std::string& option) {
  const std::string prefix = "synthetic:";
  if (data.rfind(prefix, 0) == 0) {
    const std::string n = data.substr(prefix.size());
    if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(n) == 0 || std::stoul(n) > kMaxSyntheticInstances)
      throw UsageError(option + ": expected synthetic:N with N in 1..10^8, got '" + data + "'");
  } else if (data.empty()) {
    throw UsageError(option + ": empty; expected a file name or synthetic:N");
  } else if (model_data_kind(model) == DataKind::Dags) {
    throw UsageError(option + ": " + model + " reads random DAGs, which only come as synthetic:N");
  }
}

void check_vocab_size(const std::string& model, uint32_t vocab) {
  if (model_data_kind(model) == DataKind::Pairs && vocab > 0 && vocab < 4)
    throw UsageError("--vocab-size " + std::to_string(vocab) + " leaves " + model +
                     " no word after <unk>, <s> and </s> (4 or more, or 0)");
}

CLI::Validator number_from(double low, bool inclusive) {
  const std::string bound = (inclusive ? ">= " : "> ") + bound_text(low);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(static_cast<float>(v)) ||
            (inclusive ? v < low : v <= low))
          return "expected a finite number " + bound + ", got '" + text + "'";
        return "";
      },
      "NUMBER " + bound);
}

CLI::Validator number_in(double low, double high) {
  const std::string range = "[" + bound_text(low) + ", " + bound_text(high) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        // Written so that NaN, which compares false with everything, fails.
        if (!CLI::detail::lexical_cast(text, v) || !(v >= low && v <= high))
          return "expected a number in " + range + ", got '" + text + "'";
        return "";
      },
      "NUMBER in " + range);
}

CLI::Validator seed_number() {
  const std::string max = std::to_string(UINT64_MAX);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        // Decimal digits only: CLI11 alone would wrap "-1" and saturate what overflows.
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        const std::string trimmed =
            digits ? text.substr(std::min(text.find_first_not_of('0'), text.size() - 1)) : text;
        if (!digits || trimmed.size() > max.size() ||
            (trimmed.size() == max.size() && trimmed > max))
          return "expected an integer in 0.." + max + ", got '" + text + "'";
        text = trimmed;  // no leading zeros: CLI11 would read them as octal
        return "";
      },
      "");
}

void add_model_option(CLI::App* app, std::string& model) {
  std::string models;
  for (const std::string& m : model_names()) models += (models.empty() ? "" : ", ") + m;
  app->add_option("--model", model, "the model: " + models)
      ->required()
      ->check(CLI::IsMember(model_names()));
}

void add_size_options(CLI::App* app, uint32_t& vocab, uint32_t& batch, bool no_folding) {
  app->add_option("--vocab-size", vocab,
                  no_folding ? "embedding rows; file word ids fold modulo this (0: no folding, "
                               "a row per id the data holds: the full vocabulary of a file)"
                             : "embedding rows; file word ids fold modulo this")
      ->capture_default_str()
      ->check(CLI::Range(no_folding ? 0u : 1u, kMaxVocabulary));
  app->add_option("--batch", batch, "instances per mini-batch")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
}

void check_output_file(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error(option + ": cannot write '" + path + "': " + why);
  };
  const fs::path target(write_target(path));  // a symbolic link is written through
  if (target.filename().string().size() > 255) fail("its file name is longer than 255 bytes");
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  const auto absent = [&] {  // the file or (below) a folder above it not there: named below
    return ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory;
  };
  if (ec && !absent()) fail(ec.message());
  if (fs::is_directory(st)) fail("it is a directory");
  // A device or a pipe is written directly (write_file_atomically), not through its folder.
  if (fs::exists(st) && !fs::is_regular_file(st)) return;
  const fs::path dir = target.has_parent_path() ? target.parent_path() : ".";
  const fs::file_status d = fs::status(dir, ec);
  if (ec && !absent()) fail("the folder '" + dir.string() + "': " + ec.message());
  if (!fs::exists(d)) fail("the folder '" + dir.string() + "' does not exist");
  if (!fs::is_directory(d)) fail("'" + dir.string() + "' is not a folder");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail("the folder '" + dir.string() + "' is not writable (" + std::strerror(errno) + ")");
}

void OutputFiles::add(const std::string& option, const std::string& path) {
  if (path.empty()) return;
  check_output_file(option, path);
  namespace fs = std::filesystem;
  const std::string file = fs::absolute(write_target(path)).lexically_normal().string();
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) return;  // /dev/null, /dev/stdout, a pipe
  for (const auto& [other, f] : files_)
    if (f == file)
      throw UsageError(option + " and " + other + " name one file, '" + path +
                       "': the second written would replace the first");
  files_.emplace_back(option, file);
}

void OutputFiles::write(const std::string& option, const std::function<void()>& write_file) {
  try {
    write_file();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edbatch %s: %s: %s\n", command_.c_str(), option.c_str(), e.what());
    failed_.push_back(option);
  }
}

void OutputFiles::finish() const {
  if (failed_.empty()) return;
  std::string names;
  for (const std::string& o : failed_) names += (names.empty() ? "" : ", ") + o;
  throw std::runtime_error("not written: " + names + " (above); the other files were");
}

void refuse_empty_values(const CLI::App& app) {
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0 || opt->get_items_expected_min() == 0) continue;  // flags
    for (const std::string& v : opt->results())
      if (v.empty())
        throw UsageError(opt->get_name() +
                         " was given an empty value (is a shell variable in it unset?)");
  }
}

void warn_threads(const std::string& command, uint32_t threads) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const unsigned cores = sched_getaffinity(0, sizeof set, &set) == 0
                             ? static_cast<unsigned>(CPU_COUNT(&set))
                             : std::thread::hardware_concurrency();
  if (cores == 0 || threads <= cores) return;
  std::fprintf(stderr,
               "edbatch %s: warning: --threads %u is more than the %u CPU core(s) this process "
               "may use: at most %u run at once, and the others wait for a core\n",
               command.c_str(), threads, cores, cores);
}

}  // namespace edbatch::cli
