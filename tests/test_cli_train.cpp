// `edbatch train` end to end: a tiny synthetic training run writes a policy file, a learning
// curve and a summary; `edbatch run --policy fsm:FILE` loads it (table hits in its JSON) and
// rejects it for another model; usage and file errors, found before training.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
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

const std::string kTiny =
    "--data synthetic:60 --batch 8 --hidden 8 --train-batches 4 --val-batches 2 --episodes 16 ";

}  // namespace

TEST_CASE("cli train: a policy file that edbatch run loads") {
  TempDir dir;
  const std::string policy = dir / "lattice.json", curve = dir / "curve.csv";
  const Result t = cli(dir, "train --model lattice_lstm " + kTiny + "--seed 4 -o '" + policy +
                                "' --curve '" + curve + "'");
  INFO(t.err);
  REQUIRE(t.code == 0);
  for (const char* word : {"fsm", "depth", "agenda", "lb-greedy", "lower bound"})
    CHECK(t.out.find(word) != std::string::npos);
  CHECK(t.err.find("validation") != std::string::npos);  // progress

  const nlohmann::json file = nlohmann::json::parse(slurp(policy));
  CHECK(file["format"] == "edbatch-fsm-policy");
  CHECK(file["version"] == 3);
  CHECK(file["model"] == "lattice_lstm");
  CHECK(file["hidden"] == 8);
  CHECK(file["encoding"] == "cover");
  CHECK(file["training"]["seed"] == 4);
  CHECK(file["types"].size() > 0);
  CHECK(file["table"].size() == file["entries"]);
  // The stored validation batches are no worse than any heuristic's on the same mini-batches.
  const nlohmann::json& v = file["validation"];
  for (const char* h : {"depth", "agenda", "lb-greedy"})
    CHECK(v["fsm_batches"].get<double>() <= v[h].get<double>());
  CHECK(v["fsm_batches"].get<double>() >= v["lower_bound"].get<double>());

  std::istringstream lines(slurp(curve));
  std::string header, row;
  std::getline(lines, header);
  CHECK(header == "episode,mean_batches,validation_batches,lower_bound,stage");
  int rows = 0;
  while (std::getline(lines, row)) {
    ++rows;
    const std::string stage = row.substr(row.rfind(',') + 1);
    CAPTURE(row);
    CHECK((stage == "lb-greedy" || stage == "scorer" || stage == "teacher" ||
           stage == "q-learning" || stage == "search"));
    if (rows == 1) CHECK(stage == "lb-greedy");
  }
  CHECK(rows > 0);

  // The same seed writes the same file.
  const std::string again = dir / "again.json";
  REQUIRE(cli(dir, "train --model lattice_lstm " + kTiny + "--seed 4 -o '" + again + "'").code ==
          0);
  CHECK(slurp(again) == slurp(policy));

  const std::string json = dir / "run.json";
  const Result r = cli(dir, "run --model lattice_lstm --device null --data synthetic:24 --batch 8 "
                            "--hidden 8 --policy 'fsm:" + policy + "' --json '" + json + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json m = nlohmann::json::parse(slurp(json));
  CHECK(m["policy"] == "fsm:" + policy);
  const uint64_t hits = m["policy_hits"], misses = m["policy_misses"];
  CHECK(hits + misses > 0);
  if (file["entries"].get<int>() > 0) CHECK(r.out.find("policy table hits") != std::string::npos);

  // Another model, or another hidden size (types carry shapes), is refused by name.
  const Result other = cli(dir, "run --model tree_lstm --device null --data synthetic:8 --batch 8 "
                                "--hidden 8 --policy 'fsm:" + policy + "'");
  CHECK(other.code == 1);
  CHECK(other.err.find("block:tree_lstm.leaf") != std::string::npos);
  const Result hidden = cli(dir, "run --model lattice_lstm --device null --data synthetic:8 "
                                 "--batch 8 --hidden 9 --policy 'fsm:" + policy + "'");
  CHECK(hidden.code == 1);
  CHECK(hidden.err.find("does not match") != std::string::npos);
  // Block types carry their shapes as other types do (models of blocks alone, tree_lstm's, have
  // no other type to tell the sizes apart).
  CHECK(hidden.err.find("block:lattice_lstm.char(9,9->") != std::string::npos);
}

TEST_CASE("cli train: usage and file errors") {
  TempDir dir;
  CHECK(cli(dir, "train --model lattice_lstm " + kTiny).code == 2);  // no -o
  CHECK(cli(dir, "train --model nope -o x.json").code == 2);
  CHECK(cli(dir, "train --model tree_lstm --encoding bits -o x.json").code == 2);
  CHECK(cli(dir, "train --model tree_lstm --data synthetic:0 -o x.json").code == 2);
  // Refused before any training: an empty output name, held-out data out of range.
  const Result empty = cli(dir, "train --model lattice_lstm " + kTiny + "-o ''");
  CHECK(empty.code == 2);
  CHECK(empty.err.find("--output was given an empty value") != std::string::npos);
  const Result eval =
      cli(dir, "train --model lattice_lstm " + kTiny + "--eval-data synthetic:0 -o x.json");
  CHECK(eval.code == 2);
  CHECK(eval.err.find("--eval-data: expected synthetic:N") != std::string::npos);
  const Result vocab = cli(dir, "train --model lstm_nmt --vocab-size 2 -o x.json");
  CHECK(vocab.code == 2);
  CHECK(vocab.err.find("--vocab-size 2 leaves lstm_nmt no word after") != std::string::npos);
  const Result help = cli(dir, "train --help");
  CHECK(help.code == 0);
  for (const char* flag : {"--model", "--data", "--batch", "--encoding", "--episodes", "--seed",
                           "--output", "--curve"})
    CHECK(help.out.find(flag) != std::string::npos);

  const std::string bad = dir / "bad.json";
  std::ofstream(bad) << "{\"format\": \"edbatch-fsm-policy\", \"version\": 1, \"mod";
  const Result r = cli(dir, "run --model tree_lstm --device null --data synthetic:8 --policy "
                            "'fsm:" + bad + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("corrupt or truncated") != std::string::npos);
  CHECK(cli(dir, "run --model tree_lstm --device null --policy fsm:").code == 2);
  CHECK(cli(dir, "run --model tree_lstm --device null --policy fastest").code == 2);
}

TEST_CASE("cli train: costs measured once, reused from the file, summed or along the chain") {
  TempDir dir;
  const std::string measured = dir / "cpu.json", chained = dir / "chain.json";
  const std::string tiny = "train --model lattice_lstm " + kTiny + "--no-table ";
  const Result m =
      cli(dir, tiny + "--device cpu --cost-graphs 2 --cost-reps 1 -o '" + measured + "'");
  INFO(m.err);
  REQUIRE(m.code == 0);
  CHECK(m.out.find("reward time on cpu, sum") != std::string::npos);
  const nlohmann::json costs = nlohmann::json::parse(slurp(measured))["costs"];
  CHECK(costs["combine"] == "sum");
  // The same costs from the file, combined along the critical chain: nothing is measured.
  const Result c =
      cli(dir, tiny + "--costs '" + measured + "' --combine chain -o '" + chained + "'");
  INFO(c.err);
  REQUIRE(c.code == 0);
  CHECK(c.out.find("reward time on cpu, chain") != std::string::npos);
  const nlohmann::json again = nlohmann::json::parse(slurp(chained))["costs"];
  CHECK(again["combine"] == "chain");
  CHECK(again["types"] == costs["types"]);
  CHECK(again["batch_us"] == costs.value("batch_us", 0.0));
  // --batch-us: auto keeps a file's cost per batch in series; a number replaces it, and the
  // predicted times the trainer minimises include it (at least 40 us for each of the 133 or
  // more batches of these validation mini-batches). Fixed costs rather than measured ones keep
  // these runs deterministic: measured costs may put lb-greedy within 1% of the bound, where the
  // trainer stops before its teacher runs.
  nlohmann::json fixed = nlohmann::json::parse(slurp(measured));
  for (auto& [name, cost] : fixed["costs"]["types"].items()) cost = {2.0, 0.5};
  const std::string fixed_file = dir / "fixed.json", fixed_chain = dir / "fixed_chain.json";
  std::ofstream(fixed_file) << fixed.dump();
  const Result fc =
      cli(dir, tiny + "--costs '" + fixed_file + "' --combine chain -o '" + fixed_chain + "'");
  INFO(fc.err);
  REQUIRE(fc.code == 0);
  const nlohmann::json light = nlohmann::json::parse(slurp(fixed_chain));
  REQUIRE(light["validation"]["teacher_us"].is_number());
  const std::string weighted = dir / "weighted.json";
  const Result w =
      cli(dir, tiny + "--costs '" + fixed_chain + "' --batch-us 40 -o '" + weighted + "'");
  INFO(w.err);
  REQUIRE(w.code == 0);
  CHECK(w.err.find("every batch in series     40.00 us") != std::string::npos);
  const nlohmann::json heavy = nlohmann::json::parse(slurp(weighted));
  CHECK(heavy["costs"]["batch_us"] == 40.0);
  REQUIRE(heavy["validation"]["teacher_us"].is_number());
  CHECK(heavy["validation"]["teacher_us"].get<double>() >
        light["validation"]["teacher_us"].get<double>());
  CHECK(heavy["validation"]["teacher_us"].get<double>() >=
        40 * heavy["validation"]["lower_bound"].get<double>());
  // Measured along the chain here, auto trains with the fit's cost per batch (at least a quarter
  // of a microsecond), twice and four times it, times each policy forward on the validation
  // mini-batches beside lb-greedy and keeps the fastest.
  const std::string floor = dir / "floor.json";
  const Result f = cli(
      dir, tiny + "--device cpu --combine chain --cost-graphs 2 --cost-reps 1 -o '" + floor + "'");
  INFO(f.err);
  REQUIRE(f.code == 0);
  auto check_kept_fastest = [](const nlohmann::json& policy, const std::vector<double>& tried) {
    const nlohmann::json& timed = policy["validation"]["measured_us"];
    REQUIRE(timed["batch_us"].size() == tried.size());
    CHECK(timed["lb-greedy"].get<double>() > 0);
    double fastest = 1e300, kept_us = -1;
    for (size_t k = 0; k < tried.size(); ++k) {
      const nlohmann::json& t = timed["batch_us"][k];
      CHECK(t["batch_us"].get<double>() == doctest::Approx(tried[k]));
      CHECK(t["us"].get<double>() > 0);
      if (t["us"].get<double>() < fastest) fastest = t["us"], kept_us = t["batch_us"];
    }
    CHECK(timed["fsm"].get<double>() == fastest);
    CHECK(policy["costs"]["batch_us"].get<double>() == kept_us);
  };
  const nlohmann::json floored = nlohmann::json::parse(slurp(floor));
  const double fit = floored["validation"]["measured_us"]["batch_us"][0]["batch_us"];
  CHECK(fit >= 0.25);
  check_kept_fastest(floored, {fit, 2 * fit, 4 * fit});
  CHECK(f.out.find("timed on cpu, validation") != std::string::npos);
  CHECK(f.out.find("  kept\n") != std::string::npos);
  // A list of values: a policy each, the fastest kept; they can only be timed on a device.
  const Result l = cli(dir, tiny +
                                "--device cpu --combine chain --cost-graphs 2 --cost-reps 1 "
                                "--batch-us 0,3 -o '" +
                                floor + "'");
  INFO(l.err);
  REQUIRE(l.code == 0);
  check_kept_fastest(nlohmann::json::parse(slurp(floor)), {0, 3});
  const Result untimed = cli(dir, tiny + "--costs '" + chained + "' --batch-us 0,3 -o x.json");
  CHECK(untimed.code == 2);
  CHECK(untimed.err.find("several values keep the policy that runs fastest") != std::string::npos);
  // One value from a file's costs: nothing is timed.
  CHECK_FALSE(heavy["validation"].contains("measured_us"));
  for (const char* wrong : {"-1", "x", "nan", "inf", "1,", ",1", "1,,2", "0.25,-1", ""})
    CHECK(cli(dir, tiny + "--costs '" + chained + "' --batch-us '" + wrong + "' -o x.json").code ==
          2);
  const Result summed = cli(dir, tiny + "--costs '" + measured + "' --batch-us 1 -o x.json");
  CHECK(summed.code == 2);
  CHECK(summed.err.find("--batch-us 1: the costs add up batch by batch (sum)") !=
        std::string::npos);
  CHECK(cli(dir, tiny + "--batch-us 1 -o x.json").code == 2);
  // Usage: costs from a file and measured ones; --combine without costs; a file without costs.
  CHECK(cli(dir, tiny + "--costs '" + measured + "' --device cpu -o x.json").code == 2);
  CHECK(cli(dir, tiny + "--combine chain -o x.json").code == 2);
  CHECK(c.err.find("warning") == std::string::npos);  // every type has its cost
  // Costs of another model: the run goes on, warning of the types that take the mean cost (the
  // sum of a mini-batch's losses is a type of every model).
  const std::string tree =
      "train --model tree_lstm " + kTiny + "--no-table -o '" + dir / "tree.json" + "' --costs ";
  const Result other = cli(dir, tree + "'" + measured + "'");
  INFO(other.err);
  REQUIRE(other.code == 0);
  CHECK(other.err.find("warning: --costs: 2 of the 3 types of tree_lstm (hidden 8) have no cost "
                       "in '" +
                       measured +
                       "' and take the mean of its costs: "
                       "block:tree_lstm.inner(8,8,8,8->22), block:tree_lstm.leaf(->22)\n") !=
        std::string::npos);
  nlohmann::json renamed = nlohmann::json::parse(slurp(measured));
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [name, cost] : renamed["costs"]["types"].items()) types["x" + name] = cost;
  renamed["costs"]["types"] = types;
  std::ofstream(dir / "renamed.json") << renamed.dump();
  const Result unmatched = cli(dir, tree + "'" + dir / "renamed.json" + "'");
  REQUIRE(unmatched.code == 0);
  CHECK(unmatched.err.find("warning: --costs: no type of tree_lstm (hidden 8) has a cost in '" +
                           dir / "renamed.json" +
                           "' (costs of another model, hidden size or mini-batch size?): all "
                           "3 take the mean of its costs") != std::string::npos);
  // Summed costs without a cost per batch rank every schedule the same: warned of.
  nlohmann::json flat = nlohmann::json::parse(slurp(measured));
  for (auto& [name, cost] : flat["costs"]["types"].items()) cost[0] = 0.0;
  std::ofstream(dir / "flat.json") << flat.dump();
  const Result same =
      cli(dir, tiny + "--costs '" + dir / "flat.json" + "' -o '" + dir / "same.json" + "'");
  REQUIRE(same.code == 0);
  CHECK(same.err.find("warning: the costs give no type a cost per batch, so every schedule of a "
                      "mini-batch costs the same") != std::string::npos);
  const std::string plain = dir / "plain.json";
  REQUIRE(cli(dir, tiny + "-o '" + plain + "'").code == 0);
  const Result none = cli(dir, tiny + "--costs '" + plain + "' -o x.json");
  CHECK(none.code == 2);
  CHECK(none.err.find("has no costs") != std::string::npos);
}

TEST_CASE("cli train: outputs and --eval-data are checked before training, numbers in range") {
  TempDir dir;
  const std::string tiny = "train --model tree_lstm " + kTiny;
  const std::string policy = dir / "p.json";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"-o '" + dir / "nodir/p.json" + "'", "--output: cannot write '" + dir / "nodir/p.json"},
           {"-o '" + policy + "' --curve '" + dir / "nodir/c.csv" + "'",
            "--curve: cannot write '" + dir / "nodir/c.csv"},
           {"-o '" + dir.path.string() + "'",
            "--output: cannot write '" + dir.path.string() + "': it is a directory"}}) {
    CAPTURE(args);
    const Result r = cli(dir, tiny + args);
    CHECK(r.code == 1);
    CHECK(r.err.find(message) != std::string::npos);
    CHECK(r.err.find("episode") == std::string::npos);  // no training
  }
  std::ofstream(dir / "bad.txt") << "(2 (2 a) (2 b)\n";
  const Result bad = cli(dir, tiny + "-o '" + policy + "' --eval-data '" + dir / "bad.txt" + "'");
  CHECK(bad.code == 1);
  CHECK(bad.err.find("bad.txt:1:") != std::string::npos);
  CHECK(bad.err.find("episode") == std::string::npos);
  CHECK_FALSE(fs::exists(policy));

  // --eval-data naming the file --data trains on: said, and not labelled held out.
  {
    std::ofstream trees(dir / "trees.txt");
    for (int i = 0; i < 24; ++i)
      trees << "(" << i % 5 << " (2 w" << i << ") (" << (i + 1) % 5 << " (1 a) (3 w" << i % 7
            << ")))\n";
  }
  fs::create_symlink(dir / "trees.txt", dir / "same.txt");
  const Result same =
      cli(dir,
          "train --model tree_lstm --batch 4 --hidden 8 --train-batches 4 --val-batches 2 "
          "--episodes 16 --data '" +
              dir / "trees.txt" + "' --eval-data '" + dir / "same.txt" + "' -o '" +
              dir / "same.json" + "'");
  CHECK(same.code == 0);
  CHECK(same.err.find("--eval-data and --data name one file") != std::string::npos);
  CHECK(same.out.find("the file trained on)") != std::string::npos);
  CHECK(same.out.find("not trained on") == std::string::npos);

  // Data of one instance trains and validates on it, and says so.
  std::ofstream(dir / "one.txt") << "(3 (2 a) (4 (1 b) (2 c)))\n";
  const Result one = cli(dir,
                         "train --model tree_lstm --batch 4 --hidden 8 --train-batches 2 "
                         "--val-batches 1 --episodes 4 --data '" +
                             dir / "one.txt" + "' -o '" + dir / "one.json" + "'");
  CHECK(one.code == 0);
  CHECK(one.err.find("--data holds one instance, which serves both training and validation") !=
        std::string::npos);

  // A policy file that cannot be written (/dev/full passes the checks) keeps the curve.
  const Result full = cli(dir, tiny + "-o /dev/full --curve '" + dir / "c.csv" + "'");
  CHECK(full.code == 1);
  CHECK(full.err.find("edbatch train: --output: ") != std::string::npos);
  CHECK(full.err.find("not written: --output") != std::string::npos);
  CHECK(full.out.find("NOT written to /dev/full") != std::string::npos);
  CHECK(slurp(dir / "c.csv").rfind("episode,mean_batches,", 0) == 0);

  test::check_usage_errors(
      dir, tiny,
      {{"--alpha nan", "--alpha: expected a number in [0, 1], got 'nan'"},
       {"--epsilon-start nan", "--epsilon-start: expected a number in [0, 1], got 'nan'"},
       {"--epsilon-end 1.5", "--epsilon-end: expected a number in [0, 1], got '1.5'"},
       {"--time-budget nan", "--time-budget: expected a number in [0, 1000000000]"},
       {"--time-budget inf", "--time-budget: expected a number in [0, 1000000000]"},
       {"--seed -1", "--seed: expected an integer in 0..18446744073709551615, got '-1'"}},
      " -o '" + policy + "'");
  CHECK_FALSE(fs::exists(policy));
}
