// `edbatch run` end to end: exit codes and messages for good runs, bad flags and bad files; the
// metrics JSON; --outputs; --describe; a save/load weights round trip; --decode's repeated steps.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli_run.h"

namespace fs = std::filesystem;
namespace test = edbatch::test;

namespace {

using Result = test::CliResult;
using test::json_lines;
using test::slurp;
using test::TempDir;
constexpr auto& cli = test::run_cli;

const std::string kSmall = "--no-blocks --hidden 6 --batch 8 --warmup 1 ";

}  // namespace

TEST_CASE("cli: a forward run writes sane metrics and one output line per instance") {
  TempDir dir;
  const Result r = cli(dir, "run --model tree_lstm " + kSmall + "--data synthetic:37 --json '" +
                                dir / "m.json" + "' --outputs '" + dir / "o.jsonl" + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());  // no progress bar when stderr is not a terminal
  CHECK(r.out.find("instances/s") != std::string::npos);
  CHECK(r.out.find("construction") != std::string::npos);
  CHECK(r.out.find("lower bound") != std::string::npos);

  const nlohmann::json m = nlohmann::json::parse(slurp(dir / "m.json"));
  CHECK(m["model"] == "tree_lstm");
  CHECK(m["blocks"] == false);
  CHECK(m["train"] == false);
  CHECK(m["minibatches"] == 5);  // ceil(37 / 8), one epoch
  CHECK(m["instances"] == 37);
  CHECK(m["warmup_minibatches"] == 1);
  CHECK(m["instances_per_s"].get<double>() > 0);
  for (const char* key : {"ms_per_minibatch", "construction_ms", "scheduling_ms", "execution_ms",
                          "batches_per_minibatch", "lower_bound_per_minibatch",
                          "nodes_per_minibatch", "bytes_copied_per_minibatch"}) {
    CAPTURE(key);
    const nlohmann::json& s = m[key];
    REQUIRE(s.is_object());
    CHECK(s["p10"].get<double>() <= s["median"].get<double>());
    CHECK(s["median"].get<double>() <= s["p90"].get<double>());
  }
  CHECK(m["ms_per_minibatch"]["median"].get<double>() > 0);
  CHECK(m["batches_per_minibatch"]["median"].get<double>() >=
        m["lower_bound_per_minibatch"]["median"].get<double>());
  CHECK(m["batches_over_lower_bound"].get<double>() >= 1.0);
  CHECK(m["peak_rss_bytes"].get<double>() > 0);
  CHECK(m["mean_loss_per_instance"].get<double>() > 0);
  CHECK_FALSE(m.contains("device_forward_ms"));  // CUDA only

  const std::vector<nlohmann::json> lines = json_lines(dir / "o.jsonl");
  REQUIRE(lines.size() == 37);
  for (size_t i = 0; i < lines.size(); ++i) {
    CHECK(lines[i]["instance"] == i);
    CHECK(std::isfinite(lines[i]["loss"].get<double>()));
    CHECK(lines[i]["predicted"].size() == lines[i]["labels"].size());
    CHECK(lines[i]["labels"].size() > 0);
  }
}

TEST_CASE("cli: --decode repeats a decoding step's plan, with the tokens of planning each step") {
  TempDir dir;
  std::vector<nlohmann::json> runs;
  for (const char* cache : {"64", "0"}) {
    const std::string tag = cache;
    const Result r = cli(dir,
                         "run --model lstm_nmt --data synthetic:12 --decode --hidden 6 "
                         "--batch 6 --warmup 0 --plan-cache " +
                             tag + " --json '" + dir / ("m" + tag + ".json") + "' --outputs '" +
                             dir / ("o" + tag + ".jsonl") + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    const nlohmann::json m = nlohmann::json::parse(slurp(dir / ("m" + tag + ".json")));
    runs.push_back(m);
    CHECK((r.out.find("increments repeated") != std::string::npos) == (tag != "0"));
  }
  CHECK(runs[0]["increments_repeated"].get<uint64_t>() > 0);
  CHECK(runs[1]["increments_repeated"].get<uint64_t>() == 0);
  const std::vector<nlohmann::json> a = json_lines(dir / "o64.jsonl"),
                                    b = json_lines(dir / "o0.jsonl");
  REQUIRE(a.size() == 12);
  REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i]["tokens"] == b[i]["tokens"]);
    CHECK(a[i]["score"] == b[i]["score"]);
  }
}

TEST_CASE("cli: every model runs, with training, iterations, threads and the null device") {
  TempDir dir;
  for (const char* model : {"tree_gru", "double_typed_tree_lstm", "mvrnn", "lattice_lstm",
                            "lattice_gru", "bilstm_tagger", "random_dag"}) {
    CAPTURE(model);
    const Result r = cli(dir, std::string("run --model ") + model + " " + kSmall +
                                  "--data synthetic:9 --train --iters 2 --threads 2");
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find("backward") != std::string::npos);
  }
  // On 2 threads the tree batches' backward splits by invocation range; on 1 it never does.
  for (const char* threads : {"1", "2"}) {
    CAPTURE(threads);
    const std::string json = dir / "split.json";
    const Result r = cli(dir, std::string("run --model tree_lstm --hidden 6 --batch 8 ") +
                                  "--warmup 1 --data synthetic:9 --train --iters 2 --threads " +
                                  threads + " --json '" + json + "'");
    REQUIRE(r.code == 0);
    const double split =
        nlohmann::json::parse(slurp(json))["split_backward_batches_per_minibatch"]["median"]
            .get<double>();
    CHECK((threads[0] == '2' ? split > 0 : split == 0));
  }
  // Training by epochs reports each epoch's loss; with --iters it does not.
  const Result epochs = cli(dir, "run --model tree_lstm " + kSmall +
                                     "--data synthetic:20 --train " + "--epochs 2 --lr 0.5");
  REQUIRE(epochs.code == 0);
  const size_t e1 = epochs.out.find("epoch 1/2  mean loss per instance ");
  const size_t e2 = epochs.out.find("epoch 2/2  mean loss per instance ");
  REQUIRE(e1 != std::string::npos);
  REQUIRE(e2 != std::string::npos);
  const double loss1 = std::stod(epochs.out.substr(e1 + 34)),
               loss2 = std::stod(epochs.out.substr(e2 + 34));
  CHECK(std::isfinite(loss1));
  CHECK(loss2 < loss1);  // 20 trees, lr 0.5: the second pass fits better
  // --pipeline reads each loss one mini-batch later: the same losses, forward and training.
  for (const char* train : {"", "--train "}) {
    CAPTURE(train);
    const std::string args = "run --model lattice_gru " + kSmall + "--data synthetic:17 --epochs 2 " +
                             train + "--json '" + dir / "p.json" + "'";
    const Result first = cli(dir, args);
    REQUIRE(first.code == 0);
    const nlohmann::json plain = nlohmann::json::parse(slurp(dir / "p.json"));
    const Result piped = cli(dir, args + " --pipeline");
    INFO(piped.err);
    REQUIRE(piped.code == 0);
    const nlohmann::json m = nlohmann::json::parse(slurp(dir / "p.json"));
    CHECK(m["pipeline"] == true);
    CHECK(plain["pipeline"] == false);
    // The JSON's per-epoch records: as many as epochs when training, and with equal epochs
    // their mean is the run's mean loss per instance.
    REQUIRE(plain["epochs"].size() == (*train ? 2u : 0u));
    if (*train) {
      const double a = plain["epochs"][0]["mean_loss_per_instance"].get<double>(),
                   b = plain["epochs"][1]["mean_loss_per_instance"].get<double>();
      CHECK(plain["epochs"][1]["epoch"] == 2);
      CHECK((a + b) / 2 ==
            doctest::Approx(plain["mean_loss_per_instance"].get<double>()).epsilon(1e-6));
      char line[64];
      std::snprintf(line, sizeof line, "epoch 1/2  mean loss per instance %.4f\n", a);
      CHECK(first.out.find(line) != std::string::npos);
    }
    CHECK(m["mean_loss_per_instance"].get<double>() ==
          doctest::Approx(plain["mean_loss_per_instance"].get<double>()).epsilon(1e-6));
    // Training by epochs prints the same per-epoch losses.
    auto epoch_lines = [](const std::string& out) {
      std::string lines;
      for (size_t at = out.find("epoch "); at != std::string::npos; at = out.find("epoch ", at + 1))
        lines += out.substr(at, out.find('\n', at) - at) + "\n";
      return lines;
    };
    CHECK(epoch_lines(piped.out) == epoch_lines(first.out));
    if (*train) CHECK(epoch_lines(piped.out).find("epoch 2/2") != std::string::npos);
  }
  const Result chars =
      cli(dir, "run --model bilstm_tagger --char " + kSmall + "--data synthetic:9 --iters 1");
  CHECK(chars.code == 0);
  const Result null = cli(dir, "run --model lattice_lstm --device null --policy agenda " + kSmall +
                                   "--data synthetic:9 --json '" + dir / "n.json" + "'");
  INFO(null.err);
  REQUIRE(null.code == 0);
  const nlohmann::json m = nlohmann::json::parse(slurp(dir / "n.json"));
  CHECK(m["device"] == "null");
  CHECK(m["policy"] == "agenda");
  CHECK(m["mean_loss_per_instance"].is_null());
}

TEST_CASE("cli: usage errors exit 2, runtime errors exit 1, both with a clean message") {
  TempDir dir;
  const std::string base = "run --model tree_lstm " + kSmall + "--data synthetic:4 ";
  for (const std::string& args :
       {std::string("run"), std::string("run --model nope"), base + "--batch 0",
        base + "--policy fastest", base + "--device tpu", base + "--hidden -3",
        base + "--frobnicate", base + "--data synthetic:x", base + "--data synthetic:0",
        base + "--char", std::string("run --model random_dag --data dags.txt"), std::string("")}) {
    CAPTURE(args);
    const Result r = cli(dir, args);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("edbatch", 0) == 0);
  }
  const Result unknown = cli(dir, base + "--frobnicate");
  CHECK(unknown.err.rfind("edbatch run: ", 0) == 0);

  // A missing file, a malformed file (the message names file:line:col), mismatched weights.
  const Result missing =
      cli(dir, "run --model tree_lstm --no-blocks --data '" + dir / "absent.txt" + "'");
  CHECK(missing.code == 1);
  CHECK(missing.err.rfind("edbatch run: ", 0) == 0);
  CHECK(missing.err.find("absent.txt") != std::string::npos);
  std::ofstream(dir / "bad.txt") << "(3 (2 a) (4 b))\n(3 (2 a)\n";
  const Result bad = cli(dir, "run --model tree_lstm --no-blocks --data '" + dir / "bad.txt" + "'");
  CHECK(bad.code == 1);
  CHECK(bad.err.rfind("edbatch run: ", 0) == 0);
  CHECK(bad.err.find("bad.txt:2:") != std::string::npos);
  CHECK(bad.err.find('\n') == bad.err.size() - 1);  // one line, no crash dump
  const Result weights = cli(dir, base + "--load-weights '" + dir / "bad.txt" + "'");
  CHECK(weights.code == 1);
  CHECK(weights.err.rfind("edbatch run: ", 0) == 0);
}

TEST_CASE("cli: --help and --describe") {
  TempDir dir;
  const Result help = cli(dir, "run --help");
  CHECK(help.code == 0);
  for (const char* flag :
       {"--model",        "--data",         "--vocab-size", "--batch", "--hidden",  "--policy",
        "--device",       "--threads",      "--epochs",     "--iters", "--warmup",  "--no-blocks",
        "--seed",         "--train",        "--lr",         "--char",  "--outputs", "--json",
        "--save-weights", "--load-weights", "--describe"}) {
    CAPTURE(flag);
    CHECK(help.out.find(flag) != std::string::npos);
  }
  CHECK(help.out.find("lb-greedy") != std::string::npos);
  const Result d = cli(dir, "run --model lattice_lstm --hidden 9 --describe --data synthetic:2");
  CHECK(d.code == 0);
  for (const char* text : {"char.E", "word.U_f", "h0", "c0", "W_out", "9 x 9", "sigmoid"})
    CHECK(d.out.find(text) != std::string::npos);
}

TEST_CASE("cli: weights saved after training load back to the same losses") {
  TempDir dir;
  const std::string w = dir / "w.safetensors";
  const std::string common = "run --model tree_gru " + kSmall + "--data synthetic:12 ";
  const Result train = cli(dir, common + "--train --iters 3 --lr 0.5 --save-weights '" + w +
                                    "' --outputs '" + dir / "a.jsonl" + "'");
  INFO(train.err);
  REQUIRE(train.code == 0);
  const Result load = cli(
      dir, common + "--load-weights '" + w + "' --policy none --outputs '" + dir / "b.jsonl" + "'");
  INFO(load.err);
  REQUIRE(load.code == 0);
  const Result fresh = cli(dir, common + "--outputs '" + dir / "c.jsonl" + "'");
  REQUIRE(fresh.code == 0);
  const auto a = json_lines(dir / "a.jsonl"), b = json_lines(dir / "b.jsonl"),
             c = json_lines(dir / "c.jsonl");
  REQUIRE(a.size() == 12);
  REQUIRE(b.size() == 12);
  REQUIRE(c.size() == 12);
  double changed = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double la = a[i]["loss"].get<double>(), lb = b[i]["loss"].get<double>();
    CHECK(std::fabs(la - lb) <= 1e-5 * std::max(1.0, std::fabs(la)));
    CHECK(a[i]["predicted"] == b[i]["predicted"]);
    changed += std::fabs(la - c[i]["loss"].get<double>());
  }
  CHECK(changed > 1e-3);  // training moved the weights
  // Weights of another model do not load.
  const Result other =
      cli(dir, "run --model tree_lstm " + kSmall + "--data synthetic:4 --load-weights '" + w + "'");
  CHECK(other.code == 1);
}
