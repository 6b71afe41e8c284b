// Sentence pairs (lstm_nmt's IWSLT format): the input is split at NUL bytes into a source file, its
// vocabulary, a target file and its vocabulary. load_pairs either refuses cleanly or gives pairs
// with both sides non-empty and every id below the vocabulary size; the pairs written back with a
// canonical vocabulary (<unk> <s> </s> w3 w4 ...) read back equal.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "edbatch/data.h"
#include "fuzz/fuzz_check.h"

using namespace edbatch;
using edbatch::fuzz::parses;

namespace {

constexpr uint32_t kVocab = 64;

// A temporary folder for the four files, removed with its files at exit.
struct Folder {
  std::string path;
  Folder() {
    char tmpl[] = "/tmp/fuzz_pairs.XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (d == nullptr) edbatch::fuzz::broken("cannot make a temporary folder");
    path = d;
  }
  ~Folder() {
    for (const char* f : {"src.txt", "src.vocab", "tgt.txt", "tgt.vocab", "canonical.vocab",
                          "back.src", "back.tgt"})
      std::remove((path + "/" + f).c_str());
    rmdir(path.c_str());
  }
};

const std::string& folder() {
  static const Folder dir;
  return dir.path;
}

std::string put(const std::string& name, const std::string& text) {
  const std::string path = folder() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string sentence(const std::vector<uint32_t>& ids) {
  std::string s;
  for (uint32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += id == kUnk ? "<unk>" : id == kBos ? "<s>" : id == kEos ? "</s>" : "w" + std::to_string(id);
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> parts(4);
  size_t part = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0 && part + 1 < parts.size()) {
      ++part;
      continue;
    }
    parts[part] += static_cast<char>(data[i]);
  }
  const std::string src = put("src.txt", parts[0]), src_vocab = put("src.vocab", parts[1]);
  const std::string tgt = put("tgt.txt", parts[2]), tgt_vocab = put("tgt.vocab", parts[3]);
  std::vector<SentencePair> pairs;
  if (!parses([&] { pairs = load_pairs(src, src_vocab, tgt, tgt_vocab, kVocab); })) return 0;
  std::string vocab = "<unk>\n<s>\n</s>\n", a, b;
  for (uint32_t id = 3; id < kVocab; ++id) vocab += "w" + std::to_string(id) + "\n";
  for (const SentencePair& p : pairs) {
    FUZZ_CHECK(!p.source.empty() && !p.target.empty(), "a pair with an empty side");
    for (uint32_t id : p.source) FUZZ_CHECK(id < kVocab, "source id unfolded");
    for (uint32_t id : p.target) FUZZ_CHECK(id < kVocab, "target id unfolded");
    a += sentence(p.source) + "\n";
    b += sentence(p.target) + "\n";
  }
  const std::string v = put("canonical.vocab", vocab);
  const std::vector<SentencePair> back =
      load_pairs(put("back.src", a), v, put("back.tgt", b), v, kVocab);
  FUZZ_CHECK(back.size() == pairs.size(), "written pairs read back as another number of pairs");
  for (size_t i = 0; i < pairs.size(); ++i)
    FUZZ_CHECK(back[i].source == pairs[i].source && back[i].target == pairs[i].target,
               "written pairs read back differently");
  return 0;
}
