// lstm_nmt's greedy decoding: a mini-batch decoded with incremental forwards gives every sentence
// the tokens and score of that sentence decoded alone node by node, op by op and with blocks,
// every policy; stopped sentences stop computing. And the sentence-pair loader.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "edbatch/models.h"
#include "tests/check.h"

using namespace edbatch;

namespace {

Dataset pairs_data(uint32_t n, uint32_t vocab, uint64_t seed) {
  Dataset d;
  d.kind = DataKind::Pairs;
  d.pairs = synthetic_pairs(n, seed, vocab);
  for (size_t i = 0; i < d.pairs.size(); ++i) d.pairs[i].source.resize(1 + i % 6);
  return d;
}

}  // namespace

TEST_CASE("decode: batched greedy decoding equals each sentence decoded alone") {
  constexpr uint32_t kVocab = 7;
  const Dataset data = pairs_data(13, kVocab, 3);
  for (bool blocks : {false, true}) {
    ParameterCollection pc(blocks ? 21 : 22);
    ModelOptions mo;
    mo.hidden = 6;
    mo.vocab = kVocab;
    mo.blocks = blocks;
    const auto model = make_model("lstm_nmt", pc, data, mo);
    REQUIRE(model->decodes());
    // Scale the output layer up and find a bias of </s> with which some sentences stop at
    // their own </s> and others run to their length cap.
    const uint32_t b_out = pc.size() - 1;
    for (uint32_t k = 0; k < pc.dim(b_out - 1).size(); ++k) pc.values(b_out - 1)[k] *= 3.0f;
    const float base = pc.values(b_out)[kEos];
    std::vector<uint32_t> all(data.pairs.size());
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    const DecodeOptions options{9};

    std::vector<Decoded> alone;
    size_t eos = 0, capped = 0;
    // Bisection between a bias where no sentence stops early and one where all do.
    float lo = base - 20, hi = base + 20;
    for (int trial = 0; trial < 40 && (eos == 0 || capped == 0); ++trial) {
      if (trial > 0) (eos == 0 ? lo : hi) = pc.values(b_out)[kEos];
      pc.values(b_out)[kEos] = (lo + hi) / 2;
      alone.clear();
      for (uint32_t i : all) {
        Engine e(pc, EngineOptions{"none", "cpu", 1});
        Graph g(pc);
        alone.push_back(model->decode(e, g, {i}, options).at(0));
      }
      eos = capped = 0;
      for (size_t i = 0; i < alone.size(); ++i) {
        const size_t cap = std::min<size_t>(9, 2 * data.pairs[i].source.size() + 2);
        REQUIRE(!alone[i].tokens.empty());
        CHECK(alone[i].tokens.size() <= cap);
        const bool stopped = alone[i].tokens.back() == kEos;
        eos += stopped;
        capped += !stopped;
        if (!stopped) CHECK(alone[i].tokens.size() == cap);
      }
    }
    CAPTURE(blocks);
    CHECK(eos > 0);     // some sentences stop at their own </s> ...
    CHECK(capped > 0);  // ... and others run to their length cap

    for (const char* policy : {"none", "depth", "agenda", "lb-greedy"}) {
      for (int threads : {1, 2}) {
        CAPTURE(policy);
        CAPTURE(threads);
        EngineOptions eo{policy, "cpu", threads};
        eo.min_parallel_work = 1;
        Engine e(pc, eo);
        Graph g(pc);
        const std::vector<Decoded> batched = model->decode(e, g, all, options);
        REQUIRE(batched.size() == all.size());
        size_t steps = 0;
        for (size_t i = 0; i < all.size(); ++i) {
          CAPTURE(i);
          CHECK(batched[i].tokens == alone[i].tokens);
          CHECK(std::fabs(batched[i].score - alone[i].score) <=
                1e-5 * std::max(1.0, std::fabs(alone[i].score)));
          steps += batched[i].tokens.size();
        }
        // A stopped sentence adds no more steps: one log softmax (a decoding call) per token.
        size_t step_nodes = 0;
        for (const Node& n : g.nodes())
          step_nodes += blocks ? n.op == Op::Call && g.params().block_name(n.aux) ==
                                                         "lstm_nmt.dec.decode"
                               : n.op == Op::LogSoftmax;
        CHECK(step_nodes == steps);
        // One increment per step of the longest sentence, plus the first.
        size_t longest = 0;
        for (const Decoded& d : batched) longest = std::max(longest, d.tokens.size());
        CHECK(e.plan().segments.size() == longest);
      }
    }
  }
}

TEST_CASE("decode: argmax is the first largest value, a NaN the largest (as torch.argmax)") {
  std::mt19937_64 rng(3);
  for (uint32_t n = 1; n <= 41; ++n) {
    for (int trial = 0; trial < 20; ++trial) {
      CAPTURE(n);
      CAPTURE(trial);
      std::vector<float> x(n);
      // Few distinct values, so the largest is often tied.
      for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 7) - 3) * 0.5f;
      const Tensor t{x.data(), Dim{n, 1}};
      CHECK(argmax(t) == std::max_element(x.begin(), x.end()) - x.begin());
      // One or two NaNs anywhere: the first of them; an inf alone changes nothing else.
      std::vector<float> with_nan = x;
      const uint32_t at = static_cast<uint32_t>(rng() % n), also = static_cast<uint32_t>(rng() % n);
      with_nan[at] = with_nan[also] = std::numeric_limits<float>::quiet_NaN();
      CHECK(argmax(Tensor{with_nan.data(), Dim{n, 1}}) == std::min(at, also));
      std::vector<float> with_inf = x;
      with_inf[also] = std::numeric_limits<float>::infinity();
      CHECK(argmax(Tensor{with_inf.data(), Dim{n, 1}}) == also);
      with_inf[also] = -std::numeric_limits<float>::infinity();
      if (n > 1 && x[also] < *std::max_element(x.begin(), x.end()))
        CHECK(argmax(Tensor{with_inf.data(), Dim{n, 1}}) ==
              std::max_element(x.begin(), x.end()) - x.begin());
    }
  }
  const float all_nan[3] = {NAN, NAN, NAN}, late_nan[3] = {1, 2, NAN};
  CHECK(argmax(Tensor{all_nan, Dim{3, 1}}) == 0);
  CHECK(argmax(Tensor{late_nan, Dim{3, 1}}) == 2);
  const float minus_inf[2] = {-INFINITY, -INFINITY};
  CHECK(argmax(Tensor{minus_inf, Dim{2, 1}}) == 0);
  CHECK_THROWS_AS(argmax(Tensor{}), std::runtime_error);
}

TEST_CASE("decode: models without decoding and the null device say so") {
  ParameterCollection pc(1);
  Dataset trees;
  trees.kind = DataKind::Trees;
  trees.trees = synthetic_trees(2, 1, 11);
  const auto tree = make_model("tree_lstm", pc, trees, ModelOptions{});
  Engine e(pc);
  Graph g(pc);
  CHECK_FALSE(tree->decodes());
  CHECK_THROWS_WITH_AS(tree->decode(e, g, {0}), doctest::Contains("does not decode"),
                       std::invalid_argument);
  ParameterCollection pc2(1);
  const Dataset data = pairs_data(2, 9, 1);
  ModelOptions mo;
  mo.vocab = 9;
  mo.hidden = 4;
  const auto nmt = make_model("lstm_nmt", pc2, data, mo);
  Engine null(pc2, EngineOptions{"lb-greedy", "null", 1});
  Graph g2(pc2);
  CHECK_THROWS_WITH_AS(nmt->decode(null, g2, {0, 1}), doctest::Contains("null device"),
                       std::invalid_argument);
  mo.vocab = 3;
  ParameterCollection pc3(1);
  CHECK_THROWS_WITH_AS(make_model("lstm_nmt", pc3, data, mo), doctest::Contains("needs 4"),
                       std::invalid_argument);
}

TEST_CASE("decode: sentence pairs load from the IWSLT text format") {
  const std::string dir = "/tmp/edbatch_pairs_" + std::to_string(::getpid());
  REQUIRE(std::system(("mkdir -p " + dir).c_str()) == 0);
  std::ofstream(dir + "/vocab.en") << "<unk>\n<s>\n</s>\nhello\nworld\nthe\ncat\n";
  std::ofstream(dir + "/vocab.vi") << "<unk>\n<s>\n</s>\nxin\nchao\n";
  std::ofstream(dir + "/a.en") << "hello world\nthe dog\n\nthe cat cat\n";
  std::ofstream(dir + "/a.vi") << "xin chao\nchao\nxin\nmeo xin\n";
  const std::vector<SentencePair> p =
      load_pair_files(dir + "/a.en," + dir + "/a.vi", 5);  // ids 5, 6 fold to 3, 4
  REQUIRE(p.size() == 3);  // the pair with an empty source is skipped
  CHECK(p[0].source == std::vector<uint32_t>{3, 4});
  CHECK(p[0].target == std::vector<uint32_t>{3, 4});
  CHECK(p[1].source == std::vector<uint32_t>{3, kUnk});
  CHECK(p[2].source == std::vector<uint32_t>{3, 4, 4});
  CHECK(p[2].target == std::vector<uint32_t>{kUnk, 3});
  std::ofstream(dir + "/b.vi") << "xin\n";
  CHECK_THROWS_WITH_AS(load_pair_files(dir + "/a.en," + dir + "/b.vi", 50),
                       doctest::Contains("not aligned"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_pair_files(dir + "/a.en", 50), doctest::Contains("SOURCE,TARGET"),
                       std::invalid_argument);
  std::ofstream(dir + "/a.fr") << "xin\n";  // the files are opened before their vocabularies
  CHECK_THROWS_WITH_AS(load_pair_files(dir + "/a.en," + dir + "/a.fr", 50),
                       doctest::Contains("vocab.fr"), std::invalid_argument);
  REQUIRE(std::system(("rm -rf " + dir).c_str()) == 0);
}
