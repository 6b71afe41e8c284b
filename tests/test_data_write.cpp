// Data writers: exact text of small hand-built instances, write-then-load round trips on seeded
// synthetic data of awkward sizes, errors, and `edbatch run --write-data` end to end.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "edbatch/data.h"
#include "tests/cli_run.h"

using namespace edbatch;

namespace {

std::string trees_text(const std::vector<Tree>& trees) {
  std::ostringstream out;
  write_trees(out, trees);
  return out.str();
}
std::string lattices_text(const std::vector<Lattice>& lattices) {
  std::ostringstream out;
  write_lattices(out, lattices);
  return out.str();
}
std::vector<Tree> reload_trees(const std::string& text, uint32_t vocab) {
  std::istringstream in(text);
  return parse_trees(in, "written", vocab);
}
std::vector<Lattice> reload_lattices(const std::string& text, uint32_t vocab) {
  std::istringstream in(text);
  return parse_lattices(in, "written", vocab);
}

// Renumbers ids in order of first appearance, the loaders' rule, independently of the writer.
struct FirstAppearance {
  std::map<uint32_t, uint32_t> ids;
  uint32_t operator()(uint32_t id) {
    return ids.emplace(id, static_cast<uint32_t>(ids.size())).first->second;
  }
};

TreeNode leaf(uint8_t label, uint32_t word) {
  TreeNode n;
  n.label = label;
  n.word = word;
  return n;
}
TreeNode inner(uint8_t label, int32_t left, int32_t right) {
  TreeNode n;
  n.label = label;
  n.left = left;
  n.right = right;
  return n;
}

Lattice lattice(std::vector<uint8_t> tags, const std::vector<std::vector<LatticeArc>>& arcs_in) {
  Lattice l;
  l.tags = std::move(tags);
  l.arc_begin.push_back(0);
  for (const auto& node : arcs_in) {
    l.arcs.insert(l.arcs.end(), node.begin(), node.end());
    l.arc_begin.push_back(static_cast<uint32_t>(l.arcs.size()));
  }
  return l;
}

using test::slurp;

}  // namespace

TEST_CASE("write: hand-built trees, lattices and sentences give the exact format text") {
  // (3 (2 w7) (4 (2 w3) (0 w7))) in post-order: w7, w3, w7, (w3 w7), root.
  Tree t;
  t.nodes = {leaf(2, 7), leaf(2, 3), leaf(0, 7), inner(4, 1, 2), inner(3, 0, 3)};
  Tree one;
  one.nodes = {leaf(1, 0)};
  CHECK(trees_text({t, one}) == "(3 (2 w7) (4 (2 w3) (0 w7)))\n(1 w0)\n");

  const Lattice a = lattice({5, 0, 17}, {{}, {{0, 9}}, {{1, 4}, {0, 300}}});
  const Lattice b = lattice({1}, {{}});
  CHECK(lattices_text({a, b}) ==
        "2\n"
        "3\n5 0 17\n0\n1 0 9\n2 1 4 0 300\n\n"
        "1\n1\n0\n\n");

  TaggedSentence s{{4, 0, 4}, {1, 0, 2}};
  std::ostringstream plain, named;
  write_tagged(plain, {s, TaggedSentence{{2}, {0}}});
  CHECK(plain.str() == "w4|T1 w0|T0 w4|T2\nw2|T0\n");
  write_tagged(named, {s}, {"NN", "DT", "VB"});
  CHECK(named.str() == "w4|DT w0|NN w4|VB\n");
  std::ostringstream spelled;  // ids 0 and 4 spelled, 2 with an empty spelling
  write_tagged(spelled, {s, TaggedSentence{{2}, {0}}}, {"NN", "DT", "VB"},
               {"dog", "x", "", "y", "a|b"});
  CHECK(spelled.str() == "a|b|DT dog|NN a|b|VB\nw2|NN\n");
}

TEST_CASE("write: synthetic trees load back with the same shapes, labels and renumbered words") {
  for (uint32_t n : {1u, 7u, 37u})
    for (uint32_t vocab : {13u, 256u}) {
      const std::vector<Tree> trees = synthetic_trees(n, 1000 + n, vocab);
      const std::vector<Tree> back = reload_trees(trees_text(trees), vocab);
      REQUIRE(back.size() == trees.size());
      FirstAppearance renumber;
      for (size_t i = 0; i < trees.size(); ++i) {
        REQUIRE(back[i].nodes.size() == trees[i].nodes.size());
        for (size_t k = 0; k < trees[i].nodes.size(); ++k) {
          const TreeNode &x = trees[i].nodes[k], &y = back[i].nodes[k];
          CHECK(y.left == x.left);
          CHECK(y.right == x.right);
          CHECK(y.label == x.label);
          if (x.leaf()) CHECK(y.word == renumber(x.word));
        }
      }
    }
}

TEST_CASE("write: synthetic lattices load back identical, arc ids included") {
  for (uint32_t n : {1u, 5u, 23u}) {
    const std::vector<Lattice> lattices = synthetic_lattices(n, 77 + n, 256);
    const std::vector<Lattice> back = reload_lattices(lattices_text(lattices), 256);
    REQUIRE(back.size() == lattices.size());
    for (size_t i = 0; i < lattices.size(); ++i) {
      CHECK(back[i].tags == lattices[i].tags);
      CHECK(back[i].arc_begin == lattices[i].arc_begin);
      REQUIRE(back[i].arcs.size() == lattices[i].arcs.size());
      for (size_t a = 0; a < back[i].arcs.size(); ++a) {
        CHECK(back[i].arcs[a].from == lattices[i].arcs[a].from);
        CHECK(back[i].arcs[a].id == lattices[i].arcs[a].id);
      }
    }
  }
}

TEST_CASE("write: synthetic sentences load back with renumbered words, spellings, named tags") {
  for (uint32_t n : {1u, 11u}) {
    const std::vector<TaggedSentence> sentences = synthetic_tagged(n, 5 + n, 97, 18);
    // Ids 0..88 spelled, the rest without a spelling (written as w<id>).
    std::vector<std::string> spellings = synthetic_spellings(89, 5 + n);
    std::ostringstream out;
    write_tagged(out, sentences, {}, spellings);
    std::istringstream in(out.str());
    const TaggedData back = parse_tagged(in, "written", 97);
    REQUIRE(back.sentences.size() == sentences.size());
    FirstAppearance words, tags;
    for (size_t i = 0; i < sentences.size(); ++i) {
      REQUIRE(back.sentences[i].words.size() == sentences[i].words.size());
      for (size_t k = 0; k < sentences[i].words.size(); ++k) {
        const uint32_t w = sentences[i].words[k], w_back = back.sentences[i].words[k];
        CHECK(w_back == words(w));
        REQUIRE(w_back < back.spellings.size());
        CHECK(back.spellings[w_back] == (w < 89 ? spellings[w] : "w" + std::to_string(w)));
        const uint32_t tag = back.sentences[i].tags[k];
        CHECK(tag == tags(sentences[i].tags[k]));
        REQUIRE(tag < back.tag_names.size());
        CHECK(back.tag_names[tag] == "T" + std::to_string(sentences[i].tags[k]));
      }
    }
    CHECK(back.num_tags == tags.ids.size());
  }
}

TEST_CASE("write: a tree 20000 levels deep writes (without recursion) and loads back") {
  Tree deep;  // a left spine: each inner node joins the spine so far with a new leaf
  deep.nodes.push_back(leaf(0, 0));
  int32_t spine = 0;
  for (uint32_t k = 1; k <= 20000; ++k) {
    deep.nodes.push_back(leaf(1, k % 5));
    deep.nodes.push_back(inner(static_cast<uint8_t>(k % 5), spine, spine + 1));
    spine += 2;
  }
  const std::vector<Tree> back = reload_trees(trees_text({deep}), 0);
  REQUIRE(back.size() == 1);
  CHECK(tree_depth(back[0]) == tree_depth(deep));
  CHECK(tree_words(back[0]) == tree_words(deep));
}

TEST_CASE("write: malformed instances are refused with what is wrong") {
  Tree bad;
  bad.nodes = {inner(2, 1, 2), leaf(1, 0), leaf(1, 1)};  // children after their parent
  CHECK_THROWS_WITH_AS(trees_text({bad}),
                       doctest::Contains("[write_trees] tree 0 node 0: children 1 and 2"),
                       std::invalid_argument);
  const Lattice forward = lattice({0, 0}, {{}, {{1, 3}}});
  CHECK_THROWS_WITH_AS(lattices_text({forward}),
                       doctest::Contains("arc into node 1 comes from node 1"),
                       std::invalid_argument);
  std::ostringstream out;
  CHECK_THROWS_WITH_AS(write_tagged(out, {TaggedSentence{{1, 2}, {0}}}),
                       doctest::Contains("2 words and 1 tags"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_tagged(out, {TaggedSentence{{1}, {3}}}, {"A"}),
                       doctest::Contains("tag 3 has no name"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_tagged(out, {TaggedSentence{{0}, {0}}}, {}, {"ok", "two words"}),
                       doctest::Contains("the spelling of word 1 ('two words') contains white"),
                       std::invalid_argument);
}

TEST_CASE("write: edbatch run --write-data writes the data set --data names") {
  const test::TempDir dir("edbatch_write");
  auto run = [&](const std::string& args) { return test::run_cli(dir, "run " + args); };
  const std::string lattices = dir / "lattices.txt", trees = dir / "trees.txt";
  CHECK(run("--model lattice_lstm --data synthetic:9 --seed 4 --write-data '" + lattices + "'")
            .code == 0);
  CHECK(slurp(lattices) == lattices_text(synthetic_lattices(9, 4, 256)));
  CHECK(run("--model tree_lstm --data synthetic:3 --seed 2 --vocab-size 50 --write-data '" + trees +
            "'")
            .code == 0);
  CHECK(slurp(trees) == trees_text(synthetic_trees(3, 2, 50)));
  const std::string tagged = dir / "tagged.txt";
  CHECK(run("--model bilstm_tagger --data synthetic:4 --seed 6 --vocab-size 40 --write-data '" +
            tagged + "'")
            .code == 0);
  std::ostringstream spelled;
  write_tagged(spelled, synthetic_tagged(4, 6, 40), {}, synthetic_spellings(40, 6));
  CHECK(slurp(tagged) == spelled.str());
  const test::CliResult dag =
      run("--model random_dag --data synthetic:3 --write-data '" + (dir / "d.txt") + "'");
  CHECK(dag.code == 2);
  CHECK(dag.err.find("--write-data") != std::string::npos);
  // Sentence pairs are two files of their own: refused, and a file already there is kept.
  const std::string kept = dir / "kept.txt";
  std::ofstream(kept) << "precious\n";
  const test::CliResult pairs =
      run("--model lstm_nmt --data synthetic:3 --write-data '" + kept + "'");
  CHECK(pairs.code == 2);
  CHECK(pairs.err.find("--write-data: lstm_nmt reads sentence pairs") != std::string::npos);
  CHECK(slurp(kept) == "precious\n");
}

// --json names the data file as given, also where its name is not UTF-8 (U+FFFD in its place),
// instead of failing once the run is done.
TEST_CASE("write: --json of a run whose data file's name is not UTF-8") {
  const test::TempDir dir("edbatch_write");
  const std::string data = dir / "caf\xE9.txt", json = dir / "m.json";
  std::ofstream(data) << "(3 (2 a) (4 b))\n";
  const test::CliResult r = test::run_cli(
      dir, "run --model tree_lstm --hidden 4 --data '" + data + "' --json '" + json + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(slurp(json).find("caf\xEF\xBF\xBD.txt") != std::string::npos);
}
