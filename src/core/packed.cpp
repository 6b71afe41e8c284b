#include "edbatch/packed.h"

#include <stdexcept>
#include <string>

#include "edbatch/block_plan.h"

namespace edbatch {

namespace {

[[noreturn]] void fail(const char* fn, const std::string& msg) {
  throw std::invalid_argument(std::string("[") + fn + "] " + msg);
}

const char* reduce_name(PackedGraph::Reduce r) {
  switch (r) {
    case PackedGraph::Reduce::Sum:
      return "sum";
    case PackedGraph::Reduce::Average:
      return "average";
    case PackedGraph::Reduce::Maximum:
      return "maximum";
    case PackedGraph::Reduce::SumLosses:
      return "sum_losses";
  }
  return "?";
}

Op reduce_op(PackedGraph::Reduce r) {
  switch (r) {
    case PackedGraph::Reduce::Average:
      return Op::Average;
    case PackedGraph::Reduce::Maximum:
      return Op::Maximum;
    default:
      return Op::Sum;  // sum_losses is a sum of scalars
  }
}

// Node `id` as an argument of the node about to be added as `self`: an earlier node that holds a
// value (a call node does not: its outputs do). `what` names the argument, made only on failure.
template <class What>
const Node& value_node(const Graph& g, uint32_t id, uint32_t self, const What& what) {
  if (id >= self)
    throw std::invalid_argument(what() + " is node " + std::to_string(id) +
                                ", not an earlier node (the graph has " + std::to_string(self) +
                                ")");
  const Node& n = g.node(id);
  if (n.op == Op::Call)
    throw std::invalid_argument(what() + " is node " + std::to_string(id) +
                                ", a block call: pass its outputs");
  return n;
}

std::string argument(uint32_t k) {
  return "argument " + std::to_string(k + 1);
}

}  // namespace

void PackedGraph::reset(Graph& g) {
  graph_ = &g;
  generation_ = g.generation();
  base_ = next_ = g.size();
  ++run_;
  entries_.clear();
  inputs_.clear();
  ints_.clear();
}

void PackedGraph::check_started(const char* fn) const {
  if (graph_ == nullptr) fail(fn, "call reset(graph) first");
}

uint32_t PackedGraph::slot_of(const Block& block) {
  const uint32_t id = block.id();
  if (id < slot_by_id_.size() && slot_by_id_[id] != UINT32_MAX) {
    const BlockInfo& b = blocks_[slot_by_id_[id]];
    if (b.block == &block && b.run == run_) return slot_by_id_[id];
  }
  const char* fn = "PackedGraph::call";
  if (!block.frozen())
    fail(fn, "block '" + block.name() + "': call freeze() before invoking the block");
  const BlockPlan& p = block.plan();
  if (p.params != &graph_->params())
    fail(fn, "block '" + block.name() + "': graph is over another ParameterCollection");
  if (slot_by_id_.size() <= id) slot_by_id_.resize(id + 1, UINT32_MAX);
  if (slot_by_id_[id] == UINT32_MAX) {
    slot_by_id_[id] = static_cast<uint32_t>(blocks_.size());
    blocks_.emplace_back();
  }
  BlockInfo& b = blocks_[slot_by_id_[id]];
  b.block = &block;
  b.plan = &p;
  b.run = run_;
  b.id = id;
  return slot_by_id_[id];
}

uint32_t PackedGraph::call(const Block& block, const uint32_t* inputs, const uint32_t* ints) {
  check_started("PackedGraph::call");
  const uint32_t slot = slot_of(block);
  const BlockPlan& p = *blocks_[slot].plan;
  const uint32_t nin = static_cast<uint32_t>(p.input_dims.size());
  const uint32_t nints = static_cast<uint32_t>(p.index_names.size());
  entries_.push_back(Entry{kCall, slot, static_cast<uint32_t>(inputs_.size()), nin,
                           static_cast<uint32_t>(ints_.size()), Dim{}});
  inputs_.insert(inputs_.end(), inputs, inputs + nin);
  ints_.insert(ints_.end(), ints, ints + nints);
  const uint32_t first = next_ + 1;
  next_ = first + static_cast<uint32_t>(p.output_node.size());
  return first;
}

uint32_t PackedGraph::take(const Expr& e, const char* fn) const {
  if (e.graph != graph_) fail(fn, "an argument belongs to another graph (or is uninitialised)");
  if (e.generation != generation_ || e.id >= next_)
    fail(fn, "expression " + std::to_string(e.id) + " is from before Graph::clear()");
  return e.id;
}

uint32_t PackedGraph::record_call(const Block& block, const Expr* inputs, uint32_t num_inputs,
                                  const uint32_t* ints, uint32_t num_ints) {
  const char* fn = "PackedGraph::call";
  check_started(fn);
  if (num_inputs != block.num_inputs())
    fail(fn, "block '" + block.name() + "': expects " + std::to_string(block.num_inputs()) +
                 " inputs, got " + std::to_string(num_inputs));
  if (num_ints != block.num_indices())
    fail(fn, "block '" + block.name() + "': expects " + std::to_string(block.num_indices()) +
                 " integers, got " + std::to_string(num_ints));
  ids_.clear();
  for (uint32_t k = 0; k < num_inputs; ++k) ids_.push_back(take(inputs[k], fn));
  return call(block, ids_.data(), ints);
}

uint32_t PackedGraph::reduce(Reduce r, const uint32_t* ids, uint32_t n) {
  const char* fn = reduce_name(r);
  check_started(fn);
  if (n == 0) fail(fn, "needs at least one argument");
  if (n == 1) {
    if (ids[0] >= next_) fail(fn, "argument is node " + std::to_string(ids[0]) + ", not yet added");
    return ids[0];
  }
  entries_.push_back(
      Entry{kReduce, static_cast<uint32_t>(r), static_cast<uint32_t>(inputs_.size()), n, 0, Dim{}});
  inputs_.insert(inputs_.end(), ids, ids + n);
  return next_++;
}

Expr PackedGraph::reduce(Reduce r, const std::vector<Expr>& xs) {
  const char* fn = reduce_name(r);
  check_started(fn);
  ids_.clear();
  for (const Expr& x : xs) ids_.push_back(take(x, fn));
  return expr(reduce(r, ids_.data(), static_cast<uint32_t>(ids_.size())));
}

uint32_t PackedGraph::lookup(LookupParameter table, uint32_t index) {
  check_started("lookup");
  entries_.push_back(Entry{kLookup, table.id, 0, 0, index, Dim{}});
  return next_++;
}

uint32_t PackedGraph::reshape(uint32_t x, Dim dim) {
  check_started("reshape");
  entries_.push_back(Entry{kReshape, 0, static_cast<uint32_t>(inputs_.size()), 1, 0, dim});
  inputs_.push_back(x);
  return next_++;
}

void PackedGraph::append_entry(Graph& g, const Entry& e) {
  const uint32_t self = g.size();
  const uint32_t* in = inputs_.data() + e.in_begin;
  switch (e.kind) {
    case kCall: {
      const BlockInfo& b = blocks_[e.what];
      // A block destroyed since call() recorded it: its plan is gone (a block made since may
      // even sit at its address).
      if (g.params().block(b.id) != b.block)
        throw std::invalid_argument("the block was destroyed after its call was recorded");
      const BlockPlan& p = *b.plan;
      for (uint32_t k = 0; k < e.in_count; ++k)
        value_node(g, in[k], self, [&] { return "input '" + p.input_names[k] + "'"; });
      const uint32_t* ints = ints_.data() + e.aux;
      const std::string wrong = call_mismatch(
          p, [&](uint32_t k) { return g.node(in[k]).dim; }, ints);
      if (!wrong.empty()) throw std::invalid_argument(wrong);
      add_call_nodes(g, p, in, ints);
      return;
    }
    case kReduce: {
      const Reduce r = static_cast<Reduce>(e.what);
      const Dim d0 = value_node(g, in[0], self, [] { return argument(0); }).dim;
      for (uint32_t k = 0; k < e.in_count; ++k) {
        const Dim d = value_node(g, in[k], self, [k] { return argument(k); }).dim;
        if (r == Reduce::SumLosses && d != Dim{1, 1})
          throw std::invalid_argument(argument(k) + " is " + to_string(d) + ", not a scalar");
        if (d != d0)
          throw std::invalid_argument(argument(k) + " has shape " + to_string(d) +
                                      " but argument 1 has shape " + to_string(d0));
      }
      g.add_node(reduce_op(r), d0, in, e.in_count);
      return;
    }
    case kLookup:
      edbatch::lookup(g, LookupParameter{e.what}, e.aux);
      return;
    case kReshape:
      value_node(g, in[0], self, [] { return std::string("the argument"); });
      edbatch::reshape(g.expr(in[0]), e.dim);
      return;
  }
}

void PackedGraph::append(Graph& g) {
  const char* fn = "PackedGraph::append";
  check_started(fn);
  if (&g != graph_ || g.generation() != generation_ || g.size() != base_)
    fail(fn, "the graph is not the one reset() saw (it has " + std::to_string(g.size()) +
                 " nodes; the run starts at node " + std::to_string(base_) +
                 "): append a run right after building it");
  // Arguments: the entries' inputs plus one per call output.
  g.reserve_more(next_ - base_, inputs_.size() + (next_ - base_), ints_.size());
  size_t k = 0;
  try {
    for (; k < entries_.size(); ++k) append_entry(g, entries_[k]);
  } catch (const std::invalid_argument& e) {
    const uint32_t at = g.size();
    g.truncate(base_);
    const Entry& en = entries_[k];
    const std::string what =
        en.kind == kCall     ? "call of block '" + g.params().block_name(blocks_[en.what].id) + "'"
        : en.kind == kReduce ? std::string(reduce_name(static_cast<Reduce>(en.what)))
        : en.kind == kLookup ? std::string("lookup")
                             : std::string("reshape");
    fail(fn, "entry " + std::to_string(k) + " (" + what + ", node " + std::to_string(at) +
                 "): " + e.what());
  } catch (...) {
    g.truncate(base_);
    throw;
  }
  if (g.size() != next_)
    fail(fn, "internal error: the run predicted " + std::to_string(next_) +
                 " nodes, the graph has " + std::to_string(g.size()));
}

}  // namespace edbatch
