// PQ-tree queries: the admitted orders (one, with chosen orientations, or all of them) and a
// printed form. They read the structure only.
#include "memplan/pqtree.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace edbatch {

std::vector<uint32_t> PQTree::frontier() const {
  return frontier(std::vector<uint8_t>{});
}

std::vector<uint32_t> PQTree::frontier(const std::vector<uint8_t>& reversed) const {
  std::vector<uint32_t> out;
  out.reserve(n_);
  if (root_ == kNil) return out;
  std::vector<uint32_t> stack{root_};
  while (!stack.empty()) {
    const uint32_t x = stack.back();
    stack.pop_back();
    if (nodes_[x].kind == Kind::Leaf) {
      out.push_back(x);
      continue;
    }
    const uint32_t last = x < reversed.size() && reversed[x] ? 0 : 1;
    for (uint32_t prev = kNil, c = nodes_[x].end[last]; c != kNil;) {
      stack.push_back(c);  // pushed from the last end so that the first comes out first
      const uint32_t next = other_sib(c, prev);
      prev = c;
      c = next;
    }
  }
  return out;
}

std::string PQTree::to_string() const {
  std::string out;
  if (root_ == kNil) return out;
  std::vector<std::pair<uint32_t, bool>> stack{{root_, false}};  // kNil closes a node
  while (!stack.empty()) {
    const auto [x, space] = stack.back();
    stack.pop_back();
    if (x == kNil) {
      out += ')';
      continue;
    }
    if (space) out += ' ';
    if (nodes_[x].kind == Kind::Leaf) {
      out += std::to_string(x);
      continue;
    }
    out += nodes_[x].kind == Kind::P ? "P(" : "Q(";
    stack.push_back({kNil, false});
    const std::vector<uint32_t> kids = children(x);
    for (size_t i = kids.size(); i-- > 0;) stack.push_back({kids[i], i > 0});
  }
  return out;
}

std::vector<std::vector<uint32_t>> PQTree::admitted_orders() const {
  if (n_ > 10) {
    throw std::invalid_argument("[PQTree::admitted_orders] " + std::to_string(n_) +
                                " leaves is too many to enumerate (at most 10)");
  }
  if (root_ == kNil) return {{}};
  return orders_of(root_);
}

std::vector<std::vector<uint32_t>> PQTree::orders_of(uint32_t x) const {
  if (nodes_[x].kind == Kind::Leaf) return {{x}};
  const std::vector<uint32_t> kids = children(x);
  std::vector<std::vector<std::vector<uint32_t>>> sub;
  for (uint32_t c : kids) sub.push_back(orders_of(c));
  std::vector<size_t> idx(kids.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<std::vector<size_t>> arrangements;
  if (nodes_[x].kind == Kind::P) {
    do {
      arrangements.push_back(idx);
    } while (std::next_permutation(idx.begin(), idx.end()));
  } else {
    arrangements.push_back(idx);
    arrangements.emplace_back(idx.rbegin(), idx.rend());
  }
  std::vector<std::vector<uint32_t>> out;
  for (const std::vector<size_t>& arrangement : arrangements) {
    std::vector<std::vector<uint32_t>> partial{{}};
    for (size_t i : arrangement) {
      std::vector<std::vector<uint32_t>> grown;
      for (const std::vector<uint32_t>& prefix : partial) {
        for (const std::vector<uint32_t>& tail : sub[i]) {
          grown.push_back(prefix);
          grown.back().insert(grown.back().end(), tail.begin(), tail.end());
        }
      }
      partial = std::move(grown);
    }
    out.insert(out.end(), partial.begin(), partial.end());
  }
  return out;
}

}  // namespace edbatch
