// Data formats: SST trees, lattices, tagged sentences, sentence pairs, and the synthetic
// generators; the vocabulary a data set needs unfolded.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "edbatch/data.h"
#include "edbatch/models.h"

using namespace edbatch;

namespace {

std::vector<Tree> trees_from(const std::string& text, uint32_t vocab = 256) {
  std::istringstream in(text);
  return parse_trees(in, "t.txt", vocab);
}
std::vector<Lattice> lattices_from(const std::string& text, uint32_t vocab = 256) {
  std::istringstream in(text);
  return parse_lattices(in, "l.txt", vocab);
}
TaggedData tagged_from(const std::string& text, uint32_t vocab = 256) {
  std::istringstream in(text);
  return parse_tagged(in, "s.txt", vocab);
}

bool same_tree(const Tree& a, const Tree& b) {
  if (a.nodes.size() != b.nodes.size()) return false;
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const TreeNode &x = a.nodes[i], &y = b.nodes[i];
    if (x.left != y.left || x.right != y.right || x.word != y.word || x.label != y.label)
      return false;
  }
  return true;
}
bool same_lattice(const Lattice& a, const Lattice& b) {
  if (a.tags != b.tags || a.arc_begin != b.arc_begin || a.arcs.size() != b.arcs.size())
    return false;
  for (size_t i = 0; i < a.arcs.size(); ++i)
    if (a.arcs[i].from != b.arcs[i].from || a.arcs[i].id != b.arcs[i].id) return false;
  return true;
}

doctest::Contains contains(const std::string& s) {
  return doctest::Contains(s.c_str());
}

std::filesystem::path scratch_file(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / "edbatch_test_data";
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  std::ofstream(path) << text;
  return path;
}

const char* kTwoLattices =
    "2\n"
    "3\n"
    "0 1 2\n"
    "0 \n"
    "1 0 5\n"
    "2 1 6 0 300\n"
    "\n"
    "4\n"
    "0 3 3 4\n"
    "0\n"
    "1 0 7\n"
    "1 1 8\n"
    "3 2 9 0 10 1 11\n";

}  // namespace

TEST_CASE("trees: SST lines parse into post-order binary trees") {
  auto trees = trees_from("(3 (2 It) (4 (2 's) (4 good)))\n\n  (1 (2 good) (0 bad))  \n", 0);
  REQUIRE(trees.size() == 2);
  const auto& a = trees[0].nodes;
  REQUIRE(a.size() == 5);
  // It, 's, good, ('s good), root
  CHECK(a[0].leaf());
  CHECK(a[0].word == 0);
  CHECK(a[0].label == 2);
  CHECK(a[1].word == 1);
  CHECK(a[2].word == 2);
  CHECK(a[2].label == 4);
  CHECK(a[3].left == 1);
  CHECK(a[3].right == 2);
  CHECK(a[3].label == 4);
  CHECK(!a[3].leaf());
  CHECK(a[4].left == 0);
  CHECK(a[4].right == 3);
  CHECK(a[4].label == 3);
  const auto& b = trees[1].nodes;
  REQUIRE(b.size() == 3);
  CHECK(b[0].word == 2);  // "good" keeps its id from the first tree
  CHECK(b[1].word == 3);
  CHECK(b[1].label == 0);
  CHECK(b[2].left == 0);
  CHECK(b[2].right == 1);
  CHECK(b[2].label == 1);
  CHECK(tree_depth(trees[0]) == 2);
  CHECK(tree_words(trees[0]) == 3);
  CHECK(tree_depth(trees_from("(2 one)")[0]) == 0);
}

TEST_CASE("trees: word ids fold modulo the vocabulary size") {
  auto trees = trees_from("(3 (2 a) (4 (2 b) (4 c)))\n(1 (2 c) (0 d))\n", 2);
  CHECK(trees[0].nodes[0].word == 0);
  CHECK(trees[0].nodes[1].word == 1);
  CHECK(trees[0].nodes[2].word == 0);
  CHECK(trees[1].nodes[0].word == 0);
  CHECK(trees[1].nodes[1].word == 1);
}

TEST_CASE("trees: malformed input names the line, column and what was expected") {
  auto err = [](const std::string& text) { return trees_from("(2 ok)\n\n" + text); };
  CHECK_THROWS_WITH_AS(err("(3 (2 a) (2 b)"),
                       "[parse_trees] t.txt:3:15: unbalanced brackets: expected ')' to close the "
                       "'(' at column 1 but reached the end of the line",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err(") (2 a)"),
                       doctest::Contains("t.txt:3:1: unbalanced brackets: ')' without a matching"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(3 (2 a) (2 b) (2 c))"),
                       doctest::Contains("t.txt:3:16: non-binary node at column 1: expected ')' "
                                         "after two children"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(3 (2 a) (1 (2 b)))"),
                       doctest::Contains("t.txt:3:18: unary node at column 10: expected a second "
                                         "child before ')'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(3 (7 a) (2 b))"),
                       doctest::Contains("t.txt:3:5: expected a label 0-4 after '(' but found '7'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(x a)"), doctest::Contains("t.txt:3:2: expected a label 0-4"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(-1 a)"), doctest::Contains("but found '-1'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(12 a)"), doctest::Contains("but found '12'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(2 a) b"),
                       doctest::Contains("t.txt:3:7: expected the end of the line after the tree "
                                         "but found 'b'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(2 a))"), doctest::Contains("t.txt:3:6: expected the end of the line"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(2 a b)"),
                       doctest::Contains("t.txt:3:6: the node at column 1 already has a word"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(2 a (2 b) (2 c))"),
                       doctest::Contains("t.txt:3:6: the node at column 1 already has a word: "
                                         "expected ')' but found '('"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(2 (2 b) c)"),
                       doctest::Contains("t.txt:3:10: the node at column 1 has children"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("(2)"), doctest::Contains("t.txt:3:3: empty node at column 1"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(err("2 a"), doctest::Contains("t.txt:3:1: expected '(' but found '2'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(trees_from(""),
                       "[parse_trees] t.txt:1:1: expected a bracketed tree but reached the end "
                       "of the input (no trees)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(trees_from("\n  \n"), doctest::Contains("t.txt:3:1: expected a bracketed"),
                       std::invalid_argument);
}

TEST_CASE("trees: load from a file, and a missing file") {
  auto path = scratch_file("trees.txt", "(1 (2 a) (3 b))\n(4 c)\n");
  auto trees = load_trees(path.string());
  REQUIRE(trees.size() == 2);
  CHECK(trees[1].nodes[0].word == 2);
  CHECK_THROWS_WITH_AS(load_trees((path.parent_path() / "absent.txt").string()),
                       doctest::Contains("[load_trees] cannot open"), std::invalid_argument);
}

TEST_CASE("trees: synthetic trees are deterministic and shaped like SST") {
  const auto trees = synthetic_trees(2000, 7, 100);
  const auto again = synthetic_trees(2000, 7, 100);
  const auto other = synthetic_trees(2000, 8, 100);
  REQUIRE(trees.size() == 2000);
  bool all_same = true, all_same_other = true;
  for (size_t i = 0; i < trees.size(); ++i) {
    all_same = all_same && same_tree(trees[i], again[i]);
    all_same_other = all_same_other && same_tree(trees[i], other[i]);
  }
  CHECK(all_same);
  CHECK(!all_same_other);

  for (const Tree& t : trees) {
    const uint32_t words = tree_words(t);
    REQUIRE(t.nodes.size() == 2 * words - 1);
    std::vector<int> parents(t.nodes.size(), 0);
    for (size_t i = 0; i < t.nodes.size(); ++i) {
      const TreeNode& n = t.nodes[i];
      REQUIRE(n.label <= 4);
      if (n.leaf()) {
        REQUIRE(n.right < 0);
        REQUIRE(n.word < 100);
      } else {
        REQUIRE(n.left < static_cast<int32_t>(i));
        REQUIRE(n.right < static_cast<int32_t>(i));
        ++parents[n.left];
        ++parents[n.right];
      }
    }
    for (size_t i = 0; i + 1 < t.nodes.size(); ++i) REQUIRE(parents[i] == 1);
    REQUIRE(parents.back() == 0);
  }
  const TreeStats s = tree_stats(trees);
  CHECK(s.count == 2000);
  CHECK(s.mean_words >= 17.0);
  CHECK(s.mean_words <= 21.0);
  CHECK(s.min_words >= 1);
  CHECK(s.max_words <= 52);
  CHECK(s.mean_depth >= 8.0);
  CHECK(s.mean_depth <= 12.0);
  CHECK(s.max_depth >= 20);
  CHECK(s.max_depth <= 30);

  // Labels and words spread over their ranges.
  std::vector<int> labels(5, 0);
  for (const Tree& t : trees)
    for (const TreeNode& n : t.nodes) ++labels[n.label];
  for (int c : labels) CHECK(c > 0);
  CHECK_THROWS_AS(synthetic_trees(1, 1, 0), std::invalid_argument);
}

TEST_CASE("lattices: a two-lattice file parses into CSR arcs") {
  auto lats = lattices_from(kTwoLattices);
  REQUIRE(lats.size() == 2);
  const Lattice& a = lats[0];
  CHECK(a.length() == 3);
  CHECK(a.tags == std::vector<uint8_t>{0, 1, 2});
  CHECK(a.arc_begin == std::vector<uint32_t>{0, 0, 1, 3});
  REQUIRE(a.arcs.size() == 3);
  CHECK(a.arcs[0].from == 0);
  CHECK(a.arcs[0].id == 5);
  CHECK(a.arcs[1].from == 1);
  CHECK(a.arcs[1].id == 6);
  CHECK(a.arcs[2].from == 0);
  CHECK(a.arcs[2].id == 300 % 256);
  CHECK(!Lattice::is_word_arc(2, a.arcs[1]));
  CHECK(Lattice::is_word_arc(2, a.arcs[2]));
  const Lattice& b = lats[1];
  CHECK(b.length() == 4);
  CHECK(b.tags == std::vector<uint8_t>{0, 3, 3, 4});
  CHECK(b.arc_begin == std::vector<uint32_t>{0, 0, 1, 2, 5});
  CHECK(b.arcs[4].from == 1);
  CHECK(b.arcs[4].id == 11);

  CHECK(lattices_from(kTwoLattices, 0)[0].arcs[2].id == 300);
  CHECK(lattices_from(kTwoLattices, 4)[0].arcs[2].id == 0);

  const LatticeStats s = lattice_stats(lats);
  CHECK(s.count == 2);
  CHECK(s.mean_nodes == doctest::Approx(3.5));
  CHECK(s.mean_arcs == doctest::Approx(4.0));
  CHECK(s.word_arc_fraction == doctest::Approx(3.0 / 8.0));
  CHECK(s.max_nodes == 4);
}

TEST_CASE("lattices: malformed input names the line, column and what was expected") {
  const std::string good = kTwoLattices;
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  CHECK_THROWS_WITH_AS(lattices_from(""),
                       "[parse_lattices] l.txt:1:1: expected the number of lattices on the first "
                       "line (no lattices) but reached the end of the input",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("2\n3\n", "3\n3\n")),
                       "[parse_lattices] l.txt:14:1: truncated input: expected lattice 3 of 3 but "
                       "reached the end of the input",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(good.substr(0, good.find("3 2 9"))),
                       doctest::Contains("l.txt:13:1: truncated input: expected the arcs into "
                                         "node 3 of lattice 2 of 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("1 0 5\n", "1 1 5\n")),
                       doctest::Contains("l.txt:5:3: arc 0 into node 1 of lattice 1 of 2 comes "
                                         "from node 1: expected a source node below 1"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("2 1 6 0 300", "2 1 6 3 300")),
                       doctest::Contains("l.txt:6:7: arc 1 into node 2"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("0 1 2\n", "0 1\n")),
                       doctest::Contains("l.txt:3:4: expected 3 tags for lattice 1 of 2 (its "
                                         "length) but found 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("0 3 3 4\n", "0 3 3 4 4\n")),
                       doctest::Contains("l.txt:9:9: expected 4 tags"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("1 0 7\n", "1 0 x7\n")),
                       doctest::Contains("l.txt:11:5: expected a non-negative integer (an arc "
                                         "count, source node or arc id) but found 'x7'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("0 1 2\n", "0 -1 2\n")),
                       doctest::Contains("l.txt:3:3: expected a non-negative integer (a tag) but "
                                         "found '-1'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("3 2 9 0 10 1 11", "3 2 9 0 10 1")),
                       doctest::Contains("l.txt:13:1: the arc line of node 3 of lattice 2 of 2 "
                                         "announces 3 arcs"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("1 1 8\n", "\n")),
                       doctest::Contains("l.txt:12:1: expected the arc count of node 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("2\n3\n", "1\n3\n")),
                       doctest::Contains("l.txt:8:1: expected the end of the input after the 1 "
                                         "announced lattices"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("2\n3\n", "two\n3\n")),
                       doctest::Contains("l.txt:1:1: expected a non-negative integer (the number "
                                         "of lattices) but found 'two'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("2\n3\n", "2\n0\n")),
                       doctest::Contains("l.txt:2:1: expected the lattice length in 1.."),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from(replace("0 1 2\n", "0 1 256\n")),
                       doctest::Contains("l.txt:3:5: expected a tag in 0..255 but found 256"),
                       std::invalid_argument);
}

TEST_CASE("lattices: load from a file, and a missing file") {
  auto path = scratch_file("lattices.txt", kTwoLattices);
  auto lats = load_lattices(path.string());
  REQUIRE(lats.size() == 2);
  CHECK(same_lattice(lats[1], lattices_from(kTwoLattices)[1]));
  CHECK_THROWS_WITH_AS(load_lattices((path.parent_path() / "absent.txt").string()),
                       doctest::Contains("[load_lattices] cannot open"), std::invalid_argument);
}

TEST_CASE("lattices: synthetic lattices are deterministic and shaped like the real ones") {
  const auto lats = synthetic_lattices(2000, 11, 500);
  const auto again = synthetic_lattices(2000, 11, 500);
  REQUIRE(lats.size() == 2000);
  bool all_same = true;
  for (size_t i = 0; i < lats.size(); ++i) all_same = all_same && same_lattice(lats[i], again[i]);
  CHECK(all_same);
  CHECK(!same_lattice(lats[0], synthetic_lattices(1, 12, 500)[0]));

  for (const Lattice& lat : lats) {
    const uint32_t len = lat.length();
    REQUIRE(len >= 5);
    REQUIRE(len <= 200);
    REQUIRE(lat.arc_begin.size() == len + 1);
    REQUIRE(lat.arc_begin.front() == 0);
    REQUIRE(lat.arc_begin.back() == lat.arcs.size());
    REQUIRE(lat.tags[0] == 0);
    for (uint8_t t : lat.tags) REQUIRE(t < 18);
    for (uint32_t k = 0; k < len; ++k) {
      REQUIRE(lat.arc_begin[k] <= lat.arc_begin[k + 1]);
      bool has_char_arc = k == 0;
      for (uint32_t a = lat.arc_begin[k]; a < lat.arc_begin[k + 1]; ++a) {
        REQUIRE(lat.arcs[a].from < k);
        REQUIRE(k - lat.arcs[a].from <= 4);
        REQUIRE(lat.arcs[a].id < 500);
        has_char_arc = has_char_arc || !Lattice::is_word_arc(k, lat.arcs[a]);
      }
      REQUIRE(has_char_arc);
    }
  }
  const LatticeStats s = lattice_stats(lats);
  CHECK(s.mean_nodes >= 40.0);
  CHECK(s.mean_nodes <= 48.0);
  CHECK(s.mean_arcs >= 60.0);
  CHECK(s.mean_arcs <= 72.0);
  CHECK(s.word_arc_fraction >= 0.28);
  CHECK(s.word_arc_fraction <= 0.38);
  CHECK(s.max_nodes >= 120);
  CHECK_THROWS_AS(synthetic_lattices(1, 1, 0), std::invalid_argument);
}

TEST_CASE("tagged: sentences parse with word and tag ids by first appearance") {
  auto data = tagged_from("The|DT dog|NN barks|VBZ\n\n  A|DT cat|NN dog|NN\na|b|SYM\n", 0);
  REQUIRE(data.sentences.size() == 3);
  CHECK(data.sentences[0].words == std::vector<uint32_t>{0, 1, 2});
  CHECK(data.sentences[0].tags == std::vector<uint32_t>{0, 1, 2});
  CHECK(data.sentences[1].words == std::vector<uint32_t>{3, 4, 1});
  CHECK(data.sentences[1].tags == std::vector<uint32_t>{0, 1, 1});
  CHECK(data.sentences[2].words == std::vector<uint32_t>{5});  // the word is "a|b"
  CHECK(data.num_tags == 4);
  CHECK(data.tag_names == std::vector<std::string>{"DT", "NN", "VBZ", "SYM"});

  auto folded = tagged_from("The|DT dog|NN barks|VBZ\nA|DT cat|NN dog|NN\n", 2);
  CHECK(folded.sentences[1].words == std::vector<uint32_t>{1, 0, 1});
  CHECK(folded.num_tags == 3);  // tags are never folded

  auto path = scratch_file("tagged.txt", "x|A y|B\n");
  CHECK(load_tagged(path.string()).sentences[0].tags == std::vector<uint32_t>{0, 1});
  CHECK_THROWS_WITH_AS(load_tagged((path.parent_path() / "absent.txt").string()),
                       doctest::Contains("[load_tagged] cannot open"), std::invalid_argument);
}

TEST_CASE("tagged: each word id keeps the spelling of the first word that took it") {
  const std::string text = "The|DT dog|NN barks|VBZ\n\n  A|DT cat|NN dog|NN\na|b|SYM\n";
  CHECK(tagged_from(text, 0).spellings ==
        std::vector<std::string>{"The", "dog", "barks", "A", "cat", "a|b"});
  CHECK(tagged_from(text, 4).spellings == std::vector<std::string>{"The", "dog", "barks", "A"});
  CHECK(tagged_from(text, 2).spellings == std::vector<std::string>{"The", "dog"});

  // Seeded random text over a small pool of words: the spelling of each folded id is the word
  // whose first appearance comes first among those folding onto it.
  std::mt19937 rng(17);
  const std::vector<std::string> pool = {"x", "yy", "a|b", "Zebra", "q1", "--", "ab", "ba", "é"};
  for (uint32_t vocab : {0u, 1u, 3u, 7u, 256u}) {
    CAPTURE(vocab);
    std::string file;
    std::vector<std::string> order;  // distinct words in order of first appearance
    for (int line = 0; line < 5; ++line) {
      for (uint32_t k = 0, n = 1 + rng() % 6; k < n; ++k) {
        const std::string& w = pool[rng() % pool.size()];
        if (std::find(order.begin(), order.end(), w) == order.end()) order.push_back(w);
        file += w + "|T ";
      }
      file += "\n";
    }
    std::vector<std::string> expected;
    for (size_t i = 0; i < order.size() && (vocab == 0 || i < vocab); ++i)
      expected.push_back(order[i]);
    const TaggedData data = tagged_from(file, vocab);
    CHECK(data.spellings == expected);
    for (const TaggedSentence& s : data.sentences)
      for (uint32_t w : s.words) CHECK(w < data.spellings.size());
  }
}

TEST_CASE("tagged: malformed tokens name the line and column") {
  CHECK_THROWS_WITH_AS(tagged_from("a|X\nThe|DT dog barks|VBZ\n"),
                       "[parse_tagged] s.txt:2:8: expected 'word|TAG' but found 'dog' (no '|')",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(tagged_from("a|X |NN\n"),
                       doctest::Contains("s.txt:1:5: expected a word before '|' in '|NN'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(tagged_from("a|X\n\nbc|\n"),
                       doctest::Contains("s.txt:3:4: expected a tag after '|' in 'bc|'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(tagged_from(" \n"), doctest::Contains("s.txt:2:1: expected a line of"),
                       std::invalid_argument);
}

TEST_CASE("tagged: synthetic sentences") {
  const auto sents = synthetic_tagged(500, 3, 300, 7);
  const auto again = synthetic_tagged(500, 3, 300, 7);
  REQUIRE(sents.size() == 500);
  uint32_t shortest = 1000, longest = 0;
  for (size_t i = 0; i < sents.size(); ++i) {
    const auto& s = sents[i];
    REQUIRE(s.words.size() == s.tags.size());
    REQUIRE(s.words == again[i].words);
    REQUIRE(s.tags == again[i].tags);
    shortest = std::min<uint32_t>(shortest, static_cast<uint32_t>(s.words.size()));
    longest = std::max<uint32_t>(longest, static_cast<uint32_t>(s.words.size()));
    for (uint32_t w : s.words) REQUIRE(w < 300);
    for (uint32_t t : s.tags) REQUIRE(t < 7);
  }
  CHECK(shortest >= 10);
  CHECK(longest <= 50);
  CHECK(longest - shortest >= 30);
  CHECK_THROWS_AS(synthetic_tagged(1, 1, 10, 0), std::invalid_argument);
  CHECK_THROWS_AS(synthetic_tagged(1, 1, 0, 5), std::invalid_argument);
}

TEST_CASE("tagged: synthetic spellings are distinct lowercase words, fixed by the seed") {
  for (uint32_t vocab : {1u, 29u, 1000u}) {
    CAPTURE(vocab);
    const std::vector<std::string> words = synthetic_spellings(vocab, 3);
    REQUIRE(words.size() == vocab);
    CHECK(synthetic_spellings(vocab, 3) == words);
    CHECK(std::set<std::string>(words.begin(), words.end()).size() == vocab);
    for (const std::string& w : words) {
      CHECK(w.size() >= 2);
      CHECK(w.size() <= 12);
      for (char c : w) CHECK((c >= 'a' && c <= 'z'));
    }
  }
  const std::vector<std::string> a = synthetic_spellings(1000, 3), b = synthetic_spellings(1000, 4);
  size_t same = 0, letters = 0, vowels = 0;
  double frequent = 0, rare = 0;  // mean lengths of the first and the last 100 ids
  for (size_t i = 0; i < a.size(); ++i) {
    same += a[i] == b[i];
    for (char c : a[i]) {
      ++letters;
      vowels += std::string("aeiou").find(c) != std::string::npos;
    }
    if (i < 100) frequent += a[i].size() / 100.0;
    if (i >= 900) rare += a[i].size() / 100.0;
  }
  CHECK(same < 50);
  CHECK(frequent < rare - 1.5);
  CHECK(vowels > letters / 4);  // English letter frequencies: about 38% vowels
  CHECK(vowels < letters / 2);
  CHECK_THROWS_AS(synthetic_spellings(0, 1), std::invalid_argument);
}

TEST_CASE("data: a shared Vocabulary keeps word and tag ids across files") {
  Vocabulary v;
  std::istringstream train("(2 (1 a) (3 b))\n(4 (2 c) (2 a))\n"), dev("(0 (2 c) (1 d))\n");
  const std::vector<Tree> t = parse_trees(train, "train", 0, &v);
  const std::vector<Tree> d = parse_trees(dev, "dev", 0, &v);
  CHECK(t[0].nodes[0].word == 0);  // a
  CHECK(t[1].nodes[0].word == 2);  // c
  CHECK(d[0].nodes[0].word == 2);  // c keeps its id
  CHECK(d[0].nodes[1].word == 3);  // d continues the numbering
  std::istringstream alone("(0 (2 c) (1 d))\n");
  CHECK(parse_trees(alone, "alone", 0)[0].nodes[0].word == 0);  // without: numbered afresh

  Vocabulary w;
  std::istringstream tagged("the|D dog|N\n"), held("a|D cat|N|V dog|X\n");
  const TaggedData a = parse_tagged(tagged, "train", 0, &w);
  const TaggedData b = parse_tagged(held, "dev", 0, &w);
  CHECK(a.num_tags == 2);
  CHECK(b.num_tags == 4);  // D, N, then V and X
  CHECK(b.tag_names == std::vector<std::string>{"D", "N", "V", "X"});
  CHECK(b.sentences[0].words == std::vector<uint32_t>{2, 3, 1});  // a, cat|N, dog
  CHECK(b.sentences[0].tags == std::vector<uint32_t>{0, 2, 3});
  CHECK(b.spellings == std::vector<std::string>{"the", "dog", "a", "cat|N"});
}

TEST_CASE("data: a UTF-8 byte order mark at a line's start is skipped, inside a line refused") {
  const std::string bom = "\xEF\xBB\xBF";
  const std::string trees = "(2 (1 a) (3 b))\n(4 (2 c) (2 a))\n";
  const std::vector<Tree> plain = trees_from(trees), marked = trees_from(bom + trees);
  REQUIRE(marked.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(same_tree(marked[i], plain[i]));
  // Two files joined with cat: the second's mark starts a line.
  const std::vector<Tree> joined = trees_from(bom + trees + bom + trees);
  REQUIRE(joined.size() == 2 * plain.size());
  for (size_t i = 0; i < joined.size(); ++i) CHECK(same_tree(joined[i], plain[i % plain.size()]));
  CHECK_THROWS_WITH_AS(trees_from(trees + "(1 x" + bom + ")\n"),
                       doctest::Contains("t.txt:3:5: a byte order mark (U+FEFF) inside a line"),
                       std::invalid_argument);
  const TaggedData twice = tagged_from(bom + "the|D dog|N\n" + bom + "the|D dog|N\n");
  CHECK(twice.spellings == std::vector<std::string>{"the", "dog"});
  const std::vector<Lattice> lat = lattices_from(kTwoLattices),
                             lat_marked = lattices_from(bom + kTwoLattices);
  REQUIRE(lat_marked.size() == lat.size());
  for (size_t i = 0; i < lat.size(); ++i) CHECK(same_lattice(lat_marked[i], lat[i]));
  const TaggedData tagged = tagged_from(bom + "the|D dog|N\n");
  CHECK(tagged.spellings == std::vector<std::string>{"the", "dog"});
  // Not a mark: the bytes stay for the parser, which names them.
  CHECK_THROWS_AS(trees_from("\xEF\xBB(1 x)\n"), std::invalid_argument);
  // Sentence pairs and their vocabularies, read from files.
  const auto src = scratch_file("bom.en", bom + "a b\n"), tgt = scratch_file("bom.vi", bom + "c\n");
  const auto sv = scratch_file("bom_vocab.en", bom + "<unk>\n<s>\n</s>\na\nb\n");
  const auto tv = scratch_file("bom_vocab.vi", bom + "<unk>\n<s>\n</s>\nc\n");
  const std::vector<SentencePair> pairs =
      load_pairs(src.string(), sv.string(), tgt.string(), tv.string(), 100);
  REQUIRE(pairs.size() == 1);
  CHECK(pairs[0].source == std::vector<uint32_t>{3, 4});
  CHECK(pairs[0].target == std::vector<uint32_t>{3});
}

TEST_CASE("data: a directory or a missing file given as a file names the path") {
  const auto dir = std::filesystem::temp_directory_path() / "edbatch_test_data" / "a_folder";
  std::filesystem::create_directories(dir);
  const std::string d = dir.string(), missing = (dir / "absent.txt").string();
  for (const auto& [fn, load] :
       std::vector<std::pair<std::string, std::function<void(const std::string&)>>>{
           {"load_trees", [](const std::string& p) { load_trees(p); }},
           {"load_lattices", [](const std::string& p) { load_lattices(p); }},
           {"load_tagged", [](const std::string& p) { load_tagged(p); }},
           {"load_pairs", [](const std::string& p) { load_pairs(p, p, p, p, 100); }}}) {
    CAPTURE(fn);
    CHECK_THROWS_WITH_AS(load(d),
                         contains("[" + fn + "] cannot open '" + d + "': it is a directory"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(load(missing), contains("'" + missing + "': No such file"),
                         std::invalid_argument);
  }
  // A vocabulary that is a directory.
  const auto src = scratch_file("dir_vocab.en", "a\n"), tgt = scratch_file("dir_vocab.vi", "c\n");
  CHECK_THROWS_WITH_AS(load_pairs(src.string(), d, tgt.string(), d, 100),
                       contains("'" + d + "': it is a directory"), std::invalid_argument);
}

namespace {

// A folder holding SOURCE,TARGET files s.en, s.vi and, unless empty, vocab.en and vocab.vi.
std::string pair_folder(const std::string& name, const std::string& source,
                        const std::string& target, const std::string& source_vocab,
                        const std::string& target_vocab) {
  const auto dir = std::filesystem::temp_directory_path() / "edbatch_test_data" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "s.en") << source;
  std::ofstream(dir / "s.vi") << target;
  if (!source_vocab.empty()) std::ofstream(dir / "vocab.en") << source_vocab;
  if (!target_vocab.empty()) std::ofstream(dir / "vocab.vi") << target_vocab;
  return (dir / "s.en").string() + "," + (dir / "s.vi").string();
}

}  // namespace

TEST_CASE("pairs: vocab_size 0 keeps every id, others fold and must leave room for a word") {
  std::string vocab = "<unk>\n<s>\n</s>\n";
  for (int i = 3; i < 40; ++i) vocab += "w" + std::to_string(i) + "\n";
  const std::string spec = pair_folder("pairs_nofold", "w39 w3 w5\n", "w4 zz\n", vocab, vocab);
  const std::vector<SentencePair> full = load_pair_files(spec, 0);
  REQUIRE(full.size() == 1);
  CHECK(full[0].source == std::vector<uint32_t>{39, 3, 5});
  CHECK(full[0].target == std::vector<uint32_t>{4, kUnk});
  const std::vector<SentencePair> folded = load_pair_files(spec, 10);  // 3 + (39 - 3) % 7
  CHECK(folded[0].source == std::vector<uint32_t>{4, 3, 5});
  for (uint32_t small : {1u, 3u})
    CHECK_THROWS_WITH_AS(load_pair_files(spec, small), doctest::Contains("needs 4+"),
                         std::invalid_argument);
}

TEST_CASE("pairs: a vocabulary starts with <unk>, <s>, </s>, and the message names the line") {
  const std::string ok = "<unk>\n<s>\n</s>\na\n";
  for (const auto& [vocab, where] : std::vector<std::pair<std::string, std::string>>{
           {"a\n<s>\n</s>\n", "vocab.en:1: expected '<unk>' but found 'a'"},
           {"<unk>\n</s>\n<s>\na\n", "vocab.en:2: expected '<s>' but found '</s>'"},
           {"<unk>\r\n<s>\r\nhello\r\n", "vocab.en:3: expected '</s>' but found 'hello'"},
           {"<unk>\n<s>\n", "vocab.en:3: expected '</s>' but reached the end of the file"},
           {"\xEF\xBB\xBF<unk>\n<s>\n", "vocab.en:3: expected '</s>'"}}) {
    CAPTURE(vocab);
    const std::string spec = pair_folder("pairs_special", "a\n", "a\n", vocab, ok);
    CHECK_THROWS_WITH_AS(load_pair_files(spec, 100), contains(where), std::invalid_argument);
  }
  const std::string spec = pair_folder("pairs_special", "a\n", "a\n", ok, ok);
  CHECK(load_pair_files(spec, 100)[0].source == std::vector<uint32_t>{3});
  // Files of unequal lengths: the shorter one and its count of lines are named.
  const std::string uneven = pair_folder("pairs_uneven", "a\na\na\n", "a\na\n", ok, ok);
  CHECK_THROWS_WITH_AS(load_pair_files(uneven, 100),
                       contains("s.vi has 2 lines but " + uneven.substr(0, uneven.find(',')) +
                                " has more: the files are not aligned"),
                       std::invalid_argument);
}

TEST_CASE("pairs: files read with a Vocabulary take the first pair's vocabularies") {
  const std::string train = pair_folder("pairs_train", "a b\n", "x y\n", "<unk>\n<s>\n</s>\na\nb\n",
                                        "<unk>\n<s>\n</s>\nx\ny\n");
  // Another order beside the held-out files, or none at all: the training ids either way.
  const std::string reordered =
      pair_folder("pairs_reordered", "b a c\n", "y x\n", "<unk>\n<s>\n</s>\nc\nb\na\n",
                  "<unk>\n<s>\n</s>\ny\nx\n");
  const std::string bare = pair_folder("pairs_bare", "b a c\n", "y x\n", "", "");
  Vocabulary v;
  CHECK(load_pair_files(train, 0, &v)[0].source == std::vector<uint32_t>{3, 4});
  CHECK(v.source_words.size() == 5);
  for (const std::string& heldout : {reordered, bare}) {
    CAPTURE(heldout);
    const std::vector<SentencePair> h = load_pair_files(heldout, 0, &v);
    CHECK(h[0].source == std::vector<uint32_t>{4, 3, kUnk});  // c: not in the training words
    CHECK(h[0].target == std::vector<uint32_t>{4, 3});
  }
  // Without a vocabulary, the files beside them.
  CHECK(load_pair_files(reordered, 0)[0].source == std::vector<uint32_t>{4, 5, 3});
}

TEST_CASE("data: the vocabulary of unfolded data is the largest id + 1, within the limit") {
  Dataset d;
  d.kind = DataKind::Lattices;
  d.lattices = lattices_from(kTwoLattices, 0);
  CHECK(data_vocabulary(d) == 301);  // arc id 300
  // The largest id would wrap to 0 in 32 bits; one just past the limit would allocate gigabytes.
  for (const uint32_t id : {UINT32_MAX, 100000000u, kMaxVocabulary}) {
    CAPTURE(id);
    d.lattices = lattices_from("1\n2\n0 0\n0\n1 0 " + std::to_string(id) + "\n", 0);
    CHECK_THROWS_WITH_AS(data_vocabulary(d),
                         contains("word id " + std::to_string(id) + " (instance 0)"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(data_vocabulary(d), doctest::Contains("limit of 16777216"),
                         std::invalid_argument);
  }
  d.lattices = lattices_from("1\n2\n0 0\n0\n1 0 " + std::to_string(kMaxVocabulary - 1) + "\n", 0);
  CHECK(data_vocabulary(d) == kMaxVocabulary);
  // Sentence pairs: both sides count, and the special ids and a word at least.
  Dataset p;
  p.kind = DataKind::Pairs;
  p.pairs = {{{3, 9}, {4}}, {{5}, {12}}};
  CHECK(data_vocabulary(p) == 13);
  p.pairs = {{{kUnk}, {kUnk}}};
  CHECK(data_vocabulary(p) == 4);
}

// Files that are not UTF-8 text with LF or CRLF line endings are refused where they would be read
// as other words: UTF-16 (NUL bytes), old Mac line endings (CR alone), another encoding.
TEST_CASE("data: UTF-16, CR line endings and bytes that are not UTF-8 are refused by line") {
  const std::string utf16 = std::string(
      "(\0"
      "2\0 \0a\0)\0\n\0",
      12);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {utf16, "t.txt:1:2: a NUL byte: the file is UTF-16 or binary"},
      {"(2 a)\r(3 b)\r", "t.txt:1:6: a carriage return inside a line: the file has old Mac"},
      {"(2 a)\n(3 caf\xE9)\n", "t.txt:2:7: byte 0xE9 is not UTF-8"},
      {"(2 \xC0\xAF)\n", "t.txt:1:4: byte 0xC0 is not UTF-8"},          // overlong '/'
      {"(2 \xED\xA0\x80)\n", "t.txt:1:4: byte 0xED is not UTF-8"},      // a surrogate
      {"(2 \xF4\x90\x80\x80)\n", "t.txt:1:4: byte 0xF4 is not UTF-8"},  // past U+10FFFF
      {"(2 \xE2\x82)\n", "t.txt:1:4: byte 0xE2 is not UTF-8"}};         // cut short
  for (const auto& [text, where] : bad) {
    CAPTURE(where);
    CHECK_THROWS_WITH_AS(trees_from(text), contains(where), std::invalid_argument);
  }
  // UTF-8 of every length is read as words; CRLF is a line ending.
  CHECK(trees_from("(2 (2 caf\xC3\xA9) (2 \xE1\xBB\x87\xF0\x9F\x98\x80))\r\n").size() == 1);
  CHECK_THROWS_WITH_AS(tagged_from("the|D dog|N\rthe|D\r"),
                       contains("s.txt:1:12: a carriage return inside a line"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(lattices_from("1\r2 1\r"), contains(":1:2: a carriage return"),
                       std::invalid_argument);
  const std::string ok = "<unk>\n<s>\n</s>\na\n";
  CHECK_THROWS_WITH_AS(load_pair_files(pair_folder("pairs_utf16", "a\n", utf16, ok, ok), 100),
                       contains("s.vi:1:2: a NUL byte"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      load_pair_files(pair_folder("pairs_cr", "a\n", "a\n", ok, "<unk>\r<s>\r"), 100),
      contains("vocab.vi:1:6: a carriage return"), std::invalid_argument);
  // Blank lines at the end of one file of a pair are not a pair of their own.
  const auto tail =
      load_pair_files(pair_folder("pairs_tail", "a\na\n\n \r\n", "a\na\n", ok, ok), 100);
  CHECK(tail.size() == 2);
}
