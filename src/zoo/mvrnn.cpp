// The matrix-vector RNN (`mvrnn`, Socher et al. 2012): every node has a vector v and a matrix M;
// a child's vector is transformed by its sibling's matrix.
//
// Word matrices: EM's columns hold H*H values, read as an H x H matrix through a reshape view (free
// in the memory plan). Each word's matrix starts at the identity plus the usual noise.
#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::zoo {

namespace {

class Mvrnn : public Model {
 public:
  Mvrnn(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : Model("mvrnn", pc, o), trees_(data.trees) {
    const uint32_t H = o.hidden;
    Ev_ = pc.add_lookup_parameters("Ev", o.vocab, H);
    EM_ = pc.add_lookup_parameters("EM", o.vocab, H * H);
    float* em = pc.values(EM_.id);
    for (uint32_t w = 0; w < o.vocab; ++w)
      for (uint32_t i = 0; i < H; ++i) em[static_cast<size_t>(w) * H * H + i * H + i] += 1.0f;
    w_.W_v = pc.add_parameters("W_v", Dim{H, 2 * H});
    w_.b_v = pc.add_parameters("b_v", Dim{H, 1});
    w_.W_M = pc.add_parameters("W_M", Dim{H, 2 * H});
    w_.b_M = pc.add_parameters("b_M", Dim{H, H});
    W_out_ = pc.add_parameters("W_out", Dim{5, H});
  }
  uint32_t size() const override { return static_cast<uint32_t>(trees_.size()); }
  uint32_t num_classes() const override { return 5; }
  std::vector<uint32_t> labels(uint32_t i) const override {
    const Tree& tree = trees_.at(i);
    std::vector<uint32_t> out;
    for (const TreeNode& t : tree.nodes)
      if (!t.leaf()) out.push_back(t.label);
    if (out.empty()) out.push_back(tree.nodes.back().label);
    return out;
  }
  std::string math() const override {
    return "leaf:  v = Ev[w]; M = EM[w]   (H x H, a word's own matrix)\n"
           "inner: v = tanh(W_v [M2 v1; M1 v2] + b_v); M = W_M [M1; M2] + b_M\n"
           "loss:  sum over inner nodes (the root of a one-word tree) of "
           "-log softmax(W_out v)[label]";
  }

 protected:
  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const Tree& tree = checked_tree(trees_, instance);
    v_.resize(tree.nodes.size());
    M_.resize(tree.nodes.size());
    losses_.clear();
    Sink sink(g, nullptr);  // word_matrix, node by node
    for (size_t k = 0; k < tree.nodes.size(); ++k) {
      const TreeNode& t = tree.nodes[k];
      if (t.leaf()) {
        v_[k] = lookup(g, Ev_, t.word);
        M_[k] = word_matrix(sink, t.word);
        if (tree.nodes.size() > 1) continue;
      } else {
        const Expr v1 = v_[t.left], v2 = v_[t.right], M1 = M_[t.left], M2 = M_[t.right];
        v_[k] = mvrnn_v(g, w_, v1, M1, v2, M2);
        // The root's matrix would feed nothing.
        if (k + 1 < tree.nodes.size()) M_[k] = mvrnn_M(g, w_, M1, M2);
      }
      losses_.push_back(node_loss(g, W_out_, v_[k], t.label, logits));
    }
    return sum_losses(losses_);
  }

  // Blocks: inner (inputs v1, M1, v2, M2; integer label; outputs v, M, loss, logits), root (as
  // inner without M), and the loss of a one-word tree's leaf (input v; integer label). Leaves are
  // two lookups, the second reshaped (a view), so they need no cell.
  Expr build_blocks(Sink& s, uint32_t instance, std::vector<Expr>* logits) override {
    const Tree& tree = checked_tree(trees_, instance);
    if (!inner_block_) make_blocks();
    v_.resize(tree.nodes.size());
    M_.resize(tree.nodes.size());
    losses_.clear();
    Expr out[4];
    for (size_t k = 0; k < tree.nodes.size(); ++k) {
      const TreeNode& t = tree.nodes[k];
      const uint32_t label = t.label;
      if (t.leaf()) {
        v_[k] = s.lookup(Ev_, t.word);
        M_[k] = word_matrix(s, t.word);
        if (tree.nodes.size() > 1) continue;
        s.call(*loss_block_, &v_[k], 1, &label, 1, out);
        losses_.push_back(call_loss(out, 2, logits));
        continue;
      }
      const Expr in[4] = {v_[t.left], M_[t.left], v_[t.right], M_[t.right]};
      if (k + 1 < tree.nodes.size()) {
        s.call(*inner_block_, in, 4, &label, 1, out);
        v_[k] = out[0];
        M_[k] = out[1];
        losses_.push_back(call_loss(out, 4, logits));
      } else {
        s.call(*root_block_, in, 4, &label, 1, out);
        losses_.push_back(call_loss(out, 2, logits));
      }
    }
    return s.sum_losses(losses_);
  }

 private:
  // A leaf's matrix.
  Expr word_matrix(Sink& s, uint32_t word) const {
    const uint32_t H = options_.hidden;
    return s.reshape(s.lookup(EM_, word), Dim{H, H});
  }

  void make_blocks() {
    const uint32_t H = options_.hidden;
    const Dim h{H, 1}, hh{H, H};
    for (bool root : {false, true}) {
      (root ? root_block_ : inner_block_) =
          make_block(pc_, root ? "mvrnn.root" : "mvrnn.inner", [&](Block& blk) {
            const Expr v1 = blk.input("v1", h), M1 = blk.input("M1", hh);
            const Expr v2 = blk.input("v2", h), M2 = blk.input("M2", hh);
            const uint32_t label = blk.index("label");
            const Expr v = mvrnn_v(blk.body(), w_, v1, M1, v2, M2);
            if (!root) {
              blk.output("v", v);
              blk.output("M", mvrnn_M(blk.body(), w_, M1, M2));
            }
            output_node_loss(blk, W_out_, v, label);
          });
    }
    loss_block_ = make_block(pc_, "mvrnn.loss", [&](Block& blk) {
      const Expr v = blk.input("v", h);
      output_node_loss(blk, W_out_, v, blk.index("label"));
    });
  }

  const std::vector<Tree>& trees_;
  LookupParameter Ev_, EM_;
  MvrnnWeights w_;
  Parameter W_out_;
  // Made on the first block build.
  std::unique_ptr<Block> inner_block_, root_block_, loss_block_;
  std::vector<Expr> v_, M_, losses_;
};

}  // namespace

Expr mvrnn_v(Graph& g, const MvrnnWeights& w, const Expr& v1, const Expr& M1, const Expr& v2,
             const Expr& M2) {
  return tanh(
      affine({parameter(g, w.b_v), parameter(g, w.W_v), concat({matmul(M2, v1), matmul(M1, v2)})}));
}

Expr mvrnn_M(Graph& g, const MvrnnWeights& w, const Expr& M1, const Expr& M2) {
  return affine({parameter(g, w.b_M), parameter(g, w.W_M), concat({M1, M2})});
}

std::unique_ptr<Model> make_mvrnn(ParameterCollection& pc, const Dataset& data,
                                  const ModelOptions& o) {
  return std::make_unique<Mvrnn>(pc, data, o);
}

}  // namespace edbatch::zoo
