// Bracketed binary trees (Stanford Sentiment Treebank format) and their statistics.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "edbatch/data.h"
#include "edbatch/files.h"

namespace edbatch {

namespace {

// An open '(' whose node is not finished yet.
struct OpenNode {
  uint8_t label = 0;
  size_t column = 0;
  int32_t children[2] = {-1, -1};
  uint32_t num_children = 0;
  bool has_word = false;
  uint32_t word = 0;
};

class TreeLineParser {
 public:
  TreeLineParser(const std::string& source, size_t line_no, std::string_view line,
                 std::unordered_map<std::string, uint32_t>& words, uint32_t vocab_size)
      : source_(source), line_no_(line_no), s_(line), words_(words), vocab_size_(vocab_size) {}

  Tree parse() {
    Tree tree;
    bool done = false;
    while (skip_space()) {
      const size_t column = pos_ + 1;
      if (done)
        fail(column, fmt::format("expected the end of the line after the tree but found '{}'",
                                 peek_token()));
      if (s_[pos_] == '(') {
        open_node(column);
      } else if (s_[pos_] == ')') {
        ++pos_;
        done = close_node(column, tree);
      } else {
        add_word(column, read_atom());
      }
    }
    if (!stack_.empty())
      fail(s_.size() + 1, fmt::format("unbalanced brackets: expected ')' to close the '(' at "
                                      "column {} but reached the end of the line",
                                      stack_.back().column));
    return tree;
  }

 private:
  [[noreturn]] void fail(size_t column, const std::string& what) const {
    throw std::invalid_argument(
        fmt::format("[parse_trees] {}:{}:{}: {}", source_, line_no_, column, what));
  }

  // Skips blanks; false at the end of the line.
  bool skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    return pos_ < s_.size();
  }
  static bool is_atom_char(char c) {
    return c != '(' && c != ')' && !std::isspace(static_cast<unsigned char>(c));
  }
  std::string_view read_atom() {
    size_t begin = pos_;
    while (pos_ < s_.size() && is_atom_char(s_[pos_])) ++pos_;
    return s_.substr(begin, pos_ - begin);
  }
  std::string_view peek_token() const {
    if (s_[pos_] == '(' || s_[pos_] == ')') return s_.substr(pos_, 1);
    size_t end = pos_;
    while (end < s_.size() && is_atom_char(s_[end])) ++end;
    return s_.substr(pos_, end - pos_);
  }

  void open_node(size_t column) {
    if (!stack_.empty()) {
      const OpenNode& parent = stack_.back();
      if (parent.has_word)
        fail(column, fmt::format("the node at column {} already has a word: expected ')' but "
                                 "found '('",
                                 parent.column));
      if (parent.num_children == 2)
        fail(column, fmt::format("non-binary node at column {}: expected ')' after two children "
                                 "but found a third child",
                                 parent.column));
    }
    ++pos_;
    OpenNode node;
    node.column = column;
    if (!skip_space())
      fail(pos_ + 1, "expected a label 0-4 after '(' but reached the end of the line");
    const size_t label_column = pos_ + 1;
    std::string_view label = s_[pos_] == '(' || s_[pos_] == ')' ? s_.substr(pos_, 1) : read_atom();
    if (label.size() != 1 || label[0] < '0' || label[0] > '4')
      fail(label_column, fmt::format("expected a label 0-4 after '(' but found '{}'", label));
    node.label = static_cast<uint8_t>(label[0] - '0');
    stack_.push_back(node);
  }

  // Returns true when the root closed.
  bool close_node(size_t column, Tree& tree) {
    if (stack_.empty()) fail(column, "unbalanced brackets: ')' without a matching '('");
    OpenNode open = stack_.back();
    stack_.pop_back();
    TreeNode node;
    node.label = open.label;
    if (open.has_word) {
      node.word = open.word;
    } else if (open.num_children == 2) {
      node.left = open.children[0];
      node.right = open.children[1];
    } else if (open.num_children == 1) {
      fail(column,
           fmt::format("unary node at column {}: expected a second child before ')'", open.column));
    } else {
      fail(column, fmt::format("empty node at column {}: expected a word or two children "
                               "before ')'",
                               open.column));
    }
    tree.nodes.push_back(node);
    if (stack_.empty()) return true;
    OpenNode& parent = stack_.back();
    parent.children[parent.num_children++] = static_cast<int32_t>(tree.nodes.size() - 1);
    return false;
  }

  void add_word(size_t column, std::string_view word) {
    if (stack_.empty()) fail(column, fmt::format("expected '(' but found '{}'", word));
    OpenNode& node = stack_.back();
    if (node.has_word)
      fail(column, fmt::format("the node at column {} already has a word: expected ')' but "
                               "found '{}'",
                               node.column, word));
    if (node.num_children > 0)
      fail(column, fmt::format("the node at column {} has children: expected '(' or ')' but "
                               "found the word '{}'",
                               node.column, word));
    auto it = words_.emplace(std::string(word), static_cast<uint32_t>(words_.size())).first;
    node.has_word = true;
    node.word = vocab_size_ ? it->second % vocab_size_ : it->second;
  }

  const std::string& source_;
  size_t line_no_;
  std::string_view s_;
  std::unordered_map<std::string, uint32_t>& words_;
  uint32_t vocab_size_;
  size_t pos_ = 0;
  std::vector<OpenNode> stack_;
};

bool blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

}  // namespace

std::vector<Tree> parse_trees(std::istream& in, const std::string& source_name, uint32_t vocab_size,
                              Vocabulary* vocabulary) {
  std::vector<Tree> trees;
  std::unordered_map<std::string, uint32_t> own;
  std::unordered_map<std::string, uint32_t>& words = vocabulary ? vocabulary->words : own;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    prepare_text_line(line, "parse_trees", source_name, line_no);
    if (blank(line)) continue;
    trees.push_back(TreeLineParser(source_name, line_no, line, words, vocab_size).parse());
  }
  if (trees.empty())
    throw std::invalid_argument(
        fmt::format("[parse_trees] {}:{}:1: expected a bracketed tree but reached the end of the "
                    "input (no trees)",
                    source_name, line_no + 1));
  return trees;
}

std::vector<Tree> load_trees(const std::string& path, uint32_t vocab_size, Vocabulary* vocabulary) {
  std::ifstream in = open_input(path, "load_trees");
  return parse_trees(in, path, vocab_size, vocabulary);
}

uint32_t tree_depth(const Tree& tree) {
  if (tree.nodes.empty()) throw std::invalid_argument("[tree_depth] empty tree");
  std::vector<uint32_t> depth(tree.nodes.size(), 0);
  for (size_t i = 0; i < tree.nodes.size(); ++i) {
    const TreeNode& n = tree.nodes[i];
    if (n.leaf()) continue;
    if (n.left >= static_cast<int32_t>(i) || n.right < 0 || n.right >= static_cast<int32_t>(i))
      throw std::invalid_argument(
          fmt::format("[tree_depth] node {} has children {} and {}: expected indices below {} "
                      "(post-order)",
                      i, n.left, n.right, i));
    depth[i] = 1 + std::max(depth[n.left], depth[n.right]);
  }
  return depth.back();
}

uint32_t tree_words(const Tree& tree) {
  return static_cast<uint32_t>(std::count_if(tree.nodes.begin(), tree.nodes.end(),
                                             [](const TreeNode& n) { return n.leaf(); }));
}

TreeStats tree_stats(const std::vector<Tree>& trees) {
  TreeStats s;
  if (trees.empty()) return s;
  s.count = static_cast<uint32_t>(trees.size());
  s.min_words = UINT32_MAX;
  double words = 0, depth = 0;
  for (const Tree& t : trees) {
    uint32_t w = tree_words(t), d = tree_depth(t);
    words += w;
    depth += d;
    s.min_words = std::min(s.min_words, w);
    s.max_words = std::max(s.max_words, w);
    s.max_depth = std::max(s.max_depth, d);
  }
  s.mean_words = words / s.count;
  s.mean_depth = depth / s.count;
  return s;
}

}  // namespace edbatch
