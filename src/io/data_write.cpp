// Writers for the text formats of data.h: SST trees, lattices and tagged sentences.
#include <fmt/format.h>

#include <cctype>
#include <ostream>
#include <stdexcept>
#include <string>

#include "edbatch/data.h"

namespace edbatch {

namespace {

void check_stream(const std::ostream& out, const char* fn) {
  if (!out) throw std::runtime_error(fmt::format("[{}] error writing the output", fn));
}

// One tree as a bracketed line, without recursion (trees of any depth). The tree must be in
// post-order, the way parse_trees and the generators make it.
void write_tree(std::ostream& out, const Tree& tree, size_t index, std::string& line) {
  const auto& nodes = tree.nodes;
  if (nodes.empty())
    throw std::invalid_argument(fmt::format("[write_trees] tree {} is empty", index));
  for (size_t k = 0; k < nodes.size(); ++k) {
    const TreeNode& n = nodes[k];
    if (n.label > 4)
      throw std::invalid_argument(
          fmt::format("[write_trees] tree {} node {}: label {} outside 0..4", index, k, n.label));
    if (!n.leaf() && (n.right < 0 || size_t(n.left) >= k || size_t(n.right) >= k))
      throw std::invalid_argument(fmt::format(
          "[write_trees] tree {} node {}: children {} and {} must come before it (post-order)",
          index, k, n.left, n.right));
  }
  // Each stack entry is a node and how many of its children are written already (2 = close).
  struct Open {
    int32_t node;
    int stage;
  };
  std::vector<Open> stack{{static_cast<int32_t>(nodes.size() - 1), 0}};
  line.clear();
  while (!stack.empty()) {
    Open& top = stack.back();
    const TreeNode& n = nodes[size_t(top.node)];
    if (n.leaf()) {
      line += fmt::format("({} w{})", n.label, n.word);
      stack.pop_back();
    } else if (top.stage == 0) {
      line += fmt::format("({} ", n.label);
      top.stage = 1;
      stack.push_back({n.left, 0});
    } else if (top.stage == 1) {
      line += ' ';
      top.stage = 2;
      stack.push_back({n.right, 0});
    } else {
      line += ')';
      stack.pop_back();
    }
  }
  out << line << '\n';
}

}  // namespace

void write_trees(std::ostream& out, const std::vector<Tree>& trees) {
  std::string line;
  for (size_t i = 0; i < trees.size(); ++i) write_tree(out, trees[i], i, line);
  check_stream(out, "write_trees");
}

void write_lattices(std::ostream& out, const std::vector<Lattice>& lattices) {
  out << lattices.size() << '\n';
  for (size_t i = 0; i < lattices.size(); ++i) {
    const Lattice& l = lattices[i];
    const uint32_t n = l.length();
    if (n == 0 || l.arc_begin.size() != n + 1 || l.arc_begin[0] != 0 ||
        l.arc_begin[n] != l.arcs.size())
      throw std::invalid_argument(fmt::format(
          "[write_lattices] lattice {}: expected 1 or more nodes and arc_begin of length + 1 "
          "entries from 0 to the arc count",
          i));
    out << n << '\n';
    for (uint32_t k = 0; k < n; ++k) out << (k ? " " : "") << unsigned(l.tags[k]);
    out << '\n';
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t a0 = l.arc_begin[k], a1 = l.arc_begin[k + 1];
      if (a1 < a0)
        throw std::invalid_argument(
            fmt::format("[write_lattices] lattice {}: arc_begin decreases at node {}", i, k));
      out << (a1 - a0);
      for (uint32_t a = a0; a < a1; ++a) {
        if (l.arcs[a].from >= k)
          throw std::invalid_argument(
              fmt::format("[write_lattices] lattice {}: arc into node {} comes from node {}", i, k,
                          l.arcs[a].from));
        out << ' ' << l.arcs[a].from << ' ' << l.arcs[a].id;
      }
      out << '\n';
    }
    out << '\n';
  }
  check_stream(out, "write_lattices");
}

void write_tagged(std::ostream& out, const std::vector<TaggedSentence>& sentences,
                  const std::vector<std::string>& tag_names,
                  const std::vector<std::string>& spellings) {
  for (size_t w = 0; w < spellings.size(); ++w)
    for (char c : spellings[w])
      if (std::isspace(static_cast<unsigned char>(c)))
        throw std::invalid_argument(fmt::format(
            "[write_tagged] the spelling of word {} ('{}') contains white space", w, spellings[w]));
  for (size_t i = 0; i < sentences.size(); ++i) {
    const TaggedSentence& s = sentences[i];
    if (s.words.empty() || s.words.size() != s.tags.size())
      throw std::invalid_argument(fmt::format(
          "[write_tagged] sentence {}: {} words and {} tags, expected as many tags as words "
          "(at least one)",
          i, s.words.size(), s.tags.size()));
    for (size_t k = 0; k < s.words.size(); ++k) {
      const uint32_t w = s.words[k];
      out << (k ? " " : "");
      if (w < spellings.size() && !spellings[w].empty()) {
        out << spellings[w] << '|';
      } else {
        out << 'w' << w << '|';
      }
      if (tag_names.empty()) {
        out << 'T' << s.tags[k];
      } else if (s.tags[k] < tag_names.size()) {
        out << tag_names[s.tags[k]];
      } else {
        throw std::invalid_argument(
            fmt::format("[write_tagged] sentence {}: tag {} has no name ({} tag names)", i,
                        s.tags[k], tag_names.size()));
      }
    }
    out << '\n';
  }
  check_stream(out, "write_tagged");
}

}  // namespace edbatch
