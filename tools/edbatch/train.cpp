// `edbatch train`: learns an FSM batching policy for one zoo model offline (scheduling only, no
// math) and writes the policy file that `edbatch run --policy fsm:FILE` loads.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "edbatch/edbatch.h"
#include "edbatch/files.h"
#include "edbatch/models.h"
#include "edbatch/options.h"
#include "tools/edbatch/commands.h"
#include "tools/edbatch/interrupt.h"

namespace edbatch::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct TrainOptions {
  std::string model, data = "synthetic:2560", output, curve, encoding = "cover";
  std::string eval_data, device = "none", combine = "auto", costs, batch_us = "auto";
  uint32_t vocab = 256, batch = 32, hidden = 128, train_batches = 64, val_batches = 16;
  uint32_t eval_batches = 0, cost_graphs = 8, cost_reps = 3, threads = 1;
  uint64_t seed = 1;
  std::vector<uint32_t> train_sizes;  // empty: all of --batch
  bool no_teacher = false, no_blocks = false, no_scorer = false, no_table = false;
  FsmTrainOptions fsm;
};

// Consecutive mini-batches of a data set the trainer never sees (--eval-data), over their own
// parameters: policies refer to types by name, so the same model's types match.
struct Evaluation {
  Dataset data;
  std::unique_ptr<ParameterCollection> pc;
  std::unique_ptr<Model> model;
  std::vector<std::unique_ptr<Graph>> graphs;
};

Evaluation make_evaluation(const TrainOptions& o, const ModelOptions& mo) {
  // synthetic:N draws other instances than --data's (another seed).
  Evaluation e{load_dataset(model_data_kind(o.model), o.eval_data, o.vocab, o.seed + 1), nullptr,
               nullptr, {}};
  e.pc = std::make_unique<ParameterCollection>(o.seed);
  e.model = make_model(o.model, *e.pc, e.data, mo);
  const uint32_t n = e.model->size();
  for (uint32_t b = 0; b * o.batch < n && (o.eval_batches == 0 || b < o.eval_batches); ++b) {
    auto g = std::make_unique<Graph>(*e.pc);
    std::vector<Expr> losses;
    for (uint32_t i = b * o.batch; i < std::min(n, (b + 1) * o.batch); ++i)
      losses.push_back(e.model->build(*g, i));
    sum_losses(losses);
    e.graphs.push_back(std::move(g));
  }
  return e;
}

// The comparison table: batches (and predicted time with costs) per policy against the bound.
void print_comparison(const std::vector<const Graph*>& graphs, FsmPolicy& fsm,
                      const FsmCostModel& costs, const char* what) {
  const FsmCostModel* c = costs.empty() ? nullptr : &costs;
  const double bound = mean_lower_bound(graphs);
  std::printf("%s: %zu mini-batches\n", what, graphs.size());
  std::printf("%-12s %12s %10s%s\n", "policy", "batches", "vs bound",
              c ? "   predicted us" : "");
  auto row = [&](const char* name, Policy& p) {
    double us = 0;
    const double b = mean_batches(graphs, p, c, &us);
    std::printf("%-12s %12.2f %10.3f", name, b, bound > 0 ? b / bound : 1.0);
    if (c) std::printf(" %14.1f", us);
    std::printf("\n");
  };
  row("fsm", fsm);
  uint64_t hits = 0, misses = 0, scored = 0;
  {
    Scheduler s;
    Schedule out;
    for (const Graph* g : graphs) {
      s.run(*g, fsm, out);
      hits += fsm.lookups().hits;
      misses += fsm.lookups().misses;
      scored += fsm.lookups().scored;
    }
  }
  for (const char* h : {"depth", "agenda", "lb-greedy"}) row(h, *make_policy(h));
  std::printf("%-12s %12.2f %10.3f\n", "lower bound", bound, 1.0);
  const double n = std::max<double>(1, hits + misses);
  std::printf("decisions: %.1f%% table, %.1f%% scorer, %.1f%% lb-greedy fallback\n",
              100 * hits / n, 100 * scored / n, 100 * (misses - scored) / n);
}

// Warns when the costs of --costs miss types of the model: those take the mean cost
// (FsmCostModel::of), which for costs of another model, hidden size or mini-batch size is
// (nearly) every type.
void warn_missing_costs(const TrainOptions& o, const std::vector<const Graph*>& graphs) {
  const std::set<std::string> known(o.fsm.costs.types.begin(), o.fsm.costs.types.end());
  std::set<std::string> types, missing;
  for (const Graph* g : graphs)
    for (const Node& n : g->nodes()) {
      if (!is_scheduled(n.op)) continue;
      const std::string& name = g->types().name(n.type);
      types.insert(name);
      if (!known.count(name)) missing.insert(name);
    }
  if (missing.empty()) return;
  const std::string what = o.model + " (hidden " + std::to_string(o.hidden) + ")";
  const std::string head =
      missing.size() == types.size()
          ? "no type of " + what + " has a cost in '" + o.costs +
                "' (costs of another model, hidden size or mini-batch size?): all " +
                std::to_string(types.size())
          : std::to_string(missing.size()) + " of the " + std::to_string(types.size()) +
                " types of " + what + " have no cost in '" + o.costs + "' and";
  std::fprintf(stderr, "edbatch train: warning: --costs: %s take the mean of its costs: %s\n",
               head.c_str(), CLI::detail::join(missing, ", ").c_str());
}

void check_usage(const TrainOptions& o) {
  check_data_flag(o.model, o.data);
  if (!o.eval_data.empty()) check_data_flag(o.model, o.eval_data, "--eval-data");
  check_vocab_size(o.model, o.vocab);
  if (o.output.empty()) throw UsageError("--output: empty file name");
  if (!o.costs.empty() && o.device != "none")
    throw UsageError("--costs and --device " + o.device +
                     ": the costs are either read from a file or measured, not both");
  if (o.combine != "auto" && o.costs.empty() && o.device == "none")
    throw UsageError("--combine " + o.combine + " needs costs: --device cpu|cuda or --costs FILE");
  if (o.batch_us != "auto" && o.costs.empty() && o.device == "none")
    throw UsageError("--batch-us " + o.batch_us +
                     " needs costs: --device cpu|cuda or --costs FILE");
  if (o.batch_us.find(',') != std::string::npos && o.device == "none")
    throw UsageError("--batch-us " + o.batch_us +
                     ": several values keep the policy that runs fastest, timed on the device "
                     "the costs are measured on (--device cpu|cuda)");
}

// The least per-batch cost that `--batch-us auto` gives measured chain costs. The chain model
// times a schedule by its critical chain alone, while the stages beside the chain share the
// device with it; the fit of whole-pass times cannot see that (on an H100 it returns 0), and
// schedules that trade many more batches for a slightly shorter chain then look free. On the
// H100 a quarter of a microsecond per batch gave the Lattice-LSTM policies the lowest device
// time of 0, 0.25, 0.5, 1 and 2 at mini-batches 32 and 128 (docs/policies.md).
constexpr double kMeasuredChainBatchUs = 0.25;

// The comma-separated parts of a --batch-us list ("1," gives "1" and ""; "" gives none).
std::vector<std::string> batch_us_parts(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream list(text);
  for (std::string v; std::getline(list, v, ',');) parts.push_back(v);
  if (!text.empty() && text.back() == ',') parts.emplace_back();
  return parts;
}

// The --batch-us values to train a policy with, one each. "auto" keeps what the costs hold; on
// chain costs measured in this run it tries that (at least kMeasuredChainBatchUs), twice and four
// times it, since the best value depends on the model and the mini-batch size and the fit
// cannot find it. A number or a list gives the values. Only chain costs have a cost per batch.
std::vector<double> batch_us_values(const TrainOptions& o) {
  const FsmCostModel& c = o.fsm.costs;
  if (o.batch_us == "auto") {
    if (!c.chain || !o.costs.empty()) return {c.batch_us};
    const double us = std::max(c.batch_us, kMeasuredChainBatchUs);
    return {us, 2 * us, 4 * us};
  }
  if (!c.chain)
    throw UsageError("--batch-us " + o.batch_us +
                     ": the costs add up batch by batch (sum), so a cost per batch in series "
                     "has no meaning; combine them along the chain (--combine chain, or "
                     "--device cuda)");
  std::vector<double> values;
  for (const std::string& v : batch_us_parts(o.batch_us)) values.push_back(std::stod(v));
  return values;
}

int train(TrainOptions o) {
  const auto t0 = Clock::now();
  check_usage(o);
  OutputFiles outputs("train");  // checked before any work
  outputs.add("--output", o.output);
  outputs.add("--curve", o.curve);
  outputs.read_data("--data", o.data);
  outputs.read_data("--eval-data", o.eval_data);
  // synthetic:N evaluates on another seed's instances; a file is what it holds.
  std::error_code same_ec;
  const bool eval_trained_on =
      !o.eval_data.empty() && o.eval_data.rfind("synthetic:", 0) != 0 &&
      (o.eval_data == o.data || std::filesystem::equivalent(o.eval_data, o.data, same_ec));
  if (eval_trained_on)
    std::fprintf(stderr,
                 "edbatch train: warning: --eval-data and --data name one file, '%s': the "
                 "trainer draws its mini-batches from it, so the evaluation is not held out\n",
                 o.eval_data.c_str());
  outputs.read("--costs", o.costs, "--output");  // read whole before the policy is written
  // A missing or malformed --costs file costs no work (exit 1, as other files).
  const FsmCostModel given_costs =
      o.costs.empty() ? FsmCostModel{} : load_fsm_policy(o.costs).costs;
  if (o.device == "cpu") warn_threads("train", o.threads);
  o.fsm.encoding = parse_fsm_encoding(o.encoding);
  o.fsm.seed = o.seed;
  o.fsm.teacher = !o.no_teacher;
  o.fsm.scorer = !o.no_scorer;
  o.fsm.table = !o.no_table;
  const Dataset data = load_dataset(model_data_kind(o.model), o.data, o.vocab, o.seed);
  ParameterCollection pc(o.seed);
  ModelOptions mo;
  mo.hidden = o.hidden;
  mo.vocab = o.vocab;
  mo.seed = o.seed;
  mo.blocks = !o.no_blocks;
  const std::unique_ptr<Model> model = make_model(o.model, pc, data, mo);
  const std::vector<uint32_t> sizes =
      o.train_sizes.empty() ? std::vector<uint32_t>{o.batch} : o.train_sizes;
  const FsmWorkload w =
      make_fsm_workload(*model, o.batch, sizes, o.train_batches, o.val_batches, o.seed);
  const auto train_graphs = w.train_graphs(), val_graphs = w.validation_graphs();
  if (model->size() == 1)
    std::fprintf(stderr,
                 "edbatch train: warning: --data holds one instance, which serves both training "
                 "and validation: the validation figures are not held out\n");
  // --eval-data is read before training, so that a bad file does not cost a training run.
  const std::unique_ptr<Evaluation> evaluation =
      o.eval_data.empty() ? nullptr : std::make_unique<Evaluation>(make_evaluation(o, mo));
  const std::string size_list = CLI::detail::join(sizes, ",");
  std::fprintf(stderr,
               "%s: %zu training mini-batches of up to %s instances, %zu validation ones of up "
               "to %u\n",
               o.model.c_str(), train_graphs.size(), size_list.c_str(), val_graphs.size(), o.batch);
  // The time reward: per-type costs measured on the device over some training mini-batches, or
  // those of a policy file (--costs). On a GPU, stages wait only for what they read, so the
  // costs combine along the critical chain (--combine auto).
  const bool chain = o.combine == "chain" || (o.combine == "auto" && o.device == "cuda");
  if (!o.costs.empty()) {
    o.fsm.costs = given_costs;
    if (o.fsm.costs.empty())
      throw UsageError("--costs: " + o.costs + " has no costs (a policy trained with --device)");
    if (o.combine != "auto") o.fsm.costs.chain = chain;
    warn_missing_costs(o, train_graphs);
  }
  EngineOptions eo;
  eo.device = o.device;
  eo.threads = static_cast<int>(o.threads);
  eo = apply_debug_env(eo);
  const auto stop = [] { return interrupt_signal() != 0; };
  if (o.costs.empty() && o.device != "none") {
    std::vector<Graph*> sample;
    for (size_t i = 0; i < w.train.size() && sample.size() < std::max(o.cost_graphs, 2u); ++i)
      sample.push_back(w.train[i].get());
    o.fsm.costs = measure_type_costs(pc, sample, eo, o.cost_reps, o.seed, chain, stop);
  }
  const std::vector<double> us_values =
      o.fsm.costs.empty() ? std::vector<double>{0} : batch_us_values(o);
  for (size_t i = 0; i < o.fsm.costs.types.size(); ++i)
    std::fprintf(stderr, "cost on %s (%s): %-40s %9.2f us + %8.4f us per node\n",
                 o.fsm.costs.device.c_str(), o.fsm.costs.chain ? "chain" : "sum",
                 o.fsm.costs.types[i].c_str(), o.fsm.costs.costs[i].launch_us,
                 o.fsm.costs.costs[i].node_us);
  // Summed costs without any per-batch part make every schedule of a mini-batch cost the same
  // (its nodes are the same): the time reward could not rank them.
  bool per_batch = o.fsm.costs.chain;
  for (const FsmTypeCost& c : o.fsm.costs.costs) per_batch |= c.launch_us > 0;
  if (!o.fsm.costs.empty() && !per_batch)
    std::fprintf(stderr,
                 "edbatch train: warning: the costs give no type a cost per batch, so every "
                 "schedule of a mini-batch costs the same and the time reward cannot rank them "
                 "(%s); train on batches (without --device) or measure more: --cost-graphs, "
                 "--cost-reps\n",
                 o.costs.empty() ? "the fit of the measured times found none"
                                 : ("as " + o.costs + " has them").c_str());

  // One policy per --batch-us value, each with its learning curve (written at the end, whole:
  // write_file_atomically). A stop ends training; later values are not tried.
  struct Candidate {
    double batch_us;
    FsmTrainResult result;
    std::string curve;
  };
  std::vector<Candidate> candidates;
  o.fsm.stop = stop;
  for (size_t k = 0; k < us_values.size() && (k == 0 || !interrupt_signal()); ++k) {
    o.fsm.costs.batch_us = us_values[k];
    const std::string which = us_values.size() > 1 ? " (policy " + std::to_string(k + 1) + " of " +
                                                         std::to_string(us_values.size()) + ")"
                                                   : "";
    if (o.fsm.costs.chain)
      std::fprintf(stderr, "cost on %s (chain): every batch in series %9.2f us%s\n",
                   o.fsm.costs.device.c_str(), o.fsm.costs.batch_us, which.c_str());
    std::ostringstream curve;
    curve << "episode,mean_batches,validation_batches,lower_bound,stage\n";
    auto progress = [&](const FsmCurvePoint& p) {
      std::fprintf(stderr,
                   "%-10s  episode %5u  training %8.2f  validation %8.2f  lower bound %8.2f\n",
                   p.stage, p.episode, p.mean_batches, p.validation_batches, p.lower_bound);
      curve << p.episode << "," << p.mean_batches << "," << p.validation_batches << ","
            << p.lower_bound << "," << p.stage << "\n";
    };
    FsmTrainResult r = train_fsm_policy(train_graphs, val_graphs, o.fsm, progress);
    candidates.push_back({us_values[k], std::move(r), curve.str()});
  }
  // Several policies: each runs forward over the validation mini-batches on the device, beside
  // lb-greedy, and the fastest is kept (the first when stopped before).
  size_t kept = 0;
  std::vector<double> measured;  // lb-greedy's, then each candidate's
  if (candidates.size() > 1 && !interrupt_signal()) {
    std::fprintf(stderr,
                 "timing %zu policies and lb-greedy on %s over %zu validation "
                 "mini-batches, %u passes each\n",
                 candidates.size(), o.device.c_str(), w.validation.size(), o.cost_reps);
    std::vector<Graph*> graphs;
    for (const auto& g : w.validation) graphs.push_back(g.get());
    std::vector<std::unique_ptr<Policy>> policies;
    policies.push_back(make_policy("lb-greedy"));
    for (const Candidate& c : candidates)
      policies.push_back(std::make_unique<FsmPolicy>(c.result.policy, o.output));
    measured = measure_policy_times(pc, graphs, std::move(policies), eo, o.cost_reps, stop);
    if (!measured.empty())  // the first fastest candidate (measured[0] is lb-greedy's)
      kept = static_cast<size_t>(std::min_element(measured.begin() + 1, measured.end()) -
                                 measured.begin() - 1);
  }
  FsmTrainResult& result = candidates[kept].result;
  if (interrupt_signal())
    std::fprintf(stderr, "training stopped by %s: the best candidate so far (%s) is kept\n",
                 interrupt_name(), result.best_source.c_str());
  const double train_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // The summary runs the real scheduler with the policy as `edbatch run` would load it.
  FsmPolicyInfo& info = result.policy.info;
  info.model = o.model;
  info.hidden = o.hidden;
  FsmPolicy fsm(result.policy, o.output);
  nlohmann::json validation;
  const double fsm_batches = mean_batches(val_graphs, fsm);
  validation["minibatches"] = val_graphs.size();
  for (const char* h : {"depth", "agenda", "lb-greedy"})
    validation[h] = mean_batches(val_graphs, *make_policy(h));
  // null when no teacher ran (--no-teacher, lb-greedy at the bound, or out of time)
  validation["teacher"] =
      result.teacher_batches > 0 ? nlohmann::json(result.teacher_batches) : nlohmann::json();
  if (!o.fsm.costs.empty())
    validation["teacher_us"] =
        result.teacher_batches > 0 ? nlohmann::json(result.teacher_cost) : nlohmann::json();
  validation["best"] = result.best_source;
  if (!measured.empty()) {
    // Forward microseconds on the device, per validation mini-batch.
    nlohmann::json tried = nlohmann::json::array();
    for (size_t k = 0; k < candidates.size(); ++k)
      tried.push_back({{"batch_us", candidates[k].batch_us}, {"us", measured[k + 1]}});
    validation["measured_us"] = {
        {"lb-greedy", measured[0]}, {"fsm", measured[kept + 1]}, {"batch_us", tried}};
  }
  info.validation = validation.dump();
  info.validation_batches = fsm_batches;
  // Each file is written whatever happened to the other (finish() below names a failure).
  outputs.write("--output", [&] { save_fsm_policy(o.output, result.policy); });
  if (!o.curve.empty())
    outputs.write("--curve", [&] {
      write_file_atomically(o.curve, [&](std::ostream& out) { out << candidates[kept].curve; });
    });

  std::printf(
      "%s, mini-batch %u, hidden %u, encoding %s, reward %s\n", o.model.c_str(), o.batch, o.hidden,
      o.encoding.c_str(),
      o.fsm.costs.empty()
          ? "batches"
          : ("time on " + o.fsm.costs.device + (o.fsm.costs.chain ? ", chain" : ", sum")).c_str());
  FsmPolicy loaded(result.policy, o.output);
  print_comparison(val_graphs, loaded, result.policy.costs, "validation (held out of --data)");
  if (!measured.empty()) {
    std::printf(
        "timed on %s, validation: us per forward (median of %u passes, mean over "
        "mini-batches)\n%-18s %9.1f\n",
        o.fsm.costs.device.c_str(), o.cost_reps, "lb-greedy", measured[0]);
    for (size_t k = 0; k < candidates.size(); ++k)
      std::printf("fsm, batch-us %-4.3g %9.1f  %+6.1f%%%s\n", candidates[k].batch_us,
                  measured[k + 1], 100 * (measured[k + 1] / measured[0] - 1),
                  k == kept ? "  kept" : "");
  }
  if (evaluation) {
    std::vector<const Graph*> graphs;
    for (const auto& g : evaluation->graphs) graphs.push_back(g.get());
    print_comparison(graphs, loaded, result.policy.costs,
                     ("evaluation (" + o.eval_data +
                      (eval_trained_on ? ", the file trained on)" : ", not trained on)"))
                         .c_str());
  }
  std::printf("table: %u states, scorer: %s (best: %s), %u episodes, trained in %.1f s; %s %s\n",
              result.policy.table.size(), result.policy.scorer.empty() ? "no" : "yes",
              result.best_source.c_str(), result.episodes_run, train_s,
              outputs.written("--output") ? "written to" : "NOT written to", o.output.c_str());
  outputs.finish();
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* app = root.add_subcommand(
      "train",
      "Learn an FSM batching policy for a model offline (scheduling only, no math) and write a "
      "policy file for `edbatch run --policy fsm:FILE`");
  add_model_option(app, o->model);
  app->add_option("-o,--output", o->output, "the policy file to write (JSON)")->required();
  app->add_option("--data", o->data,
                  "synthetic:N (seeded generator) or a data file of the model's kind; a fifth "
                  "(at least one instance) is held out for validation, except from a single "
                  "instance, which serves both, with a warning")
      ->capture_default_str();
  add_size_options(app, o->vocab, o->batch);
  app->add_option("--hidden", o->hidden,
                  "hidden size; types carry shapes, so run with the same --hidden")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 14));
  app->add_option("--encoding", o->encoding,
                  "state encoding: set (ready types), sorted (ready types by count), set+top "
                  "(set and the most populated type), cover (set and how much of each type's "
                  "critical nodes is ready: the strongest on lattices and DAGs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"set", "sorted", "set+top", "cover"}));
  app->add_option("--episodes", o->fsm.episodes, "Q-learning rollouts")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 24));
  app->add_option("--train-batches", o->train_batches,
                  "training mini-batches, each a random sample of the training instances")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  app->add_option("--train-sizes", o->train_sizes,
                  "instances per training mini-batch, cycled over the training mini-batches "
                  "(e.g. 16,32,64, so the policy meets other sizes than --batch); default: --batch")
      ->delimiter(',')
      ->check(CLI::Range(1u, 1u << 16));
  app->add_option("--val-batches", o->val_batches, "validation mini-batches (held-out instances)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  app->add_option("--seed", o->seed, "seed of the data, the sampling and the rollouts")
      ->capture_default_str()
      ->transform(seed_number());
  app->add_option(
         "--curve", o->curve,
         "learning-curve CSV: episode, mean_batches, validation_batches, lower_bound, stage (the "
         "candidate measured: lb-greedy, scorer, teacher, q-learning or search)")
      ->capture_default_str();
  app->add_option("--n-step", o->fsm.n_step, "n of the n-step returns")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  app->add_option("--alpha", o->fsm.alpha, "Q-learning step size")
      ->capture_default_str()
      ->check(number_in(0, 1));
  app->add_option("--epsilon-start", o->fsm.epsilon_start,
                  "exploration rate of the first rollouts, decaying linearly ...")
      ->capture_default_str()
      ->check(number_in(0, 1));
  app->add_option("--epsilon-end", o->fsm.epsilon_end, "... to this one at the last")
      ->capture_default_str()
      ->check(number_in(0, 1));
  app->add_option("--rollouts-per-round", o->fsm.rollouts_per_round,
                  "rollouts run in parallel against one table between updates")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  app->add_flag("--no-blocks", o->no_blocks,
                "op-level graphs (as edbatch run --no-blocks): their types differ from the block "
                "path's, so train and run alike");
  app->add_option("--eval-data", o->eval_data,
                  "a data file the trainer never sees: after training, its consecutive "
                  "mini-batches are scheduled under each policy and compared");
  app->add_option("--eval-batches", o->eval_batches,
                  "at most this many --eval-data mini-batches (0: all)")
      ->capture_default_str();
  app->add_option("--device", o->device,
                  "the reward: none counts batches; cpu or cuda measures per-type costs on that "
                  "device (forward passes over --cost-graphs training mini-batches) and "
                  "minimises the predicted time")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "cpu", "cuda"}));
  app->add_option("--combine", o->combine,
                  "how the time reward adds batch costs up: sum (one batch after another, as on "
                  "the CPU), chain (the critical chain of batches waiting for the batches they "
                  "read, as the GPU's stages run) or auto (chain on cuda, else sum)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "sum", "chain"}));
  app->add_option("--costs", o->costs,
                  "take the time reward's costs from this policy file (trained with --device "
                  "cpu|cuda, e.g. on another machine) instead of measuring them");
  app->add_option("--batch-us", o->batch_us,
                  "chain costs: microseconds every batch adds in series, whatever runs beside "
                  "it. Several values (0.25,1): a policy each, all timed forward on the "
                  "validation mini-batches on --device, the fastest kept. auto: the file's "
                  "(--costs); measured here, the fit's (at least 0.25: the fit cannot see that "
                  "the stages beside the chain share the device), twice and four times it, the "
                  "fastest kept")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            if (text == "auto") return "";
            const std::vector<std::string> parts = batch_us_parts(text);
            bool ok = !parts.empty();
            for (const std::string& v : parts) ok = ok && number_in(0, 1e6)(v).empty();
            return ok ? ""
                      : "expected auto, a number in [0, 1e6] or a list of them (0.25,1), got '" +
                            text + "'";
          },
          "auto|US[,US...]"));
  app->add_option("--cost-graphs", o->cost_graphs, "mini-batches the costs are measured on")
      ->capture_default_str()
      ->check(CLI::Range(2u, 1024u));
  app->add_option("--cost-reps", o->cost_reps, "timed forward passes per policy and mini-batch")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  app->add_option("--threads", o->threads, "CPU threads of the cost measurement")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  app->add_flag("--no-scorer", o->no_scorer,
                "no scorer: unseen states fall back to lb-greedy (version 1 behaviour)");
  app->add_flag("--no-table", o->no_table, "the scorer alone (no Q-learning, no table search)");
  app->add_option("--scorer-steps", o->fsm.scorer_steps,
                  "gradient steps of the scorer's imitation of the teacher")
      ->capture_default_str();
  app->add_option("--scorer-search", o->fsm.scorer_search,
                  "evaluations of the search over the scorer's weights on the training cost")
      ->capture_default_str();
  app->add_option("--time-budget", o->fsm.time_budget_s,
                  "seconds of training (of each policy, with several --batch-us values), "
                  "counted after any cost measurement; past them "
                  "training stops (checked between stages and within each) and keeps the best "
                  "so far (0: none)")
      ->capture_default_str()
      ->check(number_in(0, 1e9));
  app->add_flag("--no-teacher", o->no_teacher,
                "skip the beam-search teacher (Q-learning and the table search only)");
  app->add_option("--beam", o->fsm.beam_width, "beam width of the teacher")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 12));
  app->add_option("--refine-passes", o->fsm.refine_passes,
                  "passes of the table search on the training mini-batches (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  app->add_option("--refine-states", o->fsm.refine_states,
                  "states tried per pass of the table search, most visited first")
      ->capture_default_str();
  app->footer(
      "Training: a beam search bounded by the lower bound plans each training mini-batch (with "
      "chain costs, ranked by lb-greedy's completion of each candidate); a linear scorer over "
      "per-type frontier features imitates it and is searched on the training cost, then a "
      "table of states (the scorer deciding where it has no entry) imitates the plans; "
      "Q-learning (n-step, epsilon-greedy, reward -1 + the share of the type's critical nodes in "
      "the batch) and a search over table entries refine it. The table kept is the best by "
      "batches (with costs: predicted time) on the validation mini-batches; training stops "
      "early within 1% of the lower bound.\n"
      "Exit codes: 0 ok, 1 runtime error (data, files), 2 usage error. Progress goes to stderr, "
      "the summary to stdout. Ctrl-C (or SIGTERM, SIGHUP) stops training at its next check and "
      "writes "
      "the best policy so far; a second Ctrl-C stops at once.");
  return Command{app, [o, app] {
                   warn_unused(*app, {"--eval-batches"}, !o->eval_data.empty(),
                               "without --eval-data");
                   return train(*o);
                 }};
}

}  // namespace edbatch::cli
