// Traced user cells: a program (docs/programs.md) read into blocks over a runner's collection and
// run as a Cell: per node, messages from its predecessors (edge cells or their states), reduced,
// then the node's cell.
#pragma once
#include <memory>
#include <string>

#include "src/torch/cells.h"

namespace edbatch::torch_adapter {

// A cell name that holds a program: "program:" followed by the JSON document.
constexpr const char* kProgramPrefix = "program:";
bool is_program(const std::string& cell);

// Reads the program (the text after kProgramPrefix), adds its weights and blocks to `pc`.
// Throws std::invalid_argument naming the cell and instruction for anything malformed.
std::unique_ptr<Cell> make_program_cell(const std::string& program, ParameterCollection& pc);

}  // namespace edbatch::torch_adapter
