// Flags and checks both subcommands share (tools/edbatch/commands.h).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
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
      "", "seed");
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

void warn_unused(const CLI::App& app, const std::vector<std::string>& flags, bool applies,
                 const std::string& without) {
  if (applies) return;
  for (const std::string& f : flags)
    if (app.count(f) > 0)
      std::fprintf(stderr, "edbatch %s: warning: %s has no effect %s\n", app.get_name().c_str(),
                   f.c_str(), without.c_str());
}

void refuse_outputs_after(const std::string& flag,
                          const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::string given;
  for (const auto& [option, path] : outputs)
    if (!path.empty()) given += (given.empty() ? "" : ", ") + option;
  if (!given.empty())
    throw UsageError(flag + " does its work and exits: " + given +
                     " would not be written (run them separately)");
}

void decimal_integers(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    // A flag given twice takes its last value, as with most programs: a wrapper script may pass
    // defaults that the caller's own flags then override.
    if (opt->get_expected_max() <= 1) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    const std::string type = opt->get_type_name();
    const bool is_unsigned = type.rfind("UINT", 0) == 0;
    if (!is_unsigned && type.rfind("INT", 0) != 0) continue;
    try {
      opt->get_validator("seed");  // a seed checks its own digits and 64-bit range
      continue;
    } catch (const CLI::OptionNotFound&) {
    }
    opt->transform(CLI::Validator(
        [is_unsigned](std::string& text) -> std::string {
          if (text.empty()) return "";  // refuse_empty_values names it
          const size_t sign = text[0] == '-' || text[0] == '+' ? 1 : 0;
          if (text.size() == sign ||
              text.find_first_not_of("0123456789", sign) != std::string::npos)
            return "expected an integer (decimal digits), got '" + text + "'";
          // CLI11 would read a leading 0 as octal (010 as 8) and 0x as hexadecimal.
          const size_t digit = text.find_first_not_of('0', sign);
          if (is_unsigned && text[0] == '-' && digit != std::string::npos)
            return "a count cannot be negative, got '" + text + "'";
          text = text.substr(0, sign) + (digit == std::string::npos ? "0" : text.substr(digit));
          return "";
        },
        ""));
  }
}

std::string conversion_message(const CLI::App& app, const CLI::ConversionError& e) {
  // CLI11's "Could not convert: --iters = 5000000000": a count past its 32 bits (the seeds,
  // 64-bit, have their own check).
  const std::string text = e.what(), lead = "Could not convert: ", between = " = ";
  const size_t at = text.find(between);
  if (text.rfind(lead, 0) != 0 || at == std::string::npos) return text;
  const std::string name = text.substr(lead.size(), at - lead.size());
  // Given more than once, the values are joined with commas; the last one is taken.
  std::string value = text.substr(at + between.size());
  value = value.substr(value.rfind(',') == std::string::npos ? 0 : value.rfind(',') + 1);
  for (const CLI::App* sub : app.get_subcommands({}))
    for (const CLI::Option* opt : sub->get_options())
      if (opt->check_name(name) && opt->get_type_name().rfind("UINT", 0) == 0)
        return name + ": expected an integer in 0.." + std::to_string(UINT32_MAX) + ", got '" +
               value + "'";
  return text;
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
  std::fprintf(
      stderr,
      "edbatch %s: warning: --threads %u is more than the %u CPU core(s) this process "
      "may use: its work is cut into %u parts (results as with %u threads anywhere), run by %u "
      "thread(s)\n",
      command.c_str(), threads, cores, threads, threads, cores);
}

}  // namespace edbatch::cli
