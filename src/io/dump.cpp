// JSON and DOT dumps of block plans and of a mini-batch's schedule and layout.
#include "edbatch/dump.h"

#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

#include "edbatch/block_plan.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/schedule.h"
#include "edbatch/types.h"
#include "src/core/block_compile.h"

namespace edbatch {

namespace {

std::string node_label(const Graph& g, uint32_t v) {
  const Node& n = g.node(v);
  std::string s = std::string(op_name(n.op)) + " " + to_string(n.dim);
  if (n.op == Op::Parameter) s = g.params().name(n.aux) + " " + to_string(n.dim);
  if (n.op == Op::Call) s = "block:" + g.params().block_name(n.aux);
  return s;
}

}  // namespace

std::string block_json(const BlockPlan& p) {
  using nlohmann::json;
  const Graph& g = *p.body;
  json j;
  j["name"] = p.name;
  j["floats_per_invocation"] = p.floats_per_invocation;
  j["lower_bound"] = p.lower_bound;
  j["exact_search"] = p.exact;
  j["freeze_ms"] = p.freeze_ms;
  j["internal_views"] = p.internal_views;
  j["internal_per_member"] = p.internal_per_member;
  for (size_t k = 0; k < p.input_names.size(); ++k)
    j["inputs"].push_back({{"name", p.input_names[k]}, {"shape", to_string(p.input_dims[k])}});
  for (size_t k = 0; k < p.output_names.size(); ++k)
    j["outputs"].push_back({{"name", p.output_names[k]},
                            {"node", p.output_node[k]},
                            {"base", p.base[p.output_node[k]]}});
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const BlockStep& st = p.steps[s];
    json step{{"op", op_name(st.op)}, {"group", st.group}, {"stacked_weights", st.stacked}};
    for (uint32_t m = 0; m < st.member_count; ++m) {
      const uint32_t v = p.members[st.member_begin + m];
      step["members"].push_back({{"node", v}, {"what", node_label(g, v)}, {"base", p.base[v]}});
    }
    j["steps"].push_back(step);
  }
  for (const BlockGroup& gr : p.groups)
    j["groups"].push_back({{"first_step", gr.step_begin}, {"steps", gr.step_count}, {"fused", gr.fused}});
  return j.dump(2);
}

std::string block_dot(const BlockPlan& p) {
  const Graph& g = *p.body;
  std::ostringstream o;
  o << "digraph \"" << p.name << "\" {\n  rankdir=BT;\n  node [shape=box,fontsize=10];\n";
  for (uint32_t v = 0; v < g.size(); ++v) {
    const Node& n = g.node(v);
    if (!is_scheduled(n.op))
      o << "  n" << v << " [label=\"" << (p.input_of[v] >= 0 ? p.input_names[p.input_of[v]]
                                                                : node_label(g, v))
        << "\",shape=ellipse];\n";
  }
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const BlockStep& st = p.steps[s];
    o << "  subgraph cluster_" << s << " {\n    label=\"step " << s << " (group " << st.group
      << (p.groups[st.group].fused ? ", fused" : "") << ")\";\n";
    for (uint32_t m = 0; m < st.member_count; ++m) {
      const uint32_t v = p.members[st.member_begin + m];
      o << "    n" << v << " [label=\"" << node_label(g, v) << "\\nbase " << p.base[v] << "\"];\n";
    }
    o << "  }\n";
  }
  for (uint32_t v = 0; v < g.size(); ++v) {
    const Node& n = g.node(v);
    for (uint32_t k = 0; k < n.num_args; ++k) o << "  n" << g.args(n)[k] << " -> n" << v << ";\n";
  }
  o << "}\n";
  return o.str();
}

namespace {
// Refuses a schedule or plan made for another graph (or for each other), which the dumps would
// read out of bounds.
void check_plan_of(const Graph& g, const Schedule& s, const MemoryPlan& m, const char* fn) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string("[") + fn +
                                "] the schedule and memory plan are not "
                                "of this graph: " +
                                what);
  };
  if (m.batches.size() != s.batches.size())
    fail(std::to_string(s.batches.size()) + " batches scheduled, " +
         std::to_string(m.batches.size()) + " planned");
  for (uint32_t v : s.nodes)
    if (v >= g.size())
      fail("node " + std::to_string(v) + " scheduled, the graph has " + std::to_string(g.size()));
  for (size_t b = 0; b < s.batches.size(); ++b) {
    const Batch& batch = s.batches[b];
    const BatchPlan& bp = m.batches[b];
    if (batch.type >= g.types().size() || size_t(batch.begin) + batch.count > s.nodes.size() ||
        size_t(bp.operand_begin) + bp.operand_count > m.operands.size())
      fail("batch " + std::to_string(b) + " reads past the schedule, the plan or the types");
  }
}
}  // namespace

std::string dump_plan_json(const Graph& g, const Schedule& s, const MemoryPlan& m) {
  check_plan_of(g, s, m, "dump_plan_json");
  using nlohmann::json;
  json j;
  j["batches_count"] = s.batches.size();
  j["lower_bound"] = s.lower_bound;
  j["operands"] = {{"shared", m.shared_operands},
                   {"contiguous", m.contiguous_operands},
                   {"indexed", m.indexed_operands},
                   {"ragged", m.ragged_operands}};
  j["gather_bytes"] = m.gather_bytes;
  j["total_floats"] = m.total_floats;
  for (size_t b = 0; b < s.batches.size(); ++b) {
    const Batch& batch = s.batches[b];
    const BatchPlan& bp = m.batches[b];
    json jb{{"type", g.types().name(batch.type)},
            {"out_offset", bp.out_offset},
            {"out_size", bp.out_size},
            {"steps", bp.step_count}};
    for (uint32_t i = 0; i < batch.count; ++i) jb["nodes"].push_back(s.nodes[batch.begin + i]);
    for (uint32_t o = 0; o < bp.operand_count; ++o)
      jb["operands"].push_back(operand_mode_name(m.operands[bp.operand_begin + o].mode));
    j["batches"].push_back(jb);
  }
  return j.dump(1);
}

std::string dump_plan_dot(const Graph& g, const Schedule& s, const MemoryPlan& m) {
  check_plan_of(g, s, m, "dump_plan_dot");
  std::ostringstream o;
  o << "digraph plan {\n  rankdir=BT;\n  node [shape=box,fontsize=9];\n";
  std::vector<uint8_t> indexed(g.size(), 0);  // consumer reads some operand through an index
  for (size_t b = 0; b < s.batches.size(); ++b) {
    const Batch& batch = s.batches[b];
    const BatchPlan& bp = m.batches[b];
    bool any = false;
    for (uint32_t q = 0; q < bp.operand_count; ++q)
      any |= m.operands[bp.operand_begin + q].mode == OperandMode::Indexed;
    o << "  subgraph cluster_" << b << " {\n    label=\"batch " << b << ": "
      << g.types().name(batch.type) << " x" << batch.count << " @" << bp.out_offset << "\";\n";
    for (uint32_t i = 0; i < batch.count; ++i) {
      const uint32_t v = s.nodes[batch.begin + i];
      indexed[v] = any;
      o << "    n" << v << " [label=\"" << v << ": " << node_label(g, v) << "\"];\n";
    }
    o << "  }\n";
  }
  for (uint32_t v = 0; v < g.size(); ++v) {
    const Node& n = g.node(v);
    if (!is_scheduled(n.op)) {
      o << "  n" << v << " [label=\"" << v << ": " << node_label(g, v) << "\",shape=ellipse];\n";
      continue;
    }
    for (uint32_t k = 0; k < n.num_args; ++k)
      o << "  n" << g.args(n)[k] << " -> n" << v << (indexed[v] ? " [style=dashed]" : "") << ";\n";
  }
  o << "}\n";
  return o.str();
}

}  // namespace edbatch
