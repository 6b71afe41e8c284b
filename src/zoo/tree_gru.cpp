// The binary Tree-GRU (`tree_gru`): a GRU-style leaf cell, and inner nodes that average one
// gated update per child.
#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::zoo {

namespace {

class TreeGru : public Model {
 public:
  TreeGru(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : Model("tree_gru", pc, o), trees_(data.trees) {
    const uint32_t H = o.hidden;
    const Dim hh{H, H}, h1{H, 1};
    E_ = pc.add_lookup_parameters("E", o.vocab, H);
    U_r_ = pc.add_parameters("U_r", hh);
    U_z_ = pc.add_parameters("U_z", hh);
    U_c_ = pc.add_parameters("U_c", hh);
    for (int k = 0; k < 2; ++k) {
      const std::string s = std::to_string(k + 1);
      U_rk_[k] = pc.add_parameters("U_r" + s, hh);
      U_zk_[k] = pc.add_parameters("U_z" + s, hh);
      U_ck_[k] = pc.add_parameters("U_c" + s, hh);
    }
    b_r_ = pc.add_parameters("b_r", h1);
    b_z_ = pc.add_parameters("b_z", h1);
    b_c_ = pc.add_parameters("b_c", h1);
    W_out_ = pc.add_parameters("W_out", Dim{5, H});
  }
  uint32_t size() const override { return static_cast<uint32_t>(trees_.size()); }
  uint32_t num_classes() const override { return 5; }
  std::vector<uint32_t> labels(uint32_t i) const override {
    std::vector<uint32_t> out;
    for (const TreeNode& t : trees_.at(i).nodes) out.push_back(t.label);
    return out;
  }
  std::string math() const override {
    return "leaf:  e = E[w]; r = sigmoid(U_r e + b_r); z = sigmoid(U_z e + b_z)\n"
           "       c = tanh(U_c (r.e) + b_c); h = z.e + (1-z).c\n"
           "inner: per child k = 1, 2: r_k = sigmoid(U_rk h_k + b_r); z_k = sigmoid(U_zk h_k + b_z)\n"
           "       c_k = tanh(U_ck (r_k.h_k) + b_c)\n"
           "       h = (z1.h1 + z2.h2 + (1-z1).c1 + (1-z2).c2) / 2\n"
           "loss:  sum over all nodes of -log softmax(W_out h)[label]";
  }

 protected:
  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const Tree& tree = trees_[instance];
    check_tree(tree, "tree_gru");
    h_.resize(tree.nodes.size());
    losses_.clear();
    const Expr b_r = parameter(g, b_r_), b_z = parameter(g, b_z_), b_c = parameter(g, b_c_);
    for (size_t k = 0; k < tree.nodes.size(); ++k) {
      const TreeNode& t = tree.nodes[k];
      if (t.leaf()) {
        const Expr e = lookup(g, E_, t.word);
        const Expr r = sigmoid(affine({b_r, parameter(g, U_r_), e}));
        const Expr z = sigmoid(affine({b_z, parameter(g, U_z_), e}));
        const Expr c = tanh(affine({b_c, parameter(g, U_c_), cmult(r, e)}));
        h_[k] = sum({cmult(z, e), cmult(1.0f - z, c)});
      } else {
        std::vector<Expr> terms;
        const Expr hk[2] = {h_[t.left], h_[t.right]};
        for (int j = 0; j < 2; ++j) {
          const Expr r = sigmoid(affine({b_r, parameter(g, U_rk_[j]), hk[j]}));
          const Expr z = sigmoid(affine({b_z, parameter(g, U_zk_[j]), hk[j]}));
          const Expr c = tanh(affine({b_c, parameter(g, U_ck_[j]), cmult(r, hk[j])}));
          terms.push_back(cmult(z, hk[j]));
          terms.push_back(cmult(1.0f - z, c));
        }
        h_[k] = sum(terms) * 0.5f;
      }
      losses_.push_back(node_loss(g, W_out_, h_[k], t.label, logits));
    }
    return sum_losses(losses_);
  }
  Expr build_blocks(Graph&, uint32_t, std::vector<Expr>*) override {
    block_path_missing(name());
  }

 private:
  const std::vector<Tree>& trees_;
  LookupParameter E_;
  Parameter U_r_, U_z_, U_c_, U_rk_[2], U_zk_[2], U_ck_[2], b_r_, b_z_, b_c_, W_out_;
  std::vector<Expr> h_, losses_;
};

}  // namespace

std::unique_ptr<Model> make_tree_gru(ParameterCollection& pc, const Dataset& data,
                                     const ModelOptions& o) {
  return std::make_unique<TreeGru>(pc, data, o);
}

}  // namespace edbatch::zoo
