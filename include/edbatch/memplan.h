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
};

struct MemoryPlan {
  std::vector<BatchPlan> batches;          // parallel to Schedule::batches
  std::vector<Operand> operands;
  std::vector<uint32_t> index;             // Indexed offsets; Ragged: k+1 row starts, then offsets
  std::vector<uint32_t> node_offset;       // every node's value (UINT32_MAX for parameters)
  uint32_t input_offset = 0;               // Graph::input_values() lives here
  uint32_t total_floats = 0;
  // Operands a kernel cannot read through an index (GEMM inputs) must be gathered; the bytes such
  // gathers move per forward pass.
  uint64_t gather_bytes = 0;
  uint32_t indexed_operands = 0, contiguous_operands = 0;

  void clear();
};

// Lays out the values of `g` in schedule order, each batch's outputs contiguous, and classifies
// every batch operand. Reuses the plan's storage.
void plan_memory(const Graph& g, const Schedule& s, MemoryPlan& out);

}  // namespace edbatch
