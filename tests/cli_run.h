// Running the `edbatch` command line from tests: a scratch directory per case, the exit code and
// both output streams of one run, and whole-file reads.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace edbatch::test {

// The whole file as a string ("" when it cannot be read).
std::string slurp(const std::filesystem::path& p);

// The JSON lines of a file (`--outputs`, benchmark output), empty lines skipped.
std::vector<nlohmann::json> json_lines(const std::string& path);

// A fresh directory under the system temp directory, removed with everything in it at the end.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "edbatch_test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct CliResult {
  int code = -1;  // exit code; 128 + the signal for a process ended by one, as shells report
  std::string out, err;
};

// Runs `edbatch <args>` (args are passed to the shell as written) with its stdout and stderr
// captured in files of `dir`.
CliResult run_cli(const TempDir& dir, const std::string& args);

// Each case, `edbatch <before><arguments><after>`, is a usage error: exit code 2 and the case's
// message (a part of it) on stderr.
void check_usage_errors(const TempDir& dir, const std::string& before,
                        const std::vector<std::pair<std::string, std::string>>& cases,
                        const std::string& after = "");

}  // namespace edbatch::test
