// Lattices: parse_lattices either refuses cleanly or gives lattices whose arcs enter each node
// from an earlier one, with folded ids; write_lattices writes them back to text that parses to
// the same lattices.
#include <sstream>
#include <string>

#include "edbatch/data.h"
#include "fuzz/fuzz_check.h"

using namespace edbatch;
using edbatch::fuzz::parses;

namespace {

constexpr uint32_t kVocab = 64;

void check_lattice(const Lattice& l) {
  const uint32_t n = l.length();
  FUZZ_CHECK(n >= 1, "an empty lattice");
  FUZZ_CHECK(l.arc_begin.size() == n + 1 && l.arc_begin[0] == 0 && l.arc_begin[n] == l.arcs.size(),
             "arc_begin does not span the arcs");
  for (uint32_t k = 0; k < n; ++k) {
    FUZZ_CHECK(l.arc_begin[k] <= l.arc_begin[k + 1], "arc_begin decreases");
    for (uint32_t a = l.arc_begin[k]; a < l.arc_begin[k + 1]; ++a)
      FUZZ_CHECK(l.arcs[a].from < k && l.arcs[a].id < kVocab, "an arc from a later node");
  }
}

bool same(const std::vector<Lattice>& a, const std::vector<Lattice>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].tags != b[i].tags || a[i].arc_begin != b[i].arc_begin ||
        a[i].arcs.size() != b[i].arcs.size())
      return false;
    for (size_t k = 0; k < a[i].arcs.size(); ++k)
      if (a[i].arcs[k].from != b[i].arcs[k].from || a[i].arcs[k].id != b[i].arcs[k].id)
        return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<Lattice> lattices;
  if (!parses([&] {
        std::istringstream in(text);
        lattices = parse_lattices(in, "fuzz", kVocab);
      }))
    return 0;
  for (const Lattice& l : lattices) check_lattice(l);
  lattice_stats(lattices);
  std::ostringstream out;
  write_lattices(out, lattices);
  std::istringstream again(out.str());
  const std::vector<Lattice> back = parse_lattices(again, "written", kVocab);
  FUZZ_CHECK(same(lattices, back), "written lattices read back differently");
  return 0;
}
