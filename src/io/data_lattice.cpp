// Character lattices with word arcs: the text format and statistics.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <stdexcept>

#include "edbatch/data.h"
#include "edbatch/files.h"

namespace edbatch {

namespace {

struct Number {
  uint64_t value;
  size_t column;
};

class LatticeReader {
 public:
  LatticeReader(std::istream& in, const std::string& source) : in_(in), source_(source) {}

  [[noreturn]] void fail(size_t column, const std::string& what) const {
    throw std::invalid_argument(
        fmt::format("[parse_lattices] {}:{}:{}: {}", source_, line_no_, column, what));
  }
  [[noreturn]] void fail_at_end(const std::string& what) {
    ++line_no_;
    fail(1, what + " but reached the end of the input");
  }

  // Next line; false at the end of the input.
  bool next() {
    if (!std::getline(in_, line_)) return false;
    ++line_no_;
    prepare_text_line(line_, "parse_lattices", source_, line_no_);
    return true;
  }
  bool next_nonblank() {
    while (next())
      if (!blank()) return true;
    return false;
  }
  bool blank() const {
    return std::all_of(line_.begin(), line_.end(),
                       [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
  }

  // The current line as non-negative integers.
  std::vector<Number> numbers(const char* what) const {
    std::vector<Number> out;
    size_t i = 0;
    const size_t n = line_.size();
    while (true) {
      while (i < n && std::isspace(static_cast<unsigned char>(line_[i]))) ++i;
      if (i == n) break;
      size_t end = i;
      while (end < n && !std::isspace(static_cast<unsigned char>(line_[end]))) ++end;
      uint64_t v = 0;
      auto r = std::from_chars(line_.data() + i, line_.data() + end, v);
      if (r.ec != std::errc() || r.ptr != line_.data() + end)
        fail(i + 1, fmt::format("expected a non-negative integer ({}) but found '{}'", what,
                                line_.substr(i, end - i)));
      out.push_back({v, i + 1});
      i = end;
    }
    return out;
  }

  // The current line holds exactly one integer in [lo, hi].
  uint64_t single(const char* what, uint64_t lo, uint64_t hi) const {
    std::vector<Number> v = numbers(what);
    if (v.size() != 1)
      fail(v.size() > 1 ? v[1].column : 1,
           fmt::format("expected a single integer ({}) but found {} numbers", what, v.size()));
    if (v[0].value < lo || v[0].value > hi)
      fail(v[0].column,
           fmt::format("expected {} in {}..{} but found {}", what, lo, hi, v[0].value));
    return v[0].value;
  }

  const std::string& line() const { return line_; }

 private:
  std::istream& in_;
  const std::string& source_;
  std::string line_;
  size_t line_no_ = 0;
};

Lattice read_lattice(LatticeReader& r, uint64_t index, uint64_t count, uint32_t vocab_size) {
  const std::string which = fmt::format("lattice {} of {}", index + 1, count);
  if (!r.next_nonblank()) r.fail_at_end(fmt::format("truncated input: expected {}", which));
  const uint32_t length = static_cast<uint32_t>(r.single("the lattice length", 1, UINT32_MAX));

  Lattice lat;
  if (!r.next()) r.fail_at_end(fmt::format("expected the {} tags of {}", length, which));
  std::vector<Number> tags = r.numbers("a tag");
  if (tags.size() != length)
    r.fail(tags.size() > length ? tags[length].column : r.line().size() + 1,
           fmt::format("expected {} tags for {} (its length) but found {}", length, which,
                       tags.size()));
  for (const Number& t : tags) {
    if (t.value > 255)
      r.fail(t.column, fmt::format("expected a tag in 0..255 but found {}", t.value));
    lat.tags.push_back(static_cast<uint8_t>(t.value));
  }

  lat.arc_begin.push_back(0);
  for (uint32_t k = 0; k < length; ++k) {
    if (!r.next())
      r.fail_at_end(
          fmt::format("truncated input: expected the arcs into node {} of {} ({} arc "
                      "lines)",
                      k, which, length));
    std::vector<Number> v = r.numbers("an arc count, source node or arc id");
    if (v.empty())
      r.fail(1, fmt::format("expected the arc count of node {} of {} but found an empty line", k,
                            which));
    const uint64_t n = v[0].value;
    if ((v.size() - 1) % 2 != 0 || (v.size() - 1) / 2 != n)
      r.fail(v[0].column,
             fmt::format("the arc line of node {} of {} announces {} arcs ({} numbers after the "
                         "count) but has {} numbers after the count",
                         k, which, n, 2 * n, v.size() - 1));
    for (uint64_t j = 0; j < n; ++j) {
      const Number& from = v[1 + 2 * j];
      const Number& id = v[2 + 2 * j];
      if (from.value >= k)
        r.fail(from.column, fmt::format("arc {} into node {} of {} comes from node {}: expected "
                                        "a source node below {}",
                                        j, k, which, from.value, k));
      if (id.value > UINT32_MAX)
        r.fail(id.column, fmt::format("expected an arc id below 2^32 but found {}", id.value));
      const uint32_t raw = static_cast<uint32_t>(id.value);
      lat.arcs.push_back({static_cast<uint32_t>(from.value), vocab_size ? raw % vocab_size : raw});
    }
    lat.arc_begin.push_back(static_cast<uint32_t>(lat.arcs.size()));
  }
  return lat;
}

}  // namespace

std::vector<Lattice> parse_lattices(std::istream& in, const std::string& source_name,
                                    uint32_t vocab_size) {
  LatticeReader r(in, source_name);
  if (!r.next_nonblank())
    r.fail_at_end("expected the number of lattices on the first line (no lattices)");
  const uint64_t count = r.single("the number of lattices", 1, UINT32_MAX);
  std::vector<Lattice> lattices;
  for (uint64_t i = 0; i < count; ++i) lattices.push_back(read_lattice(r, i, count, vocab_size));
  if (r.next_nonblank())
    r.fail(1, fmt::format("expected the end of the input after the {} announced lattices but "
                          "found more lines",
                          count));
  return lattices;
}

std::vector<Lattice> load_lattices(const std::string& path, uint32_t vocab_size) {
  std::ifstream in = open_input(path, "load_lattices");
  return parse_lattices(in, path, vocab_size);
}

LatticeStats lattice_stats(const std::vector<Lattice>& lattices) {
  LatticeStats s;
  if (lattices.empty()) return s;
  s.count = static_cast<uint32_t>(lattices.size());
  s.min_nodes = UINT32_MAX;
  double nodes = 0, arcs = 0, word_arcs = 0;
  for (const Lattice& lat : lattices) {
    const uint32_t len = lat.length();
    nodes += len;
    arcs += static_cast<double>(lat.arcs.size());
    s.min_nodes = std::min(s.min_nodes, len);
    s.max_nodes = std::max(s.max_nodes, len);
    for (uint32_t k = 0; k < len && k + 1 < lat.arc_begin.size(); ++k)
      for (uint32_t a = lat.arc_begin[k]; a < lat.arc_begin[k + 1]; ++a)
        word_arcs += Lattice::is_word_arc(k, lat.arcs[a]);
  }
  s.mean_nodes = nodes / s.count;
  s.mean_arcs = arcs / s.count;
  s.word_arc_fraction = arcs > 0 ? word_arcs / arcs : 0.0;
  return s;
}

}  // namespace edbatch
