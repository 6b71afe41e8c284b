#include "memplan/layout.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace edbatch {
namespace {

constexpr uint32_t kNone = 0xffffffffu;

void validate(uint32_t n, const std::vector<SequenceWant>& wants) {
  std::vector<uint32_t> last_want(n, kNone);  // the want that last named each element
  for (uint32_t w = 0; w < wants.size(); ++w) {
    for (uint32_t e : wants[w].elems) {
      const bool out_of_range = e >= n;
      if (!out_of_range && last_want[e] != w) {
        last_want[e] = w;
        continue;
      }
      throw std::invalid_argument(
          "[order_group] want " + std::to_string(w) + ": element " + std::to_string(e) +
          (out_of_range ? " out of range for " + std::to_string(n) + " elements" : " repeated"));
    }
  }
}

// Wants by priority: bytes descending, ties by input index. Sorting compact keys keeps the
// comparisons in cache.
std::vector<uint32_t> priority_order(const std::vector<SequenceWant>& wants) {
  std::vector<std::pair<uint64_t, uint32_t>> keys(wants.size());
  for (uint32_t w = 0; w < wants.size(); ++w) keys[w] = {~wants[w].bytes, w};
  std::sort(keys.begin(), keys.end());
  std::vector<uint32_t> order(wants.size());
  for (size_t i = 0; i < keys.size(); ++i) order[i] = keys[i].second;
  return order;
}

std::vector<uint8_t> satisfied_flags(const std::vector<uint32_t>& order,
                                     const std::vector<SequenceWant>& wants) {
  std::vector<uint32_t> pos(order.size());
  for (uint32_t i = 0; i < order.size(); ++i) pos[order[i]] = i;
  std::vector<uint8_t> out(wants.size(), 1);
  for (size_t w = 0; w < wants.size(); ++w) {
    const std::vector<uint32_t>& e = wants[w].elems;
    for (size_t i = 0; i + 1 < e.size() && out[w]; ++i) out[w] = pos[e[i + 1]] == pos[e[i]] + 1;
  }
  return out;
}

// Accepted wants as "b right after a" links. Orders that satisfy a set of sequences exist iff
// the links form disjoint acyclic chains; each chain's two end elements know the other end.
// (A PQ-tree fed only adjacent pairs degenerates to exactly these chains; tests check both agree.)
class Chains {
 public:
  explicit Chains(uint32_t n) : succ_(n, kNone), pred_(n, kNone), other_end_(n) {
    std::iota(other_end_.begin(), other_end_.end(), 0u);
  }

  // Links every consecutive pair of `elems`, or none of them when one does not fit.
  bool offer(const std::vector<uint32_t>& elems) {
    linked_.clear();
    old_ends_.clear();
    for (size_t i = 0; i + 1 < elems.size(); ++i) {
      if (!link(elems[i], elems[i + 1])) {
        undo();
        return false;
      }
    }
    return true;
  }

  // The chains one after another, by their first element.
  std::vector<uint32_t> order() const {
    std::vector<uint32_t> out;
    out.reserve(succ_.size());
    for (uint32_t head = 0; head < pred_.size(); ++head) {
      if (pred_[head] != kNone) continue;
      for (uint32_t x = head; x != kNone; x = succ_[x]) out.push_back(x);
    }
    return out;
  }

 private:
  // a must end its chain and b start another one (other_end_[a] == b would close a cycle).
  bool link(uint32_t a, uint32_t b) {
    if (succ_[a] == b) return true;
    if (succ_[a] != kNone || pred_[b] != kNone || other_end_[a] == b) return false;
    const uint32_t head = other_end_[a];
    const uint32_t tail = other_end_[b];
    succ_[a] = b;
    pred_[b] = a;
    linked_.push_back(a);
    set_other_end(head, tail);
    set_other_end(tail, head);
    return true;
  }

  void set_other_end(uint32_t x, uint32_t v) {
    old_ends_.push_back({x, other_end_[x]});
    other_end_[x] = v;
  }

  void undo() {
    for (uint32_t a : linked_) {
      pred_[succ_[a]] = kNone;
      succ_[a] = kNone;
    }
    for (size_t i = old_ends_.size(); i-- > 0;) {
      other_end_[old_ends_[i].first] = old_ends_[i].second;
    }
  }

  std::vector<uint32_t> succ_, pred_;
  std::vector<uint32_t> other_end_;  // valid at chain ends only
  std::vector<uint32_t> linked_;     // links made by the current offer, for undo
  std::vector<std::pair<uint32_t, uint32_t>> old_ends_;
};

}  // namespace

GroupOrder order_group(uint32_t n, const std::vector<SequenceWant>& wants) {
  validate(n, wants);
  Chains chains(n);
  GroupOrder out;
  for (uint32_t w : priority_order(wants)) out.accepted += chains.offer(wants[w].elems);
  out.order = chains.order();
  out.satisfied = satisfied_flags(out.order, wants);
  for (size_t w = 0; w < wants.size(); ++w) {
    if (out.satisfied[w]) out.bytes_satisfied += wants[w].bytes;
  }
  return out;
}

}  // namespace edbatch
