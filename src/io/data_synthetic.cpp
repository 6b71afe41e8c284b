// Seeded synthetic trees, lattices and tagged sentences whose shape statistics follow the real
// data sets (SST trees, character lattices), so benchmarks need no downloads.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "edbatch/data.h"

namespace edbatch {

namespace {

using Rng = std::mt19937_64;

void check_vocab(const char* function, uint32_t vocab_size) {
  if (vocab_size == 0)
    throw std::invalid_argument(fmt::format(
        "[{}] expected vocab_size >= 1 but found 0 (synthetic ids need a vocabulary)", function));
}

// Zipf's law over ids 0..vocab-1: p(id) proportional to 1 / (id + 1).
class ZipfIds {
 public:
  explicit ZipfIds(uint32_t vocab) : cdf_(vocab) {
    double sum = 0;
    for (uint32_t i = 0; i < vocab; ++i) cdf_[i] = sum += 1.0 / (i + 1.0);
    for (double& c : cdf_) c /= sum;
  }
  uint32_t operator()(Rng& rng) const {
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    return static_cast<uint32_t>(std::min<size_t>(it - cdf_.begin(), cdf_.size() - 1));
  }

 private:
  std::vector<double> cdf_;
};

// A log-normal length redrawn until it falls in [lo, hi]: skewed like sentence lengths.
uint32_t skewed_length(Rng& rng, double mean, double sd, uint32_t lo, uint32_t hi) {
  const double sigma2 = std::log(1.0 + (sd * sd) / (mean * mean));
  std::lognormal_distribution<double> dist(std::log(mean) - sigma2 / 2, std::sqrt(sigma2));
  while (true) {
    double x = std::round(dist(rng));
    if (x >= lo && x <= hi) return static_cast<uint32_t>(x);
  }
}

// Per-tree bracketing style: how often a span splits off a short left part (right-branching),
// a short right part (left-branching), or splits uniformly (balanced on average).
struct TreeShape {
  double right_branching;
  double left_branching;
};

class TreeBuilder {
 public:
  TreeBuilder(Rng& rng, const ZipfIds& words, TreeShape shape)
      : rng_(rng), words_(words), shape_(shape), labels_({5, 15, 55, 17, 8}) {}

  Tree build(uint32_t num_words) {
    tree_.nodes.clear();
    tree_.nodes.reserve(2 * num_words - 1);
    span(num_words);
    return std::move(tree_);
  }

 private:
  // Appends the subtree over n words in post-order and returns its root index.
  int32_t span(uint32_t n) {
    TreeNode node;
    node.label = static_cast<uint8_t>(labels_(rng_));
    if (n == 1) {
      node.word = words_(rng_);
    } else {
      const uint32_t left = split(n);
      node.left = span(left);
      node.right = span(n - left);
    }
    tree_.nodes.push_back(node);
    return static_cast<int32_t>(tree_.nodes.size() - 1);
  }

  // Size of the left part, in 1..n-1.
  uint32_t split(uint32_t n) {
    const double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    const uint32_t short_part =
        std::min(n - 1, 1 + static_cast<uint32_t>(std::geometric_distribution<int>(0.8)(rng_)));
    if (r < shape_.right_branching) return short_part;
    if (r < shape_.right_branching + shape_.left_branching) return n - short_part;
    return std::uniform_int_distribution<uint32_t>(1, n - 1)(rng_);
  }

  Rng& rng_;
  const ZipfIds& words_;
  TreeShape shape_;
  std::discrete_distribution<int> labels_;
  Tree tree_;
};

}  // namespace

std::vector<Tree> synthetic_trees(uint32_t n, uint64_t seed, uint32_t vocab_size) {
  check_vocab("synthetic_trees", vocab_size);
  Rng rng(seed);
  const ZipfIds words(vocab_size);
  std::uniform_real_distribution<double> right(0.35, 0.55), left(0.0, 0.1);
  std::vector<Tree> trees;
  trees.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t num_words = skewed_length(rng, 19.5, 9.0, 1, 52);
    const TreeShape shape{right(rng), left(rng)};
    trees.push_back(TreeBuilder(rng, words, shape).build(num_words));
  }
  return trees;
}

std::vector<Lattice> synthetic_lattices(uint32_t n, uint64_t seed, uint32_t vocab_size) {
  check_vocab("synthetic_lattices", vocab_size);
  constexpr uint32_t kNumTags = 18;
  constexpr double kWordArcProb[3] = {0.30, 0.15, 0.09};  // words of 2, 3 and 4 characters
  Rng rng(seed);
  const ZipfIds ids(vocab_size);
  // Tag 0 marks the start node; the rest are skewed towards the low tags, as in BMES schemes.
  std::vector<double> tag_weights(kNumTags - 1);
  for (uint32_t t = 0; t + 1 < kNumTags; ++t) tag_weights[t] = 1.0 / (t + 1.0);
  std::discrete_distribution<uint32_t> tag(tag_weights.begin(), tag_weights.end());
  std::uniform_real_distribution<double> u(0.0, 1.0);

  std::vector<Lattice> lattices;
  lattices.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t length = skewed_length(rng, 44.0, 24.0, 5, 200);
    Lattice lat;
    lat.tags.resize(length, 0);
    for (uint32_t k = 1; k < length; ++k) lat.tags[k] = static_cast<uint8_t>(1 + tag(rng));
    lat.arc_begin.push_back(0);
    lat.arc_begin.push_back(0);  // the start node has no incoming arcs
    for (uint32_t k = 1; k < length; ++k) {
      lat.arcs.push_back({k - 1, ids(rng)});
      for (uint32_t len = 2; len <= 4 && len <= k; ++len)
        if (u(rng) < kWordArcProb[len - 2]) lat.arcs.push_back({k - len, ids(rng)});
      lat.arc_begin.push_back(static_cast<uint32_t>(lat.arcs.size()));
    }
    lattices.push_back(std::move(lat));
  }
  return lattices;
}

std::vector<TaggedSentence> synthetic_tagged(uint32_t n, uint64_t seed, uint32_t vocab_size,
                                             uint32_t num_tags) {
  check_vocab("synthetic_tagged", vocab_size);
  if (num_tags == 0)
    throw std::invalid_argument("[synthetic_tagged] expected num_tags >= 1 but found 0");
  Rng rng(seed);
  const ZipfIds words(vocab_size);
  std::uniform_int_distribution<uint32_t> length(10, 50), any_tag(0, num_tags - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<TaggedSentence> sentences(n);
  for (TaggedSentence& s : sentences) {
    const uint32_t len = length(rng);
    for (uint32_t j = 0; j < len; ++j) {
      const uint32_t w = words(rng);
      // A fixed hash of the word gives its usual tag; one word in ten gets another one.
      const uint32_t usual = static_cast<uint32_t>((w * 2654435761ull >> 16) % num_tags);
      s.words.push_back(w);
      s.tags.push_back(u(rng) < 0.9 ? usual : any_tag(rng));
    }
  }
  return sentences;
}

std::vector<std::string> synthetic_spellings(uint32_t vocab_size, uint64_t seed) {
  check_vocab("synthetic_spellings", vocab_size);
  // English letter frequencies in running text, in percent, for a..z.
  static const double kLetterPercent[26] = {8.2,  1.5,  2.8, 4.3,  12.7, 2.2,  2.0, 6.1,   7.0,
                                            0.15, 0.77, 4.0, 2.4,  6.7,  7.5,  1.9, 0.095, 6.0,
                                            6.3,  9.1,  2.8, 0.98, 2.4,  0.15, 2.0, 0.074};
  Rng rng(seed ^ 0x5be11edc0ffee5ull);  // not the stream of synthetic_tagged
  std::discrete_distribution<int> letter(std::begin(kLetterPercent), std::end(kLetterPercent));
  std::vector<std::string> spellings(vocab_size);
  std::unordered_set<std::string> taken;
  for (uint32_t id = 0; id < vocab_size; ++id) {
    // Frequent words are short ("the", "of"); the mean grows with the log of the Zipf rank.
    const double mean = std::min(8.0, 3.0 + 0.8 * std::log(id + 1.0));
    std::string& w = spellings[id];
    do {
      w.resize(skewed_length(rng, mean, 2.0, 2, 12));
      for (char& c : w) c = static_cast<char>('a' + letter(rng));
    } while (!taken.insert(w).second);
  }
  return spellings;
}

}  // namespace edbatch
