// Debugging dumps of a mini-batch's schedule and memory layout (block plans: Block::dump_json and
// Block::dump_dot).
#pragma once
#include <string>

namespace edbatch {

class Graph;
struct Schedule;
struct MemoryPlan;

// JSON: every batch with its type name, members, output offset and size, and each operand's
// mode; plus totals (batches, lower bound, operands by mode, gather bytes).
std::string dump_plan_json(const Graph& g, const Schedule& s, const MemoryPlan& m);
// DOT: one node per graph node, clustered by batch (in schedule order), edges from arguments;
// edges into an operand that needs indexed reads are dashed.
std::string dump_plan_dot(const Graph& g, const Schedule& s, const MemoryPlan& m);

}  // namespace edbatch
