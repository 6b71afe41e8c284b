// `edbatch run --train` with optimizers and held-out evaluation, end to end: every zoo model's
// default training run under every optimizer lowers its held-out loss on seeded synthetic data;
// --eval accuracies equal counts made here from --outputs and from hand-built data sets with a
// known answer; --save-best keeps the best epoch's weights; optimizer state files; usage errors;
// held-out sentence pairs read with the training vocabulary.
#include <doctest/doctest.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "edbatch/safetensors.h"
#include "tests/cli_run.h"

namespace test = edbatch::test;

namespace {

using Result = test::CliResult;
using test::json_lines;
using test::slurp;
using test::TempDir;
constexpr auto& cli = test::run_cli;

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

const char* const kModels[] = {"tree_lstm",     "tree_gru",     "double_typed_tree_lstm",
                               "mvrnn",         "lattice_lstm", "lattice_gru",
                               "bilstm_tagger", "random_dag"};

bool is_tree_model(const std::string& m) {
  return m == "tree_lstm" || m == "tree_gru" || m == "double_typed_tree_lstm" || m == "mvrnn";
}

// The key of the node-level accuracy in the eval JSON.
std::string unit_of(const std::string& m) {
  return m.rfind("lattice", 0) == 0 || m == "bilstm_tagger" ? "tag" : "node";
}

}  // namespace

TEST_CASE("cli optim: every model's default training lowers its held-out loss, every optimizer") {
  TempDir dir;
  for (const std::string model : kModels) {
    for (const std::string opt : {"sgd", "momentum", "adam", "adagrad"}) {
      CAPTURE(model);
      CAPTURE(opt);
      const std::string json = dir / (model + "." + opt + ".json");
      const Result r = cli(dir, "run --model " + model +
                                    " --data synthetic:64 --eval synthetic:24 --train --epochs 3 "
                                    "--batch 8 --hidden 12 --warmup 0 --optimizer " +
                                    opt + " --json '" + json + "'");
      INFO(r.err);
      REQUIRE(r.code == 0);
      const nlohmann::json j = nlohmann::json::parse(slurp(json));
      const nlohmann::json& epochs = j["epochs"];
      REQUIRE(epochs.size() == 4);  // before training, then every epoch
      CHECK(r.out.find("epoch 0/3  held-out loss per instance") != std::string::npos);
      CHECK(r.out.find("epoch 3/3  mean loss per instance") != std::string::npos);
      const double before = epochs[0]["eval"]["loss_per_instance"];
      const double after = epochs[3]["eval"]["loss_per_instance"];
      CHECK(after < before);
      CHECK(j["eval"]["instances"] == 24);
      CHECK(j["data_instances"] == 64);
      CHECK(j["optimizer"]["name"] == opt);
      CHECK(j["optimizer"]["steps"] == 3 * 8);
      for (const nlohmann::json& e : epochs) {
        const nlohmann::json& ev = e["eval"];
        CHECK(ev["instances"] == 24);
        const std::string u = unit_of(model);
        CHECK(ev[u + "_accuracy"].get<double>() ==
              doctest::Approx(ev[u + "_correct"].get<double>() / ev[u + "s"].get<double>()));
        if (is_tree_model(model)) CHECK(ev["roots"] == 24);
      }
    }
  }
}

TEST_CASE("cli optim: --eval accuracies and loss equal a count over --outputs of the same data") {
  TempDir dir;
  for (const std::string model : kModels) {
    CAPTURE(model);
    // The held-out file: the training data written out (random DAGs: the same synthetic set).
    std::string data = "synthetic:20";
    if (model != "random_dag") {
      data = dir / (model + ".data");
      REQUIRE(cli(dir, "run --model " + model + " --data synthetic:20 --seed 3 --write-data '" +
                           data + "'")
                  .code == 0);
    }
    const std::string w = dir / (model + ".w"), json = dir / (model + ".json"),
                      out = dir / (model + ".jsonl");
    const std::string common = "run --model " + model + " --hidden 8 --batch 6 --seed 3 ";
    // Some training, so predictions are not all one class.
    Result r = cli(dir, common + "--data " + data + " --train --epochs 2 --optimizer adam " +
                            "--lr 0.02 --save-weights '" + w + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    // Evaluating the data against itself: --outputs lists the same instances as --eval reads,
    // with the same ids (one vocabulary). random_dag's held-out synthetic set has its own seed,
    // and double_typed_tree_lstm's cell types are coins seeded by the instance's index (a held-out
    // copy of a tree is another instance), so those two are checked for consistency only.
    r = cli(dir, common + "--data " + data + " --eval " + data + " --load-weights '" + w +
                     "' --outputs '" + out + "' --json '" + json + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("eval  held-out loss per instance") != std::string::npos);
    const nlohmann::json ev = nlohmann::json::parse(slurp(json))["epochs"][0]["eval"];
    if (model == "random_dag" || model == "double_typed_tree_lstm") {
      CHECK(ev["nodes"].get<double>() > 0);
      CHECK(ev["node_accuracy"].get<double>() ==
            doctest::Approx(ev["node_correct"].get<double>() / ev["nodes"].get<double>()));
      continue;
    }
    uint64_t nodes = 0, node_ok = 0, roots = 0, root_ok = 0;
    double loss = 0;
    const std::vector<nlohmann::json> lines = json_lines(out);
    REQUIRE(lines.size() == 20);
    for (const nlohmann::json& l : lines) {
      const std::vector<uint32_t> gold = l["labels"], pred = l["predicted"];
      REQUIRE(gold.size() == pred.size());
      for (size_t i = 0; i < gold.size(); ++i) node_ok += gold[i] == pred[i];
      nodes += gold.size();
      root_ok += gold.back() == pred.back();
      ++roots;
      loss += l["loss"].get<double>();
    }
    const std::string u = unit_of(model);
    CHECK(ev[u + "s"] == nodes);
    CHECK(ev[u + "_correct"] == node_ok);
    CHECK(ev[u + "_accuracy"].get<double>() == doctest::Approx(double(node_ok) / nodes));
    if (is_tree_model(model)) {
      CHECK(ev["roots"] == roots);
      CHECK(ev["root_correct"] == root_ok);
      CHECK(ev["root_accuracy"].get<double>() == doctest::Approx(double(root_ok) / roots));
    }
    CHECK(ev["loss_per_instance"].get<double>() == doctest::Approx(loss / 20).epsilon(1e-5));
  }
}

// Training data where every label is one class teaches the model to predict it everywhere; the
// held-out accuracy is then the share of that class in the held-out file, known here.
TEST_CASE("cli optim: --eval on hand-built data sets with a known answer") {
  TempDir dir;
  // Six epochs of Adam on dir/train.txt, evaluated on dir/dev.txt; the run's JSON metrics.
  const auto train_and_eval = [&](const std::string& model, const std::string& extra,
                                  Result& r) {
    const std::string json = dir / "metrics.json";
    r = cli(dir, "run --model " + model + " --data '" + dir / "train.txt" + "' --eval '" +
                     dir / "dev.txt" +
                     "' --train --epochs 6 --optimizer adam --lr 0.05 --hidden 8 --batch 8 " +
                     extra + "--json '" + json + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(slurp(json));
  };
  SUBCASE("trees: root and all-node accuracy") {
    std::string train;
    for (int i = 0; i < 24; ++i)
      train += "(2 (2 (2 a) (2 b)) (2 " + std::string(i % 2 ? "c" : "d") + "))\n";
    write(dir / "train.txt", train);
    // 3 trees, 9 nodes of which 5 are labelled 2; roots 2, 2 and 4. A word ("e") the training
    // file lacks continues the vocabulary.
    write(dir / "dev.txt", "(2 (2 a) (3 b))\n(2 (1 e) (2 c))\n(4 (2 d) (0 a))\n");
    Result r;
    const nlohmann::json j = train_and_eval("tree_lstm", "--vocab-size 0 ", r);
    CHECK(j["vocab"] == 5);  // no folding: a, b, c, d and the held-out file's e
    const nlohmann::json ev = j["epochs"].back()["eval"];
    CHECK(ev["roots"] == 3);
    CHECK(ev["root_correct"] == 2);
    CHECK(ev["nodes"] == 9);
    CHECK(ev["node_correct"] == 5);
    CHECK(r.out.find("root acc 66.67%  all-node acc 55.56%") != std::string::npos);
  }
  SUBCASE("tagged sentences: tag accuracy, a tag only the held-out file has") {
    std::string train;
    for (int i = 0; i < 24; ++i) train += "the|N dog|N runs|N far|N\n";
    write(dir / "train.txt", train);
    write(dir / "dev.txt", "the|N cat|V runs|N\nfar|ADV dog|N\n");  // 3 of 5 are N
    Result r;
    const nlohmann::json ev = train_and_eval("bilstm_tagger", "", r)["epochs"].back()["eval"];
    CHECK(ev["tags"] == 5);
    CHECK(ev["tag_correct"] == 3);
    CHECK(r.out.find("tag acc 60.00%") != std::string::npos);
  }
  SUBCASE("lattices: tag accuracy") {
    // Two-node lattices tagged 0 0; the held-out lattice's tags 0 5 0.
    std::string train = "16\n";
    for (int i = 0; i < 16; ++i) train += "2\n0 0\n0\n1 0 " + std::to_string(i % 3) + "\n\n";
    write(dir / "train.txt", train);
    write(dir / "dev.txt", "1\n3\n0 5 0\n0\n1 0 1\n1 1 2\n");
    Result r;
    const nlohmann::json ev = train_and_eval("lattice_gru", "", r)["epochs"].back()["eval"];
    CHECK(ev["tags"] == 3);
    CHECK(ev["tag_correct"] == 2);
  }
}

TEST_CASE("cli optim: --save-best keeps the best epoch's weights") {
  TempDir dir;
  const std::string best = dir / "best.st", json = dir / "t.json", again = dir / "again.json";
  const std::string data =
      "--model tree_gru --data synthetic:40 --eval synthetic:16 --hidden 8 "
      "--batch 8 ";
  Result r = cli(dir, "run " + data + "--train --epochs 4 --optimizer adagrad --save-best '" +
                          best + "' --json '" + json + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("(best: saved)") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  const int best_epoch = j["eval"]["best_epoch"];
  REQUIRE(best_epoch >= 1);
  const nlohmann::json& at_best = j["epochs"][best_epoch]["eval"];
  CHECK(j["epochs"][best_epoch]["best"] == true);
  // The file records the optimizer's steps at that epoch (2 warm-up, then 5 per epoch), so it
  // cannot be resumed with the state of the run's end.
  std::map<std::string, std::string> meta;
  edbatch::read_safetensors(best, &meta);
  CHECK(meta.at("edbatch.optimizer_steps") == std::to_string(2 + 5 * best_epoch));
  // The best by root accuracy, ties by loss.
  for (int e = 1; e < static_cast<int>(j["epochs"].size()); ++e)
    CHECK(j["epochs"][e]["eval"]["root_accuracy"].get<double>() <=
          at_best["root_accuracy"].get<double>());
  // The saved weights evaluate to the best epoch's numbers.
  r = cli(dir, "run " + data + "--load-weights '" + best + "' --json '" + again + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json ev = nlohmann::json::parse(slurp(again))["epochs"][0]["eval"];
  CHECK(ev["root_correct"] == at_best["root_correct"]);
  CHECK(ev["node_correct"] == at_best["node_correct"]);
  CHECK(ev["loss_per_instance"].get<double>() ==
        doctest::Approx(at_best["loss_per_instance"].get<double>()).epsilon(1e-5));
}

TEST_CASE("cli optim: weights and optimizer state from different points of a run are refused") {
  // Weights saved after training record the optimizer's steps: a pair whose weights were
  // written later than the state (a failed --save-optimizer, a mix of runs) is refused before
  // any work; the pair saved together loads.
  TempDir dir;
  const std::string common =
      "run --model tree_lstm --data synthetic:37 --hidden 6 --batch 8 --train --optimizer adam ";
  const auto f = [&](const char* name) { return " '" + dir / name + "' "; };
  REQUIRE(
      cli(dir, common + "--iters 3 --save-weights" + f("w1") + "--save-optimizer" + f("s1")).code ==
      0);
  std::map<std::string, std::string> meta;
  edbatch::read_safetensors(dir / "w1", &meta);
  CHECK(meta.at("edbatch.optimizer_steps") == "5");  // 2 warm-up and 3 measured
  REQUIRE(cli(dir, common + "--iters 2 --load-weights" + f("w1") + "--load-optimizer" + f("s1") +
                       "--save-weights" + f("w2"))
              .code == 0);
  const Result r = cli(dir, common + "--iters 1 --load-weights" + f("w2") + "--load-optimizer" +
                                f("s1") + "--json" + f("j.json"));
  CHECK(r.code == 1);
  CHECK(r.err.find("was saved after 7 optimizer steps and --load-optimizer") != std::string::npos);
  CHECK(r.err.find("after 5: they are not from one point of a run") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "j.json"));
}

TEST_CASE("cli optim: a --save-best that cannot be written stops nothing else") {
  // /dev/full passes the checks before any work and fails at the first best epoch: training
  // goes on, the other files are written, and the run names the file it could not write.
  TempDir dir;
  const std::string weights = dir / "w.st", state = dir / "s.st", json = dir / "t.json";
  const Result r =
      cli(dir,
          "run --model tree_gru --data synthetic:40 --eval synthetic:16 --hidden 8 --batch 8 "
          "--train --epochs 3 --save-best /dev/full --save-weights '" +
              weights + "' --save-optimizer '" + state + "' --json '" + json + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("edbatch run: --save-best: ") != std::string::npos);
  CHECK(r.err.find("not written: --save-best (above); the other files were") != std::string::npos);
  CHECK(r.out.find("(best: NOT saved)") != std::string::npos);
  CHECK(r.out.find("epoch 3/3") != std::string::npos);  // training went on
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  CHECK(j["epochs"].size() == 4);
  CHECK(j["optimizer"]["steps"].get<int>() > 0);
  CHECK(std::filesystem::file_size(weights) > 0);
  CHECK(std::filesystem::file_size(state) > 0);
}

TEST_CASE("cli optim: optimizer state files, clipping and weight decay flags") {
  TempDir dir;
  const std::string state = dir / "adam.state", json = dir / "j.json";
  const std::string common =
      "run --model lattice_lstm --data synthetic:16 --hidden 8 --batch 8 "
      "--train --epochs 1 --warmup 0 ";
  Result r = cli(dir, common + "--optimizer adam --clip 1 --weight-decay 0.001 --save-optimizer '" +
                          state + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  r = cli(dir, common + "--optimizer adam --load-optimizer '" + state + "' --json '" + json + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  CHECK(j["optimizer"]["steps"] == 4);  // 2 loaded + 2 more
  CHECK(j["optimizer"]["lr"].get<double>() == doctest::Approx(0.001));
  // Another optimizer's state is refused (runtime error).
  r = cli(dir, common + "--optimizer adagrad --load-optimizer '" + state + "'");
  CHECK(r.code == 1);
  CHECK(r.err.find("not of 'adagrad'") != std::string::npos);
}

TEST_CASE("cli optim: a run resumed from its optimizer state equals one run without a stop") {
  // 37 trees in mini-batches of 8: 5 per epoch, the last short; shuffled each epoch; the
  // warm-up trains in the first run and, resumed, does not. Split at an epoch's end (--epochs)
  // and in an epoch's middle (--iters), the weights are the same bits as the whole run's.
  TempDir dir;
  const std::string common =
      "run --model tree_lstm --data synthetic:37 --hidden 6 --batch 8 --train --optimizer adam ";
  const auto f = [&](const char* name) { return " '" + dir / name + "' "; };
  const auto run = [&](const std::string& args) {
    const Result r = cli(dir, common + args);
    INFO(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return r;
  };
  const auto state = [&](const char* in, const char* out) {  // load weights and state, save both
    return "--load-weights" + f(in) + "--load-optimizer" + f((std::string(in) + "s").c_str()) +
           "--save-weights" + f(out) + "--save-optimizer" + f((std::string(out) + "s").c_str());
  };
  run("--epochs 3 --save-weights" + f("whole"));
  run("--epochs 1 --save-weights" + f("a") + "--save-optimizer" + f("as"));
  Result r = run("--epochs 2 " + state("a", "b") + "--json" + f("b.json"));
  CHECK(r.err.find("warning") == std::string::npos);
  CHECK(slurp(dir / "b") == slurp(dir / "whole"));
  const nlohmann::json j = nlohmann::json::parse(slurp(dir / "b.json"));
  CHECK(j["optimizer"]["resumed_after_minibatches"] == 5);
  CHECK(j["optimizer"]["steps"] == 2 + 15);  // the first run's warm-up and 3 epochs
  CHECK(j["epochs"].size() == 2);

  run("--iters 12 --save-weights" + f("whole_iters"));
  run("--iters 7 --save-weights" + f("c") + "--save-optimizer" + f("cs"));
  run("--iters 2 " + state("c", "d"));
  run("--iters 3 " + state("d", "e"));
  CHECK(slurp(dir / "e") == slurp(dir / "whole_iters"));

  // Another seed or mini-batch size: the state loads, the order starts again, and it says so.
  r = run("--iters 1 --seed 5 --load-weights" + f("a") + "--load-optimizer" + f("as"));
  CHECK(r.err.find("--load-optimizer") != std::string::npos);
  CHECK(r.err.find("--seed 1, --batch 8 over 37 training instances") != std::string::npos);
  CHECK(r.err.find("starts again") != std::string::npos);
}

TEST_CASE("cli optim: a data position that cannot be where the state was saved starts again") {
  // A state file edited by hand: a negative position (which would wrap around to 2^64 - 3) and
  // one past the optimizer's own steps would replay the order for good. Both are refused with a
  // warning, and the order starts again, as for another seed.
  TempDir dir;
  const std::string common =
      "run --model tree_lstm --data synthetic:37 --hidden 6 --batch 8 --train --optimizer adam ";
  const std::string weights = dir / "w", state = dir / "s", edited = dir / "edited";
  REQUIRE(cli(dir, common + "--iters 3 --save-weights '" + weights + "' --save-optimizer '" +
                       state + "'")
              .code == 0);
  std::map<std::string, std::string> meta;
  const std::vector<edbatch::NamedTensor> tensors = edbatch::read_safetensors(state, &meta);
  REQUIRE(meta.at("step") == "5");  // 2 warm-up and 3 measured mini-batches
  for (const auto& [position, why] : std::vector<std::pair<std::string, std::string>>{
           {"-3", "its data position is not readable"},
           {"1000000000000",
            "its data position, 1000000000000 mini-batches, is past its 5 "
            "optimizer steps"},
           {"\"3\"", "its data position is not readable"}}) {
    std::map<std::string, std::string> m = meta;
    m["edbatch.data_position"] =
        R"({"batch":8,"instances":37,"minibatches":)" + position + R"(,"seed":1})";
    edbatch::write_safetensors(edited, tensors, m);
    const Result r = cli(dir, common + "--iters 1 --load-weights '" + weights +
                                  "' --load-optimizer '" + edited + "'");
    INFO(position);
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK(r.err.find(why) != std::string::npos);
    CHECK(r.err.find("starts again from the first epoch's") != std::string::npos);
  }
}

TEST_CASE("cli optim: an interrupted run writes its files and resumes where it stopped") {
  // EDBATCH_INTERRUPT_AFTER=N: the process sends itself SIGINT after N measured mini-batches.
  // 37 trees in mini-batches of 8: 5 per epoch.
  TempDir dir;
  const std::string common =
      "run --model tree_lstm --data synthetic:37 --hidden 6 --batch 8 --train --optimizer adam ";
  const auto f = [&](const char* name) { return " '" + dir / name + "' "; };
  const auto interrupted = [&](const char* after, const std::string& args) {
    ::setenv("EDBATCH_INTERRUPT_AFTER", after, 1);
    const Result r = cli(dir, args);
    ::unsetenv("EDBATCH_INTERRUPT_AFTER");
    INFO(args);
    INFO(r.err);
    CHECK(r.code == 128 + SIGINT);  // ended by the signal once the files are written
    CHECK(r.err.find("interrupted") != std::string::npos);
    CHECK(r.err.find("stopped by SIGINT") != std::string::npos);
    return r;
  };
  REQUIRE(cli(dir, common + "--epochs 2 --save-weights" + f("whole")).code == 0);

  // In an epoch's middle: weights, optimizer state and JSON written, the table printed.
  Result r = interrupted("3", common + "--epochs 2 --save-weights" + f("a") + "--save-optimizer" +
                                  f("as") + "--json" + f("a.json"));
  CHECK(r.out.find("3 mini-batches measured") != std::string::npos);
  CHECK(r.out.find("stopped by SIGINT; 10 planned") != std::string::npos);
  nlohmann::json j = nlohmann::json::parse(slurp(dir / "a.json"));
  CHECK(j["interrupted"] == "SIGINT");
  CHECK(j["minibatches"] == 3);
  CHECK(j["minibatches_planned"] == 10);
  CHECK(j["optimizer"]["steps"] == 2 + 3);  // warm-up and the measured mini-batches
  CHECK(j["epochs"].empty());               // the first epoch did not end
  // Resumed for the 7 mini-batches left: the same bits as the run without a stop.
  r = cli(dir, common + "--iters 7 --load-weights" + f("a") + "--load-optimizer" + f("as") +
                   "--save-weights" + f("b"));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(slurp(dir / "b") == slurp(dir / "whole"));
  // Or by epochs: the first is the rest of the interrupted one, so --epochs 2 again ends where
  // the run without a stop ended.
  r = cli(dir, common + "--epochs 2 --load-weights" + f("a") + "--load-optimizer" + f("as") +
                   "--save-weights" + f("e") + "--json" + f("e.json"));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("epoch 1 of this run is the last 2 of its 5 mini-batches") != std::string::npos);
  CHECK(slurp(dir / "e") == slurp(dir / "whole"));
  j = nlohmann::json::parse(slurp(dir / "e.json"));
  CHECK(j["minibatches"] == 7);
  REQUIRE(j["epochs"].size() == 2);
  CHECK(j["epochs"][1]["epoch"] == 2);

  // At an epoch's end: that epoch is reported, evaluated and kept by --save-best.
  r = interrupted("5", common + "--epochs 3 --eval synthetic:9 --save-best" + f("best") + "--json" +
                           f("c.json"));
  j = nlohmann::json::parse(slurp(dir / "c.json"));
  REQUIRE(j["epochs"].size() == 2);  // --eval's epoch 0 (before training), then the first
  CHECK(j["epochs"][1]["epoch"] == 1);
  CHECK(j["minibatches"] == 5);
  CHECK(std::filesystem::exists(dir / "best"));

  // Started with SIGINT ignored (a background job of a non-interactive shell): the same stop.
  const auto before = std::signal(SIGINT, SIG_IGN);  // std::system's child inherits it
  r = interrupted("3", common + "--epochs 2 --json" + f("i.json"));
  std::signal(SIGINT, before);
  CHECK(nlohmann::json::parse(slurp(dir / "i.json"))["minibatches"] == 3);
  // A forward-only run stops the same way; a malformed value is refused before any work.
  r = interrupted(
      "2", "run --model tree_lstm --data synthetic:37 --hidden 6 --iters 6 --json" + f("d.json"));
  CHECK(nlohmann::json::parse(slurp(dir / "d.json"))["minibatches"] == 2);
  ::setenv("EDBATCH_INTERRUPT_AFTER", "x", 1);
  r = cli(dir, common + "--iters 1");
  ::unsetenv("EDBATCH_INTERRUPT_AFTER");
  CHECK(r.code == 1);
  CHECK(r.err.find("EDBATCH_INTERRUPT_AFTER='x'") != std::string::npos);
}

TEST_CASE("cli optim: --eval of lstm_nmt counts the held-out tokens") {
  // The held-out pairs follow the training pairs in the data set; the accuracy is over every
  // target token (the greedy choice under teacher forcing).
  TempDir dir;
  const std::string json = dir / "nmt.json";
  const Result r = cli(dir, "run --model lstm_nmt --data synthetic:16 --eval synthetic:7 --train "
                            "--epochs 1 --batch 4 --hidden 6 --warmup 0 --json '" + json + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  CHECK(j["eval"]["instances"] == 7);
  for (const nlohmann::json& e : j["epochs"]) {
    const nlohmann::json& ev = e["eval"];
    CHECK(ev["instances"] == 7);
    CHECK(ev["tokens"].get<double>() >= 7 * 3);  // synthetic targets have 3 tokens or more
    CHECK(ev["token_accuracy"].get<double>() ==
          doctest::Approx(ev["token_correct"].get<double>() / ev["tokens"].get<double>()));
    CHECK(ev["loss_per_instance"].get<double>() > 0);
  }
  CHECK(r.out.find("token acc ") != std::string::npos);
}

TEST_CASE("cli optim: usage errors") {
  TempDir dir;
  const std::string base = "run --model tree_lstm --data synthetic:8 ";
  for (const std::string bad :
       {"--train --save-best b.st", "--save-best b.st --eval synthetic:4",
        "--train --optimizer adam --momentum 0.9", "--eval synthetic:4 --device null",
        "--train --optimizer rmsprop", "--train --clip -1", "--train --lr 0",
        "--load-optimizer x.st", "--eval synthetic:0", "--train --vocab-size 0"}) {
    CAPTURE(bad);
    const Result r = cli(dir, base + bad);
    CHECK(r.code == 2);
    CHECK(!r.err.empty());
  }
  // Numbers out of range are refused in words, naming the flag and the value.
  test::check_usage_errors(
      dir, base,
      {{"--train --lr -1", "--lr: expected a finite number > 0, got '-1'"},
       {"--train --lr nan", "--lr: expected a finite number > 0, got 'nan'"},
       {"--train --lr 1e50", "--lr: expected a finite number > 0, got '1e50'"},
       {"--train --clip inf", "--clip: expected a finite number >= 0, got 'inf'"},
       {"--train --weight-decay -0.5", "--weight-decay: expected a finite number >= 0"}});
}

TEST_CASE("cli optim: --eval of lstm_nmt reads the held-out pairs with the training vocabulary") {
  TempDir dir;
  const std::string train = dir / "train", same = dir / "same", other = dir / "other",
                    bare = dir / "bare";
  for (const std::string& d : {train, same, other, bare}) std::filesystem::create_directories(d);
  const std::string source = "a b c\nb c\nc a\n", target = "x y\ny\nz x y\n";
  for (const std::string& d : {train, same, other, bare}) {
    write(d + "/s.en", source);
    write(d + "/s.vi", target);
  }
  for (const std::string& d : {train, same}) {
    write(d + "/vocab.en", "<unk>\n<s>\n</s>\na\nb\nc\n");
    write(d + "/vocab.vi", "<unk>\n<s>\n</s>\nx\ny\nz\n");
  }
  // The same words in another order: read with it, every id would differ.
  write(other + "/vocab.en", "<unk>\n<s>\n</s>\nc\na\nb\n");
  write(other + "/vocab.vi", "<unk>\n<s>\n</s>\nz\ny\nx\n");
  std::vector<double> losses;
  for (const std::string& d : {same, other, bare}) {
    CAPTURE(d);
    const std::string json = dir / "m.json";
    const Result r = cli(dir,
                         "run --model lstm_nmt --hidden 6 --batch 2 --seed 3 --vocab-size 0 "
                         "--data '" +
                             train + "/s.en," + train + "/s.vi' --eval '" + d + "/s.en," + d +
                             "/s.vi' --json '" + json + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    const nlohmann::json j = nlohmann::json::parse(slurp(json));
    CHECK(j["vocab"] == 6);
    losses.push_back(j["epochs"][0]["eval"]["loss_per_instance"].get<double>());
    // The held-out set is the training set: its loss is the run's.
    CHECK(losses.back() == doctest::Approx(j["mean_loss_per_instance"].get<double>()));
  }
  CHECK(losses[1] == losses[0]);
  CHECK(losses[2] == losses[0]);
}
