// The cells the PyTorch ops run, as blocks. The Tree-LSTM is the zoo's (zoo.h); the others follow
// the math of docs/models.md with the embedding lookups replaced by rows of the op's input x.
#include <fmt/format.h>

#include <stdexcept>

#include "edbatch/zoo.h"
#include "src/torch/cells.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::torch_adapter {

namespace {

void need_input(const Packed& p, int64_t k, const char* fn, const char* cell) {
  if (p.node_inputs[k] < 0)
    throw std::invalid_argument(
        fmt::format("[{}] {}: node {} has no predecessors and no input row", fn, cell, k));
}

void binary_tree_check(const Packed& p, const char* fn, const char* cell) {
  for (int64_t k = 0; k < p.num_nodes; ++k) {
    const int64_t n = p.pred_ptr[k + 1] - p.pred_ptr[k];
    if (n == 0) need_input(p, k, fn, cell);
    else if (n != 2)
      throw std::invalid_argument(fmt::format(
          "[{}] {}: node {} has {} children; a binary tree node has 0 or 2", fn, cell, k, n));
    if (p.node_types[k] != 0)
      throw std::invalid_argument(
          fmt::format("[{}] {}: node {} has type {}; this cell has one type", fn, cell, k,
                      p.node_types[k]));
  }
}

template <class Declare>
std::unique_ptr<Block> frozen(ParameterCollection& pc, const std::string& name, Declare declare) {
  return zoo::make_block(pc, name, declare);
}

// ---- Tree-LSTM (the zoo's cells) ----

class TreeLstmCell : public Cell {
 public:
  TreeLstmCell(ParameterCollection& pc, uint32_t H, uint32_t D) : Cell(H, D) {
    TreeLstmLeafWeights l;
    l.W_i = add(pc, "W_i", H, D);
    l.W_o = add(pc, "W_o", H, D);
    l.W_u = add(pc, "W_u", H, D);
    l.b_i = add(pc, "b_i", H, 0);
    l.b_o = add(pc, "b_o", H, 0);
    l.b_u = add(pc, "b_u", H, 0);
    const TreeLstmInnerWeights n{add(pc, "U_i", H, 2 * H), add(pc, "U_o", H, 2 * H),
                                 add(pc, "U_u", H, 2 * H), add(pc, "U_f1", H, H),
                                 add(pc, "U_f2", H, H),    l.b_i,
                                 l.b_o,                    l.b_u,
                                 add(pc, "b_f", H, 0)};
    const Dim h{H, 1};
    leaf_ = frozen(pc, "tree_lstm.leaf", [&](Block& b) {
      const CellState s = zoo::tree_lstm_leaf_cell(b.body(), l, b.input("x", Dim{D, 1}));
      b.output("h", s.h);
      b.output("c", s.c);
    });
    inner_ = frozen(pc, "tree_lstm.inner", [&](Block& b) {
      const CellState left{b.input("h1", h), b.input("c1", h)};
      const CellState right{b.input("h2", h), b.input("c2", h)};
      const CellState s = tree_lstm_inner(b.body(), n, left, right);
      b.output("h", s.h);
      b.output("c", s.c);
    });
  }
  uint32_t num_outputs() const override { return 2; }
  void check(const Packed& p, const char* fn) const override {
    binary_tree_check(p, fn, "tree_lstm");
  }
  void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
             std::vector<Expr>& out) override {
    const int64_t N = p.num_nodes;
    Expr o[2];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t a = p.pred_ptr[k];
      if (a == p.pred_ptr[k + 1]) {
        leaf_->call(g, &x[p.node_inputs[k]], 1, nullptr, 0, o);
      } else {
        const int64_t l = p.pred_ids[a], r = p.pred_ids[a + 1];
        const Expr in[4] = {out[l], out[N + l], out[r], out[N + r]};
        inner_->call(g, in, 4, nullptr, 0, o);
      }
      out[k] = o[0];
      out[N + k] = o[1];
    }
  }

 private:
  std::unique_ptr<Block> leaf_, inner_;
};

}  // namespace

const std::vector<std::string>& cell_names() {
  static const std::vector<std::string> names = {"tree_lstm"};
  return names;
}

std::unique_ptr<Cell> make_cell(const CellConfig& c, ParameterCollection& pc) {
  if (c.hidden == 0 || c.input_dim == 0)
    throw std::invalid_argument(fmt::format("[make_cell] {}: hidden size {} and input size {} "
                                            "must be positive",
                                            c.cell, c.hidden, c.input_dim));
  if (c.cell == "tree_lstm") return std::make_unique<TreeLstmCell>(pc, c.hidden, c.input_dim);
  std::string names;
  for (const std::string& n : cell_names()) names += (names.empty() ? "" : ", ") + n;
  throw std::invalid_argument(
      fmt::format("[make_cell] unknown cell '{}' (known: {})", c.cell, names));
}

}  // namespace edbatch::torch_adapter
