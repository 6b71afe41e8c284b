// Layout planning: choose an order of elements (arena values) so that as many batches as possible
// find their operands consecutive and in batch order, weighted by the gather bytes each saves.
#pragma once
#include <cstdint>
#include <vector>

namespace edbatch {

// One group of elements (the members of one batch) whose internal order we choose.
struct SequenceWant {
  std::vector<uint32_t> elems;  // distinct elements of [0, n): wanted consecutive, in this order
  uint64_t bytes = 0;           // what satisfying it saves (gather bytes); the priority
};

struct GroupOrder {
  std::vector<uint32_t> order;     // a permutation of [0, n): position -> element
  std::vector<uint8_t> satisfied;  // per want, in input order: 1 iff it reads in order in `order`
  uint32_t accepted = 0;           // wants the greedy pass accepted (trivial ones included)
  uint64_t bytes_satisfied = 0;    // sum of bytes of satisfied wants
};

// Greedy by bytes (descending; ties by input index): a want is accepted when some order satisfies
// it together with every want accepted before, otherwise dropped. This is what a PQ-tree admits
// for the want's adjacent pairs plus a choice of orientation; for sequences it reduces to linking
// chains, O(total elements). Accepted wants are exactly the satisfied ones, so when some order
// satisfies every want, every want is satisfied. `satisfied` is computed on the final order.
// Throws std::invalid_argument for an element out of range or repeated within a want.
GroupOrder order_group(uint32_t n, const std::vector<SequenceWant>& wants);

}  // namespace edbatch
