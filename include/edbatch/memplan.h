// Memory planning: where every value of an iteration lives in the arena, and how each batch reads
// its operands. Offsets are in floats from the arena base.
#pragma once
#include <cstdint>
#include <vector>

namespace edbatch {

class Graph;
struct Schedule;

enum class OperandMode : uint8_t {
  Param,       // a parameter, the same for every node of the batch (broadcast)
  Shared,      // one arena value read by every node of the batch
  Contiguous,  // node i reads offset + i * stride: a zero-copy view
  Indexed,     // node i reads index[index_begin + i]
  Ragged,      // variadic: node i reads index[index_begin + k + index[index_begin+i] ...]
  PerMember,   // block steps: member j's k nodes read member_operands[index_begin + j]
};

const char* operand_mode_name(OperandMode m);

struct Operand {
  OperandMode mode;
  uint32_t param;        // Param: the parameter id
  uint32_t offset;       // Shared, Contiguous: arena offset of node 0's operand
  uint32_t stride;       // Contiguous: floats between consecutive operands
  uint32_t index_begin;  // Indexed, Ragged: into MemoryPlan::index
};

struct BatchPlan {
  uint32_t out_offset;     // outputs are contiguous: node i at out_offset + i * out_size
  uint32_t out_size;
  uint32_t operand_begin;  // into MemoryPlan::operands
  uint32_t operand_count;
  uint32_t aux_begin;      // into MemoryPlan::aux: per-node integers (per_node_int in op.h)
  uint32_t count = 0;      // nodes (block steps: members x invocations)
  // Block calls: the region holds every internal value of the k invocations (value t of the
  // body at out_offset + k * base[t]); the operands are the block's inputs, and the steps of its
  // plan are MemoryPlan::steps[step_begin, step_begin + step_count).
  uint32_t step_begin = 0, step_count = 0;
};

// One forward increment: batches [batch_begin, the next segment's) and the graph's input values
// [input_begin, input_begin + input_count), copied to the arena at input_offset before they run.
// A graph run whole is one segment; an incremental forward appends one.
struct PlanSegment {
  uint32_t batch_begin = 0;
  uint32_t node_begin = 0;  // the nodes it adds: [node_begin, the next segment's)
  uint64_t gather_bytes = 0;  // MemoryPlan::gather_bytes of its batches
  uint32_t input_begin = 0, input_count = 0;
  uint32_t input_offset = 0;
  // Where its batches' entries start in MemoryPlan::operands, member_operands, index and aux:
  // the batches of a segment refer only to the entries appended for them, from these on.
  uint32_t operand_begin = 0, member_begin = 0, index_begin = 0, aux_begin = 0;
};

struct MemoryPlan {
  std::vector<BatchPlan> batches;          // parallel to Schedule::batches
  std::vector<BatchPlan> steps;            // block steps, expanded for their batch's k
  std::vector<Operand> operands;
  std::vector<Operand> member_operands;    // PerMember operands of block steps, over k nodes each
  std::vector<uint32_t> index;             // Indexed offsets; Ragged: k+1 row starts, then offsets
  std::vector<uint32_t> aux;               // per-node integer arguments, batch by batch
  // Where each aux entry comes from: a node (its aux2), kAuxFromInts | an index into
  // Graph::ints() (a block call's integer), or kAuxConstant (a block body's own).
  std::vector<uint32_t> aux_source;
  static constexpr uint32_t kAuxFromInts = 1u << 31, kAuxConstant = UINT32_MAX;
  std::vector<uint32_t> node_offset;       // every node's value (UINT32_MAX for parameters)
  std::vector<PlanSegment> segments;       // forward increments, in order
  uint32_t input_offset = 0;               // the first segment's input values live here
  uint32_t input_floats = 0;               // input values placed so far
  uint32_t total_floats = 0;
  // Operand counts by mode, over all batches (Param operands are not counted).
  uint32_t shared_operands = 0, contiguous_operands = 0, indexed_operands = 0, ragged_operands = 0;
  // Bytes of GEMM operands that are neither shared nor views, so a kernel must gather them.
  uint64_t gather_bytes = 0;
  // Block step operands: one view over all members, or one operand per member.
  uint32_t member_view_operands = 0, per_member_operands = 0;
  double layout_ms = 0;  // ordering batch members for their consumers (outer planning)

  void clear();
  // The most arguments a node of batch `b` reads through its Ragged first operand (0 when that
  // operand is not ragged).
  uint32_t max_ragged_args(const BatchPlan& b) const;
};

struct PlanOptions {
  // Reorder each batch's members so that consumers read them as contiguous views (the layout
  // planner, consumers before producers). Off: members stay in schedule order.
  bool order_for_consumers = true;
};

// Lays out the values of `g` batch by batch, each batch's outputs contiguous, and classifies
// every batch operand. May reorder members within batches of `s`. Reuses the plan's storage.
void plan_memory(const Graph& g, Schedule& s, MemoryPlan& out, const PlanOptions& options = {});
// Incremental forward: `out` plans batches [0, first_batch) of `s` and nodes [0, first_node);
// appends a segment with the batches from first_batch (members reordered among themselves only)
// and the inputs of nodes [first_node, end_node) (end_node past the graph: to its end), laid out
// after everything planned, which keeps its offsets. The plan then covers nodes [0, end_node).
void extend_memory_plan(const Graph& g, Schedule& s, uint32_t first_batch, uint32_t first_node,
                        MemoryPlan& out, const PlanOptions& options = {},
                        uint32_t end_node = UINT32_MAX);
// How repeat_last_segment planned an increment.
enum class SegmentRepeat : uint8_t {
  None,       // not a repeat: nothing changed
  Shifted,    // the last segment's schedule and plan, shifted
  Replanned,  // the last segment's schedule and places, shifted; the operands planned afresh
};

// Incremental forward whose nodes repeat those of the plan's last segment (a decoding step after
// a step over the same sentences): nodes [first, end_node), first = the nodes planned, are the
// last segment's n nodes again, n further on, with the same ops, types, shapes and attributes
// (an Input's values and a block call's integers n segments' worth further on too), and every
// argument either the last segment's argument n further on, the same parameter node, or (where
// the old node read a value from before the last segment) a value from before of the same kind
// and shape. Then the schedule and the places that Scheduler::extend and extend_memory_plan would
// append are the last segment's, shifted. So are the operands (and the block steps, indices and
// per-node integers, read from the new nodes) when every value read from before is the one the
// last segment read, n nodes on, laid out one segment's floats further (Shifted); otherwise the
// operands are planned as extend_memory_plan plans them (Replanned: a step after a sentence
// stopped, or after a beam search's reorder). Not a repeat (None): nothing changes. The
// schedule's lower bound is left to the caller (the last segment's contribution again).
SegmentRepeat repeat_last_segment(const Graph& g, Schedule& s, MemoryPlan& p,
                                  uint32_t end_node = UINT32_MAX);
// Rewrites the plan's per-node integers (lookup indices, labels, picked indices, dropout keys,
// block calls' integers) from `g`: a plan made for a graph of the same structure then serves `g`.
void refresh_plan_aux(const Graph& g, MemoryPlan& plan);

}  // namespace edbatch
