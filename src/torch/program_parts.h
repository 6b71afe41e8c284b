// The parts of a traced program (src/torch/program.cpp) shared with the hoisting analysis
// (src/torch/program_hoist.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edbatch/block.h"

namespace edbatch::torch_adapter {

// One instruction of a cell's body (docs/programs.md).
struct Instr {
  std::string op, where;
  std::vector<uint32_t> args;
  uint32_t size = 0, begin = 0, end = 0;
  int32_t slot = -1, weight = -1, bias = -1;
  float alpha = 0, beta = 0, eps = 1e-5f, p = 0, value = 0;
};

// Which instructions of a cell read only the cell's x row (and weights and constants), and which
// of those the rest of the cell reads: those are computed for every x row at once, ahead of the
// propagation, by a block of their own (the cell's input projection), and the cell's block reads
// them as inputs. A cell whose x-only part has no linear layer is not split.
struct Hoisting {
  std::vector<uint8_t> in_hoist;  // per instruction: translated into the projection block
  std::vector<uint8_t> in_main;   // per instruction: translated into the cell's block
  std::vector<uint32_t> outputs;  // the projection's outputs (instructions), in body order
  bool any() const { return !outputs.empty(); }
};
// `input_slot`: the slot of the x row; `x_input`: the program's input is x rows (not ids).
Hoisting plan_hoisting(const std::vector<Instr>& body, const std::vector<uint32_t>& outputs,
                       int32_t input_slot, bool x_input);

// A cell compiled for one role (node or edge).
struct CellProgram {
  std::string name;
  std::vector<Instr> body;
  std::vector<uint32_t> outputs;
  std::unique_ptr<Block> block;
  std::vector<int32_t> float_slots;  // the block's inputs, in declaration order
  int32_t input_slot = 0;            // the slot of the x row (node cells 0, edge cells last)
  bool pass_through = false;         // a node cell returning its message: no block, no call
  bool reads_ids = false;            // the block's first integer is the input id
  uint32_t first_site = 0, sites = 0;  // its dropout sites (integers after the id)
  // The input projection (Hoisting): its block reads the x row; the cell's block reads its
  // outputs through the slots kHoistedSlot + i. Per build, its outputs by x row (row -1, the
  // zeros, first), made when a call first needs them.
  std::unique_ptr<Block> projection;
  uint32_t projected = 0;  // the projection's outputs
  std::vector<Expr> projections;
};
constexpr int32_t kHoistedSlot = 1 << 20;

}  // namespace edbatch::torch_adapter
