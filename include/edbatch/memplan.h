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
  uint32_t aux_begin;      // into MemoryPlan::aux: per-node lookup index / pick index / label
};

struct MemoryPlan {
  std::vector<BatchPlan> batches;          // parallel to Schedule::batches
  std::vector<Operand> operands;
  std::vector<uint32_t> index;             // Indexed offsets; Ragged: k+1 row starts, then offsets
  std::vector<uint32_t> aux;               // per-node integer arguments, batch by batch
  std::vector<uint32_t> node_offset;       // every node's value (UINT32_MAX for parameters)
  uint32_t input_offset = 0;               // Graph::input_values() lives here
  uint32_t total_floats = 0;
  // Operand counts by mode, over all batches (Param operands are not counted).
  uint32_t shared_operands = 0, contiguous_operands = 0, indexed_operands = 0, ragged_operands = 0;

  void clear();
};

// Lays out the values of `g` in schedule order, each batch's outputs contiguous, and classifies
// every batch operand. Reuses the plan's storage.
void plan_memory(const Graph& g, const Schedule& s, MemoryPlan& out);

}  // namespace edbatch
