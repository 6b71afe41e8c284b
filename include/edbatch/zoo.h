// Models written against the public API. Each builds one instance at a time into a Graph and
// returns that instance's summed loss.
#pragma once
#include <cstdint>
#include <vector>

#include "edbatch/data.h"
#include "edbatch/graph.h"
#include "edbatch/params.h"

namespace edbatch {

// Binary Tree-LSTM, op by op (Tai et al.): leaf e = E[w]; i, o, u from W_* e + b_*; c = i.u;
// h = o.tanh(c). Inner: x = [h1; h2]; i, o, u from U_* x + b_*; f_k = sigmoid(U_fk h_k + b_f);
// c = i.u + f1.c1 + f2.c2; h = o.tanh(c). A softmax loss on W_out h at every node.
class TreeLstmOps {
 public:
  TreeLstmOps(ParameterCollection& pc, uint32_t vocab, uint32_t hidden, uint32_t classes = 5);
  Expr build(Graph& g, const Tree& tree) const;
  uint32_t hidden() const { return hidden_; }

 private:
  uint32_t hidden_;
  LookupParameter E_;
  Parameter W_i_, W_o_, W_u_, U_i_, U_o_, U_u_, U_f1_, U_f2_, b_i_, b_o_, b_u_, b_f_, W_out_;
  mutable std::vector<Expr> h_, c_, losses_;
};

}  // namespace edbatch
