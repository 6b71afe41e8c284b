// Internal to the CPU backend: where and when a backward pass zeroes the adjoint arena.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "edbatch/backend.h"

namespace edbatch::cpu {

// A backward pass accumulates into adjoints, so each must be zero before its first write. Zeroing
// the whole arena up front writes every line out to memory long before it is used; instead, the
// region of batch a (its outputs and, for a block call, every internal value) is zeroed right
// before the backward of the last batch that reads a value there, which is the first to
// accumulate into it. Regions holding a seed, and the graph's inputs, are zeroed at the start;
// a region nothing reads, right before its own batch. Padding between regions is never read and
// never zeroed.
class AdjointZeroing {
 public:
  // Plans the pass of `p` (the batches' regions and their readers; O(nodes + arguments)).
  void plan(const PlanRef& p, const BackwardSeed& seed);
  // Zeroes what must be zero before the seeds are added.
  void at_start(float* adjoints) const { zero(0, adjoints); }
  // Zeroes what must be zero before the backward of batch b.
  void before(size_t b, float* adjoints) const { zero(b + 1, adjoints); }

 private:
  // Ranges (offset, floats) by slot: slot 0 at the start, slot b + 1 before batch b.
  std::vector<uint32_t> slot_begin_;
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
  // Scratch, kept between passes.
  std::vector<int64_t> last_reader_;
  std::vector<uint8_t> seeded_;
  std::vector<uint32_t> fill_;
  std::vector<std::pair<uint32_t, std::pair<uint32_t, uint32_t>>> regions_;  // (slot, range)

  void zero(size_t slot, float* adjoints) const;
};

}  // namespace edbatch::cpu
