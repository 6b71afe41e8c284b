// Internal to the memory planner: ordering batch members for their consumers, and expanding block
// calls into their steps.
#pragma once
#include <cstdint>
#include <vector>

#include "edbatch/memplan.h"
#include "memplan/layout.h"

namespace edbatch {

class Graph;
struct Node;
struct Schedule;
struct BlockPlan;

struct OuterOrderScratch {
  std::vector<uint32_t> batch_of, pos, reordered, elems;
  // seen[e] == stamp: position e of the producer batch is in the want being collected.
  std::vector<uint32_t> seen;
  uint32_t stamp = 0;
  std::vector<std::vector<SequenceWant>> wants;
};

// Reorders members within each batch of `s` from first_batch (never across batches); nodes
// before first_node belong to earlier batches, which stay as they are.
void order_for_consumers(const Graph& g, Schedule& s, OuterOrderScratch& scratch,
                         uint32_t first_batch = 0, uint32_t first_node = 0);

// Appends the steps of a batch of `k` calls of block `b` (members `calls`) to out.steps, and their
// operands, indices and per-node integers. `bp` is the call batch's plan, whose operands (the
// block's inputs) are already classified.
void expand_call(const Graph& g, const BlockPlan& b, const uint32_t* calls, uint32_t k,
                 BatchPlan& bp, MemoryPlan& out);

// An x of at least this many columns per node (a matrix, as in MV-RNN) is multiplied in place,
// one GEMM per node, instead of being gathered: each product is already wide enough to run well.
constexpr uint32_t kDirectGemmCols = 8;

// Bytes a GEMM kernel gathers for operand `slot` (x) of a batch of `count` nodes whose weight
// operand is `w`: the x of a shared weight that is neither shared nor a view, with fewer than
// kDirectGemmCols columns. 0 for other slots.
uint64_t gather_bytes(const Graph& g, const Node& first, uint32_t slot, const Operand& x,
                      const Operand& w, uint32_t count);

// Classifies operand offsets of `count` nodes as shared, a view (constant stride) or indexed.
Operand classify_offsets(const uint32_t* offsets, uint32_t count, uint32_t size, MemoryPlan& out);

// Where the input values of a segment of nodes [first_node, end_node) end, those before it
// ending at `input_floats`.
uint32_t segment_inputs_end(const Graph& g, uint32_t input_floats, uint32_t first_node,
                            uint32_t end_node);

// extend_memory_plan's parts for a segment of batches [first_batch, ...) and nodes [first_node,
// n). begin_segment appends the segment with its input block (after everything planned) and
// returns where its batches start; the batches are then placed (out.batches' offsets, sizes and
// counts, their members' and block outputs' node_offset, out.total_floats); finish_segment
// places inputs and reshapes and plans every batch's operands (a block call's steps too).
uint64_t begin_segment(const Graph& g, uint32_t first_batch, uint32_t first_node, uint32_t n,
                       MemoryPlan& out);
void finish_segment(const Graph& g, const Schedule& s, uint32_t first_batch, uint32_t first_node,
                    uint32_t n, MemoryPlan& out);

}  // namespace edbatch
