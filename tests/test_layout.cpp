// Layout planning: order_group against brute force over all permutations, against a PQ-tree
// implementation of the same greedy, and truthful flags on large seeded cases.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "memplan/layout.h"
#include "memplan/pqtree.h"

using namespace edbatch;

namespace {

using Order = std::vector<uint32_t>;
using Wants = std::vector<SequenceWant>;

bool reads_in_order(const Order& order, const Order& elems) {
  std::vector<size_t> pos(order.size());
  for (size_t i = 0; i < order.size(); ++i) pos[order[i]] = i;
  for (size_t i = 0; i + 1 < elems.size(); ++i) {
    if (pos[elems[i + 1]] != pos[elems[i]] + 1) return false;
  }
  return true;
}

bool is_permutation_of(const Order& order, uint32_t n) {
  Order sorted = order;
  std::sort(sorted.begin(), sorted.end());
  Order identity(n);
  std::iota(identity.begin(), identity.end(), 0u);
  return sorted == identity;
}

// The checks that hold for every input: a permutation, and flags and totals that tell the truth.
// Accepted wants are exactly the satisfied ones (an accepted want's orientation is guaranteed).
void check_truthful(uint32_t n, const Wants& wants, const GroupOrder& g) {
  REQUIRE(is_permutation_of(g.order, n));
  REQUIRE(g.satisfied.size() == wants.size());
  uint64_t bytes = 0;
  uint32_t count = 0;
  size_t lies = 0;
  for (size_t w = 0; w < wants.size(); ++w) {
    lies += g.satisfied[w] != reads_in_order(g.order, wants[w].elems);
    if (g.satisfied[w]) bytes += wants[w].bytes;
    count += g.satisfied[w];
  }
  CHECK(lies == 0);
  CHECK(g.bytes_satisfied == bytes);
  CHECK(g.accepted == count);
}

std::vector<uint32_t> priority_order(const Wants& wants) {
  std::vector<uint32_t> order(wants.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return wants[a].bytes > wants[b].bytes; });
  return order;
}

// Per permutation of [0, n), the bit set of wants it satisfies.
std::vector<uint32_t> satisfied_masks(uint32_t n, const Wants& wants) {
  Order p(n);
  std::iota(p.begin(), p.end(), 0u);
  std::vector<uint32_t> out;
  do {
    uint32_t mask = 0;
    for (size_t w = 0; w < wants.size(); ++w) {
      mask |= uint32_t(reads_in_order(p, wants[w].elems)) << w;
    }
    out.push_back(mask);
  } while (std::next_permutation(p.begin(), p.end()));
  return out;
}

bool jointly_satisfiable(const std::vector<uint32_t>& masks, uint32_t set) {
  return std::any_of(masks.begin(), masks.end(), [&](uint32_t m) { return (m & set) == set; });
}

// A want: a run of a hidden order (forwards or backwards), or random distinct elements.
Order random_elems(std::mt19937& rng, const Order& hidden) {
  const uint32_t n = static_cast<uint32_t>(hidden.size());
  Order e;
  if (rng() % 2 == 0) {
    const uint32_t lo = rng() % n;
    const uint32_t len = 1 + rng() % std::min<uint32_t>(4, n - lo);
    e.assign(hidden.begin() + lo, hidden.begin() + lo + len);
    if (rng() % 4 == 0) std::reverse(e.begin(), e.end());
  } else {
    e = hidden;
    std::shuffle(e.begin(), e.end(), rng);
    e.resize(rng() % std::min<uint32_t>(5, n + 1));
  }
  return e;
}

// The same greedy on a PQ-tree: reduce a want's adjacent pairs under a checkpoint; then its
// elements are adjacent leaf children of one node, and every accepted want there must need the
// same orientation of that node. The final order reads each such node in that orientation.
class PQGreedy {
 public:
  PQGreedy(uint32_t n, const Wants& wants)
      : wants_(wants), tree_(n), first_(n, PQTree::kNil), next_(wants.size()), pos_(n) {}

  bool offer(uint32_t w) {
    const Order& e = wants_[w].elems;
    if (e.size() < 2) return true;
    tree_.checkpoint();
    bool ok = true;
    for (size_t i = 0; ok && i + 1 < e.size(); ++i) ok = tree_.reduce({e[i], e[i + 1]});
    if (!ok || !agrees(w)) {
      tree_.rollback_to_checkpoint();
      return false;
    }
    tree_.release_checkpoint();
    next_[w] = first_[e[0]];
    first_[e[0]] = w;
    return true;
  }

  Order order() {
    std::vector<uint8_t> reversed(tree_.node_capacity());
    for (uint32_t w : first_) {
      if (w == PQTree::kNil) continue;
      number(node_of(w));
      reversed[node_of(w)] = !forward(w);
    }
    return tree_.frontier(reversed);
  }

 private:
  uint32_t node_of(uint32_t w) const { return tree_.parent(wants_[w].elems[0]); }
  bool forward(uint32_t w) const { return pos_[wants_[w].elems[0]] < pos_[wants_[w].elems[1]]; }

  Order number(uint32_t x) {  // pos_ of each leaf child of x in stored order
    const Order kids = tree_.children(x);
    for (uint32_t i = 0; i < kids.size(); ++i) {
      if (kids[i] < tree_.size()) pos_[kids[i]] = i;
    }
    return kids;
  }

  bool agrees(uint32_t w) {
    const uint32_t x = node_of(w);
    const Order kids = number(x);
    for (uint32_t e : wants_[w].elems) REQUIRE(tree_.parent(e) == x);
    for (uint32_t c : kids) {
      if (c >= tree_.size()) continue;
      for (uint32_t u = first_[c]; u != PQTree::kNil; u = next_[u]) {
        if (forward(u) != forward(w)) return false;
      }
    }
    return true;
  }

  const Wants& wants_;
  PQTree tree_;
  std::vector<uint32_t> first_, next_, pos_;  // accepted wants listed by first element
};

std::string message_of(uint32_t n, const Wants& wants) {
  try {
    order_group(n, wants);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}

}  // namespace

TEST_CASE("layout: order_group is the greedy of its definition, checked by brute force") {
  size_t all_satisfiable = 0, some_rejected = 0;
  for (uint32_t n = 1; n <= 7; ++n) {
    const uint32_t runs = n <= 5 ? 400 : n == 6 ? 200 : 80;
    for (uint32_t run = 0; run < runs; ++run) {
      std::mt19937 rng(100 * n + run);
      Order hidden(n);
      std::iota(hidden.begin(), hidden.end(), 0u);
      std::shuffle(hidden.begin(), hidden.end(), rng);
      Wants wants(1 + rng() % 7);
      const uint32_t max_bytes = run % 2 ? 4 : 1000;  // few distinct bytes: many ties
      for (SequenceWant& w : wants) w = {random_elems(rng, hidden), 1 + rng() % max_bytes};
      const GroupOrder g = order_group(n, wants);
      check_truthful(n, wants, g);
      // Each want is satisfied iff it fits with the satisfied wants of higher priority.
      const std::vector<uint32_t> masks = satisfied_masks(n, wants);
      uint32_t taken = 0;
      for (uint32_t w : priority_order(wants)) {
        const bool fits = jointly_satisfiable(masks, taken | 1u << w);
        INFO("n " << n << " run " << run << " want " << w);
        CHECK(g.satisfied[w] == fits);
        if (fits) taken |= 1u << w;
      }
      const uint32_t everything = (1u << wants.size()) - 1;
      if (jointly_satisfiable(masks, everything)) {
        ++all_satisfiable;
        CHECK(g.accepted == wants.size());
      } else {
        ++some_rejected;
      }
    }
  }
  // Both outcomes must be common for the test to mean anything.
  CHECK(all_satisfiable > 500);
  CHECK(some_rejected > 500);
}

TEST_CASE("layout: order_group and the PQ-tree greedy accept the same wants") {
  for (uint32_t seed = 0; seed < 60; ++seed) {
    std::mt19937 rng(seed);
    const uint32_t n = seed < 50 ? 8 + seed : 500;
    Order hidden(n);
    std::iota(hidden.begin(), hidden.end(), 0u);
    std::shuffle(hidden.begin(), hidden.end(), rng);
    Wants wants(n);
    for (SequenceWant& w : wants) w = {random_elems(rng, hidden), 1 + rng() % 50};
    PQGreedy reference(n, wants);
    std::vector<uint8_t> accepted(wants.size());
    for (uint32_t w : priority_order(wants)) accepted[w] = reference.offer(w);
    const Order ref_order = reference.order();
    REQUIRE(is_permutation_of(ref_order, n));
    size_t ref_lies = 0;
    for (size_t w = 0; w < wants.size(); ++w) {
      ref_lies += accepted[w] != reads_in_order(ref_order, wants[w].elems);
    }
    CHECK(ref_lies == 0);
    const GroupOrder g = order_group(n, wants);
    check_truthful(n, wants, g);
    CHECK(g.satisfied == accepted);
  }
}

TEST_CASE("layout: a single want, and disjoint wants, are always satisfied") {
  for (uint32_t run = 0; run < 500; ++run) {
    std::mt19937 rng(run);
    const uint32_t n = 1 + run % 40;
    Order shuffled(n);
    std::iota(shuffled.begin(), shuffled.end(), 0u);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const Wants single{{Order(shuffled.begin(), shuffled.begin() + rng() % (n + 1)), 5}};
    GroupOrder g = order_group(n, single);
    check_truthful(n, single, g);
    CHECK(g.satisfied[0] == 1);
    Wants disjoint;
    for (uint32_t lo = 0; lo < n;) {
      const uint32_t len = std::min<uint32_t>(n - lo, 1 + rng() % 6);
      disjoint.push_back({Order(shuffled.begin() + lo, shuffled.begin() + lo + len), rng() % 50});
      lo += len;
    }
    g = order_group(n, disjoint);
    check_truthful(n, disjoint, g);
    CHECK(g.accepted == disjoint.size());
  }
}

TEST_CASE("layout: conflicting wants, the one with more bytes wins") {
  SUBCASE("a run and a pair that cannot be adjacent in it") {
    const GroupOrder a = order_group(3, {{{0, 1, 2}, 10}, {{2, 0}, 5}});
    CHECK(a.order == Order{0, 1, 2});
    CHECK(a.satisfied == std::vector<uint8_t>{1, 0});
    CHECK(a.accepted == 1);
    CHECK(a.bytes_satisfied == 10);
    const GroupOrder b = order_group(3, {{{0, 1, 2}, 5}, {{2, 0}, 10}});
    CHECK(b.satisfied == std::vector<uint8_t>{0, 1});
    CHECK(b.bytes_satisfied == 10);
  }
  SUBCASE("the same elements in opposite orders; ties go to the earlier want") {
    CHECK(order_group(4, {{{1, 2, 3}, 1}, {{3, 2, 1}, 2}}).satisfied == std::vector<uint8_t>{0, 1});
    CHECK(order_group(4, {{{3, 2, 1}, 7}, {{1, 2, 3}, 7}}).satisfied == std::vector<uint8_t>{1, 0});
    CHECK(order_group(4, {{{1, 2, 3}, 7}, {{3, 2, 1}, 7}}).satisfied == std::vector<uint8_t>{1, 0});
  }
  SUBCASE("an orientation conflict through a bridge does not block later wants") {
    // (1 2) would tie (0 1) and (3 2) into one chain that reads one of them backwards; dropping it
    // keeps (2 4) possible.
    const Wants wants{{{0, 1}, 9}, {{3, 2}, 8}, {{1, 2}, 7}, {{2, 4}, 1}};
    const GroupOrder g = order_group(5, wants);
    CHECK(g.satisfied == std::vector<uint8_t>{1, 1, 0, 1});
    CHECK(g.bytes_satisfied == 18);
  }
  SUBCASE("an element with three wanted neighbours") {
    const GroupOrder g = order_group(4, {{{0, 1}, 4}, {{1, 2}, 3}, {{1, 3}, 2}});
    CHECK(g.satisfied == std::vector<uint8_t>{1, 1, 0});
  }
}

TEST_CASE("layout: invalid arguments") {
  const std::string out_of_range = message_of(4, {{{0, 1}, 1}, {{2, 4}, 1}});
  CHECK(out_of_range.find("[order_group] want 1: element 4 out of range") == 0);
  CHECK(message_of(4, {{{3, 1, 3}, 1}}).find("[order_group] want 0: element 3 repeated") == 0);
  CHECK(message_of(0, {{{0}, 1}}).find("[order_group]") == 0);
  // The same element in two different wants is fine; empty inputs are fine.
  CHECK(order_group(3, {{{0, 1}, 1}, {{1, 2}, 1}}).accepted == 2);
  CHECK(order_group(0, {}).order.empty());
  CHECK(order_group(2, {{{}, 3}, {{1}, 4}}).bytes_satisfied == 7);
}

TEST_CASE("layout: 2000 elements, tree-like disjoint wants, bridges and noise") {
  const uint32_t n = 2000;
  for (uint32_t seed = 0; seed < 4; ++seed) {
    std::mt19937 rng(seed);
    Order target(n);  // an order that satisfies every want except the noise
    std::iota(target.begin(), target.end(), 0u);
    std::shuffle(target.begin(), target.end(), rng);
    Wants wants;
    std::vector<uint32_t> chunk_starts;
    for (uint32_t lo = 0; lo < n;) {  // the batches: disjoint runs of the target order
      const uint32_t len = std::min<uint32_t>(n - lo, 1 + rng() % 8);
      chunk_starts.push_back(lo);
      wants.push_back({Order(target.begin() + lo, target.begin() + lo + len), 1000 + rng() % 1000});
      lo += len;
    }
    for (uint32_t i = 0; i < 300; ++i) {  // runs that cross chunk boundaries
      const uint32_t start = chunk_starts[1 + rng() % (chunk_starts.size() - 1)];
      const uint32_t lo = start - 1 - (start >= 2 ? rng() % 2 : 0);
      const uint32_t len = std::min<uint32_t>(n - lo, 2 + rng() % 4);
      wants.push_back({Order(target.begin() + lo, target.begin() + lo + len), 100 + rng() % 900});
    }
    const size_t feasible = wants.size();
    for (uint32_t i = 0; i < 300 * (seed % 2); ++i) {  // random pairs and triples, least bytes
      Order e(2 + rng() % 2);
      for (uint32_t& v : e) v = rng() % n;
      std::sort(e.begin(), e.end());
      e.erase(std::unique(e.begin(), e.end()), e.end());
      std::shuffle(e.begin(), e.end(), rng);
      wants.push_back({e, rng() % 100});
    }
    const GroupOrder g = order_group(n, wants);
    check_truthful(n, wants, g);
    size_t missed = 0;
    for (size_t w = 0; w < feasible; ++w) missed += !g.satisfied[w];
    CHECK(missed == 0);
  }
}
