// PQ-trees: every admitted order set is checked against brute force over all permutations.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "memplan/pqtree.h"

using namespace edbatch;

namespace {

using Order = std::vector<uint32_t>;
using Orders = std::vector<Order>;

Orders all_permutations(uint32_t n) {
  Order p(n);
  std::iota(p.begin(), p.end(), 0u);
  Orders out;
  do {
    out.push_back(p);
  } while (std::next_permutation(p.begin(), p.end()));
  return out;
}

bool consecutive(const Order& order, const std::vector<uint32_t>& subset) {
  if (subset.empty()) return true;
  std::vector<size_t> pos(order.size());
  for (size_t i = 0; i < order.size(); ++i) pos[order[i]] = i;
  size_t lo = order.size(), hi = 0;
  for (uint32_t v : subset) {
    lo = std::min(lo, pos[v]);
    hi = std::max(hi, pos[v]);
  }
  return hi - lo + 1 == subset.size();
}

Orders filter(const Orders& orders, const std::vector<uint32_t>& subset) {
  Orders out;
  for (const Order& o : orders) {
    if (consecutive(o, subset)) out.push_back(o);
  }
  return out;
}

Orders sorted(Orders orders) {
  std::sort(orders.begin(), orders.end());
  return orders;
}

bool contains(const Orders& sorted_orders, const Order& o) {
  return std::binary_search(sorted_orders.begin(), sorted_orders.end(), o);
}

// Orders admitted by a sequence of constraints, by brute force.
Orders brute_force(uint32_t n, const std::vector<std::vector<uint32_t>>& constraints) {
  Orders orders = all_permutations(n);
  for (const auto& c : constraints) orders = filter(orders, c);
  return orders;
}

// A random subset: an interval of a hidden order, an arbitrary set, or a small set.
std::vector<uint32_t> random_subset(std::mt19937& rng, const Order& hidden) {
  const uint32_t n = static_cast<uint32_t>(hidden.size());
  const uint32_t kind = rng() % 20;
  std::vector<uint32_t> s;
  if (kind < 10) {
    const uint32_t lo = rng() % n;
    const uint32_t hi = lo + rng() % (n - lo);
    s.assign(hidden.begin() + lo, hidden.begin() + hi + 1);
  } else {
    Order all(n);
    std::iota(all.begin(), all.end(), 0u);
    std::shuffle(all.begin(), all.end(), rng);
    const uint32_t k = kind < 17 ? rng() % (n + 1) : std::min<uint32_t>(n, 2 + rng() % 2);
    s.assign(all.begin(), all.begin() + k);
  }
  std::shuffle(s.begin(), s.end(), rng);
  return s;
}

// True when every P-node of a to_string() text has two or more children and every Q-node three
// or more: the tree is in the canonical form that the templates must preserve.
bool canonical(const std::string& text) {
  std::vector<std::pair<char, uint32_t>> open;  // node kind, children so far
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == 'P' || c == 'Q') {
      if (!open.empty()) ++open.back().second;
      open.push_back({c, 0});
      i += 2;
    } else if (c == ')') {
      if (open.back().second < (open.back().first == 'Q' ? 3u : 2u)) return false;
      open.pop_back();
      ++i;
    } else if (c == ' ') {
      ++i;
    } else {
      if (!open.empty()) ++open.back().second;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    }
  }
  return open.empty();
}

// Runs `constraints` on a fresh tree and checks every step against brute force.
void check_sequence(uint32_t n, const std::vector<std::vector<uint32_t>>& constraints) {
  PQTree tree(n);
  Orders current = all_permutations(n);
  for (const auto& c : constraints) {
    const std::string before = tree.to_string();
    const Orders survivors = filter(current, c);
    const bool ok = tree.reduce(c);
    CHECK(ok == !survivors.empty());
    if (ok) {
      current = survivors;
    } else {
      CHECK(tree.to_string() == before);
    }
    CHECK(sorted(tree.admitted_orders()) == current);
  }
}

}  // namespace

TEST_CASE("pqtree: admitted orders equal brute force on random constraint sets") {
  size_t accepted = 0, rejected = 0;
  for (uint32_t n = 1; n <= 8; ++n) {
    const uint32_t runs = n <= 5 ? 300 : n == 6 ? 120 : n == 7 ? 40 : 15;
    for (uint32_t run = 0; run < runs; ++run) {
      std::mt19937 rng(1000 * n + run);
      Order hidden(n);
      std::iota(hidden.begin(), hidden.end(), 0u);
      std::shuffle(hidden.begin(), hidden.end(), rng);
      PQTree tree(n), twin(n);
      Orders current = all_permutations(n);
      for (uint32_t step = 0; step < 2 * n + 2; ++step) {
        const std::vector<uint32_t> s = random_subset(rng, hidden);
        const std::string before_text = tree.to_string();
        const Orders survivors = filter(current, s);
        const bool ok = tree.reduce(s);
        std::vector<uint32_t> shuffled = s;
        std::shuffle(shuffled.begin(), shuffled.end(), rng);
        CHECK(twin.reduce(shuffled) == ok);  // the order of ids in a subset must not matter
        if (ok) {
          ++accepted;
          CHECK(!survivors.empty());
          current = survivors;
        } else {
          ++rejected;
          CHECK(survivors.empty());
          CHECK(tree.to_string() == before_text);
        }
        // After a rejection `current` is unchanged, so this also proves the tree is unchanged.
        const Orders admitted = sorted(tree.admitted_orders());
        REQUIRE(admitted == current);
        CHECK(sorted(twin.admitted_orders()) == current);
        CHECK(contains(admitted, tree.frontier()));
      }
    }
  }
  // Both outcomes must be exercised often for the test to mean anything.
  CHECK(accepted > 2000);
  CHECK(rejected > 500);
}

TEST_CASE("pqtree: hand-written cases") {
  SUBCASE("a chain of overlapping pairs gives one Q-node") {
    PQTree t(4);
    CHECK(t.reduce({0, 1}));
    CHECK(t.reduce({1, 2}));
    CHECK(t.reduce({3, 2}));
    CHECK(sorted(t.admitted_orders()) == Orders{{0, 1, 2, 3}, {3, 2, 1, 0}});
    const std::string text = t.to_string();
    CHECK((text == "Q(0 1 2 3)" || text == "Q(3 2 1 0)"));
  }
  SUBCASE("three pairwise adjacencies on three leaves") {
    // {0,1},{1,2} force 0 and 2 apart: {0,2} cannot also be consecutive.
    REQUIRE(brute_force(3, {{0, 1}, {1, 2}, {0, 2}}).empty());
    PQTree t(3);
    CHECK(t.reduce({0, 1}));
    CHECK(t.reduce({1, 2}));
    CHECK_FALSE(t.reduce({0, 2}));
    CHECK(sorted(t.admitted_orders()) == Orders{{0, 1, 2}, {2, 1, 0}});
  }
  SUBCASE("a leaf with three neighbours") {
    REQUIRE(brute_force(4, {{0, 1}, {1, 2}, {1, 3}}).empty());
    check_sequence(4, {{0, 1}, {1, 2}, {1, 3}, {2, 0}});
  }
  SUBCASE("nested sets") {
    check_sequence(5, {{0, 1}, {0, 1, 2}, {0, 1, 2, 3}});
    CHECK(brute_force(5, {{0, 1}, {0, 1, 2}, {0, 1, 2, 3}}).size() == 16);
  }
  SUBCASE("overlapping triples, then a doubly partial root") {
    check_sequence(6, {{0, 1, 2}, {2, 3, 4}, {1, 2, 3}, {5, 0}, {4, 5}});
    check_sequence(7, {{2, 3, 4}, {1, 2}, {4, 5}, {0, 1}, {5, 6}, {1, 2, 3, 4, 5}, {3, 6}});
    check_sequence(6, {{1, 2, 3, 4}, {0, 1}, {4, 5}, {0, 1, 2}, {3, 4, 5}});
  }
  SUBCASE("a partial P-node merges into a Q-node") {
    check_sequence(8, {{0, 1, 2}, {3, 4, 5}, {2, 3}, {5, 6, 7}, {1, 2, 3, 4}, {4, 0}});
    check_sequence(8, {{0, 1}, {2, 3}, {1, 2}, {3, 4, 5, 6}, {6, 7}, {0, 7}});
  }
  SUBCASE("trivial subsets never change the tree") {
    PQTree t(5);
    CHECK(t.reduce({1, 3}));
    const std::string text = t.to_string();
    CHECK(t.reduce({}));
    CHECK(t.reduce({4}));
    CHECK(t.reduce({4, 3, 2, 1, 0}));
    CHECK(t.to_string() == text);
  }
  SUBCASE("tiny trees") {
    CHECK(PQTree(0).frontier().empty());
    CHECK(PQTree(0).admitted_orders() == Orders{{}});
    PQTree one(1);
    CHECK(one.reduce({0}));
    CHECK(one.frontier() == Order{0});
    CHECK(one.to_string() == "0");
    PQTree two(2);
    CHECK(two.size() == 2);
    CHECK(two.reduce({1, 0}));
    CHECK(sorted(two.admitted_orders()) == Orders{{0, 1}, {1, 0}});
  }
}

TEST_CASE("pqtree: a rejected reduce leaves a tree that keeps working") {
  // Medium trees, beyond brute force: accepted constraints must hold in the frontier, a rejected
  // one must not change the tree, and the tree stays canonical.
  for (uint32_t seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(seed);
    const uint32_t n = 20 + seed;
    Order hidden(n);
    std::iota(hidden.begin(), hidden.end(), 0u);
    std::shuffle(hidden.begin(), hidden.end(), rng);
    PQTree tree(n);
    std::vector<std::vector<uint32_t>> accepted;
    for (uint32_t step = 0; step < 3 * n; ++step) {
      const std::vector<uint32_t> s = random_subset(rng, hidden);
      const std::string before = tree.to_string();
      if (tree.reduce(s)) {
        accepted.push_back(s);
      } else {
        CHECK(tree.to_string() == before);
      }
      CHECK(canonical(tree.to_string()));
    }
    const Order f = tree.frontier();
    Order check = f;
    std::sort(check.begin(), check.end());
    Order identity(n);
    std::iota(identity.begin(), identity.end(), 0u);
    REQUIRE(check == identity);
    size_t broken = 0;
    for (const auto& s : accepted) broken += !consecutive(f, s);
    CHECK(broken == 0);
  }
}

TEST_CASE("pqtree: 2000 leaves, thousands of interval constraints of one hidden order") {
  const uint32_t n = 2000;
  std::mt19937 rng(7);
  Order hidden(n);
  std::iota(hidden.begin(), hidden.end(), 0u);
  std::shuffle(hidden.begin(), hidden.end(), rng);
  std::vector<std::vector<uint32_t>> constraints;
  for (uint32_t i = 0; i < 4000; ++i) {
    const uint32_t len = i % 4 == 0 ? 2 + rng() % (n - 1) : 2 + rng() % 30;
    const uint32_t lo = rng() % (n - len + 1);
    std::vector<uint32_t> s(hidden.begin() + lo, hidden.begin() + lo + len);
    std::shuffle(s.begin(), s.end(), rng);
    constraints.push_back(std::move(s));
  }
  PQTree tree(n);
  size_t failed = 0;
  for (const auto& s : constraints) failed += !tree.reduce(s);
  CHECK(failed == 0);
  const Order f = tree.frontier();
  Order check = f;
  std::sort(check.begin(), check.end());
  Order identity(n);
  std::iota(identity.begin(), identity.end(), 0u);
  REQUIRE(check == identity);
  size_t broken = 0;
  for (const auto& s : constraints) broken += !consecutive(f, s);
  CHECK(broken == 0);
}

TEST_CASE("pqtree: a checkpoint undoes or keeps a group of reductions") {
  size_t undone = 0, kept = 0;
  for (uint32_t run = 0; run < 300; ++run) {
    std::mt19937 rng(run);
    const uint32_t n = 3 + run % 6;
    Order hidden(n);
    std::iota(hidden.begin(), hidden.end(), 0u);
    std::shuffle(hidden.begin(), hidden.end(), rng);
    PQTree tree(n);
    Orders current = all_permutations(n);
    for (uint32_t group = 0; group < n; ++group) {
      const std::string before = tree.to_string();
      Orders survivors = current;
      tree.checkpoint();
      for (uint32_t step = 1 + rng() % 4; step > 0; --step) {
        const std::vector<uint32_t> s = random_subset(rng, hidden);
        const Orders next = filter(survivors, s);
        CHECK(tree.reduce(s) == !next.empty());
        if (!next.empty()) survivors = next;
      }
      REQUIRE(sorted(tree.admitted_orders()) == survivors);
      if (rng() % 2 == 0) {
        ++undone;
        tree.rollback_to_checkpoint();
        CHECK(tree.to_string() == before);  // the same structure, not only the same orders
      } else {
        ++kept;
        tree.release_checkpoint();
        current = survivors;
      }
      REQUIRE(sorted(tree.admitted_orders()) == current);
    }
  }
  CHECK(undone > 300);
  CHECK(kept > 300);

  PQTree t(4);
  CHECK_THROWS_AS(t.rollback_to_checkpoint(), std::invalid_argument);
  CHECK_THROWS_AS(t.release_checkpoint(), std::invalid_argument);
  t.checkpoint();
  CHECK_THROWS_AS(t.checkpoint(), std::invalid_argument);
}

TEST_CASE("pqtree: every choice of reversed nodes gives an admitted order") {
  for (uint32_t run = 0; run < 200; ++run) {
    std::mt19937 rng(500 + run);
    const uint32_t n = 2 + run % 7;
    Order hidden(n);
    std::iota(hidden.begin(), hidden.end(), 0u);
    std::shuffle(hidden.begin(), hidden.end(), rng);
    PQTree tree(n);
    for (uint32_t step = 0; step < n; ++step) tree.reduce(random_subset(rng, hidden));
    const Orders admitted = sorted(tree.admitted_orders());
    for (uint32_t leaf = 0; leaf < n; ++leaf) {  // live nodes are the leaves' ancestors
      for (uint32_t x = tree.parent(leaf); x != PQTree::kNil; x = tree.parent(x)) {
        for (uint32_t c : tree.children(x)) CHECK(tree.parent(c) == x);
      }
    }
    for (uint32_t trial = 0; trial < 8; ++trial) {
      std::vector<uint8_t> reversed(tree.node_capacity());
      for (uint8_t& r : reversed) r = rng() % 2;
      CHECK(contains(admitted, tree.frontier(reversed)));
    }
  }
  PQTree chain(5);
  for (uint32_t i = 0; i + 1 < 5; ++i) CHECK(chain.reduce({i, i + 1}));
  Order forward = chain.frontier();
  const Order backward =
      chain.frontier(std::vector<uint8_t>(chain.node_capacity(), 1));  // the one Q-node flipped
  std::reverse(forward.begin(), forward.end());
  CHECK(backward == forward);
}

TEST_CASE("pqtree: invalid arguments") {
  PQTree t(5);
  CHECK(t.reduce({0, 1}));
  const std::string text = t.to_string();
  auto message_of = [&](const std::vector<uint32_t>& s) {
    try {
      t.reduce(s);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  const std::string out_of_range = message_of({2, 5});
  CHECK(out_of_range.find("[PQTree::reduce]") == 0);
  CHECK(out_of_range.find("leaf 5") != std::string::npos);
  const std::string duplicate = message_of({3, 1, 3});
  CHECK(duplicate.find("duplicate") != std::string::npos);
  CHECK(duplicate.find("leaf 3") != std::string::npos);
  CHECK(message_of({4, 4}).find("duplicate leaf 4") != std::string::npos);
  CHECK(t.to_string() == text);
  CHECK(t.reduce({2, 3}));

  CHECK_THROWS_AS(PQTree(11).admitted_orders(), std::invalid_argument);
  PQTree ten(10);
  for (uint32_t i = 0; i + 1 < 10; ++i) CHECK(ten.reduce({i, i + 1}));
  CHECK(ten.admitted_orders().size() == 2);
}
