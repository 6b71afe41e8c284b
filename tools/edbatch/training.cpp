// The training side of `edbatch run` (tools/edbatch/training.h).
#include "tools/edbatch/training.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>

#include "edbatch/safetensors.h"
#include "tools/edbatch/commands.h"
#include "tools/edbatch/metrics.h"

namespace edbatch::cli {

void add_training_options(CLI::App* app, TrainingOptions& o) {
  app->add_option("--optimizer", o.optimizer,
                  "sgd, momentum (sgd with --momentum 0.9 unless given), adam or adagrad "
                  "(edbatch/optim.h); updates run where the parameters live")
      ->capture_default_str()
      ->check(CLI::IsMember(optimizer_names()));
  app->add_option("--lr", o.lr,
                  "learning rate on the mean per-instance loss (default per optimizer: sgd 0.1, "
                  "momentum (or sgd with --momentum) 0.01, adam 0.001, adagrad 0.05)")
      ->check(number_from(0, false));
  app->add_option("--momentum", o.momentum, "sgd: heavy-ball momentum in [0, 1) (0: none)")
      ->check(number_in(0, 0.999))
      ->each([&o](const std::string&) { o.momentum_given = true; });
  app->add_option("--weight-decay", o.weight_decay,
                  "L2 weight decay added to every gradient (lookup tables: the touched columns)")
      ->check(number_from(0, true));
  app->add_option("--clip", o.clip,
                  "clip the gradients of each mini-batch (of its mean loss) to this global L2 "
                  "norm (0: no clipping)")
      ->capture_default_str()
      ->check(number_from(0, true));
  app->add_option("--eval", o.eval,
                  "held-out data (a file of the model's format, read with the training data's "
                  "vocabulary, or synthetic:N drawn with its own seed): evaluated before "
                  "training and after every epoch (loss per instance; trees: root and all-node "
                  "sentiment accuracy; lattices, tagged sentences: tag accuracy)");
  app->add_option("--save-best", o.save_best,
                  "with --train and --eval: save the weights of the epoch with the best held-out "
                  "accuracy (root accuracy for trees; ties: lower held-out loss) here");
  app->add_option("--save-optimizer", o.save_optimizer,
                  "save the optimizer's state (step count, moments) after the run (safetensors)");
  app->add_option("--load-optimizer", o.load_optimizer,
                  "load the optimizer's state before the run (from --save-optimizer of the same "
                  "optimizer and model) to continue training: over the same data, --batch and "
                  "--seed the order of mini-batches continues where the saved run stopped, and "
                  "the warm-up mini-batches do not train");
}

void check_training_usage(const TrainingOptions& o, bool train, const std::string& device,
                          const std::string& model) {
  if (o.momentum_given && o.optimizer != "sgd" && o.optimizer != "momentum")
    throw UsageError("--momentum applies to --optimizer sgd or momentum, not " + o.optimizer);
  if (!o.save_best.empty() && (o.eval.empty() || !train))
    throw UsageError("--save-best needs --train and --eval");
  if (!o.eval.empty()) {
    check_data_flag(model, o.eval, "--eval");
    if (device == "null") throw UsageError("--eval needs values: the null device computes none");
  }
  if ((!o.save_optimizer.empty() || !o.load_optimizer.empty()) && !train)
    throw UsageError("--save-optimizer and --load-optimizer need --train");
}

uint32_t SavedVocabulary::check(const Vocabulary& data, uint32_t vocab_size, uint32_t rows) const {
  // Saved weights keep their words' and tags' ids; new ones continue the numbering, in the order
  // the data met them, so the smallest new id is the first new word or tag.
  const auto check_ids = [&](const std::unordered_map<std::string, uint32_t>& ids, size_t known,
                             const char* what, const char* how) {
    const std::pair<const std::string, uint32_t>* first = nullptr;
    for (const auto& entry : ids)
      if (entry.second >= known && (!first || entry.second < first->second)) first = &entry;
    if (first)
      throw std::runtime_error(fmt::format(
          "'{}' has {} for each of {} {}, and the data holds others (the first: '{}'): {}", path,
          what == std::string("words") ? "a row" : "a class", known, what, first->first, how));
  };
  if (tags > 0)
    check_ids(data.tags, tags, "tags", "a tag the training data lacked has no output class");
  if (vocab_size != 0 || words == 0) return rows;
  check_ids(data.words, words, "words",
            "with --vocab-size 0 each word needs its own row; fold ids with --vocab-size N as "
            "when training");
  return std::max<uint32_t>(rows, static_cast<uint32_t>(words));
}

void SavedVocabulary::load(ParameterCollection& pc) {
  try {
    load_parameters(tensors, path, pc);
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("expected shape") == std::string::npos) throw;
    throw std::runtime_error(std::string(e.what()) +
                             " (the model's shapes follow --hidden, --vocab-size and the data: "
                             "run with those the weights were saved with; a class the training "
                             "data did not have, such as a larger tag, has no output row)");
  }
  tensors = {};
}

std::map<std::string, std::string> DataPosition::metadata() const {
  const nlohmann::json j = {
      {"seed", seed}, {"batch", batch}, {"instances", instances}, {"minibatches", minibatches}};
  return {{"edbatch.data_position", j.dump()}};
}

namespace {
// The position a state file was saved at, or nullopt (with why) when it has none or another run
// shape.
std::optional<uint64_t> saved_position(const std::map<std::string, std::string>& meta,
                                       const DataPosition& here, uint64_t steps, std::string& why) {
  const auto it = meta.find("edbatch.data_position");
  if (it == meta.end()) {
    why = "it holds no data position (saved by another program or an older edbatch)";
    return std::nullopt;
  }
  DataPosition saved;
  try {
    const nlohmann::json j = nlohmann::json::parse(it->second);
    // Counts only: get<uint64_t>() would wrap -3 around to 2^64 - 3.
    auto count = [&j](const char* key) {
      const nlohmann::json& v = j.at(key);
      if (!v.is_number_unsigned()) throw std::invalid_argument(key);
      return v.get<uint64_t>();
    };
    saved.seed = count("seed");
    saved.batch = static_cast<uint32_t>(std::min<uint64_t>(count("batch"), UINT32_MAX));
    saved.instances = static_cast<uint32_t>(std::min<uint64_t>(count("instances"), UINT32_MAX));
    saved.minibatches = count("minibatches");
  } catch (const std::exception&) {
    why = "its data position is not readable";
    return std::nullopt;
  }
  if (saved.seed != here.seed || saved.batch != here.batch || saved.instances != here.instances) {
    why = fmt::format(
        "it was saved by a run with --seed {}, --batch {} over {} training instances, and this "
        "run has --seed {}, --batch {} over {}",
        saved.seed, saved.batch, saved.instances, here.seed, here.batch, here.instances);
    return std::nullopt;
  }
  // Every mini-batch a run measures takes one optimizer step (warm-up ones take steps too): a
  // position past the steps is not one the state was saved at, and replaying the order up to it
  // could take as long as the run it claims.
  if (saved.minibatches > steps) {
    why = fmt::format("its data position, {} mini-batches, is past its {} optimizer steps",
                      saved.minibatches, steps);
    return std::nullopt;
  }
  return saved.minibatches;
}
}  // namespace

std::unique_ptr<Optimizer> make_cli_optimizer(const TrainingOptions& o, ParameterCollection& pc,
                                              const DataPosition& here, uint64_t* resume_after) {
  OptimizerOptions oo;
  oo.lr = o.lr;
  oo.momentum = o.momentum;
  oo.weight_decay = o.weight_decay;
  oo.clip_norm = o.clip;
  // "momentum" is SGD with momentum 0.9 unless --momentum says otherwise, 0 included (the
  // library reads 0 as not given); its default rate stays.
  const bool own_momentum = o.optimizer == "momentum" && o.momentum_given;
  if (own_momentum && oo.lr == 0) oo.lr = default_learning_rate("momentum");
  std::unique_ptr<Optimizer> opt = make_optimizer(own_momentum ? "sgd" : o.optimizer, pc, oo);
  *resume_after = 0;
  if (o.load_optimizer.empty()) return opt;
  std::map<std::string, std::string> meta;
  load_optimizer_state(o.load_optimizer, *opt, &meta);
  std::string why;
  if (const std::optional<uint64_t> position = saved_position(meta, here, opt->steps(), why))
    *resume_after = *position;
  else
    std::fprintf(stderr,
                 "edbatch run: warning: --load-optimizer '%s': %s, so the order of mini-batches "
                 "starts again from the first epoch's\n",
                 o.load_optimizer.c_str(), why.c_str());
  return opt;
}

namespace {
constexpr const char* kWeightsSteps = "edbatch.optimizer_steps";
}  // namespace

std::map<std::string, std::string> with_optimizer_steps(std::map<std::string, std::string> metadata,
                                                        const Optimizer& optimizer) {
  if (optimizer.steps() > 0) metadata[kWeightsSteps] = std::to_string(optimizer.steps());
  return metadata;
}

void check_trained_weights(const ParameterCollection& pc, const std::string& after) {
  for (uint32_t id = 0; id < pc.size(); ++id) {
    if (pc.is_view(id)) continue;
    const float* v = pc.values(id);
    const float* bad =
        std::find_if(v, v + pc.dim(id).size(), [](float x) { return !std::isfinite(x); });
    if (bad == v + pc.dim(id).size()) continue;
    throw std::runtime_error(fmt::format(
        "{}: after its update, parameter '{}' holds {}; training stopped and nothing is saved "
        "(lower --lr or --weight-decay, clip the gradients with --clip, or find the first "
        "non-finite value with --check-numerics)",
        after, pc.name(id), *bad));
  }
}

void check_saved_pair(const std::string& weights,
                      const std::map<std::string, std::string>& weights_metadata,
                      const std::string& state, const Optimizer& optimizer) {
  const auto it = weights_metadata.find(kWeightsSteps);
  if (weights.empty() || state.empty() || it == weights_metadata.end()) return;
  if (it->second == std::to_string(optimizer.steps())) return;
  throw std::runtime_error(fmt::format(
      "--load-weights '{}' was saved after {} optimizer steps and --load-optimizer '{}' after {}: "
      "they are not from one point of a run (weights of --save-best's epoch with the state at "
      "the run's end, one of a pair that failed to be written, or files of different runs); "
      "load weights and state saved together",
      weights, it->second, state, optimizer.steps()));
}

Evaluation evaluate(Model& model, Engine& engine, uint32_t first, uint32_t end, uint32_t batch) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool trees = model_data_kind(model.name()) == DataKind::Trees;
  Evaluation e;
  Graph g(model.params());
  std::vector<Expr> losses;
  std::vector<std::vector<Expr>> logits;
  for (uint32_t b = first; b < end; b += batch) {
    const uint32_t n = std::min(batch, end - b);
    g.clear();
    losses.clear();
    logits.assign(n, {});
    for (uint32_t k = 0; k < n; ++k) losses.push_back(model.build(g, b + k, &logits[k]));
    engine.forward(g, sum_losses(losses));
    for (uint32_t k = 0; k < n; ++k) {
      const std::vector<uint32_t> gold = model.labels(b + k);
      const std::vector<uint32_t> predicted = predicted_labels(engine, logits[k]);
      const double loss = as_scalar(engine.value(losses[k]));
      if (!std::isfinite(loss) && e.first_not_finite == UINT32_MAX) {
        e.first_not_finite = b + k;
        e.not_finite_loss = loss;
      }
      e.loss += loss;
      e.instances += 1;
      for (size_t i = 0; i < gold.size() && i < predicted.size(); ++i)
        e.node_correct += predicted[i] == gold[i];
      e.nodes += gold.size();
      if (trees && !gold.empty()) {
        e.root_correct += !predicted.empty() && predicted.back() == gold.back();
        e.roots += 1;
      }
    }
  }
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return e;
}

EpochReport::EpochReport(const TrainingOptions& o, Model& model, Engine& engine,
                         uint32_t train_size, uint32_t batch, uint32_t epochs,
                         std::map<std::string, std::string> weights_metadata, OutputFiles& outputs,
                         const Optimizer& optimizer)
    : o_(o),
      model_(model),
      engine_(engine),
      train_size_(train_size),
      batch_(batch),
      epochs_(epochs),
      weights_metadata_(std::move(weights_metadata)),
      outputs_(outputs),
      optimizer_(optimizer) {}

namespace {
std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * x);
  return buf;
}
}  // namespace

std::string EpochReport::not_finite(const Evaluation& e) const {
  return "--eval: held-out instance " + std::to_string(e.first_not_finite - train_size_) + " of '" +
         o_.eval + "': the loss is " + loss_text(e.not_finite_loss) +
         ", not finite (find the first non-finite value with --check-numerics)";
}

Evaluation EpochReport::run_eval(uint32_t epoch, nlohmann::json& line, std::string& text,
                                 bool training) {
  const Evaluation e = evaluate(model_, engine_, train_size_, model_.size(), batch_);
  // While training, the run goes on (its training loss is checked on its own) and says so.
  if (e.first_not_finite != UINT32_MAX && training)
    std::fprintf(stderr, "edbatch run: warning: %s\n", not_finite(e).c_str());
  const DataKind kind = model_data_kind(model_.name());
  nlohmann::json j;
  j["loss_per_instance"] = std::isfinite(e.loss) ? nlohmann::json(e.loss_per_instance()) : nullptr;
  j["instances"] = e.instances;
  j["seconds"] = e.seconds;
  char buf[64];
  std::snprintf(buf, sizeof buf, "held-out loss per instance %.4f", e.loss_per_instance());
  text += std::isnan(e.loss) ? "held-out loss per instance nan" : buf;  // not printf's "-nan"
  const char* unit = kind == DataKind::Lattices || kind == DataKind::Tagged ? "tag"
                     : kind == DataKind::Pairs                              ? "token"
                                                                            : "node";
  if (kind == DataKind::Trees) {
    j["root_accuracy"] = e.root_accuracy();
    j["root_correct"] = e.root_correct;
    j["roots"] = e.roots;
    text += "  root acc " + percent(e.root_accuracy());
  }
  j[std::string(unit) + "_accuracy"] = e.node_accuracy();
  j[std::string(unit) + "_correct"] = e.node_correct;
  j[std::string(unit) + "s"] = e.nodes;
  text += std::string("  ") + (kind == DataKind::Trees ? "all-node" : unit) + " acc " +
          percent(e.node_accuracy());
  line["eval"] = j;
  eval_s_ += e.seconds;
  // Time to this accuracy: wall time since the report began, and the part of it not spent
  // evaluating.
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  line["wall_s"] = wall;
  line["train_wall_s"] = wall - eval_s_;
  // The best epoch: highest accuracy (root accuracy for trees), then lowest held-out loss.
  const double accuracy = kind == DataKind::Trees ? e.root_accuracy() : e.node_accuracy();
  const double loss = e.loss_per_instance();
  if (epoch != 0 && !std::isfinite(loss) && !o_.save_best.empty())
    text += "  (not finite: not kept by --save-best)";
  if (epoch == 0 && training && std::isfinite(loss)) {
    start_accuracy_ = accuracy;
    start_loss_ = loss;
  }
  if (epoch == 0 || !std::isfinite(loss)) return e;
  if (best_epoch_ < 0 || accuracy > best_accuracy_ ||
      (accuracy == best_accuracy_ && loss < best_loss_)) {
    best_epoch_ = epoch;
    best_accuracy_ = accuracy;
    best_loss_ = loss;
    line["best"] = true;
    if (!o_.save_best.empty()) {
      // A file that cannot be written is reported (and named at the end) while training goes
      // on: the run's other files and a later best epoch are still written.
      outputs_.write("--save-best", [&] {
        save_parameters(o_.save_best, model_.params(),
                        with_optimizer_steps(weights_metadata_, optimizer_));
      });
      text += outputs_.written("--save-best") ? "  (best: saved)" : "  (best: NOT saved)";
    } else {
      text += "  (best)";
    }
  }
  return e;
}

void EpochReport::before_training() {
  if (!evaluating()) return;
  nlohmann::json line;
  line["epoch"] = 0;
  // Training by --iters (epochs_ 0) has no epochs to count.
  std::string text =
      epochs_ ? "epoch 0/" + std::to_string(epochs_) + "  " : std::string("before training  ");
  run_eval(0, line, text);
  epochs_json_.push_back(line);
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void EpochReport::epoch_end(uint32_t epoch, double train_loss) {
  nlohmann::json line;
  line["epoch"] = epoch;
  line["mean_loss_per_instance"] =
      std::isfinite(train_loss) ? nlohmann::json(train_loss) : nullptr;
  char buf[96];
  std::snprintf(buf, sizeof buf, "epoch %u/%u  mean loss per instance %.4f", epoch, epochs_,
                train_loss);
  std::string text = buf;
  if (std::isnan(train_loss))
    text = "epoch " + std::to_string(epoch) + "/" + std::to_string(epochs_) +
           "  mean loss per instance nan";
  if (evaluating()) {
    text += "  ";
    run_eval(epoch, line, text);
  }
  epochs_json_.push_back(line);
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void EpochReport::after_iterations(uint32_t minibatches) {
  if (!evaluating()) return;
  nlohmann::json line;
  line["epoch"] = 1;
  line["minibatches"] = minibatches;
  std::string text = "after " + std::to_string(minibatches) + " mini-batches  ";
  run_eval(1, line, text);
  epochs_json_.push_back(line);
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void EpochReport::evaluate_once() {
  if (!evaluating()) return;
  nlohmann::json line;
  line["epoch"] = 0;
  std::string text = "eval  ";
  const Evaluation e = run_eval(0, line, text, false);
  if (e.first_not_finite != UINT32_MAX) throw std::runtime_error(not_finite(e));
  epochs_json_.push_back(line);
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void EpochReport::warn_if_untrained_was_best() const {
  if (best_epoch_ < 1 || start_accuracy_ < 0) return;
  if (start_accuracy_ < best_accuracy_ ||
      (start_accuracy_ == best_accuracy_ && start_loss_ >= best_loss_))
    return;
  // Training by --iters (epochs_ 0) evaluates once, after its last mini-batch.
  const std::string trained =
      epochs_ ? "every trained epoch (the best, epoch " + std::to_string(best_epoch_) + ": "
              : std::string("the weights after the last mini-batch (");
  std::fprintf(stderr,
               "edbatch run: warning: the weights before training (accuracy %s, held-out loss "
               "%.4f) did better than %saccuracy %s, held-out loss %.4f)%s\n",
               percent(start_accuracy_).c_str(), start_loss_, trained.c_str(),
               percent(best_accuracy_).c_str(), best_loss_,
               o_.save_best.empty() ? "" : "; --save-best holds those weights");
}

void EpochReport::add_to_json(nlohmann::json& j) const {
  j["epochs"] = epochs_json_;
  if (evaluating()) {
    j["eval"] = {{"data", o_.eval},
                 {"instances", model_.size() - train_size_},
                 {"best_epoch", best_epoch_ >= 0 ? nlohmann::json(best_epoch_) : nullptr}};
    if (!o_.save_best.empty()) {
      j["eval"]["save_best"] = o_.save_best;
      j["eval"]["save_best_written"] = best_epoch_ >= 0 && outputs_.written("--save-best");
    }
  }
}

}  // namespace edbatch::cli
