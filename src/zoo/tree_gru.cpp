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
    w_.U_r = pc.add_parameters("U_r", hh);
    w_.U_z = pc.add_parameters("U_z", hh);
    w_.U_c = pc.add_parameters("U_c", hh);
    for (int k = 0; k < 2; ++k) {
      const std::string s = std::to_string(k + 1);
      w_.U_rk[k] = pc.add_parameters("U_r" + s, hh);
      w_.U_zk[k] = pc.add_parameters("U_z" + s, hh);
      w_.U_ck[k] = pc.add_parameters("U_c" + s, hh);
    }
    w_.b_r = pc.add_parameters("b_r", h1);
    w_.b_z = pc.add_parameters("b_z", h1);
    w_.b_c = pc.add_parameters("b_c", h1);
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
    const Tree& tree = checked_tree(trees_, instance);
    h_.resize(tree.nodes.size());
    losses_.clear();
    for (size_t k = 0; k < tree.nodes.size(); ++k) {
      const TreeNode& t = tree.nodes[k];
      h_[k] = t.leaf() ? tree_gru_leaf(g, w_, lookup(g, E_, t.word))
                       : tree_gru_inner(g, w_, h_[t.left], h_[t.right]);
      losses_.push_back(node_loss(g, W_out_, h_[k], t.label, logits));
    }
    return sum_losses(losses_);
  }

  // Blocks with the node's loss: leaf (integers word, label), inner (inputs h1, h2; integer
  // label); outputs h, loss, logits.
  Expr build_blocks(Sink& s, uint32_t instance, std::vector<Expr>* logits) override {
    const Tree& tree = checked_tree(trees_, instance);
    if (!leaf_block_) make_blocks();
    h_.resize(tree.nodes.size());
    losses_.clear();
    Expr out[3];
    for (size_t k = 0; k < tree.nodes.size(); ++k) {
      const TreeNode& t = tree.nodes[k];
      if (t.leaf()) {
        const uint32_t ints[2] = {t.word, t.label};
        s.call(*leaf_block_, nullptr, 0, ints, 2, out);
      } else {
        const Expr in[2] = {h_[t.left], h_[t.right]};
        const uint32_t label = t.label;
        s.call(*inner_block_, in, 2, &label, 1, out);
      }
      h_[k] = out[0];
      losses_.push_back(call_loss(out, 3, logits));
    }
    return s.sum_losses(losses_);
  }

 private:
  void make_blocks() {
    const Dim h{options_.hidden, 1};
    leaf_block_ = make_block(pc_, "tree_gru.leaf", [&](Block& blk) {
      const uint32_t word = blk.index("word"), label = blk.index("label");
      const Expr hh = tree_gru_leaf(blk.body(), w_, blk.lookup(E_, word));
      blk.output("h", hh);
      output_node_loss(blk, W_out_, hh, label);
    });
    inner_block_ = make_block(pc_, "tree_gru.inner", [&](Block& blk) {
      const Expr h1 = blk.input("h1", h), h2 = blk.input("h2", h);
      const uint32_t label = blk.index("label");
      const Expr hh = tree_gru_inner(blk.body(), w_, h1, h2);
      blk.output("h", hh);
      output_node_loss(blk, W_out_, hh, label);
    });
  }

  const std::vector<Tree>& trees_;
  LookupParameter E_;
  TreeGruWeights w_;
  Parameter W_out_;
  std::unique_ptr<Block> leaf_block_, inner_block_;  // made on the first block build
  std::vector<Expr> h_, losses_;
};

}  // namespace

Expr tree_gru_leaf(Graph& g, const TreeGruWeights& w, const Expr& e) {
  const Expr r = sigmoid(affine({parameter(g, w.b_r), parameter(g, w.U_r), e}));
  const Expr z = sigmoid(affine({parameter(g, w.b_z), parameter(g, w.U_z), e}));
  const Expr c = tanh(affine({parameter(g, w.b_c), parameter(g, w.U_c), cmult(r, e)}));
  return sum({cmult(z, e), cmult(1.0f - z, c)});
}

Expr tree_gru_inner(Graph& g, const TreeGruWeights& w, const Expr& h1, const Expr& h2) {
  std::vector<Expr> terms;
  const Expr hk[2] = {h1, h2};
  for (int k = 0; k < 2; ++k) {
    const Expr r = sigmoid(affine({parameter(g, w.b_r), parameter(g, w.U_rk[k]), hk[k]}));
    const Expr z = sigmoid(affine({parameter(g, w.b_z), parameter(g, w.U_zk[k]), hk[k]}));
    const Expr c = tanh(affine({parameter(g, w.b_c), parameter(g, w.U_ck[k]), cmult(r, hk[k])}));
    terms.push_back(cmult(z, hk[k]));
    terms.push_back(cmult(1.0f - z, c));
  }
  return sum(terms) * 0.5f;
}

std::unique_ptr<Model> make_tree_gru(ParameterCollection& pc, const Dataset& data,
                                     const ModelOptions& o) {
  return std::make_unique<TreeGru>(pc, data, o);
}

}  // namespace edbatch::zoo
