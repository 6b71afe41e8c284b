// Building a mini-batch in bulk: block calls, lookups, reshapes and reductions recorded as flat
// integer arrays and appended to a graph in one pass (append), instead of one checked Expr
// builder call per node. For programs that already hold their structures as arrays (child lists,
// arc lists, packed batches): the graph comes out node for node as the Expr builders would make
// it, with the same checks and messages, and is appended whole or not at all. Host time per node
// is about that of Block::call (docs/performance.md, "Host work per node").
//
//   PackedGraph run;
//   run.reset(g);                       // node ids continue from g.size()
//   uint32_t h = run.call(leaf, nullptr, ints);          // output o of the call is h + o
//   uint32_t s = run.reduce(PackedGraph::Reduce::Sum, ids, n);
//   run.append(g);                      // all or nothing
//
// Ids a run hands out are the ids the nodes get on append. The Expr overloads take and give the
// same ids as Exprs of the graph, so code written against Block::call runs unchanged on a run.
#pragma once
#include <cstdint>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/graph.h"

namespace edbatch {

class PackedGraph {
 public:
  enum class Reduce : uint32_t { Sum, Average, Maximum, SumLosses };

  // Starts an empty run over `g`: its first node will be g.size(). Keeps the storage.
  void reset(Graph& g);
  // A call of `block` (frozen, over g's collection) on input node ids (block.num_inputs() of
  // them) and integers (block.num_indices()). Returns the id of its first output; output o is that
  // id + o (the call node itself is the id before it).
  uint32_t call(const Block& block, const uint32_t* inputs, const uint32_t* ints);
  // As Block::call: the same arguments, Exprs whose ids are those the nodes get on append.
  // (Inline, so that the caller reads the outputs from registers, not from stores in flight.)
  void call(const Block& block, const Expr* inputs, uint32_t num_inputs, const uint32_t* ints,
            uint32_t num_ints, Expr* outputs) {
    const uint32_t first = record_call(block, inputs, num_inputs, ints, num_ints);
    const uint32_t n = next_ - first;
    for (uint32_t o = 0; o < n; ++o) outputs[o] = Expr{graph_, first + o, generation_};
  }
  // sum / average / maximum / sum_losses of graph.h over node ids (n >= 1). As there, one argument
  // is the result itself and adds no node.
  uint32_t reduce(Reduce r, const uint32_t* ids, uint32_t n);
  Expr reduce(Reduce r, const std::vector<Expr>& xs);
  // lookup(g, table, index) and reshape(x, dim) of graph.h.
  uint32_t lookup(LookupParameter table, uint32_t index);
  uint32_t reshape(uint32_t x, Dim dim);

  uint32_t first() const { return base_; }  // the id of the run's first node
  uint32_t end() const { return next_; }    // one past the id of its last node
  Expr expr(uint32_t id) const { return Expr{graph_, id, generation_}; }

  // Appends the run to its graph, which must not have changed since reset(). Throws
  // std::invalid_argument naming the entry and what is wrong (the messages of Block::call and the
  // Expr builders); the graph is then as it was before. The run stays (append it to nothing
  // else: reset() starts the next).
  void append(Graph& g);

 private:
  enum Kind : uint32_t { kCall, kReduce, kLookup, kReshape };
  struct Entry {
    Kind kind;
    uint32_t what;      // call: block slot; reduce: Reduce; lookup: table id
    uint32_t in_begin;  // into inputs_ (call, reduce, reshape)
    uint32_t in_count;
    uint32_t aux;  // call: start in ints_; lookup: the index
    Dim dim;       // reshape: the shape
  };
  struct BlockInfo {
    const Block* block;
    const BlockPlan* plan;  // valid while the collection still has `block` under `id`
    uint64_t run;           // the reset() it was checked in
    uint32_t id;            // ParameterCollection::block(id): never reused
  };
  uint32_t slot_of(const Block& block);
  // The Expr call's checks and record; returns the id of the first output.
  uint32_t record_call(const Block& block, const Expr* inputs, uint32_t num_inputs,
                       const uint32_t* ints, uint32_t num_ints);
  uint32_t take(const Expr& e, const char* fn) const;
  void check_started(const char* fn) const;
  void append_entry(Graph& g, const Entry& e);

  Graph* graph_ = nullptr;
  uint32_t generation_ = 0;
  uint32_t base_ = 0, next_ = 0;
  uint64_t run_ = 0;  // counts reset()s
  std::vector<Entry> entries_;
  std::vector<uint32_t> inputs_, ints_;
  std::vector<uint32_t> ids_;  // the Expr overloads' arguments as ids
  std::vector<BlockInfo> blocks_;
  std::vector<uint32_t> slot_by_id_;  // block id -> slot in blocks_ (UINT32_MAX: none yet)
};

}  // namespace edbatch
