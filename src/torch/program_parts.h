// The parts of a traced program (src/torch/program.cpp) read and analysed on their own
// (src/torch/program_parts.cpp): the document's fields, its instructions, the hoisting analysis.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "edbatch/block.h"

namespace edbatch::torch_adapter {

using json = nlohmann::json;

// Throws std::invalid_argument: "[edbatch.propagate] program: <what>".
[[noreturn]] void bad(const std::string& what);

template <class T>
T field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) bad(fmt::format("{}: missing \"{}\"", where, key));
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    bad(fmt::format("{}: \"{}\" has the wrong type", where, key));
  }
}

template <class T>
T field_or(const json& j, const char* key, T fallback, const std::string& where) {
  return j.contains(key) ? field<T>(j, key, where) : fallback;
}

// One instruction of a cell's body (docs/programs.md).
struct Instr {
  std::string op, where;
  std::vector<uint32_t> args;
  uint32_t size = 0, begin = 0, end = 0;
  int32_t slot = -1, weight = -1, bias = -1;
  float alpha = 0, beta = 0, eps = 1e-5f, p = 0, value = 0;
};

// What the program's cells read as their input row: x rows, ids, or nothing.
enum class InputKind { X, Ids, None };

// Instruction v of `cell`'s body, checked against the values defined before it.
Instr read_instr(const json& j, const std::string& cell, size_t v);

// Which instructions of a cell read only the cell's input row, its x row or its id (and weights
// and constants), and which of those the rest of the cell reads: those are computed for every
// row at once, ahead of the propagation, by a block of their own (the cell's input projection),
// and the cell's block reads them as inputs. A cell whose input-only part has no linear layer is
// not split.
struct Hoisting {
  std::vector<uint8_t> in_hoist;  // per instruction: translated into the projection block
  std::vector<uint8_t> in_main;   // per instruction: translated into the cell's block
  std::vector<uint32_t> outputs;  // the projection's outputs (instructions), in body order
  bool any() const { return !outputs.empty(); }
};
// `input_slot`: the slot of the x row. With ids as the input, the part that reads only the id
// (its embeddings and what follows from them) is projected per row in the same way.
Hoisting plan_hoisting(const std::vector<Instr>& body, const std::vector<uint32_t>& outputs,
                       int32_t input_slot, InputKind input);

// How a node's incoming messages become one (docs/programs.md, "Propagation"): per component
// their sum, mean or elementwise maximum; or Softmax, attention over the messages: component 0
// holds each message's score (one row), the node receives the scores' log-sum-exp there and every
// other component summed with the scores' softmax as the weights.
enum class Reduce { Sum, Mean, Max, Softmax };
Reduce read_reduce(const std::string& name, const std::vector<uint32_t>& message);
// messages[c][j]: component c of incoming message j (at least one message); `sizes`: each
// component's rows. Writes one Expr per component to `reduced`.
void reduce_messages(Reduce how, const std::vector<std::vector<Expr>>& messages,
                     const std::vector<uint32_t>& sizes, Expr* reduced);

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
  uint32_t id_rows = UINT32_MAX;       // the rows of its smallest embedding table (ids below it)
  // The input projection (Hoisting): its block reads the x row; the cell's block reads its
  // outputs through the slots kHoistedSlot + i. Per build, its outputs by x row (row -1, the
  // zeros, first), made when a call first needs them.
  std::unique_ptr<Block> projection;
  uint32_t projected = 0;  // the projection's outputs
  std::vector<Expr> projections;
};
constexpr int32_t kHoistedSlot = 1 << 20;

// A sum of products with weights, kept while a cell is translated so that `W1 x + W2 h + b`
// becomes one affine node (one GEMM step) rather than two and an addition.
struct LinearForm {
  std::vector<Expr> terms;  // W1, x1, W2, x2, ... (parameter nodes and values)
  std::vector<Expr> biases;
};
// Two linear forms that add into one affine: products, or a product and a projected input (a bias).
bool foldable(const LinearForm& a, const LinearForm& b);

}  // namespace edbatch::torch_adapter
