// The training side of `edbatch run`: optimizer flags, held-out evaluation after each epoch
// (--eval), keeping the best weights (--save-best), and the per-epoch report on stdout and in
// the JSON (tools/edbatch/training.cpp).
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "edbatch/engine.h"
#include "edbatch/models.h"
#include "edbatch/optim.h"
#include "edbatch/safetensors.h"
#include "tools/edbatch/commands.h"

namespace edbatch::cli {

struct TrainingOptions {
  std::string optimizer = "sgd";
  float lr = 0;  // 0: the optimizer's default
  // Clipping is on by default: without it SGD diverges on mvrnn, lattice_lstm, bilstm_tagger
  // and random_dag at its default rate (docs/models.md).
  float momentum = 0, weight_decay = 0, clip = 5;
  bool momentum_given = false;  // --momentum on the command line, 0 included
  std::string eval, save_best, save_optimizer, load_optimizer;
};

// --optimizer, --lr, --momentum, --weight-decay, --clip, --eval, --save-best, --save-optimizer,
// --load-optimizer.
void add_training_options(CLI::App* app, TrainingOptions& o);
// Throws UsageError for combinations that cannot work.
void check_training_usage(const TrainingOptions& o, bool train, const std::string& device,
                          const std::string& model);
// Mini-batches of instance ids: the data set in order (shuffled by the seed when training),
// epoch after epoch, the last mini-batch of an epoch possibly short.
class BatchStream {
 public:
  BatchStream(uint32_t n, uint32_t batch, bool shuffle, uint64_t seed)
      : order_(n), batch_(batch), shuffle_(shuffle), rng_(seed) {
    std::iota(order_.begin(), order_.end(), 0u);
    if (shuffle_) std::shuffle(order_.begin(), order_.end(), rng_);
  }
  uint32_t per_epoch() const { return (size() + batch_ - 1) / batch_; }
  uint32_t size() const { return static_cast<uint32_t>(order_.size()); }
  void next(std::vector<uint32_t>& out) {
    if (pos_ >= order_.size()) {
      pos_ = 0;
      if (shuffle_) std::shuffle(order_.begin(), order_.end(), rng_);
    }
    const size_t end = std::min(order_.size(), pos_ + batch_);
    out.assign(order_.begin() + pos_, order_.begin() + end);
    pos_ = end;
  }

 private:
  std::vector<uint32_t> order_;
  uint32_t batch_;
  bool shuffle_;
  std::mt19937_64 rng_;
  size_t pos_ = 0;
};

// Where a training run stands in its data: --save-optimizer keeps it in the state's metadata
// ("edbatch.data_position"), so that a run with --load-optimizer over the same data, --batch and
// --seed continues the order of mini-batches where the saved run stopped.
struct DataPosition {
  uint64_t seed = 0;
  uint32_t batch = 0, instances = 0;  // --batch, training instances
  uint64_t minibatches = 0;           // measured mini-batches taken so far, over all runs
  std::map<std::string, std::string> metadata() const;
};
// The optimizer the flags ask for, its state loaded from --load-optimizer. `*resume_after`
// becomes the mini-batches the loaded state's runs took when its data position matches `here`
// (seed, batch and instances); otherwise it stays 0 and a warning says that the order of
// mini-batches starts again.
std::unique_ptr<Optimizer> make_cli_optimizer(const TrainingOptions& o, ParameterCollection& pc,
                                              const DataPosition& here, uint64_t* resume_after);
// Weights saved after training record the optimizer's steps ("edbatch.optimizer_steps"), so that
// a resumed run checks that --load-weights and --load-optimizer come from one point of a run
// (check_saved_pair). `metadata` with that entry when the optimizer has taken steps.
std::map<std::string, std::string> with_optimizer_steps(std::map<std::string, std::string> metadata,
                                                        const Optimizer& optimizer);
// Throws std::runtime_error when the weights (`weights_metadata`, read from `weights`) record
// other optimizer steps than the state loaded into `optimizer` from `state` (nothing is checked
// when either is not given or the weights record none).
void check_saved_pair(const std::string& weights,
                      const std::map<std::string, std::string>& weights_metadata,
                      const std::string& state, const Optimizer& optimizer);

// Held-out evaluation: a forward pass over instances [first, end) of the model's data, the
// argmax of each loss node's logits against its gold label.
struct Evaluation {
  double loss = 0;  // summed over instances
  uint32_t instances = 0;
  uint64_t node_correct = 0, nodes = 0;  // every loss node
  uint64_t root_correct = 0, roots = 0;  // trees: the last loss node (the root)
  double seconds = 0;
  uint32_t first_not_finite = UINT32_MAX;  // the first instance whose loss is not finite
  double not_finite_loss = 0;              // ... and its loss
  double loss_per_instance() const { return instances ? loss / instances : 0; }
  double node_accuracy() const { return nodes ? double(node_correct) / nodes : 0; }
  double root_accuracy() const { return roots ? double(root_correct) / roots : 0; }
};
Evaluation evaluate(Model& model, Engine& engine, uint32_t first, uint32_t end, uint32_t batch);

// After the last update of `after` ("epoch 1, mini-batch 5 of 5"): throws std::runtime_error
// naming the first parameter that holds a value that is not finite (the loss, checked before
// each update, cannot see the last one diverge).
void check_trained_weights(const ParameterCollection& pc, const std::string& after);

// The vocabulary of the weights --load-weights names (how many words and tags they have rows
// and classes for) against the data read with it.
struct SavedVocabulary {
  size_t words = 0, tags = 0;
  std::string path;
  std::vector<NamedTensor> tensors;  // the file's, read once with its metadata
  // The embedding rows of the model (`rows`: the data's); throws std::runtime_error naming a tag
  // the weights have no class for, or (with --vocab-size 0) a word they have no row for.
  uint32_t check(const Vocabulary& data, uint32_t vocab_size, uint32_t rows) const;
  // load_parameters, a shape that does not fit explained; releases the tensors.
  void load(ParameterCollection& pc);
};

// Evaluates after each epoch, prints the epoch's line, keeps the best weights, and collects the
// "epochs" JSON. Without --eval it only prints and collects the training loss.
class EpochReport {
 public:
  // `weights_metadata` goes into --save-best's files (the data's vocabulary), with the steps
  // `optimizer` has taken, written through `outputs` (a failed write is reported and training
  // goes on).
  EpochReport(const TrainingOptions& o, Model& model, Engine& engine, uint32_t train_size,
              uint32_t batch, uint32_t epochs, std::map<std::string, std::string> weights_metadata,
              OutputFiles& outputs, const Optimizer& optimizer);
  bool evaluating() const { return !o_.eval.empty(); }
  // Epoch 0: the held-out set before training (with --eval).
  void before_training();
  // After epoch `epoch` (from 1) with its mean training loss per instance.
  void epoch_end(uint32_t epoch, double train_loss);
  // Training by --iters: one evaluation at the end (as epoch 1 for --save-best).
  void after_iterations(uint32_t minibatches);
  // A run without --train: one evaluation of the weights as they are. Throws std::runtime_error
  // when an instance's loss is not finite.
  void evaluate_once();
  // After training: warns when the weights before training (epoch 0) did better on the held-out
  // set than every trained epoch (--save-best keeps trained epochs only).
  void warn_if_untrained_was_best() const;
  // "epochs" and "eval" for the metrics JSON.
  void add_to_json(nlohmann::json& j) const;

 private:
  // While training, a held-out loss that is not finite is a warning (the training loss stops a
  // run on its own); evaluate_once throws.
  Evaluation run_eval(uint32_t epoch, nlohmann::json& line, std::string& text,
                      bool training = true);
  std::string not_finite(const Evaluation& e) const;  // what the first non-finite loss was

  const TrainingOptions& o_;
  Model& model_;
  Engine& engine_;
  uint32_t train_size_, batch_, epochs_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double eval_s_ = 0;  // evaluation time so far
  std::map<std::string, std::string> weights_metadata_;
  OutputFiles& outputs_;
  const Optimizer& optimizer_;
  nlohmann::json epochs_json_ = nlohmann::json::array();
  int64_t best_epoch_ = -1;
  double best_accuracy_ = -1, best_loss_ = 0;
  double start_accuracy_ = -1, start_loss_ = 0;  // epoch 0's, when it was evaluated
};

}  // namespace edbatch::cli
