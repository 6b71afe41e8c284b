// Tagged sentences, one per line: "word|TAG word|TAG ...".
#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "edbatch/data.h"
#include "edbatch/files.h"

namespace edbatch {

namespace {

class TaggedParser {
 public:
  TaggedParser(const std::string& source, uint32_t vocab_size, Vocabulary& vocabulary)
      : source_(source),
        vocab_size_(vocab_size),
        words_(vocabulary.words),
        tags_(vocabulary.tags),
        tag_names_(vocabulary.tag_names),
        spellings_(vocabulary.spellings) {}

  // Appends the line's sentence; false for a blank line.
  bool parse_line(size_t line_no, std::string_view line, TaggedSentence& out) {
    out.words.clear();
    out.tags.clear();
    size_t i = 0;
    while (true) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i == line.size()) break;
      size_t end = i;
      while (end < line.size() && !std::isspace(static_cast<unsigned char>(line[end]))) ++end;
      add_token(line_no, i + 1, line.substr(i, end - i), out);
      i = end;
    }
    return !out.words.empty();
  }

  TaggedData finish(std::vector<TaggedSentence> sentences) {
    TaggedData data;
    data.sentences = std::move(sentences);
    data.num_tags = static_cast<uint32_t>(tag_names_.size());
    data.tag_names = tag_names_;
    data.spellings = spellings_;
    return data;
  }

 private:
  [[noreturn]] void fail(size_t line_no, size_t column, const std::string& what) const {
    throw std::invalid_argument(
        fmt::format("[parse_tagged] {}:{}:{}: {}", source_, line_no, column, what));
  }

  // The tag follows the last '|', so words may contain '|' themselves.
  void add_token(size_t line_no, size_t column, std::string_view token, TaggedSentence& out) {
    const size_t bar = token.rfind('|');
    if (bar == std::string_view::npos)
      fail(line_no, column, fmt::format("expected 'word|TAG' but found '{}' (no '|')", token));
    if (bar == 0) fail(line_no, column, fmt::format("expected a word before '|' in '{}'", token));
    if (bar + 1 == token.size())
      fail(line_no, column + bar + 1, fmt::format("expected a tag after '|' in '{}'", token));
    std::string_view word = token.substr(0, bar), tag = token.substr(bar + 1);
    auto w = words_.emplace(std::string(word), static_cast<uint32_t>(words_.size()));
    const uint32_t id = vocab_size_ ? w.first->second % vocab_size_ : w.first->second;
    if (id == spellings_.size()) spellings_.emplace_back(word);  // the first word on this id
    out.words.push_back(id);
    auto t = tags_.emplace(std::string(tag), static_cast<uint32_t>(tags_.size()));
    if (t.second) tag_names_.emplace_back(tag);
    out.tags.push_back(t.first->second);
  }

  const std::string& source_;
  uint32_t vocab_size_;
  std::unordered_map<std::string, uint32_t>& words_;
  std::unordered_map<std::string, uint32_t>& tags_;
  std::vector<std::string>& tag_names_;
  std::vector<std::string>& spellings_;
};

}  // namespace

TaggedData parse_tagged(std::istream& in, const std::string& source_name, uint32_t vocab_size,
                        Vocabulary* vocabulary) {
  Vocabulary own;
  TaggedParser parser(source_name, vocab_size, vocabulary ? *vocabulary : own);
  std::vector<TaggedSentence> sentences;
  TaggedSentence sentence;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    prepare_text_line(line, "parse_tagged", source_name, line_no);
    if (parser.parse_line(line_no, line, sentence)) sentences.push_back(sentence);
  }
  if (sentences.empty())
    throw std::invalid_argument(
        fmt::format("[parse_tagged] {}:{}:1: expected a line of 'word|TAG' tokens but reached "
                    "the end of the input (no sentences)",
                    source_name, line_no + 1));
  return parser.finish(std::move(sentences));
}

TaggedData load_tagged(const std::string& path, uint32_t vocab_size, Vocabulary* vocabulary) {
  std::ifstream in = open_input(path, "load_tagged");
  return parse_tagged(in, path, vocab_size, vocabulary);
}

}  // namespace edbatch
