// The command line and the user's files: an output that would replace an input is refused before
// any work; /dev/stdout redirected to a file is written where it stands; integers are decimal;
// flags that do nothing are said to; saved weights name a tag they have no class for; sentence
// pairs' vocabularies with blank lines and one shared by both sides; a file-size limit and a
// closed standard stream.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/cli_run.h"

namespace fs = std::filesystem;
namespace test = edbatch::test;

namespace {

using Result = test::CliResult;
using test::slurp;
using test::TempDir;
constexpr auto& cli = test::run_cli;

const std::string kSmall = "--hidden 6 --batch 8 --warmup 1 ";
const std::string kTrees = "(3 (2 a) (4 (2 b) (3 c)))\n(1 (1 d) (2 e))\n(2 (2 a) (3 e))\n";

}  // namespace

TEST_CASE("cli files: an output naming a file the command reads is refused, the file kept") {
  TempDir dir;
  const std::string data = dir / "data.txt";
  std::ofstream(data) << kTrees;
  fs::create_symlink(data, dir / "link.txt");
  const std::string run = "run --model tree_lstm " + kSmall + "--iters 1 --data '" + data + "' ";
  test::check_usage_errors(
      dir, run,
      {{"--write-data '" + data + "'", "--write-data and --data name one file, '" + data +
                                           "': writing --write-data would "
                                           "replace what --data reads"},
       {"--outputs '" + data + "'", "--outputs and --data name one file"},
       {"--json '" + dir / "link.txt" + "'", "--json and --data name one file"},  // a link to it
       {"--train --eval '" + dir / "link.txt" + "' --save-weights '" + data + "'",
        "--save-weights and --data name one file"}});
  CHECK(slurp(data) == kTrees);
  // A file whose name holds a comma is one file (for sentence pairs it would name two).
  const std::string comma = dir / "a,b.txt";
  std::ofstream(comma) << kTrees;
  test::check_usage_errors(dir, "run --model tree_lstm " + kSmall + "--data '" + comma + "' ",
                           {{"--outputs '" + comma + "'", "--outputs and --data name one file"}});
  CHECK(slurp(comma) == kTrees);
  test::check_usage_errors(
      dir, "train --model tree_lstm --hidden 6 --episodes 2 ",
      {{"--data '" + data + "' -o '" + data + "'", "--output and --data name one file"}});
  CHECK(slurp(data) == kTrees);

  // Weights loaded and saved to one file continue a training run; the weights are refused as
  // another output.
  const std::string weights = dir / "w.st";
  REQUIRE(cli(dir, run + "--train --save-weights '" + weights + "'").code == 0);
  const std::string saved = slurp(weights);
  const Result again =
      cli(dir, run + "--train --load-weights '" + weights + "' --save-weights '" + weights + "'");
  INFO(again.err);
  CHECK(again.code == 0);
  CHECK(slurp(weights) != saved);  // trained further
  const Result json = cli(dir, run + "--load-weights '" + weights + "' --json '" + weights + "'");
  CHECK(json.code == 2);
  CHECK(json.err.find("--json and --load-weights name one file") != std::string::npos);
}

TEST_CASE("cli files: /dev/stdout redirected to a file gets the file after the table") {
  TempDir dir;
  // run_cli sends standard output into a file: the JSON goes there after what was printed, and
  // the table printed after it stays (replacing the file would have dropped one or the other).
  const Result r = cli(
      dir, "run --model tree_lstm " + kSmall + "--no-blocks --data synthetic:9 --json /dev/stdout");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("instances/s") != std::string::npos);
  const size_t end = r.out.find("\n}\n");  // the JSON is written first, indented
  REQUIRE(r.out.rfind("{\n", 0) == 0);
  REQUIRE(end != std::string::npos);
  CHECK(nlohmann::json::parse(r.out.substr(0, end + 2))["data_instances"] == 9);
  CHECK(r.out.find("instances/s", end) != std::string::npos);
  // A descriptor that is not open is named before any work.
  const Result closed = cli(dir, "run --model tree_lstm --data synthetic:9 --json /dev/fd/57");
  CHECK(closed.code == 1);
  CHECK(closed.err.find("names file descriptor 57, which is not open") != std::string::npos);
}

TEST_CASE("cli files: integers are decimal, flags that do nothing say so") {
  TempDir dir;
  const std::string json = dir / "m.json";
  const Result r = cli(dir,
                       "run --model tree_lstm --hidden 010 --batch 08 --vocab-size 0100 "
                       "--warmup 0 --data synthetic:9 --json '" +
                           json + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  CHECK(j["hidden"] == 10);  // not octal 8
  CHECK(j["batch"] == 8);    // 08 is no octal number
  CHECK(j["vocab"] == 100);
  test::check_usage_errors(
      dir, "run --model tree_lstm --data synthetic:9 ",
      {{"--batch abc", "--batch: expected an integer (decimal digits), got 'abc'"},
       {"--hidden 0x10", "--hidden: expected an integer (decimal digits), got '0x10'"},
       {"--batch 1e3", "got '1e3'"},
       {"--write-data '" + dir / "d.txt" + "' --json '" + json + "'",
        "--write-data does its work and exits: --json would not be written"},
       {"--describe --save-weights '" + dir / "w.st" + "'", "--describe does its work and exits"}});
  const Result lr = cli(dir,
                        "run --model tree_lstm --hidden 6 --data synthetic:9 --lr 0.5 "
                        "--max-len 3");
  CHECK(lr.code == 0);
  CHECK(lr.err.find("warning: --lr has no effect without --train") != std::string::npos);
  CHECK(lr.err.find("warning: --max-len has no effect without --decode") != std::string::npos);
}

TEST_CASE("cli files: saved weights name a tag the data has and they have no class for") {
  TempDir dir;
  std::ofstream(dir / "train.txt") << "the|D film|N works|V\na|D dull|J plot|N\n";
  std::ofstream(dir / "test.txt") << "the|D film|N rocks|X\n";
  const std::string weights = dir / "w.st";
  const std::string tagger = "run --model bilstm_tagger --hidden 6 --iters 1 --warmup 0 --data '";
  REQUIRE(
      cli(dir, tagger + dir / "train.txt" + "' --train --save-weights '" + weights + "'").code ==
      0);
  const Result r = cli(dir, tagger + dir / "test.txt" + "' --load-weights '" + weights + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("has a class for each of 4 tags, and the data holds others (the first: 'X')") !=
        std::string::npos);
}

TEST_CASE("cli files: sentence pair vocabularies with blank lines, and one for both sides") {
  TempDir dir;
  std::ofstream(dir / "a.en") << "hello world\nworld\n";
  std::ofstream(dir / "a.vi") << "xin chao\nchao\n";
  std::ofstream(dir / "vocab.en") << "<unk>\n<s>\n</s>\nhello  \nworld\n\n\n";  // blanks at the end
  std::ofstream(dir / "vocab.vi") << "<unk>\n<s>\n</s>\nxin\nchao\n";
  const std::string nmt = "run --model lstm_nmt --hidden 4 --batch 2 --iters 1 --warmup 0 ";
  const std::string pair = "--data '" + dir / "a.en" + "," + dir / "a.vi" + "' ";
  const Result ok = cli(dir, nmt + pair + "--vocab-size 0 --json '" + dir / "m.json" + "'");
  INFO(ok.err);
  REQUIRE(ok.code == 0);
  CHECK(nlohmann::json::parse(slurp(dir / "m.json"))["vocab"] == 5);  // no row for the blanks
  std::ofstream(dir / "vocab.en") << "<unk>\n<s>\n</s>\nhello\n\nworld\n";
  const Result gap = cli(dir, nmt + pair);
  CHECK(gap.code == 1);
  CHECK(gap.err.find("vocab.en:5: a blank line before the word on line 6") != std::string::npos);
  // Two sides of one extension read one vocab.txt: said, not silent.
  std::ofstream(dir / "b.txt") << "hello world\n";
  std::ofstream(dir / "c.txt") << "hello\n";
  std::ofstream(dir / "vocab.txt") << "<unk>\n<s>\n</s>\nhello\nworld\n";
  const Result shared = cli(dir, nmt + "--data '" + dir / "b.txt" + "," + dir / "c.txt" + "'");
  CHECK(shared.code == 0);
  CHECK(shared.err.find("share one vocabulary, " + dir / "vocab.txt") != std::string::npos);
}

TEST_CASE("cli files: a missing --costs file costs edbatch train no work") {
  TempDir dir;
  const Result r = cli(dir, "train --model tree_lstm --hidden 6 -o '" + dir / "p.json" +
                                "' --costs '" + dir / "missing.json" + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("missing.json") != std::string::npos);
  CHECK(r.err.find("episode") == std::string::npos);
  CHECK_FALSE(fs::exists(dir / "p.json"));
}

#ifdef EDBATCH_CLI_PATH
namespace {
// `edbatch ARGS` under `ulimit LIMIT` in dir (its output in out.txt): its standard error, once it
// has exited with code 1.
std::string limited_run(const TempDir& dir, const std::string& limit, const std::string& args) {
  const std::string cmd = "cd '" + dir.path.string() + "' && ulimit " + limit + " && exec '" +
                          EDBATCH_CLI_PATH + "' " + args + " > out.txt 2> err.txt";
  const int status = std::system(("sh -c \"" + cmd + "\"").c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  return slurp(dir / "err.txt");
}
}  // namespace
#endif

TEST_CASE("cli files: a file-size limit fails the write that meets it, not the run") {
#ifdef EDBATCH_CLI_PATH
  // ulimit -f: SIGXFSZ ended the run without a word, a temporary file left and the other files
  // not written. The weights (249 KB) pass the limit, the JSON (2 KB) does not.
  TempDir dir;
  const std::string err =
      limited_run(dir, "-f 24",
                  "run --model tree_lstm --hidden 64 --iters 2 --save-weights w.st --json j.json");
  CHECK(err.find("edbatch run: --save-weights: ") != std::string::npos);
  CHECK(err.find("File too large") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "j.json"))["instances"] == 64);
  for (const auto& entry : fs::directory_iterator(dir.path))
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
#endif
}

TEST_CASE("cli files: out of memory names what could not grow") {
#if defined(EDBATCH_CLI_PATH) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // ulimit -v (the sanitizers need more address space than it leaves): the mini-batch's 977 MiB
  // of values cannot be had.
  TempDir dir;
  const std::string err = limited_run(
      dir, "-v 600000", "run --model tree_lstm --hidden 1024 --batch 512 --iters 1 --warmup 0");
  INFO(err);
  CHECK(err.find("edbatch run: [cpu] out of memory: a mini-batch's values, adjoints or scratch "
                 "could not grow from 0.0 to 976.7 MiB: try a smaller --batch") !=
        std::string::npos);
#endif
}

TEST_CASE("cli files: a standard stream closed at start is /dev/null, not the next file opened") {
#ifdef EDBATCH_CLI_PATH
  // With 2>&- the next file opened would be descriptor 2, and a message (Ctrl-C's) would land
  // inside it: /dev/null takes the place, so /dev/fd/2 is open, and written to nowhere.
  TempDir dir;
  const std::string cmd = std::string("'") + EDBATCH_CLI_PATH +
                          "' run --model tree_lstm --hidden 8 --iters 1 --json /dev/fd/2 > '" +
                          dir / "out.txt" + "' 2>&-";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(slurp(dir / "out.txt").find("instances/s") != std::string::npos);
#endif
}

TEST_CASE("cli files: a run stopped before its first measured mini-batch reports no times") {
#ifdef EDBATCH_CLI_PATH
  // SIGTERM (or SIGHUP: a terminal closed) while the data loads (600,000 synthetic trees):
  // warm-up runs whole, nothing is measured, the files are written, and the JSON holds nulls,
  // not medians of nothing as 0.
  for (const auto& [name, number] :
       std::vector<std::pair<std::string, int>>{{"TERM", 15}, {"HUP", 1}}) {
    CAPTURE(name);
    TempDir dir;
    // The run leaves a signal its parent ignored ignored (nohup), so under `nohup` the test's
    // own ignored SIGHUP would reach it: the child gets the default dispositions instead.
    struct sigaction previous[2], dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &dfl, &previous[0]);
    sigaction(SIGHUP, &dfl, &previous[1]);
    const std::string cmd =
        "cd '" + dir.path.string() + "' && ('" + EDBATCH_CLI_PATH +
        "' run --model tree_lstm --data synthetic:600000 --hidden 8 --batch 64 --train --iters 3 "
        "--json m.json > out.txt 2> err.txt & pid=$!; "
        // once its handlers are in place (SigCgt: SIGTERM's and SIGHUP's bits), as the run
        // begins: loading the data alone then takes a second or more
        "i=0; while [ $i -lt 3000 ]; do "
        "m=$(awk '/^SigCgt/{print $2}' /proc/$pid/status 2>/dev/null); "
        "[ -n \"$m\" ] && [ $(( 0x$m & 0x4001 )) -eq $(( 0x4001 )) ] && break; "
        "sleep 0.01; i=$((i+1)); done; kill -" +
        name + " $pid; wait $pid)";
    const int status = std::system(cmd.c_str());
    sigaction(SIGTERM, &previous[0], nullptr);
    sigaction(SIGHUP, &previous[1], nullptr);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 128 + number);
    const nlohmann::json j = nlohmann::json::parse(slurp(dir / "m.json"));
    CHECK(j["minibatches"] == 0);
    CHECK(j["interrupted"] == "SIG" + name);
    CHECK(j["ms_per_minibatch"].is_null());
    CHECK(j["instances_per_s"].is_null());
    CHECK(j["batches_over_lower_bound"].is_null());
    CHECK(slurp(dir / "out.txt").find("no mini-batch was measured") != std::string::npos);
  }
#endif
}
