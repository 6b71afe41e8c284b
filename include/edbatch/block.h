// Blocks: static subgraphs (cells) declared once and invoked many times. freeze() compiles the
// body: its internal batching, the layout of its values and its fused elementwise groups. In a
// mini-batch, all invocations of one block form one batching type, and a batch of k invocations
// runs the compiled plan once with k columns.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edbatch/graph.h"
#include "edbatch/params.h"

namespace edbatch {

struct BlockPlan;

struct FreezeOptions {
  // Order each internal step's members for the steps that read them (the layout planner).
  // Off: members stay in body order, so more internal operands need index lists.
  bool plan_layout = true;
};

class Block {
 public:
  // `name` names the block's batching type ("block:<name>(<input shapes>-><output floats>)") and
  // must be unique per collection.
  Block(ParameterCollection& params, std::string name);
  ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  // ---- declaring the body (before freeze) ----
  // The body is an ordinary graph over the same collection: build it with the usual Expr
  // functions, e.g. sigmoid(affine({parameter(b.body(), bias), parameter(b.body(), W), x})).
  Graph& body();
  // An input of the given shape, supplied per invocation.
  Expr input(const std::string& name, Dim dim);
  // An integer supplied per invocation (a word id or a label); returns its slot.
  uint32_t index(const std::string& name);
  // A column of `table` chosen by the invocation's integer in `slot`.
  Expr lookup(LookupParameter table, uint32_t slot);
  // -log softmax(x)[label], the label being the invocation's integer in `slot`.
  Expr pick_neg_log_softmax(const Expr& x, uint32_t slot);
  // dropout(x, p, key) (graph.h), the key being the invocation's integer in `slot`.
  Expr dropout(const Expr& x, float p, uint32_t slot);
  void output(const std::string& name, const Expr& e);
  // Compiles the body. Throws if called twice, without outputs, or when the body is malformed.
  void freeze(const FreezeOptions& options = {});

  // ---- invoking (after freeze) ----
  // One Expr per output, in declaration order. Inputs and integers in declaration order.
  std::vector<Expr> operator()(Graph& g, const std::vector<Expr>& inputs,
                               const std::vector<uint32_t>& indices = {}) const;
  // The same without allocating: `outputs` receives num_outputs() Exprs.
  void call(Graph& g, const Expr* inputs, uint32_t num_inputs, const uint32_t* indices,
            uint32_t num_indices, Expr* outputs) const;

  bool frozen() const;
  const std::string& name() const;
  uint32_t id() const;  // index in the collection's block registry
  uint32_t num_inputs() const;
  uint32_t num_indices() const;
  uint32_t num_outputs() const;
  Dim input_dim(uint32_t k) const;
  Dim output_dim(uint32_t k) const;
  const std::string& input_name(uint32_t k) const;
  const std::string& output_name(uint32_t k) const;
  const BlockPlan& plan() const;  // after freeze
  // The compiled plan as JSON or DOT, for debugging.
  std::string dump_json() const;
  std::string dump_dot() const;
  double freeze_ms() const;

 private:
  std::unique_ptr<BlockPlan> plan_;
};

}  // namespace edbatch
