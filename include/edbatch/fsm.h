// The learned FSM batching policy: a table from an encoding of the ready frontier to the type to
// run next, and a linear scorer over per-type frontier features that decides where the table has
// no entry (it generalises to unseen mini-batches). Trained offline over many mini-batches
// (fsm/fsm_train.cpp), saved to a versioned policy file keyed by type names, loaded by
// `make_policy("fsm:FILE")`; `make_policy("auto")` learns one on first use and caches it
// (fsm/fsm_auto.cpp). Without a scorer, unseen states fall back to lb-greedy.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "edbatch/schedule.h"

namespace edbatch {

class Graph;
class ParameterCollection;
struct EngineOptions;

// How a frontier becomes a table key. Type ids in keys are indices into the policy's type names.
//   set:     the set of ready types (at most 128 types)
//   sorted:  the ready types ordered by ready count, most first, ties by index (the first
//            16; at most 254 types)
//   set+top: the set plus the type with the most ready nodes (at most 120 types)
//   cover:   the set plus, per ready type, how much of its critical nodes (those on its longest
//            remaining chain) is ready: none, under half, half or more, all (at most 32 types)
enum class FsmEncoding : uint8_t { Set, Sorted, SetTop, Cover };
const char* fsm_encoding_name(FsmEncoding e);
FsmEncoding parse_fsm_encoding(const std::string& name);  // throws std::invalid_argument
uint32_t fsm_encoding_max_types(FsmEncoding e);

struct FsmKey {
  uint64_t lo = 0, hi = 0;
  bool operator==(const FsmKey& o) const { return lo == o.lo && hi == o.hi; }
};
struct FsmKeyHash {
  size_t operator()(const FsmKey& k) const {
    uint64_t h = k.lo * 0x9E3779B97F4A7C15ull ^ (k.hi + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
    return static_cast<size_t>(h ^ (h >> 31));
  }
};

// `ids` (type indices, distinct), `counts` (ready nodes) and `levels` (coverage levels, read by
// `cover` only) of the r ready types, in any order. `scratch` holds at least r entries. Ids must
// be below fsm_encoding_max_types(e).
FsmKey fsm_encode(FsmEncoding e, const uint32_t* ids, const uint32_t* counts,
                  const uint32_t* levels, uint32_t r, uint32_t* scratch);
// 0: no critical node ready, 1: under half, 2: half or more, 3: all of them.
inline uint32_t fsm_coverage_level(uint32_t critical_ready, uint32_t critical_total) {
  return (critical_ready > 0) + (2 * critical_ready >= critical_total) +
         (critical_ready >= critical_total);  // branch-free; critical_total > 0
}

// Open addressing, linear probing: O(1) average lookups with no allocation.
class FsmTable {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  void insert(const FsmKey& key, uint32_t action);  // replaces an existing entry
  uint32_t find(const FsmKey& key) const {
    if (keys_.empty()) return kNone;
    for (size_t i = FsmKeyHash()(key) & mask_;; i = (i + 1) & mask_) {
      if (actions_[i] == kNone) return kNone;
      if (keys_[i] == key) return actions_[i];
    }
  }
  uint32_t size() const { return size_; }
  // Every entry, in slot order.
  void for_each(const std::function<void(const FsmKey&, uint32_t)>& f) const;

 private:
  void grow();
  std::vector<FsmKey> keys_;
  std::vector<uint32_t> actions_;
  size_t mask_ = 0;
  uint32_t size_ = 0;
};

// ---- The scorer: the generalising part of a learned policy ----

// Features of one ready type t in a frontier (all scale-free, so they transfer across mini-batch
// sizes): 0 share = critical_ready / critical_total; 1 full = all critical nodes ready; 2 log2(1 +
// ready count); 3 remaining bound / the largest among ready types; 4 average depth relative to
// the ready types' (0 shallowest, 1 deepest); 5 slack = ready nodes off the critical level /
// ready; 6 longest = has the largest remaining bound; 7 full x feature 3.
constexpr uint32_t kFsmFeatures = 8;
const char* fsm_feature_name(uint32_t i);

// Score of t = weights . features(t) + type_bias[t's index]; the policy runs the highest score
// (ties: lb-greedy's order). Costs a pass over the ready types per decision.
struct FsmScorer {
  std::vector<double> weights;    // kFsmFeatures of them; empty: no scorer
  std::vector<double> type_bias;  // per index into the policy's types (0 for unknown types)
  bool empty() const { return weights.empty(); }
};

// One ready type as the scorer sees it.
struct ReadyView {
  uint32_t type;   // what the caller chooses by (a graph or local type id)
  uint32_t tie;    // the graph's type id: ties go as lb-greedy breaks them
  uint32_t index;  // into the scorer's type_bias (UINT32_MAX: none)
  uint32_t ready, critical_ready, critical_total, bound;
  double depth;    // the type's average depth
};
// The features of the r ready types, r x kFsmFeatures, row by row.
void fsm_features(const ReadyView* v, uint32_t r, double* out);
// The position in v of the highest score (ties: larger share, then lower depth, then lower tie).
// `features` is scratch for r x kFsmFeatures doubles.
uint32_t fsm_score_choice(const FsmScorer& s, const ReadyView* v, uint32_t r, double* features);

// ---- Costs: the time reward ----

// Predicted time of a batch of `n` nodes of a type: launch_us + n * node_us.
struct FsmTypeCost {
  double launch_us = 1, node_us = 0;
};
// Per-type costs measured on a device (measure_type_costs). Empty (no types): every batch costs
// 1, so the reward counts batches.
struct FsmCostModel {
  std::string device;  // where the costs were measured
  std::vector<std::string> types;
  std::vector<FsmTypeCost> costs;  // per entry of types
  // How batch costs combine into a schedule's time. false: they add up (one batch after
  // another, as on the CPU). true: the critical chain, as on a GPU whose stages wait only for
  // the stages they read (docs/cuda.md): a batch starts once every batch it reads from has
  // finished, and the schedule takes as long as its longest chain of batches, plus `batch_us`
  // for every batch (what each adds in series whatever runs beside it: its launch, its stage's
  // place in the launch).
  bool chain = false;
  double batch_us = 0;
  bool empty() const { return types.empty(); }
  // A type not in the model costs the mean of the model's types (1, 0 when empty).
  FsmTypeCost of(const std::string& type_name) const;
  // Predicted microseconds of a schedule of `g`: the sum over its batches, or with `chain` the
  // end of its last batch.
  double predicted_us(const Graph& g, const Schedule& s) const;
};

// Measures per-type costs on the engine's device by regression: every graph runs forward under
// several policies (lb-greedy, agenda, depth and seeded random orders; `reps` times each, the
// median kept), and the forward time (device time on a GPU, execution time on the CPU) is fitted
// by non-negative least squares to sum over types (launch_us x batches + node_us x nodes) plus
// a constant. With `chain` the sums run along each schedule's critical chain of batches, which
// depends on the costs, plus batch_us times all its batches: the fit starts from the sum model's
// costs and is repeated on the chains of the last fit's costs until they no longer change (at
// most 8 rounds). `loss` is the
// expression each graph runs (its summed loss). The graphs must be built over `params`. When
// `stop` returns true between two passes, measuring ends and no costs are returned.
FsmCostModel measure_type_costs(ParameterCollection& params, const std::vector<Graph*>& graphs,
                                const EngineOptions& device, uint32_t reps = 3, uint64_t seed = 1,
                                bool chain = false, const std::function<bool()>& stop = {});
// The forward time of each policy on the engine's device, in microseconds: the mean over
// `graphs` of each graph's median of `reps` timed passes (after one untimed round), the policies
// alternating graph by graph. Each pass runs a graph's last expression (its summed loss); device
// time on a GPU, execution time on the CPU. Empty when `stop` returns true between two passes.
std::vector<double> measure_policy_times(ParameterCollection& params,
                                         const std::vector<Graph*>& graphs,
                                         std::vector<std::unique_ptr<Policy>> policies,
                                         const EngineOptions& device, uint32_t reps,
                                         const std::function<bool()>& stop = {});
// The fit itself, on given forward times (microseconds) of `schedules` of `graphs` (one sample
// per entry, graphs repeated as needed): per-type costs of the types the graphs schedule.
FsmCostModel fit_type_costs(const std::vector<const Graph*>& graphs,
                            const std::vector<Schedule>& schedules,
                            const std::vector<double>& times_us, bool chain);

// Everything a policy file holds besides the table.
struct FsmPolicyInfo {
  std::string model;  // the zoo model (or another name for graphs built elsewhere)
  uint32_t hidden = 0;
  FsmEncoding encoding = FsmEncoding::Cover;
  std::vector<std::string> types;  // the type names the table's indices refer to
  // Block types' names carry their shapes ("block:name(8,8->16)"); files before version 3 name
  // them without ("block:name"), and a graph's block types match those by name alone.
  bool block_shapes = true;
  std::string training;  // training settings, a JSON object as text
  double validation_batches = 0;   // mean batches per validation mini-batch
  double validation_lower_bound = 0;
  std::string validation;  // the validation comparison, a JSON object as text
};

struct FsmPolicyData {
  FsmPolicyInfo info;
  FsmTable table;      // key -> index into info.types
  FsmScorer scorer;    // decides where the table has no entry; empty: lb-greedy does
  FsmCostModel costs;  // what the training minimised (empty: batches)
};

// Version 2 added the scorer and the costs, version 3 block types' shapes; version 1 files
// (tables alone) and version 2 files still load.
constexpr uint32_t kFsmFormatVersion = 3;
// JSON; the format is described in docs/policies.md. Throws std::runtime_error when the file
// cannot be written or read, is not a policy file, has a format version this build does not
// read, or is corrupt or truncated, naming the file and what is wrong.
void save_fsm_policy(const std::string& path, const FsmPolicyData& policy);
FsmPolicyData load_fsm_policy(const std::string& path);
// The file's text, and reading it from memory (`source_name` names it in errors).
std::string fsm_policy_json(const FsmPolicyData& policy);
FsmPolicyData parse_fsm_policy(const std::string& text, const std::string& source_name);

class FsmPolicy : public Policy {
 public:
  // `source` names the policy in error messages (the file).
  FsmPolicy(FsmPolicyData data, std::string source = "<memory>");
  const char* name() const override { return name_.c_str(); }
  // Maps the file's type names to the graph's type ids; throws std::invalid_argument naming the
  // graph's types that the file does not know (and the file's types this graph lacks).
  void begin(const Graph& g) override;
  uint32_t choose(const Frontier& f) override;
  Lookups lookups() const override { return lookups_; }
  const FsmPolicyData& data() const { return data_; }

 private:
  uint32_t fallback(const Frontier& f);
  FsmPolicyData data_;
  std::string source_, name_;
  std::unique_ptr<Policy> fallback_;
  bool cover_;
  Lookups lookups_;
  uint64_t mapped_table_ = 0;  // the serial of the TypeTable the maps below were made for ...
  uint32_t mapped_size_ = 0;   // ... and its size then
  std::unordered_map<std::string, uint32_t> index_;  // the file's type name -> index
  bool unknown_ = false;                // a scheduled type of the table is not among the file's
  std::vector<uint32_t> local_of_;      // graph type id -> index into the file's types
  std::vector<uint32_t> global_of_;     // index -> graph type id (UINT32_MAX when absent)
  std::vector<uint32_t> ids_, counts_, scratch_;
  std::vector<ReadyView> views_;  // the scorer's scratch
  std::vector<double> features_;
};

// ---- Training ----

// Settings of train_fsm_policy (docs/policies.md describes the method).
struct FsmTrainOptions {
  FsmEncoding encoding = FsmEncoding::Cover;
  uint32_t episodes = 400;       // Q-learning rollouts (each one training mini-batch)
  uint32_t rollouts_per_round = 16;  // rollouts run in parallel against one frozen table
  uint32_t n_step = 4;           // n-step returns
  double alpha = 0.3, gamma = 1.0;
  double epsilon_start = 0.3, epsilon_end = 0.02;  // linear over the episodes
  bool teacher = true;           // imitate a beam search bounded by the lower bound first
  uint32_t beam_width = 16;
  // Then a search in table space: per visited state (most visited first, at most refine_states
  // per pass), the action with the fewest batches on the training mini-batches that visit it.
  uint32_t refine_passes = 1, refine_states = 300;
  double early_stop = 0.01;      // stop once validation batches <= (1 + this) * lower bound
  uint32_t eval_every = 1;       // rounds between validations
  uint64_t seed = 1;
  // The scorer: imitation of the teacher's plans (softmax over the ready types, full-batch
  // gradient steps), then a seeded (1+1) search over its weights on the training cost.
  bool scorer = true;
  uint32_t scorer_steps = 300, scorer_search = 120;
  bool table = true;           // false: the scorer alone (no Q-learning, no table search)
  FsmCostModel costs;          // the reward: predicted time; empty: batches
  // Wall-clock limit in seconds (0: none). Past it, the search and the later stages stop and
  // the best candidate so far is kept; results then depend on the machine's speed.
  double time_budget_s = 0;
  // Asked to stop (the command line sets it on Ctrl-C): when it returns true, training ends as
  // at the time budget, with the best candidate so far. Called from the training thread only.
  std::function<bool()> stop;
};

struct FsmCurvePoint {
  // The candidate measured: "lb-greedy", "scorer", "teacher" (the table of the teacher's
  // votes), "q-learning" or "search".
  const char* stage = "";
  uint32_t episode = 0;           // rollouts done
  double mean_batches = 0;        // over the training mini-batches (Q-learning: its rollouts)
  double validation_batches = 0;  // mean over the validation mini-batches (greedy table)
  double lower_bound = 0;         // mean over the validation mini-batches
};

struct FsmTrainResult {
  FsmPolicyData policy;  // the best table by validation batches (info.types set; model/hidden
                         // left to the caller)
  std::vector<FsmCurvePoint> curve;
  double teacher_batches = 0;  // mean batches of the beam search on the validation set (0: none
                               // ran, or it was cut short)
  double teacher_cost = 0;     // ... and its mean cost (batches, or the predicted time)
  double validation_cost = 0;  // mean predicted cost of the kept policy (= batches without costs)
  uint32_t episodes_run = 0;
  std::string best_source;  // "lb-greedy" (empty table), "teacher", "q-learning" or "search"
  // A stage was cut short or skipped by the time budget or stop(), not by reaching the bound.
  bool out_of_time = false;
};

// Each graph is one mini-batch; all must share one TypeTable (one ParameterCollection) and outlive
// the call. Deterministic for options.seed at any thread count. Throws std::invalid_argument for
// empty lists, zero widths or counts, and more types than the encoding supports.
FsmTrainResult train_fsm_policy(const std::vector<const Graph*>& train,
                                const std::vector<const Graph*>& validation,
                                const FsmTrainOptions& options,
                                const std::function<void(const FsmCurvePoint&)>& progress = {});

// ---- Workloads: mini-batch graphs of a zoo model for training and comparison ----

class Model;

struct FsmWorkload {
  std::vector<std::unique_ptr<Graph>> train, validation;
  std::vector<const Graph*> train_graphs() const;
  std::vector<const Graph*> validation_graphs() const;
};

// Shuffles the instances with `seed` and holds out the last fifth (at least one instance) for
// validation: `validation_batches` consecutive mini-batches of it (fewer when it is short). The
// `train_batches` training mini-batches each draw `batch` distinct instances from the rest
// (all instances when the data set has only one). Throws std::invalid_argument when empty.
FsmWorkload make_fsm_workload(Model& model, uint32_t batch, uint32_t train_batches,
                              uint32_t validation_batches, uint64_t seed);
// The same with training mini-batches of several sizes: training mini-batch b draws
// train_sizes[b % train_sizes.size()] instances (a policy that meets other mini-batch sizes than
// the one it was trained at). Validation mini-batches are of `batch` instances.
FsmWorkload make_fsm_workload(Model& model, uint32_t batch,
                              const std::vector<uint32_t>& train_sizes, uint32_t train_batches,
                              uint32_t validation_batches, uint64_t seed);

// Mean batches per graph under a policy, with the Scheduler (the run-time path); `cost_us`, when
// given, receives the mean predicted time under `costs`.
double mean_batches(const std::vector<const Graph*>& graphs, Policy& policy,
                    const FsmCostModel* costs = nullptr, double* cost_us = nullptr);
double mean_lower_bound(const std::vector<const Graph*>& graphs);

// ---- auto: a policy learned on first use ----

// make_policy("auto", context) (PolicyContext in schedule.h): at its first graph, looks in the
// cache directory for a policy keyed by the graph's scheduled type names (which carry the hidden
// size) and the device; when there is none, or it is corrupt or stale (another format, other
// types, another device: a warning says so), trains a scorer on that graph within
// context.auto_budget_s (0: no limit), writes it to the cache and uses it. When lb-greedy is
// already at the lower bound on that graph, the next graphs are tried (up to 8, within the same
// budget) before the empty result (lb-greedy) is cached; each is looked up under its own key
// first, and what is learned is cached under the key of the graph it was learned on. Later
// graphs with types it does not know run lb-greedy. `trained()` says whether this instance
// trained.
class AutoPolicy : public Policy {
 public:
  explicit AutoPolicy(PolicyContext context);
  const char* name() const override { return "auto"; }
  void begin(const Graph& g) override;
  uint32_t choose(const Frontier& f) override;
  Lookups lookups() const override;
  bool trained() const { return trained_; }
  double training_s() const { return training_s_; }
  // The entry looked up for the last graph before one was found or learned: the file the
  // policy was read from or written to.
  const std::string& cache_path() const { return path_; }
  static std::string cache_key(const Graph& g, const std::string& device);

 private:
  void warn(const std::string& what) const;
  void learn(const Graph& g);
  void load_cached(const Graph& g);
  PolicyContext context_;
  std::unique_ptr<FsmPolicy> learned_;
  std::unique_ptr<Policy> fallback_;
  Policy* current_ = nullptr;
  std::string dir_, path_;
  std::vector<std::string> looked_up_;  // entries already read (or found missing)
  bool started_ = false, trained_ = false;
  uint32_t attempts_ = 0;
  double training_s_ = 0;
};

}  // namespace edbatch
