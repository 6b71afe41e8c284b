// `edbatch run` end to end: exit codes and messages for good runs, bad flags and bad files; the
// metrics JSON; --outputs; --describe; a save/load weights round trip; --decode's repeated steps;
// losses that are not finite; --vocab-size 0; input and output paths checked before any work.
#include <doctest/doctest.h>
#include <sched.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "edbatch/safetensors.h"
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
                             dir / ("o" + tag + ".jsonl") + "'" +
                             // Held-out pairs are measured, not written among the outputs.
                             (tag == "0" ? " --eval synthetic:5" : ""));
    INFO(r.err);
    REQUIRE(r.code == 0);
    const nlohmann::json m = nlohmann::json::parse(slurp(dir / ("m" + tag + ".json")));
    runs.push_back(m);
    CHECK((r.out.find("increments repeated") != std::string::npos) == (tag != "0"));
    CHECK(m["decode"] == true);  // told apart from a forward run's metrics
    CHECK(m["max_len"] == 100);
    CHECK(r.out.find("greedy decoding") != std::string::npos);
  }
  CHECK(runs[0]["increments_repeated"].get<uint64_t>() > 0);
  CHECK(runs[0]["increments_replanned"].get<uint64_t>() <=
        runs[0]["increments_repeated"].get<uint64_t>());
  CHECK(runs[1]["increments_repeated"].get<uint64_t>() == 0);
  CHECK(runs[1]["increments_replanned"].get<uint64_t>() == 0);
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
    CHECK(plain["decode"] == false);
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

TEST_CASE("cli: a run on the CPU never maps cuBLAS") {
  // Mapping libcublas and libcublasLt took seconds and about 150 MB at every start, --help's
  // too; the CUDA backend opens them when it first runs. The dynamic loader's trace of a CPU run
  // lists what the process loaded (TBB, always; cuBLAS, never).
#ifdef EDBATCH_CLI_PATH
  TempDir dir;
  const std::string cmd = "LD_DEBUG=libs LD_DEBUG_OUTPUT='" + (dir / "ld") + "' '" +
                          EDBATCH_CLI_PATH + "' run --model tree_lstm " + kSmall +
                          "--data synthetic:8 --iters 2 --train > /dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::string trace;
  for (const auto& entry : fs::directory_iterator(dir.path))
    if (entry.path().filename().string().rfind("ld.", 0) == 0) trace += slurp(entry.path());
  CHECK(trace.find("libtbb") != std::string::npos);
  CHECK(trace.find("libcublas") == std::string::npos);
#endif
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

TEST_CASE("cli: saved weights keep the data's word and tag ids for files read later") {
  // The same instances in another order, and among other ones, get the same losses and labels:
  // words and tags take the ids they had in training, not their order in the file read now.
  TempDir dir;
  struct Kind {
    const char* model;
    std::vector<std::string> lines;  // the training file; read later: 2, 0 and a new one
    std::string unseen;
  };
  const std::vector<Kind> kinds = {{"tree_lstm",
                                    {"(3 (2 good) (4 (2 film) (3 indeed)))",
                                     "(1 (2 a) (0 (1 dull) (2 plot)))", "(2 (2 the) (2 film))"},
                                    "(4 (2 brand) (3 new))"},
                                   {"bilstm_tagger",
                                    {"the|D film|N works|V", "a|D dull|J plot|N", "films|N work|V"},
                                    "new|J words|N"}};
  for (const Kind& k : kinds) {
    CAPTURE(k.model);
    const std::string a = dir / "a.txt", b = dir / "b.txt", w = dir / "w.st";
    std::ofstream(a) << k.lines[0] << "\n" << k.lines[1] << "\n" << k.lines[2] << "\n";
    std::ofstream(b) << k.lines[2] << "\n" << k.unseen << "\n" << k.lines[0] << "\n";
    const std::string run = std::string("run --model ") + k.model + " " + kSmall;
    REQUIRE(
        cli(dir, run + "--data '" + a + "' --train --iters 3 --lr 0.5 --save-weights '" + w + "'")
            .code == 0);
    for (const std::string& data : {a, b})
      REQUIRE(cli(dir, run + "--data '" + data + "' --load-weights '" + w + "' --outputs '" + data +
                           ".jsonl'")
                  .code == 0);
    const auto in_a = json_lines(a + ".jsonl"), in_b = json_lines(b + ".jsonl");
    REQUIRE(in_a.size() == 3);
    REQUIRE(in_b.size() == 3);
    // The losses within float rounding: an instance's values may differ in the last bits with
    // its place in the mini-batch (its neighbours here are others).
    for (const auto& [i, j] : {std::pair{2, 0}, std::pair{0, 2}}) {
      CHECK(in_b[j]["loss"].get<double>() ==
            doctest::Approx(in_a[i]["loss"].get<double>()).epsilon(1e-6));
      CHECK(in_b[j]["predicted"] == in_a[i]["predicted"]);
    }
  }
  // --vocab-size 0: a row per word the weights know; data with other words is refused.
  const std::string a = dir / "trees.txt", w = dir / "w0.st";
  std::ofstream(a) << kinds[0].lines[0] << "\n" << kinds[0].lines[1] << "\n";
  const std::string run = "run --model tree_lstm " + kSmall + "--vocab-size 0 ";
  REQUIRE(cli(dir, run + "--data '" + a + "' --save-weights '" + w + "'").code == 0);
  std::ofstream(dir / "part.txt") << "(1 (2 dull) (2 film))\n";  // known words, fewer rows
  CHECK(cli(dir, run + "--data '" + dir / "part.txt" + "' --load-weights '" + w + "'").code == 0);
  // The first new word is named, whatever the order of the map that holds them.
  std::ofstream(dir / "new.txt") << "(2 (2 film) (1 (2 zany) (2 quirky)))\n"
                                 << kinds[0].unseen << "\n";
  const Result unseen =
      cli(dir, run + "--data '" + dir / "new.txt" + "' --load-weights '" + w + "'");
  CHECK(unseen.code == 1);
  CHECK(unseen.err.find("the data holds others (the first: 'zany')") != std::string::npos);
}

TEST_CASE("cli: a last update that leaves the weights not finite stops the run unsaved") {
  // The loss is checked before each update: the weights after the last one are checked at the
  // end, so infinite weights are neither saved nor reported as a good run.
  TempDir dir;
  const std::string w = dir / "w.st", json = dir / "m.json", best = dir / "b.st";
  const Result r = cli(dir,
                       "run --model tree_lstm --hidden 6 --batch 8 --data synthetic:16 --eval "
                       "synthetic:4 --train --iters 1 --warmup 0 --lr 3e38 --weight-decay 1e38 "
                       "--clip 0 --save-weights '" +
                           w + "' --save-best '" + best + "' --json '" + json + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("epoch 1, mini-batch 1 of 2: after its update, parameter '") !=
        std::string::npos);
  CHECK(r.err.find("training stopped and nothing is saved") != std::string::npos);
  CHECK_FALSE(fs::exists(w));
  CHECK_FALSE(fs::exists(json));
  CHECK_FALSE(fs::exists(best));
}

TEST_CASE("cli: a forward run whose loss is not finite fails, naming where") {
  TempDir dir;
  const std::string common =
      "run --model tree_lstm --no-blocks --hidden 6 --batch 8 --data "
      "synthetic:12 ";
  const std::string w = dir / "w.st", nan = dir / "nan.st";
  REQUIRE(cli(dir, common + "--iters 1 --save-weights '" + w + "'").code == 0);
  std::vector<edbatch::NamedTensor> tensors = edbatch::read_safetensors(w);
  for (edbatch::NamedTensor& t : tensors)
    if (t.name == "W_out") t.data[0] = std::nanf("");
  edbatch::write_safetensors(nan, tensors);
  const std::string json = dir / "m.json", out = dir / "o.jsonl";
  for (const std::string& extra :
       {std::string(""), std::string("--warmup 0 "), std::string("--pipeline --warmup 0 "),
        std::string("--iters 1 --warmup 0 ")}) {
    CAPTURE(extra);
    const Result r = cli(dir, common + extra + "--load-weights '" + nan + "' --json '" + json +
                                  "' --outputs '" + out + "' --eval synthetic:4");
    CHECK(r.code == 1);
    CHECK(r.err.find("mini-batch 1") != std::string::npos);
    CHECK(r.err.find("the loss is nan, not finite") != std::string::npos);
    CHECK(r.err.find("--check-numerics") != std::string::npos);
    CHECK(r.out.find("instances/s") == std::string::npos);  // no table of a failed run
    CHECK_FALSE(fs::exists(json));
    CHECK_FALSE(fs::exists(out));
  }
  // --check-numerics names the first non-finite value and its mini-batch.
  const Result checked = cli(dir, common + "--load-weights '" + nan + "' --check-numerics");
  CHECK(checked.code == 1);
  CHECK(checked.err.find("mini-batch 1") != std::string::npos);
  // The null device computes no loss: null, as before.
  const Result null =
      cli(dir, common + "--device null --load-weights '" + nan + "' --json '" + json + "'");
  REQUIRE(null.code == 0);
  CHECK(nlohmann::json::parse(slurp(json))["mean_loss_per_instance"].is_null());

  // Held-out data that overflows where the training data does not: the evaluation fails.
  std::string deep = "(2 a)";
  for (int i = 0; i < 3000; ++i) deep = "(2 " + deep + " (2 b))";
  std::ofstream(dir / "deep.txt") << deep << "\n";
  std::ofstream(dir / "flat.txt") << "(2 (2 a) (2 b))\n";
  const std::string mvrnn = "run --model mvrnn --hidden 8 --warmup 0 --data '" + dir / "flat.txt" +
                            "' --eval '" + dir / "deep.txt" + "'";
  const Result eval = cli(dir, mvrnn);
  CHECK(eval.code == 1);
  CHECK(eval.err.find("--eval: held-out instance 0 of '" + dir / "deep.txt" + "': the loss is ") !=
        std::string::npos);
  CHECK(eval.err.find("not finite") != std::string::npos);
  // While training, the run goes on and warns.
  const Result trained = cli(dir, mvrnn + " --train --epochs 1");
  CHECK(trained.code == 0);
  CHECK(trained.err.find("warning: --eval: held-out instance 0 of '" + dir / "deep.txt" +
                         "': the loss is ") != std::string::npos);
  // --outputs covers instances the measured mini-batches did not: the deep tree, second.
  std::ofstream(dir / "both.txt") << "(2 (2 a) (2 b))\n" << deep << "\n";
  const Result outputs = cli(dir,
                             "run --model mvrnn --hidden 8 --warmup 0 --batch 1 --iters 1 "
                             "--data '" +
                                 dir / "both.txt" + "' --outputs '" + out + "'");
  CHECK(outputs.code == 1);
  CHECK(outputs.err.find("edbatch run: --outputs: instance 1: the loss is ") != std::string::npos);
  CHECK(outputs.err.find("--outputs: --outputs") == std::string::npos);  // named once
  CHECK_FALSE(fs::exists(out));
  // Run alone it fails in the mini-batch.
  const Result alone =
      cli(dir, "run --model mvrnn --hidden 8 --warmup 0 --data '" + dir / "deep.txt" + "'");
  CHECK(alone.code == 1);
  CHECK(alone.err.find("epoch 1, mini-batch 1 of 1: the loss is ") != std::string::npos);
}

// A pass that fails inside the engine (EDBATCH_FAIL_FORWARD=N or EDBATCH_FAIL_BACKWARD=N: the
// engine's Nth forward or backward pass throws, as a device error or a failed launch would) names
// the mini-batch it failed in, training or not, in the warm-up or after it, and the run writes no
// file and no table.
TEST_CASE("cli: a pass that fails inside the engine names its mini-batch and writes nothing") {
  TempDir dir;
  const std::string w = dir / "w.st", json = dir / "m.json";
  const std::string common =
      "run --model tree_lstm --hidden 6 --batch 8 --data synthetic:40 "
      "--save-weights '" +
      w + "' --json '" + json + "' ";
  struct Case {
    const char *variable, *pass;
    std::string args;
    const char* where;
  };
  for (const Case& c : std::vector<Case>{
           {"EDBATCH_FAIL_FORWARD", "3", "--train --warmup 0", "epoch 1, mini-batch 3 of 5: "},
           {"EDBATCH_FAIL_FORWARD", "7", "--train --warmup 1 --epochs 2",
            "epoch 2, mini-batch 1 of 5: "},
           {"EDBATCH_FAIL_FORWARD", "2", "--warmup 3", "warm-up mini-batch 2: "},
           {"EDBATCH_FAIL_FORWARD", "4", "--no-blocks --warmup 1 --iters 5", "mini-batch 3 of 5: "},
           {"EDBATCH_FAIL_BACKWARD", "2", "--train --warmup 0", "epoch 1, mini-batch 2 of 5: "}}) {
    CAPTURE(c.variable);
    CAPTURE(c.args);
    ::setenv(c.variable, c.pass, 1);
    const Result r = cli(dir, common + c.args);
    ::unsetenv(c.variable);
    CHECK(r.code == 1);
    const std::string pass = c.variable == std::string("EDBATCH_FAIL_FORWARD")
                                 ? "[Engine::forward] forward pass "
                                 : "[Engine::backward] backward pass ";
    CHECK(r.err.find(c.where + pass + c.pass + " failed: injected") != std::string::npos);
    CHECK(r.out.find("instances/s") == std::string::npos);
    CHECK_FALSE(fs::exists(w));
    CHECK_FALSE(fs::exists(json));
  }
  // The same runs without it write their files.
  REQUIRE(cli(dir, common + "--train --warmup 0").code == 0);
  CHECK(fs::exists(w));
  CHECK(fs::exists(json));
}

TEST_CASE("cli: --vocab-size 0 reads ids unfolded, sentence pairs included, within the limit") {
  TempDir dir;
  std::string vocab = "<unk>\n<s>\n</s>\n";
  for (int i = 3; i < 300; ++i) vocab += "w" + std::to_string(i) + "\n";
  std::ofstream(dir / "vocab.en") << vocab;
  std::ofstream(dir / "vocab.vi") << vocab;
  std::ofstream(dir / "s.en") << "w3 w299 w7\nw5 w6\n";
  std::ofstream(dir / "s.vi") << "w4 w250\nw8\n";
  const std::string json = dir / "m.json";
  const Result nmt = cli(dir,
                         "run --model lstm_nmt --hidden 4 --batch 2 --warmup 0 --vocab-size 0 "
                         "--data '" +
                             dir / "s.en" + "," + dir / "s.vi" + "' --json '" + json + "'");
  INFO(nmt.err);
  REQUIRE(nmt.code == 0);
  CHECK(nlohmann::json::parse(slurp(json))["vocab"] == 300);  // w299 unfolded
  // An id whose row count would wrap 32 bits, and one whose table would take gigabytes.
  for (const std::string id : {"4294967295", "100000000"}) {
    CAPTURE(id);
    std::ofstream(dir / "lat.txt") << "1\n2\n0 0\n0\n1 0 " << id << "\n";
    const Result r = cli(
        dir, "run --model lattice_lstm --hidden 4 --vocab-size 0 --data '" + dir / "lat.txt" + "'");
    CHECK(r.code == 1);
    CHECK(r.err.find("--vocab-size 0: ") != std::string::npos);
    CHECK(r.err.find("word id " + id) != std::string::npos);
    CHECK(r.err.find("16777216") != std::string::npos);
    CHECK(r.err.find("fold the ids with --vocab-size N") != std::string::npos);
  }
}

TEST_CASE("cli: a directory given as an input file is named as one") {
  TempDir dir;
  const std::string folder = dir / "folder";
  fs::create_directories(folder);
  const std::string base = "run --model tree_lstm " + kSmall + "--data synthetic:8 ";
  for (const std::string& args :
       {base + "--load-weights '" + folder + "'", base + "--policy 'fsm:" + folder + "'",
        "run --model tree_lstm --data '" + folder + "'", base + "--eval '" + folder + "'",
        base + "--train --load-optimizer '" + folder + "'",
        "run --model lstm_nmt --data '" + folder + "," + folder + "'",
        "train --model tree_lstm -o '" + dir / "p.json" + "' --data '" + folder + "'"}) {
    CAPTURE(args);
    const Result r = cli(dir, args);
    CHECK(r.code == 1);
    CHECK(r.err.find("cannot open '" + folder + "': it is a directory") != std::string::npos);
  }
  // A vocabulary that is a directory.
  fs::create_directories(dir / "nmt/vocab.en");
  std::ofstream(dir / "nmt/s.en") << "a\n";
  std::ofstream(dir / "nmt/s.vi") << "a\n";
  const Result vocab =
      cli(dir, "run --model lstm_nmt --data '" + dir / "nmt/s.en" + "," + dir / "nmt/s.vi" + "'");
  CHECK(vocab.code == 1);
  CHECK(vocab.err.find("vocab.en': it is a directory") != std::string::npos);
}

TEST_CASE("cli: output files are checked before any work") {
  TempDir dir;
  const std::string base = "run --model tree_lstm " + kSmall + "--data synthetic:8 ";
  const std::string train = base + "--train --epochs 1 ";
  fs::create_directories(dir / "folder");
  for (const auto& [args, option] : std::vector<std::pair<std::string, std::string>>{
           {train + "--save-weights '" + dir / "nodir/w.st" + "'", "--save-weights"},
           {train + "--json '" + dir / "nodir/m.json" + "'", "--json"},
           {train + "--outputs '" + dir / "nodir/o.jsonl" + "'", "--outputs"},
           {train + "--save-optimizer '" + dir / "nodir/s.st" + "'", "--save-optimizer"},
           {train + "--eval synthetic:4 --save-best '" + dir / "nodir/b.st" + "'", "--save-best"},
           {base + "--write-data '" + dir / "nodir/d.txt" + "'", "--write-data"}}) {
    CAPTURE(args);
    const Result r = cli(dir, args);
    CHECK(r.code == 1);
    CHECK(r.err.find(option + ": cannot write '" + dir / "nodir/") != std::string::npos);
    CHECK(r.err.find("the folder '" + dir / "nodir" + "' does not exist") != std::string::npos);
    CHECK(r.out.empty());  // nothing ran
  }
  const Result folder = cli(dir, train + "--json '" + dir / "folder" + "'");
  CHECK(folder.code == 1);
  CHECK(folder.err.find("--json: cannot write '" + dir / "folder" + "': it is a directory") !=
        std::string::npos);
  std::ofstream(dir / "file") << "x";
  const Result file = cli(dir, train + "--json '" + dir / "file/m.json" + "'");
  CHECK(file.code == 1);
  CHECK(file.err.find("'" + dir / "file" + "' is not a folder") != std::string::npos);
  // A malformed debugging switch is refused before any work too (--write-data runs no engine).
  ::setenv("EDBATCH_CUDA_CHAIN", "sometimes", 1);
  const Result chain = cli(dir, base + "--write-data '" + dir / "d.txt" + "'");
  ::unsetenv("EDBATCH_CUDA_CHAIN");
  CHECK(chain.code == 1);
  CHECK(chain.err.find("EDBATCH_CUDA_CHAIN='sometimes'") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "d.txt"));
  // A device is written directly, whatever its folder.
  CHECK(cli(dir, "run --model tree_lstm " + kSmall + "--data synthetic:8 --json /dev/null").code ==
        0);
}

// What a run writes at its end: an empty value (an unset shell variable) and one file named by
// two options are usage errors; a file name too long for its temporary file's, or a link to a
// file not there yet, is written; one file that fails leaves the others written.
TEST_CASE("cli: output files: empty names, one file twice, long names, links, one failure") {
  TempDir dir;
  const std::string train = "run --model tree_lstm " + kSmall + "--data synthetic:8 --train ";
  for (const std::string flag : {"--save-weights", "--json", "--load-weights", "--eval",
                                 "--load-optimizer", "--outputs", "--save-optimizer"}) {
    CAPTURE(flag);
    const Result r = cli(dir, train + flag + " ''");
    CHECK(r.code == 2);
    CHECK(r.err.find(flag + " was given an empty value") != std::string::npos);
  }
  const std::string w = dir / "w.st";
  Result r = cli(dir, train + "--save-weights '" + w + "' --json '" + w + "'");
  CHECK(r.code == 2);
  CHECK(r.err.find("--json and --save-weights name one file") != std::string::npos);
  CHECK(!fs::exists(w));
  CHECK(cli(dir, train + "--json /dev/null --outputs /dev/null").code == 0);  // devices: many
  // 250 bytes: the name fits, the name with ".tmp.<pid>.<n>" would not.
  const std::string long_name = dir / std::string(250, 'w');
  r = cli(dir, train + "--save-weights '" + long_name + "'");
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(fs::file_size(long_name) > 0);
  r = cli(dir, train + "--save-weights '" + dir / std::string(256, 'w') + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("its file name is longer than 255 bytes") != std::string::npos);
  CHECK(r.out.empty());
  // A link to a file not written yet is written through.
  fs::create_symlink(dir / "target.st", dir / "link.st");
  CHECK(cli(dir, train + "--save-weights '" + dir / "link.st" + "'").code == 0);
  CHECK(fs::is_symlink(dir / "link.st"));
  CHECK(fs::file_size(dir / "target.st") > 0);
  // --outputs to a full device: the weights, the optimizer's state and the JSON are written.
  r = cli(dir, train + "--save-weights '" + w + "' --save-optimizer '" + dir / "s.st" +
                   "' --json '" + dir / "m.json" + "' --outputs /dev/full");
  CHECK(r.code == 1);
  CHECK(r.err.find("--outputs: [write_file_atomically] '/dev/full': error writing (No space") !=
        std::string::npos);
  CHECK(r.err.find("not written: --outputs") != std::string::npos);
  for (const char* f : {"w.st", "s.st", "m.json"}) CHECK(fs::file_size(dir / f) > 0);
}

// --optimizer momentum is SGD with momentum 0.9 unless --momentum says otherwise, 0 included;
// --momentum with Adam or AdaGrad is a usage error, 0 included.
TEST_CASE("cli: --momentum 0 is momentum 0") {
  TempDir dir;
  const std::string json = dir / "m.json";
  const std::string base = "run --model tree_lstm " + kSmall +
                           "--data synthetic:8 --iters 1 --train --json '" + json + "' ";
  for (const auto& [flags, momentum] :
       std::vector<std::pair<std::string, double>>{{"--optimizer momentum", 0.9},
                                                   {"--optimizer momentum --momentum 0", 0.0},
                                                   {"--optimizer momentum --momentum 0.5", 0.5},
                                                   {"--momentum 0.5", 0.5}}) {
    CAPTURE(flags);
    REQUIRE(cli(dir, base + flags).code == 0);
    const nlohmann::json j = nlohmann::json::parse(test::slurp(json));
    CHECK(j["optimizer"]["momentum"].get<double>() == doctest::Approx(momentum));
    CHECK(j["optimizer"]["lr"].get<double>() == doctest::Approx(0.01));
  }
  const Result r = cli(dir, base + "--optimizer adam --momentum 0");
  CHECK(r.code == 2);
  CHECK(r.err.find("--momentum applies to --optimizer sgd or momentum, not adam") !=
        std::string::npos);
}

TEST_CASE("cli: numbers that are not numbers, and seeds out of range, are usage errors") {
  TempDir dir;
  const std::string base = "run --model tree_lstm " + kSmall + "--data synthetic:8 --iters 1 ";
  test::check_usage_errors(
      dir, base,
      {{"--plan-cache nan", "--plan-cache: expected a number in [0, 1000000], got 'nan'"},
       {"--plan-cache inf", "--plan-cache: expected a number in [0, 1000000], got 'inf'"},
       {"--policy-budget nan", "--policy-budget: expected a number in [0, 1000000]"},
       {"--policy-budget -1", "--policy-budget: expected a number in [0, 1000000]"},
       {"--train --momentum nan", "--momentum: expected a number in [0, 0.999], got 'nan'"},
       {"--train --momentum 1", "--momentum: expected a number in [0, 0.999]"},
       {"--seed -1", "--seed: expected an integer in 0..18446744073709551615, got '-1'"},
       {"--seed 18446744073709551616", "--seed: expected an integer in 0..1844674407370955161"},
       {"--seed 99999999999999999999999", "got '99999999999999999999999'"},
       {"--seed 0x10", "--seed: expected an integer"},
       {"--seed 1.5", "--seed: expected an integer"},
       {"--iters -1", "--iters: a count cannot be negative, got '-1'"},
       {"--warmup 5000000000", "--warmup: expected an integer in 0..4294967295, got '5000000000'"},
       {"--iters 99999999999999999999", "--iters: expected an integer in 0..4294967295"}});
  // The largest seed is taken as it is; leading zeros are decimal.
  for (const auto& [seed, value] : std::vector<std::pair<std::string, uint64_t>>{
           {"18446744073709551615", UINT64_MAX}, {"010", 10}, {"0", 0}}) {
    CAPTURE(seed);
    const std::string json = dir / "s.json";
    const Result r = cli(dir, base + "--seed " + seed + " --json '" + json + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(slurp(json))["seed"].get<uint64_t>() == value);
  }
}

TEST_CASE("cli: a flag given twice takes its last value; flags that do nothing are warned of") {
  TempDir dir;
  const std::string json = dir / "r.json";
  const Result twice =
      cli(dir, "run --model tree_lstm " + kSmall +
                   "--data synthetic:12 --batch 5 --batch 4 --iters 3 --iters 2 --epochs 3 "
                   "--train --lr 0.1 --json '" +
                   json + "'");
  INFO(twice.err);
  REQUIRE(twice.code == 0);
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  CHECK(j["batch"] == 4);
  CHECK(j["minibatches_planned"] == 2);
  CHECK(j["optimizer"]["lr"].get<double>() == 0.1);  // the float's shortest decimal
  CHECK(j["lr"].get<double>() == 0.1);
  CHECK(twice.err.find("warning: --epochs has no effect with --iters") != std::string::npos);
  const Result describe =
      cli(dir, "run --model tree_lstm " + kSmall + "--data synthetic:4 --train --describe");
  CHECK(describe.code == 0);
  CHECK(describe.err.find("warning: --train has no effect with --write-data or --describe") !=
        std::string::npos);
}

TEST_CASE("cli: untrained weights better than every trained epoch are warned of") {
  // A learning rate far too large: held-out root accuracy 10% before training, no better after
  // (what it is after depends on the CPU's vector units: the run is chaotic).
  TempDir dir;
  const std::string run =
      "run --model tree_lstm --data synthetic:30 --eval synthetic:20 "
      "--hidden 4 --train --lr 50 --clip 0 ";
  const Result epochs = cli(dir, run + "--epochs 2 --save-best '" + dir / "best.st" + "'");
  INFO(epochs.err);
  REQUIRE(epochs.code == 0);
  CHECK(epochs.err.find("warning: the weights before training (accuracy 10.00%, held-out loss "
                        "67.0062) did better than every trained epoch (the best, epoch ") !=
        std::string::npos);
  CHECK(epochs.err.find("--save-best holds those weights") != std::string::npos);
  const Result sane = cli(dir,
                          "run --model tree_lstm --data synthetic:30 --eval synthetic:20 "
                          "--hidden 4 --train --epochs 2");
  REQUIRE(sane.code == 0);
  CHECK(sane.err.find("warning") == std::string::npos);
}

TEST_CASE("cli: an unknown command is named, and more threads than cores are warned of") {
  TempDir dir;
  const Result bogus = cli(dir, "bogus --model tree_lstm");
  CHECK(bogus.code == 2);
  CHECK(bogus.err.find("edbatch: unknown command 'bogus' (expected run or train)") !=
        std::string::npos);
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  const std::string threads = std::to_string(CPU_COUNT(&set) + 1);
  const Result r =
      cli(dir, "run --model tree_lstm " + kSmall + "--data synthetic:8 --threads " + threads);
  CHECK(r.code == 0);
  CHECK(r.err.find("warning: --threads " + threads + " is more than the " +
                   std::to_string(CPU_COUNT(&set)) + " CPU core(s)") != std::string::npos);
  // The work is cut into that many parts for as many threads as there are cores: TBB is not
  // asked for more workers than it allows (it would warn on stderr beside ours).
  CHECK(r.err.find("TBB") == std::string::npos);
}

TEST_CASE("cli: sentence pairs with an empty side are skipped with a warning") {
  TempDir dir;
  std::ofstream(dir / "vocab.en") << "<unk>\n<s>\n</s>\nhello\nworld\n";
  std::ofstream(dir / "vocab.vi") << "<unk>\n<s>\n</s>\nxin\nchao\n";
  std::ofstream(dir / "a.en") << "hello world\nworld\n\nhello\nhello hello\n";
  std::ofstream(dir / "a.vi") << "xin chao\nchao\nxin\n\nchao xin\n";
  const Result r =
      cli(dir, "run --model lstm_nmt --hidden 4 --batch 2 --iters 1 --data '" + dir / "a.en" + "," +
                   dir / "a.vi" + "' --json '" + dir / "m.json" + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("2 of the lines of") != std::string::npos);
  CHECK(r.err.find("have an empty side and were skipped (the first: line 3)") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(dir / "m.json"))["data_instances"] == 3);
  // A vocabulary with no room for a word is a usage error, before any file is read.
  test::check_usage_errors(dir, "run --model lstm_nmt --iters 1 --data synthetic:4 ",
                           {{"--vocab-size 3", "--vocab-size 3 leaves lstm_nmt no word after"},
                            {"--vocab-size 1", "(4 or more, or 0)"}});
}
