// The model zoo: every model of docs/models.md behind one interface, the data sets they read, and
// the seeded random DAGs of `random_dag`. `edbatch run` is a thin layer over this header.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edbatch/data.h"
#include "edbatch/engine.h"
#include "edbatch/graph.h"
#include "edbatch/packed.h"
#include "edbatch/params.h"

namespace edbatch {

namespace zoo {
class Sink;
}

// ---- Random DAGs ----

struct DagArc {
  uint32_t from;  // an earlier state
  uint8_t type;   // arc type, below DagOptions::arc_types
};

// States in topological order; arcs into state k are arcs[arc_begin[k] .. arc_begin[k+1]).
struct Dag {
  std::vector<uint8_t> state_types;  // below DagOptions::state_types
  std::vector<uint32_t> inputs;      // a vocabulary id per state (its input x)
  std::vector<uint8_t> labels;       // below DagOptions::labels
  std::vector<uint32_t> arc_begin;   // size() + 1 entries
  std::vector<DagArc> arcs;
  uint32_t size() const { return static_cast<uint32_t>(state_types.size()); }
};

struct DagOptions {
  uint32_t min_states = 150, max_states = 250;  // uniform: 200 on average
  uint32_t max_in_degree = 4;  // every state but the first reads 1..max_in_degree earlier ones
  uint32_t window = 32;        // ... among the `window` states before it (keeps the DAGs deep)
  uint32_t arc_types = 2, state_types = 3, labels = 5;
};

// Deterministic for a seed. Throws std::invalid_argument for inconsistent options.
std::vector<Dag> synthetic_dags(uint32_t n, uint64_t seed, uint32_t vocab_size = 256,
                                const DagOptions& options = {});

// ---- Data sets ----

enum class DataKind { Trees, Lattices, Tagged, Dags, Pairs };
const char* data_kind_name(DataKind kind);  // "trees", "lattices", ...

struct Dataset {
  DataKind kind = DataKind::Trees;
  std::string source;  // the spec it was loaded from
  std::vector<Tree> trees;
  std::vector<Lattice> lattices;
  TaggedData tagged;
  std::vector<Dag> dags;
  std::vector<SentencePair> pairs;
  uint32_t size() const;  // instances of `kind`
};

// `spec` is "synthetic:N" (seeded generators of data.h / synthetic_dags) or a file in the
// format of data.h; sentence pairs are "SOURCE,TARGET", two files whose vocabularies are
// vocab.<extension> beside them (tst2012.en,tst2012.vi: vocab.en, vocab.vi), see load_pairs. Throws std::invalid_argument for a malformed spec (naming it) and for data
// errors (file:line:col from the loaders); DAGs come only from "synthetic:N".
// With `vocabulary`, a file's words and tags continue its numbering (see Vocabulary).
Dataset load_dataset(DataKind kind, const std::string& spec, uint32_t vocab_size, uint64_t seed,
                     Vocabulary* vocabulary = nullptr);

// A training set and a held-out set in one Dataset, so that one model (one collection of
// parameters) runs both: instances [0, *train_size) come from `train_spec`, the rest from
// `heldout_spec`. Files share one Vocabulary, so held-out words and tags get the training set's
// ids (new ones continue the numbering: a tag only the held-out file has gets an output class of
// its own); a synthetic held-out set is drawn with its own seed (heldout_seed(seed)), so it is
// not a copy of a synthetic training set, and keeps the training set's spellings. With
// `vocabulary`, both files continue its numbering (as load_dataset's).
Dataset load_dataset_with_heldout(DataKind kind, const std::string& train_spec,
                                  const std::string& heldout_spec, uint32_t vocab_size,
                                  uint64_t seed, uint32_t* train_size,
                                  Vocabulary* vocabulary = nullptr);
uint64_t heldout_seed(uint64_t seed);
// The most embedding rows (and output classes) a vocabulary may have: ids and argmax indices
// must be exact as floats.
constexpr uint32_t kMaxVocabulary = 1u << 24;
// The most instances "synthetic:N" may ask for.
constexpr uint32_t kMaxSyntheticInstances = 100000000;
// One more than the largest word (or arc, or input) id of the data set: the embedding rows a model
// needs for data loaded without folding (vocab_size 0). At least 1 (sentence pairs: 4, the
// special ids and a word). Throws std::invalid_argument naming the instance and the id when that
// is more than kMaxVocabulary.
uint32_t data_vocabulary(const Dataset& data);

// ---- Models ----

// Greedy decoding (Model::decode): a sentence stops at its own </s> or after
// min(max_len, 2 |source| + 2) tokens.
struct DecodeOptions {
  uint32_t max_len = 100;
};
struct Decoded {
  std::vector<uint32_t> tokens;  // the </s> it stopped at included
  double score = 0;              // sum of the tokens' log-probabilities
};

struct ModelOptions {
  uint32_t hidden = 128;  // hidden size = embedding size
  uint32_t vocab = 256;   // rows of the embedding tables; data ids must be below it
  bool blocks = true;     // build through blocks (build_blocks), else op by op
  // With blocks: record each instance's calls into a PackedGraph and append them in bulk (the
  // same graph as per-node Block::calls; not faster for the zoo's per-instance builds,
  // docs/performance.md); false: one Block::call per node.
  bool packed = false;
  uint64_t seed = 1;      // structural coins (double_typed_tree_lstm)
  bool char_embeddings = false;  // bilstm_tagger: character BiLSTM for rare words
  uint32_t rare_below = 5;       // ... words seen fewer times than this in the data set
  uint32_t char_vocab = 128;     // ... rows of the character table (see docs/models.md)
  // Instances [0, train_instances) are the training set (0: all of them); statistics of the data
  // (bilstm_tagger's rare words) come from those only, not from held-out instances after them.
  uint32_t train_instances = 0;
};

// One model over one data set. Adds its parameters to the collection it is made with (one
// collection per model: names are unique per collection). The data set must outlive it.
class Model {
 public:
  Model(std::string name, ParameterCollection& pc, const ModelOptions& options);
  virtual ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& name() const { return name_; }
  const ModelOptions& options() const { return options_; }
  ParameterCollection& params() const { return pc_; }
  virtual uint32_t size() const = 0;         // instances in the data set
  virtual uint32_t num_classes() const = 0;  // rows of W_out
  // The model's equations, one per line.
  virtual std::string math() const = 0;
  // Name, every tensor of the collection with its shape, and math().
  std::string describe() const;

  // Adds instance `instance` to `g` and returns its loss: the sum over its loss nodes of
  // pick_neg_log_softmax(W_out h, label). With `logits`, appends each loss node's W_out h in the
  // order of labels(instance). Op by op, or through build_blocks when options().blocks.
  Expr build(Graph& g, uint32_t instance, std::vector<Expr>* logits = nullptr);
  // Gold labels of the instance's loss nodes.
  virtual std::vector<uint32_t> labels(uint32_t instance) const = 0;

  // Sequence-to-sequence models (lstm_nmt) decode: greedy decoding of `instances` into `g`
  // (cleared first) with incremental forwards on `engine`, one step for all sentences still
  // running; each sentence's next input is the argmax of its own last step. Others throw.
  virtual bool decodes() const { return false; }
  virtual std::vector<Decoded> decode(Engine& engine, Graph& g,
                                      const std::vector<uint32_t>& instances,
                                      const DecodeOptions& options = {});

 protected:
  virtual Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) = 0;
  // The block path: each structure node is one call of a compiled cell (same math as build_ops).
  // Nodes go through `sink`: per node into the graph, or into a PackedGraph (options().packed).
  virtual Expr build_blocks(zoo::Sink& sink, uint32_t instance, std::vector<Expr>* logits) = 0;
  void check_instance(uint32_t instance) const;
  // trees[instance], checked (zoo::check_tree) the first time this model builds it: a data set
  // built over many epochs is checked once, not at every build.
  const Tree& checked_tree(const std::vector<Tree>& trees, uint32_t instance);
  // -log softmax(W_out h)[label], recording W_out h in `logits` when given.
  Expr node_loss(Graph& g, Parameter W_out, const Expr& h, uint32_t label,
                 std::vector<Expr>* logits) const;

  ParameterCollection& pc_;
  ModelOptions options_;

 private:
  std::string name_;
  std::vector<uint8_t> tree_checked_;  // by instance: checked_tree passed
  PackedGraph run_;  // the packed block build's run, reused
};

// tree_lstm, tree_gru, double_typed_tree_lstm, mvrnn, lattice_lstm, lattice_gru, bilstm_tagger,
// lstm_nmt, random_dag.
const std::vector<std::string>& model_names();
// The data a model reads; throws std::invalid_argument for an unknown model, listing the names.
DataKind model_data_kind(const std::string& model);
// Throws std::invalid_argument for an unknown model or data of the wrong kind.
std::unique_ptr<Model> make_model(const std::string& name, ParameterCollection& pc,
                                  const Dataset& data, const ModelOptions& options);

// argmax of each logit vector after a forward on `engine` (empty with the null device).
std::vector<uint32_t> predicted_labels(const Engine& engine, const std::vector<Expr>& logits);

}  // namespace edbatch
