// The packed structures of the PyTorch extension (src/torch/cells.h) as text, for the fuzz target
// and its seeds: a first line "<cell> <x rows>", then one line of integers per array in the
// order node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs, instance_offsets.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace edbatch::fuzz {

// The cells the target runs, indexed by the first number of the text (modulo their count), with
// the input sizes they take at hidden size kHidden.
constexpr uint32_t kHidden = 3, kMvrnnInput = kHidden + kHidden * kHidden;  // a leaf's v and M
struct FuzzCell {
  const char* name;
  uint32_t input_dim;
};
inline constexpr FuzzCell kCells[] = {{"tree_lstm", 2},    {"tree_gru", kHidden},
                                      {"lattice_lstm", 2}, {"lattice_gru", 2},
                                      {"random_dag", 2},   {"mvrnn", kMvrnnInput}};

struct PackedText {
  int64_t cell = 0, num_x = 0;
  std::vector<int64_t> arrays[7];
};

// False for text that is not lines of integers.
inline bool parse_packed_text(const std::string& text, PackedText& out) {
  std::istringstream in(text);
  std::string line;
  for (int i = -1; i < 7 && std::getline(in, line); ++i) {
    std::vector<int64_t> v;
    const char* p = line.c_str();
    while (true) {
      while (*p == ' ' || *p == '\t' || *p == '\r') ++p;
      if (*p == '\0') break;
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(p, &end, 10);
      if (end == p || errno == ERANGE) return false;
      v.push_back(x);
      p = end;
    }
    if (i < 0) {
      if (v.size() != 2) return false;
      out.cell = v[0];
      out.num_x = v[1];
    } else {
      out.arrays[i] = std::move(v);
    }
  }
  return true;
}

inline std::string packed_text(const PackedText& p) {
  std::string s = std::to_string(p.cell) + " " + std::to_string(p.num_x) + "\n";
  for (const auto& a : p.arrays) {
    for (size_t i = 0; i < a.size(); ++i) s += (i ? " " : "") + std::to_string(a[i]);
    s += "\n";
  }
  return s;
}

}  // namespace edbatch::fuzz
