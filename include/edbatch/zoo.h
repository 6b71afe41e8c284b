// Op-level cells written against the public API, shared by the models of models.h, and the
// Tree-LSTM as a standalone class for programs that need only it.
#pragma once
#include <cstdint>
#include <vector>

#include "edbatch/data.h"
#include "edbatch/graph.h"
#include "edbatch/params.h"

namespace edbatch {

struct CellState {
  Expr h, c;
};

// Binary Tree-LSTM (Tai et al.). Leaf: e = E[w]; i, o, u = sigmoid/sigmoid/tanh(W_* e + b_*);
// c = i.u; h = o.tanh(c). Inner: x = [h1; h2]; i, o, u from U_* x + b_*;
// f_k = sigmoid(U_fk h_k + b_f); c = i.u + f1.c1 + f2.c2; h = o.tanh(c).
struct TreeLstmLeafWeights {
  LookupParameter E;
  Parameter W_i, W_o, W_u, b_i, b_o, b_u;
};
struct TreeLstmInnerWeights {
  Parameter U_i, U_o, U_u, U_f1, U_f2, b_i, b_o, b_u, b_f;
};
CellState tree_lstm_leaf(Graph& g, const TreeLstmLeafWeights& w, uint32_t word);
CellState tree_lstm_inner(Graph& g, const TreeLstmInnerWeights& w, const CellState& left,
                          const CellState& right);
// Throws std::invalid_argument naming `fn` unless `tree` is non-empty and in post-order.
void check_tree(const Tree& tree, const char* fn);

// The Tree-LSTM with a softmax loss on W_out h at every node (the `tree_lstm` model of
// models.h builds the same graph).
class TreeLstmOps {
 public:
  TreeLstmOps(ParameterCollection& pc, uint32_t vocab, uint32_t hidden, uint32_t classes = 5);
  // Returns the tree's summed loss; appends each node's W_out h to `logits` when given.
  Expr build(Graph& g, const Tree& tree, std::vector<Expr>* logits = nullptr) const;
  uint32_t hidden() const { return hidden_; }

 private:
  uint32_t hidden_;
  TreeLstmLeafWeights leaf_;
  TreeLstmInnerWeights inner_;
  Parameter W_out_;
  mutable std::vector<CellState> states_;
  mutable std::vector<Expr> losses_;
};

}  // namespace edbatch
