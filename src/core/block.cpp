// Blocks: declaration, invocation and dumps. Compilation lives in block_compile.cpp.
#include "edbatch/block.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "edbatch/block_plan.h"
#include "edbatch/types.h"
#include "src/core/block_compile.h"

namespace edbatch {

namespace {
[[noreturn]] void fail(const char* fn, const BlockPlan& p, const std::string& msg) {
  throw std::invalid_argument(std::string("[") + fn + "] block '" + p.name + "': " + msg);
}
}  // namespace

Block::Block(ParameterCollection& params, std::string name) : plan_(std::make_unique<BlockPlan>()) {
  plan_->name = std::move(name);
  plan_->params = &params;
  plan_->id = params.register_block(plan_->name, this);
  plan_->source = std::make_unique<Graph>(params);
}

Block::~Block() {
  if (plan_) plan_->params->unregister_block(plan_->id);
}

Graph& Block::body() {
  if (plan_->frozen) fail("Block::body", *plan_, "the body is frozen");
  return *plan_->source;
}

Expr Block::input(const std::string& name, Dim dim) {
  BlockPlan& p = *plan_;
  if (p.frozen) fail("Block::input", p, "cannot add inputs after freeze()");
  for (const std::string& n : p.input_names)
    if (n == name) fail("Block::input", p, "input '" + name + "' declared twice");
  const std::vector<float> zeros(dim.size(), 0.0f);
  const Expr e = edbatch::input(*p.source, dim, zeros);
  p.input_names.push_back(name);
  p.input_dims.push_back(dim);
  p.source_inputs.push_back(e.id);
  return e;
}

uint32_t Block::index(const std::string& name) {
  BlockPlan& p = *plan_;
  if (p.frozen) fail("Block::index", p, "cannot add integers after freeze()");
  for (const std::string& n : p.index_names)
    if (n == name) fail("Block::index", p, "integer '" + name + "' declared twice");
  p.index_names.push_back(name);
  p.index_limit.push_back(kNoLimit);
  return static_cast<uint32_t>(p.index_names.size() - 1);
}

namespace {
void mark_slot(BlockPlan& p, const Expr& e, uint32_t slot, uint32_t limit) {
  p.source_slot.resize(p.source->size(), UINT32_MAX);
  p.source_slot[e.id] = slot;
  if (limit < p.index_limit[slot]) p.index_limit[slot] = limit;
}
}  // namespace

Expr Block::lookup(LookupParameter table, uint32_t slot) {
  BlockPlan& p = *plan_;
  if (p.frozen) fail("Block::lookup", p, "the body is frozen");
  if (slot >= p.index_names.size())
    fail("Block::lookup", p, "no integer slot " + std::to_string(slot));
  const Expr e = edbatch::lookup(*p.source, table, 0);
  mark_slot(p, e, slot, p.params->dim(table.id).cols);
  return e;
}

Expr Block::pick_neg_log_softmax(const Expr& x, uint32_t slot) {
  BlockPlan& p = *plan_;
  if (p.frozen) fail("Block::pick_neg_log_softmax", p, "the body is frozen");
  if (slot >= p.index_names.size())
    fail("Block::pick_neg_log_softmax", p, "no integer slot " + std::to_string(slot));
  const Expr e = edbatch::pick_neg_log_softmax(x, 0);
  mark_slot(p, e, slot, p.source->node(x.id).dim.rows);
  return e;
}

Expr Block::dropout(const Expr& x, float p, uint32_t slot) {
  BlockPlan& bp = *plan_;
  if (bp.frozen) fail("Block::dropout", bp, "the body is frozen");
  if (slot >= bp.index_names.size())
    fail("Block::dropout", bp, "no integer slot " + std::to_string(slot));
  if (!(p >= 0 && p < 1))  // the body's node numbers would mean nothing to the caller
    fail("Block::dropout", bp, fmt::format("p = {:g} is outside [0, 1)", p));
  const Expr e = edbatch::dropout(x, p, 0);
  mark_slot(bp, e, slot, kNoLimit);
  return e;
}

void Block::output(const std::string& name, const Expr& e) {
  BlockPlan& p = *plan_;
  if (p.frozen) fail("Block::output", p, "cannot add outputs after freeze()");
  if (e.graph != p.source.get()) fail("Block::output", p, "'" + name + "' is not from this body");
  const Node& n = p.source->node_of(e, "Block::output");
  if (!is_scheduled(n.op))
    fail("Block::output", p, "'" + name + "' is an input or parameter, not computed by the body");
  for (const std::string& o : p.output_names)
    if (o == name) fail("Block::output", p, "output '" + name + "' declared twice");
  p.output_names.push_back(name);
  p.source_outputs.push_back(e.id);
}

void Block::freeze(const FreezeOptions& options) {
  BlockPlan& p = *plan_;
  if (p.frozen) fail("Block::freeze", p, "already frozen");
  if (p.source_outputs.empty()) fail("Block::freeze", p, "no outputs declared");
  // A step of the compiled body reads at most kMaxStepOperands operands (the kernels' operand
  // tables); nested calls (a concat of concats) take more.
  for (uint32_t v = 0; v < p.source->size(); ++v) {
    const Node& n = p.source->node(v);
    if (is_scheduled(n.op) && n.num_args > kMaxStepOperands)
      fail("Block::freeze", p,
           "body node " + std::to_string(v) + " (" + op_name(n.op) + ") has " +
               std::to_string(n.num_args) + " arguments, and a block step reads at most " +
               std::to_string(kMaxStepOperands) +
               ": split it into parts of at most that many (a sum or maximum over the parts' "
               "sums or maxima; an average as the sum of the parts' sums scaled by 1/n; an "
               "affine as the sum of affines over parts of its products)");
  }
  p.source_slot.resize(p.source->size(), UINT32_MAX);
  compile_block(p, options);
  p.frozen = true;
}

std::vector<Expr> Block::operator()(Graph& g, const std::vector<Expr>& inputs,
                                    const std::vector<uint32_t>& indices) const {
  std::vector<Expr> out(plan_->output_names.size());
  call(g, inputs.data(), static_cast<uint32_t>(inputs.size()), indices.data(),
       static_cast<uint32_t>(indices.size()), out.data());
  return out;
}

void Block::call(Graph& g, const Expr* inputs, uint32_t num_inputs, const uint32_t* indices,
                 uint32_t num_indices, Expr* outputs) const {
  const BlockPlan& p = *plan_;
  const char* fn = "Block::call";
  if (!p.frozen) fail(fn, p, "call freeze() before invoking the block");
  if (&g.params() != p.params) fail(fn, p, "graph is over another ParameterCollection");
  if (num_inputs != p.input_dims.size())
    fail(fn, p, "expects " + std::to_string(p.input_dims.size()) + " inputs, got " +
                    std::to_string(num_inputs));
  if (num_indices != p.index_names.size())
    fail(fn, p, "expects " + std::to_string(p.index_names.size()) + " integers, got " +
                    std::to_string(num_indices));
  // The inputs' ids, on the stack for the usual few inputs.
  constexpr uint32_t kOnStack = 16;
  uint32_t ids_here[kOnStack];
  std::vector<uint32_t> ids_many;
  uint32_t* ids = ids_here;
  if (num_inputs > kOnStack) {
    ids_many.resize(num_inputs);
    ids = ids_many.data();
  }
  for (uint32_t k = 0; k < num_inputs; ++k) {
    if (inputs[k].graph != &g) fail(fn, p, "input '" + p.input_names[k] + "' is from another graph");
    g.node_of(inputs[k], fn);  // not from before clear()
    ids[k] = inputs[k].id;
  }
  const std::string wrong = call_mismatch(
      p, [&](uint32_t k) { return g.node(ids[k]).dim; }, indices);
  if (!wrong.empty()) fail(fn, p, wrong);
  const uint32_t call = add_call_nodes(g, p, ids, indices);
  for (uint32_t o = 0; o < p.output_node.size(); ++o) outputs[o] = g.expr(call + 1 + o);
}

bool Block::frozen() const { return plan_->frozen; }
const std::string& Block::name() const { return plan_->name; }
uint32_t Block::id() const { return plan_->id; }
uint32_t Block::num_inputs() const { return static_cast<uint32_t>(plan_->input_dims.size()); }
uint32_t Block::num_indices() const { return static_cast<uint32_t>(plan_->index_names.size()); }
uint32_t Block::num_outputs() const { return static_cast<uint32_t>(plan_->output_names.size()); }
Dim Block::input_dim(uint32_t k) const { return plan_->input_dims.at(k); }
Dim Block::output_dim(uint32_t k) const {
  return plan_->source->node(plan_->source_outputs.at(k)).dim;
}
const std::string& Block::input_name(uint32_t k) const { return plan_->input_names.at(k); }
const std::string& Block::output_name(uint32_t k) const { return plan_->output_names.at(k); }
const BlockPlan& Block::plan() const {
  if (!plan_->frozen) fail("Block::plan", *plan_, "not frozen");
  return *plan_;
}
double Block::freeze_ms() const { return plan_->freeze_ms; }
std::string Block::dump_json() const { return block_json(plan()); }
std::string Block::dump_dot() const { return block_dot(plan()); }

}  // namespace edbatch
