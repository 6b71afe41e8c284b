// The model zoo: every model, op by op, on small synthetic data with awkward hidden sizes:
// engine (policies none and lb-greedy, 1 and 2 threads) = the double-precision reference in loss
// and every parameter gradient; deterministic builds for a seed; the DAG generator; the factory.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "edbatch/zoo.h"
#include "tests/check.h"
#include "tests/engine_run.h"
#include "tests/reference.h"

using namespace edbatch;
using namespace edbatch::testing;

namespace {

constexpr uint32_t kVocab = 17;

// A few small instances of the kind `model` reads.
Dataset small_data(const std::string& model, uint64_t seed) {
  Dataset d;
  d.kind = model_data_kind(model);
  d.source = "test";
  switch (d.kind) {
    case DataKind::Trees: d.trees = synthetic_trees(4, seed, kVocab); break;
    case DataKind::Lattices: {
      d.lattices = synthetic_lattices(3, seed, kVocab);
      // Keep the reference fast: the first lattice only, cut to its first 23 nodes, and a
      // lattice of a single arc-less node.
      Lattice& l = d.lattices[0];
      const uint32_t keep = std::min<uint32_t>(23, l.length());
      l.tags.resize(keep);
      l.arc_begin.resize(keep + 1);
      l.arcs.resize(l.arc_begin.back());
      Lattice one;
      one.tags = {3};
      one.arc_begin = {0, 0};
      d.lattices[1] = one;
      d.lattices.resize(2);
      break;
    }
    case DataKind::Tagged:
      d.tagged.sentences = synthetic_tagged(3, seed, kVocab, 5);
      d.tagged.num_tags = 5;
      d.tagged.spellings = synthetic_spellings(kVocab - 4, seed);  // the top ids unspelled
      for (TaggedSentence& s : d.tagged.sentences) {
        s.words.resize(std::min<size_t>(s.words.size(), 7));
        s.tags.resize(s.words.size());
      }
      break;
    case DataKind::Pairs:
      d.pairs = synthetic_pairs(3, seed, kVocab);
      for (SentencePair& p : d.pairs) {
        p.source.resize(std::min<size_t>(p.source.size(), 5));
        p.target.resize(std::min<size_t>(p.target.size(), 4));
      }
      d.pairs[1].target.clear();  // an empty target: the loss of </s> alone
      break;
    case DataKind::Dags: {
      DagOptions o;
      o.min_states = 1;
      o.max_states = 23;
      d.dags = synthetic_dags(4, seed, kVocab, o);
      break;
    }
  }
  return d;
}

ModelOptions small_options(uint32_t hidden, bool chars = false) {
  ModelOptions o;
  o.hidden = hidden;
  o.vocab = kVocab;
  o.blocks = false;
  o.seed = 5;
  o.char_embeddings = chars;
  o.char_vocab = 7;
  return o;
}

void check_model(const std::string& name, uint32_t hidden, bool chars = false) {
  CAPTURE(name);
  CAPTURE(hidden);
  const Dataset data = small_data(name, 11);
  ParameterCollection pc(3);
  const std::unique_ptr<Model> model = make_model(name, pc, data, small_options(hidden, chars));
  REQUIRE(model->size() == data.size());
  Graph g(pc);
  std::vector<Expr> losses;
  std::vector<std::vector<Expr>> logits(model->size());
  for (uint32_t i = 0; i < model->size(); ++i) losses.push_back(model->build(g, i, &logits[i]));
  const Expr loss = sum_losses(losses);
  CAPTURE(g.size());

  Reference ref(g);
  ref.forward();
  ref.backward(loss.id);
  // Every parameter takes part in the loss.
  for (uint32_t p = 0; p < pc.size(); ++p) {
    double norm = 0;
    for (double v : ref.param_grads[p]) norm += v * v;
    CAPTURE(pc.name(p));
    CHECK(norm > 0);
  }
  for (const char* policy : {"none", "lb-greedy"}) {
    for (int threads : {1, 2}) {
      CAPTURE(policy);
      CAPTURE(threads);
      const EngineRun r = run_engine(g, loss, policy, threads);
      check_close(&r.loss, &ref.values[loss.id][0], 1, 2e-5, "loss vs double reference");
      for (uint32_t p = 0; p < pc.size(); ++p)
        check_close(r.grads[p], ref.param_grads[p], r.grads[p].size(), 2e-5,
                    "grad of " + pc.name(p) + " vs double reference");
    }
  }
  // One logit vector of num_classes() per gold label, and a prediction for each.
  Engine e(pc, EngineOptions{"lb-greedy", "cpu", 1});
  e.forward(g, loss);
  for (uint32_t i = 0; i < model->size(); ++i) {
    const std::vector<uint32_t> gold = model->labels(i);
    REQUIRE(logits[i].size() == gold.size());
    const std::vector<uint32_t> predicted = predicted_labels(e, logits[i]);
    REQUIRE(predicted.size() == gold.size());
    for (size_t k = 0; k < gold.size(); ++k) {
      CHECK(gold[k] < model->num_classes());
      CHECK(predicted[k] < model->num_classes());
      CHECK(g.node(logits[i][k].id).dim == Dim{model->num_classes(), 1});
    }
  }
}

// The nodes of a graph as plain numbers, for comparing two builds.
std::vector<uint64_t> fingerprint(const Graph& g) {
  std::vector<uint64_t> f;
  for (const Node& n : g.nodes()) {
    f.push_back(static_cast<uint64_t>(n.op) << 32 | n.num_args);
    f.push_back(uint64_t(n.dim.rows) << 32 | n.dim.cols);
    f.push_back(uint64_t(n.aux) << 32 | n.aux2);
    for (uint32_t k = 0; k < n.num_args; ++k) f.push_back(g.args(n)[k]);
  }
  return f;
}

std::vector<uint64_t> build_fingerprint(const std::string& name, uint64_t seed,
                                        std::vector<float>* values = nullptr) {
  const Dataset data = small_data(name, 11);
  ParameterCollection pc(3);
  ModelOptions o = small_options(5);
  o.seed = seed;
  const std::unique_ptr<Model> model = make_model(name, pc, data, o);
  Graph g(pc);
  for (uint32_t i = 0; i < model->size(); ++i) model->build(g, i);
  if (values)
    for (uint32_t p = 0; p < pc.size(); ++p)
      values->insert(values->end(), pc.values(p), pc.values(p) + pc.dim(p).size());
  return fingerprint(g);
}

}  // namespace

TEST_CASE("zoo: tree_lstm = reference") {
  check_model("tree_lstm", 7);
  check_model("tree_lstm", 1);
}
TEST_CASE("zoo: tree_gru = reference") { check_model("tree_gru", 13); }
TEST_CASE("zoo: double_typed_tree_lstm = reference") { check_model("double_typed_tree_lstm", 7); }
TEST_CASE("zoo: mvrnn = reference") { check_model("mvrnn", 5); }
TEST_CASE("zoo: lattice_lstm = reference") { check_model("lattice_lstm", 7); }
TEST_CASE("zoo: lattice_gru = reference") { check_model("lattice_gru", 13); }
TEST_CASE("zoo: bilstm_tagger = reference, with and without character embeddings") {
  check_model("bilstm_tagger", 7);
  check_model("bilstm_tagger", 5, true);
}
// bilstm_tagger with characters (words seen once), loss by the double-precision reference.
double tagger_loss(const TaggedData& tagged) {
  Dataset data;
  data.kind = DataKind::Tagged;
  data.tagged = tagged;
  ParameterCollection pc(3);
  ModelOptions o = small_options(5, true);
  o.rare_below = 2;
  const std::unique_ptr<Model> model = make_model("bilstm_tagger", pc, data, o);
  Graph g(pc);
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < model->size(); ++i) losses.push_back(model->build(g, i));
  const Expr loss = sum_losses(losses);
  Reference ref(g);
  ref.forward();
  return ref.values[loss.id][0];
}

TEST_CASE("zoo: bilstm_tagger's rare words are read from their spellings") {
  // Words 3 and 4 are rare. Every variant below keeps the characters' first appearances (t h e c
  // a s m r n, 9 characters folded into char_vocab 7) so only the rare words' characters change.
  TaggedData base;
  base.sentences = {{{1, 2, 3, 1}, {0, 1, 2, 0}}, {{2, 4, 1}, {1, 3, 0}}};
  base.num_tags = 4;
  base.spellings = {"the", "cat", "sat", "mat", "ran", "rat", "at", "mta"};
  const double loss = tagger_loss(base);

  TaggedData other_id = base;  // word 3 replaced by word 7, spelled as word 3 was
  other_id.sentences[0].words[2] = 7;
  other_id.spellings[7] = "mat";
  CHECK(tagger_loss(other_id) == loss);

  for (const char* respelled : {"tam", "rat", "ma", "mats"}) {
    CAPTURE(respelled);
    TaggedData changed = base;
    changed.spellings[3] = respelled;
    CHECK(std::abs(tagger_loss(changed) - loss) > 1e-9);
  }

  // Without spellings, characters come from the ids: moving a word to another id changes them.
  TaggedData unspelled = base, unspelled_other_id = other_id;
  unspelled.spellings.resize(3);
  unspelled_other_id.spellings.resize(3);
  unspelled_other_id.spellings.resize(8);  // empty spellings count as none
  CHECK(std::abs(tagger_loss(unspelled) - loss) > 1e-9);
  CHECK(std::abs(tagger_loss(unspelled_other_id) - tagger_loss(unspelled)) > 1e-9);

  // Synthetic data sets come spelled.
  CHECK(load_dataset(DataKind::Tagged, "synthetic:5", 11, 1).tagged.spellings ==
        synthetic_spellings(11, 1));
}

TEST_CASE("zoo: random_dag = reference") { check_model("random_dag", 7); }

TEST_CASE("zoo: builds are deterministic for a seed") {
  for (const std::string& name : model_names()) {
    CAPTURE(name);
    std::vector<float> v1, v2;
    CHECK(build_fingerprint(name, 9, &v1) == build_fingerprint(name, 9, &v2));
    CHECK(v1 == v2);
  }
  // The double-typed Tree-LSTM's coins follow the seed.
  CHECK(build_fingerprint("double_typed_tree_lstm", 9) !=
        build_fingerprint("double_typed_tree_lstm", 10));
}

TEST_CASE("zoo: tree_lstm builds the graph of TreeLstmOps") {
  const Dataset data = small_data("tree_lstm", 4);
  ParameterCollection pc1(2), pc2(2);
  const std::unique_ptr<Model> model = make_model("tree_lstm", pc1, data, small_options(6));
  TreeLstmOps ops(pc2, kVocab, 6);
  Graph g1(pc1), g2(pc2);
  for (uint32_t i = 0; i < model->size(); ++i) {
    model->build(g1, i);
    ops.build(g2, data.trees[i]);
  }
  REQUIRE(g1.size() == g2.size());
  for (uint32_t k = 0; k < g1.size(); ++k) {
    CHECK(g1.node(k).op == g2.node(k).op);
    CHECK(g1.node(k).dim == g2.node(k).dim);
  }
  for (const char* p : {"E", "W_i", "W_o", "W_u", "U_i", "U_o", "U_u", "U_f1", "U_f2", "b_i",
                        "b_o", "b_u", "b_f", "W_out"}) {
    CAPTURE(p);
    REQUIRE(pc1.find(p) != UINT32_MAX);
    const uint32_t a = pc1.find(p), b = pc2.find(p);
    CHECK(std::equal(pc1.values(a), pc1.values(a) + pc1.dim(a).size(), pc2.values(b)));
  }
}

TEST_CASE("zoo: describe lists every tensor and the math") {
  for (const std::string& name : model_names()) {
    CAPTURE(name);
    const Dataset data = small_data(name, 1);
    ParameterCollection pc(1);
    const std::unique_ptr<Model> model = make_model(name, pc, data, small_options(4));
    const std::string d = model->describe();
    for (uint32_t p = 0; p < pc.size(); ++p) CHECK(d.find(pc.name(p)) != std::string::npos);
    CHECK(d.find("W_out") != std::string::npos);
    CHECK(d.find("loss") != std::string::npos);
  }
}

TEST_CASE("zoo: factory errors and the block hook") {
  const Dataset trees = small_data("tree_lstm", 1);
  ParameterCollection pc(1);
  CHECK_THROWS_WITH_AS(make_model("nope", pc, trees, small_options(4)),
                       doctest::Contains("unknown model 'nope'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_model("lattice_lstm", pc, trees, small_options(4)),
                       doctest::Contains("reads lattices"), std::invalid_argument);
  CHECK_THROWS_AS(model_data_kind("nope"), std::invalid_argument);
  const std::unique_ptr<Model> m = make_model("tree_gru", pc, trees, small_options(4));
  Graph g(pc);
  CHECK_THROWS_AS(m->build(g, m->size()), std::invalid_argument);
}

TEST_CASE("zoo: tree models refuse a tree whose children come after it, at every build") {
  // Instance 1 is valid; instance 0's root reads node 2, itself (not in post-order).
  Dataset data;
  data.kind = DataKind::Trees;
  Tree bad, good;
  bad.nodes.resize(3);
  bad.nodes[2].left = 0;
  bad.nodes[2].right = 2;
  good.nodes.resize(3);
  good.nodes[2].left = 0;
  good.nodes[2].right = 1;
  data.trees = {bad, good};
  for (const char* name : {"tree_lstm", "tree_gru", "double_typed_tree_lstm", "mvrnn"})
    for (const bool blocks : {false, true}) {
      CAPTURE(name);
      CAPTURE(blocks);
      ParameterCollection pc(1);
      ModelOptions o = small_options(4);
      o.blocks = blocks;
      const std::unique_ptr<Model> m = make_model(name, pc, data, o);
      Graph g(pc);
      CHECK_NOTHROW(m->build(g, 1));
      const std::string where = std::string(name) + ": instance 0";
      for (int attempt = 0; attempt < 2; ++attempt) {
        CHECK_THROWS_WITH_AS(m->build(g, 0),
                             doctest::Contains("node 2 has children that do not come before it"),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(m->build(g, 0), doctest::Contains(where.c_str()),
                             std::invalid_argument);
      }
      CHECK_NOTHROW(m->build(g, 1));  // checked once, built again
    }
}

TEST_CASE("zoo: data sets by spec") {
  const Dataset d = load_dataset(DataKind::Dags, "synthetic:3", 11, 1);
  CHECK(d.size() == 3);
  CHECK(load_dataset(DataKind::Tagged, "synthetic:5", 11, 1).tagged.num_tags == 18);
  for (const char* bad : {"synthetic:", "synthetic:x", "synthetic:0", "synthetic:-1",
                          "synthetic:3x"})
    CHECK_THROWS_WITH_AS(load_dataset(DataKind::Trees, bad, 11, 1),
                         doctest::Contains("synthetic:N"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_dataset(DataKind::Dags, "dags.txt", 11, 1),
                       doctest::Contains("synthetic:N"), std::invalid_argument);
  CHECK_THROWS_AS(load_dataset(DataKind::Trees, "/nonexistent/trees.txt", 11, 1),
                  std::invalid_argument);
}

TEST_CASE("zoo: random DAGs are deterministic, acyclic and within their options") {
  DagOptions o;
  const std::vector<Dag> a = synthetic_dags(20, 7, 13, o), b = synthetic_dags(20, 7, 13, o);
  uint64_t states = 0;
  std::set<uint32_t> arc_types, state_types;
  for (size_t i = 0; i < a.size(); ++i) {
    const Dag& d = a[i];
    CHECK(d.state_types == b[i].state_types);
    CHECK(d.inputs == b[i].inputs);
    CHECK(d.arc_begin == b[i].arc_begin);
    CHECK(d.size() >= o.min_states);
    CHECK(d.size() <= o.max_states);
    REQUIRE(d.arc_begin.size() == d.size() + 1);
    states += d.size();
    for (uint32_t k = 0; k < d.size(); ++k) {
      const uint32_t degree = d.arc_begin[k + 1] - d.arc_begin[k];
      CHECK(degree <= o.max_in_degree);
      CHECK((k == 0) == (degree == 0));
      CHECK(d.inputs[k] < 13);
      CHECK(d.labels[k] < o.labels);
      state_types.insert(d.state_types[k]);
      for (uint32_t e = d.arc_begin[k]; e < d.arc_begin[k + 1]; ++e) {
        CHECK(d.arcs[e].from < k);
        CHECK(d.arcs[e].from + o.window >= k);
        arc_types.insert(d.arcs[e].type);
      }
    }
  }
  CHECK(states / a.size() > 150);
  CHECK(states / a.size() < 250);
  CHECK(arc_types.size() == o.arc_types);
  CHECK(state_types.size() == o.state_types);
  CHECK(synthetic_dags(3, 8, 13, o)[0].state_types != a[0].state_types);
  o.min_states = 0;
  CHECK_THROWS_AS(synthetic_dags(1, 1, 13, o), std::invalid_argument);
}
