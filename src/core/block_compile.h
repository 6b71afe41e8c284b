// Internal: compiling a block's body into a BlockPlan, and dumping it.
#pragma once
#include <string>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"

namespace edbatch {

// Rewrites the body, batches it internally, stacks weights, lays out its values and groups its
// elementwise steps. Throws std::invalid_argument naming the block for a malformed body.
void compile_block(BlockPlan& p, const FreezeOptions& options);

std::string block_json(const BlockPlan& p);
std::string block_dot(const BlockPlan& p);

}  // namespace edbatch
