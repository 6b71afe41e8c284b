// SST trees: parse_trees either refuses cleanly or gives post-order binary trees with labels 0-4
// and folded word ids, which write_trees writes back to text that parses to the same trees.
#include <sstream>
#include <string>

#include "edbatch/data.h"
#include "fuzz/fuzz_check.h"

using namespace edbatch;
using edbatch::fuzz::parses;

namespace {

constexpr uint32_t kVocab = 64;

void check_tree(const Tree& t) {
  const auto& nodes = t.nodes;
  FUZZ_CHECK(!nodes.empty(), "an empty tree");
  std::vector<uint8_t> parents(nodes.size(), 0);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const TreeNode& n = nodes[k];
    FUZZ_CHECK(n.label <= 4, "label above 4");
    if (n.leaf()) {
      FUZZ_CHECK(n.right < 0 && n.word < kVocab, "leaf with a right child or an unfolded word");
      continue;
    }
    FUZZ_CHECK(n.left >= 0 && n.right >= 0 && size_t(n.left) < k && size_t(n.right) < k,
               "children not before their parent");
    ++parents[size_t(n.left)];
    ++parents[size_t(n.right)];
  }
  for (size_t k = 0; k + 1 < nodes.size(); ++k) FUZZ_CHECK(parents[k] == 1, "not a tree");
  FUZZ_CHECK(parents.back() == 0, "the root has a parent");
  tree_depth(t);  // throws on a tree that is not in post-order
}

bool same(const std::vector<Tree>& a, const std::vector<Tree>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].nodes.size() != b[i].nodes.size()) return false;
    for (size_t k = 0; k < a[i].nodes.size(); ++k) {
      const TreeNode &x = a[i].nodes[k], &y = b[i].nodes[k];
      if (x.left != y.left || x.right != y.right || x.word != y.word || x.label != y.label)
        return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<Tree> trees;
  if (!parses([&] {
        std::istringstream in(text);
        trees = parse_trees(in, "fuzz", kVocab);
      }))
    return 0;
  for (const Tree& t : trees) check_tree(t);
  std::ostringstream out;
  write_trees(out, trees);
  std::istringstream again(out.str());
  const std::vector<Tree> back = parse_trees(again, "written", kVocab);
  FUZZ_CHECK(same(trees, back), "written trees read back differently");
  std::ostringstream out2;
  write_trees(out2, back);
  FUZZ_CHECK(out2.str() == out.str(), "writing is not stable");
  return 0;
}
