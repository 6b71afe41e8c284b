// Tagged sentences: parse_tagged either refuses cleanly or gives sentences with a tag per word
// and a spelling per word id; write_tagged writes them back (with the spellings and tag names)
// to text that parses to the same data.
#include <sstream>
#include <string>

#include "edbatch/data.h"
#include "fuzz/fuzz_check.h"

using namespace edbatch;
using edbatch::fuzz::parses;

namespace {

constexpr uint32_t kVocab = 64;

void check_data(const TaggedData& d) {
  FUZZ_CHECK(!d.sentences.empty(), "no sentences");
  FUZZ_CHECK(d.tag_names.size() == d.num_tags, "tag names and tag count differ");
  for (const TaggedSentence& s : d.sentences) {
    FUZZ_CHECK(!s.words.empty() && s.words.size() == s.tags.size(), "a tag per word");
    for (size_t k = 0; k < s.words.size(); ++k) {
      FUZZ_CHECK(s.words[k] < kVocab && s.words[k] < d.spellings.size(), "word id unfolded");
      FUZZ_CHECK(s.tags[k] < d.num_tags, "tag id out of range");
    }
  }
}

bool same(const TaggedData& a, const TaggedData& b) {
  if (a.sentences.size() != b.sentences.size() || a.tag_names != b.tag_names ||
      a.spellings != b.spellings)
    return false;
  for (size_t i = 0; i < a.sentences.size(); ++i)
    if (a.sentences[i].words != b.sentences[i].words || a.sentences[i].tags != b.sentences[i].tags)
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  TaggedData d;
  if (!parses([&] {
        std::istringstream in(text);
        d = parse_tagged(in, "fuzz", kVocab);
      }))
    return 0;
  check_data(d);
  std::ostringstream out;
  write_tagged(out, d.sentences, d.tag_names, d.spellings);
  std::istringstream again(out.str());
  const TaggedData back = parse_tagged(again, "written", kVocab);
  FUZZ_CHECK(same(d, back), "written sentences read back differently");
  return 0;
}
