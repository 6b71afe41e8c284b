// The Model base, the registry of model names, and data sets by spec.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include "edbatch/models.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch {

namespace {

using Factory = std::unique_ptr<Model> (*)(ParameterCollection&, const Dataset&,
                                           const ModelOptions&);
struct Entry {
  const char* name;
  DataKind kind;
  Factory make;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = {
      {"tree_lstm", DataKind::Trees, zoo::make_tree_lstm},
      {"tree_gru", DataKind::Trees, zoo::make_tree_gru},
      {"double_typed_tree_lstm", DataKind::Trees, zoo::make_double_typed_tree_lstm},
      {"mvrnn", DataKind::Trees, zoo::make_mvrnn},
      {"lattice_lstm", DataKind::Lattices, zoo::make_lattice_lstm},
      {"lattice_gru", DataKind::Lattices, zoo::make_lattice_gru},
      {"bilstm_tagger", DataKind::Tagged, zoo::make_bilstm_tagger},
      {"lstm_nmt", DataKind::Pairs, zoo::make_lstm_nmt},
      {"random_dag", DataKind::Dags, zoo::make_random_dag},
  };
  return entries;
}

const Entry& find_model(const std::string& name, const char* fn) {
  for (const Entry& e : registry())
    if (name == e.name) return e;
  std::string known;
  for (const std::string& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument(
      fmt::format("[{}] unknown model '{}' (known: {})", fn, name, known));
}

}  // namespace

const char* data_kind_name(DataKind kind) {
  switch (kind) {
    case DataKind::Trees: return "trees";
    case DataKind::Lattices: return "lattices";
    case DataKind::Tagged: return "tagged sentences";
    case DataKind::Dags: return "DAGs";
    case DataKind::Pairs: return "sentence pairs";
  }
  return "?";
}

uint32_t Dataset::size() const {
  switch (kind) {
    case DataKind::Trees: return static_cast<uint32_t>(trees.size());
    case DataKind::Lattices: return static_cast<uint32_t>(lattices.size());
    case DataKind::Tagged: return static_cast<uint32_t>(tagged.sentences.size());
    case DataKind::Dags: return static_cast<uint32_t>(dags.size());
    case DataKind::Pairs: return static_cast<uint32_t>(pairs.size());
  }
  return 0;
}

Dataset load_dataset(DataKind kind, const std::string& spec, uint32_t vocab_size, uint64_t seed,
                     Vocabulary* vocabulary) {
  Dataset d;
  d.kind = kind;
  d.source = spec;
  const std::string prefix = "synthetic:";
  if (spec.rfind(prefix, 0) == 0) {
    const std::string count = spec.substr(prefix.size());
    size_t used = 0;
    unsigned long n = 0;
    try {
      n = std::stoul(count, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (count.empty() || used != count.size() || count[0] == '-' || n == 0 ||
        n > kMaxSyntheticInstances)
      throw std::invalid_argument(fmt::format(
          "[load_dataset] expected synthetic:N with N in 1..10^8 but found '{}'", spec));
    const uint32_t count32 = static_cast<uint32_t>(n);
    switch (kind) {
      case DataKind::Trees: d.trees = synthetic_trees(count32, seed, vocab_size); break;
      case DataKind::Lattices: d.lattices = synthetic_lattices(count32, seed, vocab_size); break;
      case DataKind::Tagged:
        d.tagged.sentences = synthetic_tagged(count32, seed, vocab_size);
        d.tagged.spellings = synthetic_spellings(vocab_size, seed);
        d.tagged.num_tags = 18;
        break;
      case DataKind::Dags: d.dags = synthetic_dags(count32, seed, vocab_size); break;
      case DataKind::Pairs: d.pairs = synthetic_pairs(count32, seed, vocab_size); break;
    }
    return d;
  }
  switch (kind) {
    case DataKind::Trees:
      d.trees = load_trees(spec, vocab_size, vocabulary);
      break;
    case DataKind::Lattices: d.lattices = load_lattices(spec, vocab_size); break;
    case DataKind::Tagged:
      d.tagged = load_tagged(spec, vocab_size, vocabulary);
      break;
    case DataKind::Dags:
      throw std::invalid_argument(fmt::format(
          "[load_dataset] DAGs have no file format: use synthetic:N, not '{}'", spec));
    case DataKind::Pairs:
      d.pairs = load_pair_files(spec, vocab_size, vocabulary);
      break;
  }
  if (d.size() == 0)
    throw std::invalid_argument(fmt::format("[load_dataset] '{}' holds no {}", spec,
                                            data_kind_name(kind)));
  return d;
}

uint64_t heldout_seed(uint64_t seed) {
  return zoo::mix64(seed ^ 0x68656c646f7574ull);
}

Dataset load_dataset_with_heldout(DataKind kind, const std::string& train_spec,
                                  const std::string& heldout_spec, uint32_t vocab_size,
                                  uint64_t seed, uint32_t* train_size, Vocabulary* vocabulary) {
  Vocabulary own;
  Vocabulary& v = vocabulary ? *vocabulary : own;
  Dataset d = load_dataset(kind, train_spec, vocab_size, seed, &v);
  Dataset h = load_dataset(kind, heldout_spec, vocab_size, heldout_seed(seed), &v);
  if (uint64_t{d.size()} + h.size() > UINT32_MAX)
    throw std::invalid_argument("[load_dataset_with_heldout] more than 2^32 - 1 instances");
  *train_size = d.size();
  auto append = [](auto& to, auto& from) {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  };
  append(d.trees, h.trees);
  append(d.lattices, h.lattices);
  append(d.dags, h.dags);
  append(d.tagged.sentences, h.tagged.sentences);
  append(d.pairs, h.pairs);
  if (kind == DataKind::Tagged) {
    d.tagged.num_tags = std::max(d.tagged.num_tags, h.tagged.num_tags);
    // A file read last holds the vocabulary's names and spellings so far.
    if (h.tagged.tag_names.size() > d.tagged.tag_names.size())
      d.tagged.tag_names = std::move(h.tagged.tag_names);
    if (h.tagged.spellings.size() > d.tagged.spellings.size() &&
        heldout_spec.rfind("synthetic:", 0) != 0)
      d.tagged.spellings = std::move(h.tagged.spellings);
  }
  return d;
}

uint32_t data_vocabulary(const Dataset& data) {
  uint32_t top = 0;
  size_t at = 0;  // the instance holding `top`
  const auto see = [&](uint32_t id, size_t instance) {
    if (id <= top) return;
    top = id;
    at = instance;
  };
  for (size_t i = 0; i < data.trees.size(); ++i)
    for (const TreeNode& n : data.trees[i].nodes)
      if (n.leaf()) see(n.word, i);
  for (size_t i = 0; i < data.lattices.size(); ++i)
    for (const LatticeArc& a : data.lattices[i].arcs) see(a.id, i);
  for (size_t i = 0; i < data.tagged.sentences.size(); ++i)
    for (uint32_t w : data.tagged.sentences[i].words) see(w, i);
  for (size_t i = 0; i < data.dags.size(); ++i)
    for (uint32_t x : data.dags[i].inputs) see(x, i);
  for (size_t i = 0; i < data.pairs.size(); ++i) {
    for (uint32_t w : data.pairs[i].source) see(w, i);
    for (uint32_t w : data.pairs[i].target) see(w, i);
  }
  // 64 bits: the largest id + 1 must not wrap to 0.
  const uint64_t rows = std::max<uint64_t>(uint64_t{top} + 1, data.kind == DataKind::Pairs ? 4 : 1);
  if (rows > kMaxVocabulary)
    throw std::invalid_argument(fmt::format(
        "[data_vocabulary] word id {} (instance {}) needs {} embedding rows, a row per id: "
        "more than the limit of {}",
        top, at, rows, kMaxVocabulary));
  return static_cast<uint32_t>(rows);
}

// ---- Model ----

Model::Model(std::string name, ParameterCollection& pc, const ModelOptions& options)
    : pc_(pc), options_(options), name_(std::move(name)) {
  if (options.hidden == 0 || options.vocab == 0)
    throw std::invalid_argument(fmt::format("[{}] hidden and vocab must be at least 1", name_));
}

Model::~Model() = default;

std::string Model::describe() const {
  std::string out = fmt::format("model {}: {} instances, hidden {}, {} classes\n\ntensors:\n",
                                name_, size(), options_.hidden, num_classes());
  size_t width = 0;
  for (uint32_t p = 0; p < pc_.size(); ++p) width = std::max(width, pc_.name(p).size());
  for (uint32_t p = 0; p < pc_.size(); ++p) {
    const Dim d = pc_.dim(p);
    const std::string shape = pc_.is_lookup(p)
                                  ? fmt::format("lookup: {} entries of {}", d.cols, d.rows)
                                  : fmt::format("{} x {}", d.rows, d.cols);
    out += fmt::format("  {:<{}}  {}\n", pc_.name(p), width, shape);
  }
  out += "\nmath:\n";
  std::string m = math();
  size_t begin = 0;
  while (begin < m.size()) {
    size_t end = m.find('\n', begin);
    if (end == std::string::npos) end = m.size();
    out += "  " + m.substr(begin, end - begin) + "\n";
    begin = end + 1;
  }
  return out;
}

std::vector<Decoded> Model::decode(Engine&, Graph&, const std::vector<uint32_t>&,
                                   const DecodeOptions&) {
  throw std::invalid_argument(fmt::format("[{}] does not decode: only lstm_nmt does", name_));
}

Expr Model::build(Graph& g, uint32_t instance, std::vector<Expr>* logits) {
  check_instance(instance);
  if (!options_.blocks) return build_ops(g, instance, logits);
  if (!options_.packed) {
    zoo::Sink sink(g, nullptr);
    return build_blocks(sink, instance, logits);
  }
  run_.reset(g);
  zoo::Sink sink(g, &run_);
  const Expr loss = build_blocks(sink, instance, logits);
  run_.append(g);
  return loss;
}

void Model::check_instance(uint32_t instance) const {
  if (instance >= size())
    throw std::invalid_argument(fmt::format("[{}] instance {} out of range for {} instances",
                                            name_, instance, size()));
}

const Tree& Model::checked_tree(const std::vector<Tree>& trees, uint32_t instance) {
  const Tree& tree = trees[instance];
  if (instance < tree_checked_.size() && tree_checked_[instance]) return tree;
  check_tree(tree, fmt::format("{}: instance {}", name_, instance).c_str());
  if (tree_checked_.size() < trees.size()) tree_checked_.resize(trees.size(), 0);
  tree_checked_[instance] = 1;
  return tree;
}

Expr Model::node_loss(Graph& g, Parameter W_out, const Expr& h, uint32_t label,
                      std::vector<Expr>* logits) const {
  const Expr z = matmul(parameter(g, W_out), h);
  if (logits) logits->push_back(z);
  return pick_neg_log_softmax(z, label);
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Entry& e : registry()) v.push_back(e.name);
    return v;
  }();
  return names;
}

DataKind model_data_kind(const std::string& model) {
  return find_model(model, "model_data_kind").kind;
}

std::unique_ptr<Model> make_model(const std::string& name, ParameterCollection& pc,
                                  const Dataset& data, const ModelOptions& options) {
  const Entry& e = find_model(name, "make_model");
  if (data.kind != e.kind)
    throw std::invalid_argument(fmt::format("[make_model] {} reads {}, but the data set holds {}",
                                            name, data_kind_name(e.kind),
                                            data_kind_name(data.kind)));
  return e.make(pc, data, options);
}

std::vector<uint32_t> predicted_labels(const Engine& engine, const std::vector<Expr>& logits) {
  std::vector<uint32_t> out;
  out.reserve(logits.size());
  for (const Expr& z : logits) {
    const Tensor t = engine.value(z);
    if (t.data == nullptr) return {};
    out.push_back(argmax(t));
  }
  return out;
}

namespace zoo {
void output_node_loss(Block& blk, Parameter W_out, const Expr& h, uint32_t label) {
  const Expr z = matmul(parameter(blk.body(), W_out), h);
  blk.output("loss", blk.pick_neg_log_softmax(z, label));
  blk.output("logits", z);
}
}  // namespace zoo

}  // namespace edbatch
