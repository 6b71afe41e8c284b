#include "tests/cli_run.h"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace edbatch::test {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TempDir::TempDir(const std::string& prefix) {
  static int counter = 0;
  path = std::filesystem::temp_directory_path() /
         (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

CliResult run_cli(const TempDir& dir, const std::string& args) {
#ifdef EDBATCH_CLI_PATH
  const std::string out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd =
      std::string("'") + EDBATCH_CLI_PATH + "' " + args + " > '" + out + "' 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  // The shell reports a child ended by a signal as 128 + the signal, or is itself ended by it.
  r.code = WIFEXITED(status)     ? WEXITSTATUS(status)
           : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                 : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
#else
  (void)dir;
  (void)args;
  return CliResult{-1, "", "the tests were built without the edbatch command line"};
#endif
}

void check_usage_errors(const TempDir& dir, const std::string& before,
                        const std::vector<std::pair<std::string, std::string>>& cases,
                        const std::string& after) {
  for (const auto& [args, message] : cases) {
    CAPTURE(args);
    const CliResult r = run_cli(dir, before + args + after);
    CHECK(r.code == 2);
    CHECK(r.err.find(message) != std::string::npos);
  }
}

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace edbatch::test
