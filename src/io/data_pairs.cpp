// Sentence pairs for translation models: the IWSLT'15 text format (a source and a target file
// aligned by line, each with a vocabulary file) and seeded synthetic pairs.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "edbatch/data.h"
#include "edbatch/files.h"

namespace edbatch {

uint32_t fold_word(uint32_t id, uint32_t vocab_size) {
  if (vocab_size < 4)
    throw std::invalid_argument(fmt::format(
        "[fold_word] vocab_size {} leaves no room for words after <unk>, <s>, </s> (needs 4+)",
        vocab_size));
  return id < vocab_size ? id : 3 + (id - 3) % (vocab_size - 3);
}

namespace {

using WordIds = std::unordered_map<std::string, uint32_t>;

// One word per line, the id its line number; the first three lines are the special words.
WordIds read_vocab(const std::string& path) {
  static const char* const special[] = {"<unk>", "<s>", "</s>"};
  std::ifstream in = open_input(path, "load_pairs");
  WordIds ids;
  std::string line;
  uint32_t next = 0, line_no = 0, blank = 0;  // blank: a blank line since the last word
  while (std::getline(in, line)) {
    prepare_text_line(line, "load_pairs", path, ++line_no);
    line.erase(line.find_last_not_of(" \t") + 1);  // trailing blanks, as data lines have
    if (line.empty()) {  // blank lines may end the file; a word's id is its line's number
      if (!blank) blank = line_no;
      continue;
    }
    if (blank)
      throw std::invalid_argument(fmt::format(
          "[load_pairs] {}:{}: a blank line before the word on line {} (a word's id is its "
          "line's number from 0: blank lines may only end the file)",
          path, blank, line_no));
    if (line.find_first_of(" \t") != std::string::npos)
      throw std::invalid_argument(fmt::format(
          "[load_pairs] {}:{}: expected one word per line, found '{}'", path, line_no, line));
    if (next < 3 && line != special[next])
      throw std::invalid_argument(fmt::format(
          "[load_pairs] {}:{}: expected '{}' but found '{}': a vocabulary starts with <unk>, "
          "<s>, </s> on its first three lines",
          path, line_no, special[next], line));
    ids.emplace(line, next++);  // a repeated word keeps its first id
  }
  if (next < 3)
    throw std::invalid_argument(fmt::format(
        "[load_pairs] {}:{}: expected '{}' but reached the end of the file ({} words): a "
        "vocabulary starts with <unk>, <s>, </s> on its first three lines",
        path, next + 1, special[next], next));
  return ids;
}

std::vector<uint32_t> words_of(const std::string& line, const WordIds& vocab, uint32_t vocab_size) {
  std::vector<uint32_t> out;
  std::istringstream words(line);
  std::string w;
  while (words >> w) {
    const auto it = vocab.find(w);
    const uint32_t id = it == vocab.end() ? kUnk : it->second;
    out.push_back(vocab_size ? fold_word(id, vocab_size) : id);
  }
  return out;
}

// Whether `line` and the rest of `in` hold nothing but white space.
bool blank_to_end(std::istream& in, std::string& line) {
  do {
    if (line.find_first_not_of(" \t\v\f\r") != std::string::npos) return false;
  } while (std::getline(in, line));
  return true;
}

// The aligned files, opened.
struct PairFiles {
  std::string source_path, target_path;
  std::ifstream source, target;
  PairFiles(std::string s, std::string t)
      : source_path(std::move(s)),
        target_path(std::move(t)),
        source(open_input(source_path, "load_pairs")),
        target(open_input(target_path, "load_pairs")) {}
};

std::vector<SentencePair> read_pairs(PairFiles& files, const WordIds& sv, const WordIds& tv,
                                     uint32_t vocab_size) {
  const std::string &source_path = files.source_path, &target_path = files.target_path;
  std::ifstream &src = files.source, &tgt = files.target;
  std::vector<SentencePair> pairs;
  std::string a, b;
  uint32_t skipped = 0, first_skipped = 0;
  for (uint32_t line = 1;; ++line) {
    const bool has_a = static_cast<bool>(std::getline(src, a));
    const bool has_b = static_cast<bool>(std::getline(tgt, b));
    if (!has_a && !has_b) break;
    if (has_a) prepare_text_line(a, "load_pairs", source_path, line);
    if (has_b) prepare_text_line(b, "load_pairs", target_path, line);
    if (has_a != has_b) {
      // Blank lines at the end of one file only are not a line of their own.
      if (blank_to_end(has_a ? src : tgt, has_a ? a : b)) break;
      throw std::invalid_argument(fmt::format(
          "[load_pairs] {} has {} lines but {} has more: the files are not aligned",
          has_a ? target_path : source_path, line - 1, has_a ? source_path : target_path));
    }
    SentencePair p{words_of(a, sv, vocab_size), words_of(b, tv, vocab_size)};
    if (!p.source.empty() && !p.target.empty()) {
      pairs.push_back(std::move(p));
    } else if (skipped++ == 0) {
      first_skipped = line;
    }
  }
  // A pair with nothing on one side has no sentence to translate or no target to learn.
  if (skipped > 0)
    std::fprintf(stderr,
                 "[edbatch] warning: [load_pairs] %u of the lines of %s and %s have an empty "
                 "side and were skipped (the first: line %u)\n",
                 skipped, source_path.c_str(), target_path.c_str(), first_skipped);
  return pairs;
}

}  // namespace

std::vector<SentencePair> load_pairs(const std::string& source_path,
                                     const std::string& source_vocab,
                                     const std::string& target_path,
                                     const std::string& target_vocab, uint32_t vocab_size) {
  if (vocab_size != 0) fold_word(0, vocab_size);  // checks vocab_size
  PairFiles files(source_path, target_path);
  return read_pairs(files, read_vocab(source_vocab), read_vocab(target_vocab), vocab_size);
}

std::vector<SentencePair> load_pair_files(const std::string& spec, uint32_t vocab_size,
                                          Vocabulary* vocabulary) {
  const size_t comma = spec.find(',');
  if (comma == std::string::npos || comma == 0 || comma + 1 == spec.size() ||
      spec.find(',', comma + 1) != std::string::npos)
    throw std::invalid_argument(fmt::format(
        "[load_pair_files] expected SOURCE,TARGET (two files) but found '{}'", spec));
  if (vocab_size != 0) fold_word(0, vocab_size);
  const std::string src = spec.substr(0, comma), tgt = spec.substr(comma + 1);
  PairFiles files(src, tgt);
  // Files read after the vocabulary's first pair take its words' ids.
  if (vocabulary && !vocabulary->source_words.empty())
    return read_pairs(files, vocabulary->source_words, vocabulary->target_words, vocab_size);
  const auto vocab_of = [&](const std::string& path) {
    const size_t slash = path.find_last_of('/');
    const size_t dot = path.find_last_of('.');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
      throw std::invalid_argument(fmt::format(
          "[load_pair_files] '{}' has no extension to name its vocabulary (vocab.<ext>)", path));
    const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
    return dir + "vocab" + path.substr(dot);
  };
  const std::string src_vocab = vocab_of(src), tgt_vocab = vocab_of(tgt);
  if (src_vocab == tgt_vocab)
    std::fprintf(stderr,
                 "[edbatch] warning: [load_pair_files] %s and %s share one vocabulary, %s (a "
                 "side's vocabulary is named by its file's extension: give the sides their "
                 "languages' extensions, e.g. .en and .vi)\n",
                 src.c_str(), tgt.c_str(), src_vocab.c_str());
  WordIds sv = read_vocab(src_vocab), tv = read_vocab(tgt_vocab);
  std::vector<SentencePair> pairs = read_pairs(files, sv, tv, vocab_size);
  if (vocabulary) {
    vocabulary->source_words = std::move(sv);
    vocabulary->target_words = std::move(tv);
  }
  return pairs;
}

std::vector<SentencePair> synthetic_pairs(uint32_t n, uint64_t seed, uint32_t vocab_size) {
  fold_word(0, vocab_size);
  const uint32_t words = vocab_size - 3;
  std::vector<double> cdf(words);  // Zipf over word ids 3..vocab_size-1
  double sum = 0;
  for (uint32_t i = 0; i < words; ++i) cdf[i] = sum += 1.0 / (i + 1.0);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 19);
  // The fixed source -> target word map: a permutation of the word ids from the seed.
  std::vector<uint32_t> perm(words);
  for (uint32_t i = 0; i < words; ++i) perm[i] = 3 + i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<SentencePair> pairs(n);
  for (SentencePair& p : pairs) {
    const uint32_t len = std::uniform_int_distribution<uint32_t>(3, 30)(rng);
    for (uint32_t i = 0; i < len; ++i) {
      const double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
      const auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
      p.source.push_back(3 + static_cast<uint32_t>(std::min<size_t>(it - cdf.begin(), words - 1)));
    }
    for (uint32_t i = len; i-- > 0;) {
      const uint32_t w = perm[p.source[i] - 3];
      p.target.push_back(w);
      if (i % 5 == 4) p.target.push_back(w);
    }
  }
  return pairs;
}

}  // namespace edbatch
