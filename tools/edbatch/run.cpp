// `edbatch run`: runs one model of the zoo over a data set, mini-batch by mini-batch, forward
// only or training, and reports throughput and batching statistics.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "edbatch/edbatch.h"
#include "edbatch/files.h"
#include "edbatch/models.h"
#include "edbatch/options.h"
#include "edbatch/safetensors.h"
#include "tools/edbatch/commands.h"
#include "tools/edbatch/decode.h"
#include "tools/edbatch/interrupt.h"
#include "tools/edbatch/metrics.h"
#include "tools/edbatch/run_options.h"
#include "tools/edbatch/training.h"

namespace edbatch::cli {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Builds one mini-batch, runs it, and trains on it when asked. The data set's first `size`
// instances are the ones run (held-out instances of --eval follow them).
class Runner {
 public:
  Runner(const RunOptions& o, Model& model, Engine& engine, Optimizer& optimizer, uint32_t size)
      : o_(o),
        model_(model),
        engine_(engine),
        optimizer_(optimizer),
        size_(size),
        g_(model.params()) {}

  // With --pipeline the loss is read one mini-batch later (finish() reads the last one): this
  // mini-batch is queued before the loss of `previous` is read, so its CPU work overlaps the
  // device's work on the previous one.
  MiniBatchSample step(const std::vector<uint32_t>& ids, bool train,
                       MiniBatchSample* previous = nullptr) {
    if (o_.decode) return decode_sample(model_, engine_, g_, ids, DecodeOptions{o_.max_len});
    MiniBatchSample s;
    const Stats before = engine_.stats();
    const auto t0 = Clock::now();
    g_.clear();
    losses_.clear();
    for (uint32_t i : ids) losses_.push_back(model_.build(g_, i));
    const Expr loss = sum_losses(losses_);
    Tensor value;
    uint64_t ticket = 0;
    if (o_.pipeline)
      ticket = engine_.submit(g_, loss);
    else
      value = engine_.forward(g_, loss);
    if (train) {
      engine_.backward(g_, loss);
      const auto t1 = Clock::now();
      // Where the parameters live: on a device, without a round trip through the host. The
      // gradients are those of the mean loss of the mini-batch. The null device does no math,
      // so it has no gradients to apply either.
      if (o_.device != "null") optimizer_.step(engine_, 1.0f / static_cast<float>(ids.size()));
      s.update_ms = ms_since(t1);
    }
    if (o_.pipeline) {
      if (pending_ && previous) previous->loss = loss_of(engine_.result(pending_ticket_));
      pending_ = true;
      pending_ticket_ = ticket;
    }
    s.total_ms = ms_since(t0);
    const Stats& st = engine_.stats();
    s.instances = static_cast<uint32_t>(ids.size());
    take_engine_stats(s, st, before);
    s.construction_ms = st.construction_ms;
    s.backward_ms = train ? st.backward_ms : 0;
    if (!o_.pipeline) s.loss = loss_of(value);
    return s;
  }

  // --pipeline: whether the loss of the last mini-batch queued is still to be read.
  bool pending() const { return pending_; }
  // --pipeline: reads the loss of the last mini-batch queued.
  void finish(MiniBatchSample* last) {
    if (!pending_) return;
    const double loss = loss_of(engine_.result(pending_ticket_));
    if (last) last->loss = loss;
    pending_ = false;
  }

  // One forward pass over the whole data set, one JSON line per instance.
  void write_outputs(const std::string& path) {
    write_file_atomically(path, [&](std::ostream& out) {
      if (o_.decode)
        write_decoded(out, model_, engine_, g_, size_, o_.batch, DecodeOptions{o_.max_len});
      else
        write_outputs_to(out);
    });
  }

 private:
  void write_outputs_to(std::ostream& out) {
    BatchStream stream(size_, o_.batch, false, 0);
    std::vector<uint32_t> ids;
    std::vector<std::vector<Expr>> logits;
    for (uint32_t b = 0; b < stream.per_epoch(); ++b) {
      stream.next(ids);
      g_.clear();
      losses_.clear();
      logits.assign(ids.size(), {});
      for (size_t k = 0; k < ids.size(); ++k)
        losses_.push_back(model_.build(g_, ids[k], &logits[k]));
      engine_.forward(g_, sum_losses(losses_));
      for (size_t k = 0; k < ids.size(); ++k) {
        const Tensor loss = engine_.value(losses_[k]);
        if (loss.data && !std::isfinite(loss.data[0]))
          throw std::runtime_error(
              "instance " + std::to_string(ids[k]) + ": the loss is " + loss_text(loss.data[0]) +
              ", not finite; nothing written (find the first non-finite value with "
              "--check-numerics)");
        nlohmann::json line;
        line["instance"] = ids[k];
        line["loss"] = loss.data ? nlohmann::json(loss.data[0]) : nlohmann::json(nullptr);
        line["labels"] = model_.labels(ids[k]);
        line["predicted"] = predicted_labels(engine_, logits[k]);
        out << line.dump() << "\n";
      }
    }
  }

  const RunOptions& o_;
  Model& model_;
  Engine& engine_;
  Optimizer& optimizer_;
  uint32_t size_;
  Graph g_;
  std::vector<Expr> losses_;
  bool pending_ = false;
  uint64_t pending_ticket_ = 0;

  static double loss_of(const Tensor& t) {
    return t.data ? t.data[0] : std::numeric_limits<double>::quiet_NaN();
  }
};

// A run stops at the first mini-batch whose loss is not finite (a loss is read one mini-batch
// late with --pipeline; the null device computes none), and a NumericsError of --check-numerics
// is reported with the mini-batch it came from.
class LossCheck {
 public:
  LossCheck(const RunOptions& o, uint32_t per_epoch, bool warmup)
      : on_(o.device != "null"), train_(o.train), per_epoch_(per_epoch), warmup_(warmup) {}

  // "epoch 2, mini-batch 7 of 32" for the b-th mini-batch (0-based) of the stream.
  std::string where(size_t b) const {
    if (warmup_) return "warm-up mini-batch " + std::to_string(b + 1);
    return "epoch " + std::to_string(b / per_epoch_ + 1) + ", mini-batch " +
           std::to_string(b % per_epoch_ + 1) + " of " + std::to_string(per_epoch_);
  }
  // Checks the samples whose loss is known: all but the last while `last_pending`.
  void operator()(const std::vector<MiniBatchSample>& samples, bool last_pending) {
    const size_t known = samples.size() - (last_pending && !samples.empty() ? 1 : 0);
    for (; on_ && checked_ < known; ++checked_) {
      const double loss = samples[checked_].loss;
      if (std::isfinite(loss)) continue;
      if (train_)
        throw std::runtime_error(
            where(checked_) + ": the training loss is " + loss_text(loss) +
            "; training stopped (lower --lr, clip the gradients with --clip, or find the "
            "first non-finite value with --check-numerics)");
      throw std::runtime_error(where(checked_) + ": the loss is " + loss_text(loss) +
                               ", not finite; the run stopped (find the first non-finite value "
                               "with --check-numerics)");
    }
    checked_ = std::max(checked_, known);
  }
  // Runs one step, naming its mini-batch in an error from inside it (a --check-numerics error,
  // a device error, a pass that failed); memory that could not be had stays std::bad_alloc, which
  // main() answers with its hint. With --pipeline a device's asynchronous error may belong to
  // the mini-batch queued before.
  template <class F>
  MiniBatchSample step(size_t b, const F& f) const {
    try {
      return f();
    } catch (const NumericsError& e) {
      throw NumericsError(where(b) + ": " + e.what(), e.node);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(where(b) + ": " + e.what());
    }
  }

 private:
  bool on_, train_;
  uint32_t per_epoch_;
  bool warmup_;
  size_t checked_ = 0;
};

uint32_t vocabulary_of(const Dataset& data) {
  try {
    return data_vocabulary(data);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("--vocab-size 0: " + std::string(e.what()) +
                             "; fold the ids with --vocab-size N (N at most " +
                             std::to_string(kMaxVocabulary) + ")");
  }
}

// The data set in its text format (check_usage refused DAGs and pairs).
int write_data(const Dataset& data, const std::string& path) {
  write_file_atomically(path, [&](std::ostream& out) {
    if (data.kind == DataKind::Trees) write_trees(out, data.trees);
    if (data.kind == DataKind::Lattices) write_lattices(out, data.lattices);
    if (data.kind == DataKind::Tagged)
      write_tagged(out, data.tagged.sentences, data.tagged.tag_names, data.tagged.spellings);
  });
  return 0;
}

int run(const RunOptions& o) {
  const auto wall0 = Clock::now();
  check_usage(o);
  OutputFiles outputs = output_files(o);
  interrupt_after(0);  // a malformed EDBATCH_INTERRUPT_AFTER is refused before any work
  apply_debug_env(EngineOptions{});  // and malformed EDBATCH_CUDA_* debugging switches
  if (o.device == "cpu") warn_threads("run", o.threads);
  const DataKind kind = model_data_kind(o.model);
  if (!o.write_data.empty())
    return write_data(load_dataset(kind, o.data, o.vocab, o.seed), o.write_data);
  // Weights saved from data files keep their words' and tags' ids: files read now give the same
  // words the same ids (new ones continue the numbering).
  Vocabulary vocabulary;
  std::map<std::string, std::string> loaded;  // --load-weights' metadata
  SavedVocabulary saved{0, 0, o.load_weights, {}};
  if (!o.load_weights.empty()) {
    saved.tensors = read_safetensors(o.load_weights, &loaded);
    vocabulary = vocabulary_from_metadata(loaded, o.vocab, o.load_weights);
  }
  saved.words = vocabulary.words.size();
  saved.tags = vocabulary.tags.size();
  // With --eval the held-out instances follow the training set's in one data set (one model).
  uint32_t train_size = 0;
  const Dataset data = o.t.eval.empty()
                           ? load_dataset(kind, o.data, o.vocab, o.seed, &vocabulary)
                           : load_dataset_with_heldout(kind, o.data, o.t.eval, o.vocab, o.seed,
                                                       &train_size, &vocabulary);
  const std::map<std::string, std::string> saved_vocabulary = vocabulary_metadata(vocabulary);
  if (o.t.eval.empty()) train_size = data.size();
  ParameterCollection pc(o.seed);
  ModelOptions mo;
  mo.hidden = o.hidden;
  mo.vocab = o.vocab ? o.vocab : vocabulary_of(data);
  if (!o.load_weights.empty()) mo.vocab = saved.check(vocabulary, o.vocab, mo.vocab);
  mo.blocks = !o.no_blocks;
  mo.packed = o.packed;
  mo.seed = o.seed;
  mo.char_embeddings = o.chars;
  mo.train_instances = train_size;
  const std::unique_ptr<Model> model = make_model(o.model, pc, data, mo);
  if (o.describe) {
    std::fputs(model->describe().c_str(), stdout);
    return 0;
  }
  if (!o.load_weights.empty()) saved.load(pc);

  EngineOptions eo;
  eo.policy = o.policy;
  eo.device = o.device;
  eo.threads = static_cast<int>(o.threads);
  eo.check_numerics = o.check_numerics;
  eo.auto_policy_budget_s = o.policy_budget;
  eo.policy_cache_dir = o.policy_cache;
  eo.plan_cache_bytes = static_cast<size_t>(o.plan_cache_mb * (1 << 20));
  eo = apply_debug_env(eo);  // EDBATCH_CUDA_* debugging switches
  Engine engine(pc, eo);
  uint64_t resumed = 0;  // mini-batches the loaded optimizer state's runs took
  const std::unique_ptr<Optimizer> optimizer =
      make_cli_optimizer(o.t, pc, DataPosition{o.seed, o.batch, train_size, 0}, &resumed);
  check_saved_pair(o.load_weights, loaded, o.t.load_optimizer, *optimizer);
  Runner runner(o, *model, engine, *optimizer, train_size);
  EpochReport report(o.t, *model, engine, train_size, o.batch, o.iters ? 0 : o.epochs,
                     saved_vocabulary, outputs, *optimizer);
  if (o.train) report.before_training();

  // Warm-up mini-batches (the first of the data) fill the arena and caches; not measured.
  BatchStream warm(train_size, o.batch, false, o.seed);
  std::vector<uint32_t> ids;
  std::vector<MiniBatchSample> warm_samples;
  warm_samples.reserve(o.warmup);
  LossCheck warm_check(o, warm.per_epoch(), true);
  // Warm-up runs whole even when interrupted: its steps train, and a run resumed from the saved
  // state has no warm-up steps of its own.
  for (uint32_t w = 0; w < o.warmup; ++w) {
    warm.next(ids);
    MiniBatchSample* previous = warm_samples.empty() ? nullptr : &warm_samples.back();
    const bool train = o.train && o.t.load_optimizer.empty();  // resumed: no steps of its own
    warm_samples.push_back(warm_check.step(w, [&] { return runner.step(ids, train, previous); }));
    warm_check(warm_samples, runner.pending());
  }
  runner.finish(warm_samples.empty() ? nullptr : &warm_samples.back());
  warm_check(warm_samples, false);
  const uint64_t growths_at_warmup = engine.stats().arena_growths;

  BatchStream stream(train_size, o.batch, o.train, o.seed);
  for (uint64_t k = 0; k < resumed; ++k) stream.next(ids);  // where the saved run stopped
  // Resumed in an epoch's middle, the first of --epochs is the rest of that epoch, so the run
  // ends at an epoch's end as the run without a stop does.
  const auto rest = static_cast<uint32_t>(resumed % stream.per_epoch());
  if (!o.iters && rest != 0)
    std::fprintf(stderr,
                 "edbatch run: resuming in an epoch's middle: epoch 1 of this run is the last %u "
                 "of its %u mini-batches\n",
                 stream.per_epoch() - rest, stream.per_epoch());
  const uint32_t total = o.iters ? o.iters : o.epochs * stream.per_epoch() - rest;
  const bool show = isatty(STDERR_FILENO);
  std::vector<MiniBatchSample> samples;
  samples.reserve(total);
  double instances = 0, ms = 0;
  size_t epoch_first = 0;  // the first sample of the current epoch
  RunInfo info;
  LossCheck check(o, stream.per_epoch(), false);
  for (uint32_t b = 0; b < total && !interrupt_signal(); ++b) {
    stream.next(ids);
    MiniBatchSample* previous = samples.empty() ? nullptr : &samples.back();
    // Reserved: no reallocation.
    samples.push_back(check.step(b, [&] { return runner.step(ids, o.train, previous); }));
    check(samples, runner.pending());
    instances += samples.back().instances;
    ms += samples.back().total_ms;
    if (show) progress(b + 1, total, instances, ms);
    interrupt_after(b + 1);
    // Training by epochs: the loss of each pass over the data, as it went.
    if (o.train && !o.iters && (resumed + b + 1) % stream.per_epoch() == 0) {
      runner.finish(&samples.back());
      check(samples, false);
      double epoch_loss = 0, epoch_instances = 0;
      for (size_t k = epoch_first; k < samples.size(); ++k) {
        epoch_loss += samples[k].loss;
        epoch_instances += samples[k].instances;
      }
      epoch_first = samples.size();
      if (show) std::fputs("\r\033[K", stderr);
      report.epoch_end((b + stream.per_epoch()) / stream.per_epoch(), epoch_loss / epoch_instances);
    }
  }
  runner.finish(samples.empty() ? nullptr : &samples.back());
  check(samples, false);
  if (o.train && o.device != "null")
    check_trained_weights(pc, samples.empty() ? "the warm-up" : check.where(samples.size() - 1));
  const auto measured = static_cast<uint32_t>(samples.size());  // fewer when interrupted
  if (show && interrupt_signal()) std::fputs("\r\033[K", stderr);
  if (!o.train) report.evaluate_once();
  if (o.train && o.iters) report.after_iterations(measured);
  if (o.train) report.warn_if_untrained_was_best();

  info.model = o.model;
  info.data = o.data;
  info.device = o.device;
  info.policy = engine.policy().name();
  info.data_instances = train_size;
  info.batch = o.batch;
  info.hidden = o.hidden;
  info.vocab = mo.vocab;
  info.threads = o.threads;
  info.warmup = o.warmup;
  info.seed = o.seed;
  info.blocks = mo.blocks;
  info.packed = mo.blocks && mo.packed;
  info.train = o.train;
  info.pipeline = o.pipeline;
  info.decode = o.decode;
  info.max_len = o.max_len;
  info.planned = total;
  info.interrupted = interrupt_name();
  info.lr = optimizer->learning_rate();
  info.arena_bytes = engine.stats().arena_bytes;
  info.arena_growths_after_warmup = engine.stats().arena_growths - growths_at_warmup;

  // The weights first: a failure of one file (--outputs' pass stops at a loss that is not
  // finite) leaves the others written.
  if (!o.save_weights.empty())
    outputs.write("--save-weights", [&] {
      save_parameters(o.save_weights, pc, with_optimizer_steps(saved_vocabulary, *optimizer));
    });
  if (!o.t.save_optimizer.empty())
    outputs.write("--save-optimizer", [&] {
      save_optimizer_state(
          o.t.save_optimizer, *optimizer,
          DataPosition{o.seed, o.batch, train_size, resumed + measured}.metadata());
    });
  if (!o.outputs.empty()) outputs.write("--outputs", [&] { runner.write_outputs(o.outputs); });
  info.peak_rss_bytes = peak_rss_bytes();
  info.wall_s = ms_since(wall0) / 1e3;
  if (!o.json.empty())
    outputs.write("--json", [&] {
      info.interrupted = interrupt_name();  // a signal during the writes above ends it as well
      nlohmann::json j = metrics_json(info, samples);
      if (o.train) {
        const UpdateRule& h = optimizer->hyperparameters();
        j["optimizer"] = {{"name", o.t.optimizer},
                          {"lr", json_decimal(h.lr)},
                          {"momentum", json_decimal(h.momentum)},
                          {"weight_decay", json_decimal(h.weight_decay)},
                          {"clip", json_decimal(h.clip_norm)},
                          {"steps", optimizer->steps()},
                          {"resumed_after_minibatches", resumed}};
      }
      report.add_to_json(j);
      // File names need not be UTF-8: such bytes become U+FFFD rather than fail the run here.
      const std::string text =
          j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      write_file_atomically(o.json, [&](std::ostream& out) { out << text; });
    });
  std::fputs(metrics_table(info, samples).c_str(), stdout);
  outputs.finish();
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& root) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* app = root.add_subcommand(
      "run", "Run a model of the zoo over a data set and report throughput and batching");
  add_model_option(app, o->model);
  app->add_option("--data", o->data,
                  "synthetic:N (seeded generator) or a data file: SST trees, lattices or "
                  "word|TAG sentences, as the model reads; lstm_nmt: SOURCE,TARGET files with "
                  "vocab.<ext> beside them")
      ->capture_default_str();
  add_size_options(app, o->vocab, o->batch, /*no_folding=*/true);
  app->add_option("--hidden", o->hidden, "hidden size (= embedding size)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 14));
  std::vector<std::string> policies = policy_names();
  app->add_option("--policy", o->policy,
                  "batching policy: " + CLI::detail::join(policies) +
                      ", or fsm:FILE, a learned policy file written by `edbatch train`; auto "
                      "learns one on the first mini-batch and caches it (--policy-budget, "
                      "--policy-cache)"
                      ". lb-greedy is the default: it gives the fewest batches on every zoo "
                      "model (at the chain lower bound on several) in less scheduling time than "
                      "depth or agenda, and its time per mini-batch was the lowest or within "
                      "the p10-p90 spread of the lowest on each zoo model (CPU, hidden 128, "
                      "mini-batch 32; see docs/models.md)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [policies](std::string& p) -> std::string {
            if (p.rfind("fsm:", 0) == 0 && p.size() > 4) return "";
            for (const std::string& q : policies)
              if (p == q) return "";
            return "unknown policy '" + p + "' (expected " + CLI::detail::join(policies) +
                   " or fsm:FILE)";
          },
          "POLICY"));
  app->add_option("--policy-budget", o->policy_budget,
                  "--policy auto: seconds of training allowed at the first mini-batch (0: no "
                  "limit)")
      ->capture_default_str()
      ->check(number_in(0, 1e6));
  app->add_option("--policy-cache", o->policy_cache,
                  "--policy auto: the cache directory (default $XDG_CACHE_HOME/edbatch/policies "
                  "or ~/.cache/edbatch/policies)");
  app->add_option("--plan-cache", o->plan_cache_mb,
                  "MiB of schedules and memory plans kept for structures that repeat (a "
                  "mini-batch whose structure was planned twice before runs on the kept "
                  "plan, with bitwise the same results; 0: off)")
      ->capture_default_str()
      ->check(number_in(0, 1e6));
  app->add_option("--device", o->device,
                  "cpu, null (schedules and plans, no math: with --train no update either) or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "null", "cuda"}));
  app->add_option("--threads", o->threads, "CPU threads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  app->add_option("--epochs", o->epochs, "measured passes over the data (unless --iters)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  app->add_option("--iters", o->iters,
                  "measured mini-batches, cycling over the data (0: use --epochs)")
      ->capture_default_str();
  app->add_option("--warmup", o->warmup,
                  "mini-batches run first and left out of the measurements (they train too, "
                  "except with --load-optimizer)")
      ->capture_default_str();
  app->add_flag("--no-blocks", o->no_blocks,
                "build op by op instead of through blocks (compiled cells); the default is "
                "blocks");
  app->add_flag("--packed", o->packed,
                "with blocks, record each instance's block calls into a PackedGraph and append "
                "them in bulk instead of adding each node as it is built (Block::call); the same "
                "graph either way");
  app->add_option("--seed", o->seed, "seed of the synthetic data, initial weights and shuffling")
      ->capture_default_str()
      ->transform(seed_number());
  app->add_flag("--train", o->train,
                "forward, backward and an optimizer step per mini-batch (data shuffled per "
                "epoch)");
  add_training_options(app, o->t);
  app->add_flag("--pipeline", o->pipeline,
                "queue each mini-batch before reading the previous one's loss "
                "(Engine::submit), so building, scheduling and planning overlap the device's "
                "work; the same numbers, read one mini-batch later");
  app->add_flag("--check-numerics", o->check_numerics,
                "check every value of every pass (and every gradient when training) and stop at "
                "the first that is not finite, naming its mini-batch, batch, op and node "
                "(EngineOptions::check_numerics; slower). Without it, training still stops at "
                "the first mini-batch whose loss is not finite");
  app->add_flag("--decode", o->decode,
                "lstm_nmt: greedy decoding instead of the training loss, one incremental "
                "forward per step over the sentences still running (instances/s are sentences "
                "decoded per second; the loss is minus the summed log-probabilities)");
  app->add_option("--max-len", o->max_len,
                  "--decode: a sentence stops at </s> or after min(this, 2 |source| + 2) tokens")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  app->add_flag("--char", o->chars,
                "bilstm_tagger: character BiLSTM embeddings for words seen fewer than 5 times");
  app->add_option("--outputs", o->outputs,
                  "after the run, one forward pass over the data: a JSON line per instance with "
                  "its loss, gold labels and predicted labels (with --decode: its tokens, score "
                  "and reference)");
  app->add_option("--json", o->json, "write the metrics as JSON (median, p10, p90 per mini-batch)");
  app->add_option("--save-weights", o->save_weights, "save the weights after the run (safetensors)");
  app->add_option("--load-weights", o->load_weights,
                  "load weights (safetensors) before the run; names and shapes must match");
  app->add_option("--write-data", o->write_data,
                  "write the data set --data names in its text format (SST trees, lattices or "
                  "word|TAG sentences; tree words become w<id>, tagged words keep their "
                  "spellings) to this file, and exit (not for sentence pairs or random DAGs)");
  app->add_flag("--describe", o->describe,
                "print the model's tensors (names, shapes) and math, and exit");
  app->footer(
      "Exit codes: 0 ok, 1 runtime error (data, files, device), 2 usage error.\n"
      "A progress bar goes to stderr when it is a terminal; the table goes to stdout.\n"
      "Ctrl-C (or SIGTERM, SIGHUP) stops after the mini-batch in progress and writes the run's "
      "files as "
      "at its end (the optimizer state resumes exactly there); a second Ctrl-C stops at once.");
  return Command{app, [o, app] {
                   warn_unused(*app,
                               {"--optimizer", "--lr", "--momentum", "--weight-decay", "--clip"},
                               o->train, "without --train");
                   warn_unused(*app, {"--max-len"}, o->decode, "without --decode");
                   warn_unused(*app, {"--policy-budget", "--policy-cache"}, o->policy == "auto",
                               "without --policy auto");
                   warn_unused(*app, {"--packed"}, !o->no_blocks, "with --no-blocks");
                   warn_unused(*app, {"--epochs"},
                               o->iters == 0 || !o->write_data.empty() || o->describe,
                               "with --iters, which sets the mini-batches to run");
                   warn_unused(*app, {"--train", "--eval", "--epochs", "--iters"},
                               o->write_data.empty() && !o->describe,
                               "with --write-data or --describe, which exit before any run");
                   return run(*o);
                 }};
}

}  // namespace edbatch::cli
