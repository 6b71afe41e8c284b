#include <stdexcept>
#include <string>

#include "edbatch/zoo.h"

namespace edbatch {

TreeLstmOps::TreeLstmOps(ParameterCollection& pc, uint32_t vocab, uint32_t hidden,
                         uint32_t classes)
    : hidden_(hidden) {
  const Dim hh{hidden, hidden}, h2{hidden, 2 * hidden}, h1{hidden, 1};
  E_ = pc.add_lookup_parameters("E", vocab, hidden);
  W_i_ = pc.add_parameters("W_i", hh);
  W_o_ = pc.add_parameters("W_o", hh);
  W_u_ = pc.add_parameters("W_u", hh);
  U_i_ = pc.add_parameters("U_i", h2);
  U_o_ = pc.add_parameters("U_o", h2);
  U_u_ = pc.add_parameters("U_u", h2);
  U_f1_ = pc.add_parameters("U_f1", hh);
  U_f2_ = pc.add_parameters("U_f2", hh);
  b_i_ = pc.add_parameters("b_i", h1);
  b_o_ = pc.add_parameters("b_o", h1);
  b_u_ = pc.add_parameters("b_u", h1);
  b_f_ = pc.add_parameters("b_f", h1);
  W_out_ = pc.add_parameters("W_out", Dim{classes, hidden});
}

Expr TreeLstmOps::build(Graph& g, const Tree& tree) const {
  if (tree.nodes.empty()) throw std::invalid_argument("[TreeLstmOps::build] empty tree");
  const size_t n = tree.nodes.size();
  h_.resize(n);
  c_.resize(n);
  losses_.clear();
  const Expr b_i = parameter(g, b_i_), b_o = parameter(g, b_o_), b_u = parameter(g, b_u_);
  const Expr W_out = parameter(g, W_out_);
  for (size_t k = 0; k < n; ++k) {
    const TreeNode& t = tree.nodes[k];
    if (t.leaf()) {
      const Expr e = lookup(g, E_, t.word);
      const Expr i = sigmoid(affine({b_i, parameter(g, W_i_), e}));
      const Expr o = sigmoid(affine({b_o, parameter(g, W_o_), e}));
      const Expr u = tanh(affine({b_u, parameter(g, W_u_), e}));
      c_[k] = cmult(i, u);
      h_[k] = cmult(o, tanh(c_[k]));
    } else {
      if (t.left < 0 || t.right < 0 || static_cast<size_t>(t.left) >= k ||
          static_cast<size_t>(t.right) >= k)
        throw std::invalid_argument("[TreeLstmOps::build] node " + std::to_string(k) +
                                    " has children that do not come before it");
      const Expr h1 = h_[t.left], h2 = h_[t.right];
      const Expr x = concat({h1, h2});
      const Expr i = sigmoid(affine({b_i, parameter(g, U_i_), x}));
      const Expr o = sigmoid(affine({b_o, parameter(g, U_o_), x}));
      const Expr u = tanh(affine({b_u, parameter(g, U_u_), x}));
      const Expr bf = parameter(g, b_f_);
      const Expr f1 = sigmoid(affine({bf, parameter(g, U_f1_), h1}));
      const Expr f2 = sigmoid(affine({bf, parameter(g, U_f2_), h2}));
      c_[k] = sum({cmult(i, u), cmult(f1, c_[t.left]), cmult(f2, c_[t.right])});
      h_[k] = cmult(o, tanh(c_[k]));
    }
    losses_.push_back(pick_neg_log_softmax(matmul(W_out, h_[k]), t.label));
  }
  return sum_losses(losses_);
}

}  // namespace edbatch
