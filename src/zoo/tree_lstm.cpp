// Binary Tree-LSTMs: the cells, the standalone TreeLstmOps, and the `tree_lstm` and
// `double_typed_tree_lstm` models.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch {

CellState tree_lstm_leaf(Graph& g, const TreeLstmLeafWeights& w, uint32_t word) {
  return zoo::tree_lstm_leaf_cell(g, w, lookup(g, w.E, word));
}

CellState zoo::tree_lstm_leaf_cell(Graph& g, const TreeLstmLeafWeights& w, const Expr& e) {
  const Expr i = sigmoid(affine({parameter(g, w.b_i), parameter(g, w.W_i), e}));
  const Expr o = sigmoid(affine({parameter(g, w.b_o), parameter(g, w.W_o), e}));
  const Expr u = tanh(affine({parameter(g, w.b_u), parameter(g, w.W_u), e}));
  const Expr c = cmult(i, u);
  return {cmult(o, tanh(c)), c};
}

CellState tree_lstm_inner(Graph& g, const TreeLstmInnerWeights& w, const CellState& left,
                          const CellState& right) {
  const Expr x = concat({left.h, right.h});
  const Expr i = sigmoid(affine({parameter(g, w.b_i), parameter(g, w.U_i), x}));
  const Expr o = sigmoid(affine({parameter(g, w.b_o), parameter(g, w.U_o), x}));
  const Expr u = tanh(affine({parameter(g, w.b_u), parameter(g, w.U_u), x}));
  const Expr bf = parameter(g, w.b_f);
  const Expr f1 = sigmoid(affine({bf, parameter(g, w.U_f1), left.h}));
  const Expr f2 = sigmoid(affine({bf, parameter(g, w.U_f2), right.h}));
  const Expr c = sum({cmult(i, u), cmult(f1, left.c), cmult(f2, right.c)});
  return {cmult(o, tanh(c)), c};
}

void check_tree(const Tree& tree, const char* fn) {
  if (tree.nodes.empty()) throw std::invalid_argument(fmt::format("[{}] empty tree", fn));
  for (size_t k = 0; k < tree.nodes.size(); ++k) {
    const TreeNode& t = tree.nodes[k];
    if (t.leaf()) continue;
    if (t.right < 0 || static_cast<size_t>(t.left) >= k || static_cast<size_t>(t.right) >= k)
      throw std::invalid_argument(fmt::format(
          "[{}] node {} has children that do not come before it", fn, k));
  }
}

namespace {

TreeLstmLeafWeights add_leaf_weights(ParameterCollection& pc, uint32_t vocab, uint32_t hidden) {
  const Dim hh{hidden, hidden}, h1{hidden, 1};
  TreeLstmLeafWeights w;
  w.E = pc.add_lookup_parameters("E", vocab, hidden);
  w.W_i = pc.add_parameters("W_i", hh);
  w.W_o = pc.add_parameters("W_o", hh);
  w.W_u = pc.add_parameters("W_u", hh);
  w.b_i = pc.add_parameters("b_i", h1);
  w.b_o = pc.add_parameters("b_o", h1);
  w.b_u = pc.add_parameters("b_u", h1);
  return w;
}

// An inner cell's weights named `prefix`U_i etc.; with `leaf` given, it shares the leaf's b_i,
// b_o, b_u (the Tree-LSTM of Tai et al.), else it has its own.
TreeLstmInnerWeights add_inner_weights(ParameterCollection& pc, uint32_t hidden,
                                       const std::string& prefix,
                                       const TreeLstmLeafWeights* leaf) {
  const Dim hh{hidden, hidden}, h2{hidden, 2 * hidden}, h1{hidden, 1};
  TreeLstmInnerWeights w;
  w.U_i = pc.add_parameters(prefix + "U_i", h2);
  w.U_o = pc.add_parameters(prefix + "U_o", h2);
  w.U_u = pc.add_parameters(prefix + "U_u", h2);
  w.U_f1 = pc.add_parameters(prefix + "U_f1", hh);
  w.U_f2 = pc.add_parameters(prefix + "U_f2", hh);
  if (leaf) {
    w.b_i = leaf->b_i;
    w.b_o = leaf->b_o;
    w.b_u = leaf->b_u;
  } else {
    w.b_i = pc.add_parameters(prefix + "b_i", h1);
    w.b_o = pc.add_parameters(prefix + "b_o", h1);
    w.b_u = pc.add_parameters(prefix + "b_u", h1);
  }
  w.b_f = pc.add_parameters(prefix + "b_f", h1);
  return w;
}

// The Tree-LSTM cells as blocks, each with its node's loss: a leaf (integers word, label) and one
// inner block per inner cell (inputs h1, c1, h2, c2; integer label); outputs h, c, loss, logits.
class TreeLstmBlocks {
 public:
  TreeLstmBlocks(ParameterCollection& pc, const std::string& model, uint32_t hidden,
                 const TreeLstmLeafWeights& leaf, const TreeLstmInnerWeights* inner,
                 uint32_t num_inner, Parameter W_out) {
    const Dim h{hidden, 1};
    leaf_ = zoo::make_block(pc, model + ".leaf", [&](Block& b) {
      const uint32_t word = b.index("word"), label = b.index("label");
      const CellState s = zoo::tree_lstm_leaf_cell(b.body(), leaf, b.lookup(leaf.E, word));
      b.output("h", s.h);
      b.output("c", s.c);
      zoo::output_node_loss(b, W_out, s.h, label);
    });
    for (uint32_t k = 0; k < num_inner; ++k) {
      const std::string name = num_inner == 1 ? ".inner" : ".cell" + std::to_string(k + 1);
      inner_.push_back(zoo::make_block(pc, model + name, [&](Block& b) {
        const CellState left{b.input("h1", h), b.input("c1", h)};
        const CellState right{b.input("h2", h), b.input("c2", h)};
        const uint32_t label = b.index("label");
        const CellState s = tree_lstm_inner(b.body(), inner[k], left, right);
        b.output("h", s.h);
        b.output("c", s.c);
        zoo::output_node_loss(b, W_out, s.h, label);
      }));
    }
  }

  // The tree's summed loss; inner node k uses inner cell cell_of(k).
  template <class CellOf>
  Expr build(zoo::Sink& s, const Tree& tree, std::vector<Expr>* logits, CellOf cell_of) {
    states_.resize(tree.nodes.size());
    losses_.clear();
    Expr out[4];
    for (uint32_t k = 0; k < tree.nodes.size(); ++k) {
      const TreeNode& t = tree.nodes[k];
      if (t.leaf()) {
        const uint32_t ints[2] = {t.word, t.label};
        s.call(*leaf_, nullptr, 0, ints, 2, out);
      } else {
        const Expr in[4] = {states_[t.left].h, states_[t.left].c, states_[t.right].h,
                            states_[t.right].c};
        const uint32_t label = t.label;
        s.call(*inner_[cell_of(k)], in, 4, &label, 1, out);
      }
      states_[k] = {out[0], out[1]};
      losses_.push_back(zoo::call_loss(out, 4, logits));
    }
    return s.sum_losses(losses_);
  }

 private:
  std::unique_ptr<Block> leaf_;
  std::vector<std::unique_ptr<Block>> inner_;
  std::vector<CellState> states_;
  std::vector<Expr> losses_;
};

}  // namespace

TreeLstmOps::TreeLstmOps(ParameterCollection& pc, uint32_t vocab, uint32_t hidden,
                         uint32_t classes)
    : hidden_(hidden) {
  leaf_ = add_leaf_weights(pc, vocab, hidden);
  inner_ = add_inner_weights(pc, hidden, "", &leaf_);
  W_out_ = pc.add_parameters("W_out", Dim{classes, hidden});
}

Expr TreeLstmOps::build(Graph& g, const Tree& tree, std::vector<Expr>* logits) const {
  check_tree(tree, "TreeLstmOps::build");
  states_.resize(tree.nodes.size());
  losses_.clear();
  const Expr W_out = parameter(g, W_out_);
  for (size_t k = 0; k < tree.nodes.size(); ++k) {
    const TreeNode& t = tree.nodes[k];
    states_[k] = t.leaf() ? tree_lstm_leaf(g, leaf_, t.word)
                          : tree_lstm_inner(g, inner_, states_[t.left], states_[t.right]);
    const Expr z = matmul(W_out, states_[k].h);
    if (logits) logits->push_back(z);
    losses_.push_back(pick_neg_log_softmax(z, t.label));
  }
  return sum_losses(losses_);
}

namespace zoo {

namespace {

constexpr uint32_t kSentimentClasses = 5;

std::vector<uint32_t> tree_labels(const Tree& tree) {
  std::vector<uint32_t> out;
  for (const TreeNode& t : tree.nodes) out.push_back(t.label);
  return out;
}

class TreeLstm : public Model {
 public:
  TreeLstm(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : Model("tree_lstm", pc, o), trees_(data.trees), ops_(pc, o.vocab, o.hidden) {}
  uint32_t size() const override { return static_cast<uint32_t>(trees_.size()); }
  uint32_t num_classes() const override { return kSentimentClasses; }
  std::vector<uint32_t> labels(uint32_t i) const override { return tree_labels(trees_.at(i)); }
  std::string math() const override {
    return "leaf:  e = E[w]; i = sigmoid(W_i e + b_i); o = sigmoid(W_o e + b_o); "
           "u = tanh(W_u e + b_u)\n"
           "       c = i.u; h = o.tanh(c)\n"
           "inner: x = [h1; h2]; i = sigmoid(U_i x + b_i); o = sigmoid(U_o x + b_o); "
           "u = tanh(U_u x + b_u)\n"
           "       f1 = sigmoid(U_f1 h1 + b_f); f2 = sigmoid(U_f2 h2 + b_f)\n"
           "       c = i.u + f1.c1 + f2.c2; h = o.tanh(c)\n"
           "loss:  sum over all nodes of -log softmax(W_out h)[label]";
  }

 protected:
  Expr build_ops(Graph& g, uint32_t i, std::vector<Expr>* logits) override {
    // Checked here too, so that a bad tree is named by model and instance; TreeLstmOps::build
    // checks again for its standalone callers (one pass over the nodes).
    return ops_.build(g, checked_tree(trees_, i), logits);
  }
  Expr build_blocks(zoo::Sink& s, uint32_t i, std::vector<Expr>* logits) override {
    const Tree& tree = checked_tree(trees_, i);
    if (!blocks_) {
      // TreeLstmOps keeps its weights to itself; the blocks find the same ones by name.
      auto P = [this](const char* n) { return Parameter{pc_.find(n)}; };
      TreeLstmLeafWeights leaf;
      leaf.E = LookupParameter{pc_.find("E")};
      leaf.W_i = P("W_i");
      leaf.W_o = P("W_o");
      leaf.W_u = P("W_u");
      leaf.b_i = P("b_i");
      leaf.b_o = P("b_o");
      leaf.b_u = P("b_u");
      const TreeLstmInnerWeights inner{P("U_i"), P("U_o"), P("U_u"), P("U_f1"), P("U_f2"),
                                       leaf.b_i, leaf.b_o, leaf.b_u, P("b_f")};
      blocks_ = std::make_unique<TreeLstmBlocks>(pc_, name(), options_.hidden, leaf, &inner, 1,
                                                 P("W_out"));
    }
    return blocks_->build(s, tree, logits, [](uint32_t) { return 0u; });
  }

 private:
  const std::vector<Tree>& trees_;
  TreeLstmOps ops_;
  std::unique_ptr<TreeLstmBlocks> blocks_;  // made on the first block build
};

// Each inner node uses one of two inner cells, chosen by a coin seeded by (seed, instance, node).
class DoubleTypedTreeLstm : public Model {
 public:
  DoubleTypedTreeLstm(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : Model("double_typed_tree_lstm", pc, o), trees_(data.trees) {
    leaf_ = add_leaf_weights(pc, o.vocab, o.hidden);
    cells_[0] = add_inner_weights(pc, o.hidden, "cell1.", nullptr);
    cells_[1] = add_inner_weights(pc, o.hidden, "cell2.", nullptr);
    W_out_ = pc.add_parameters("W_out", Dim{kSentimentClasses, o.hidden});
  }
  uint32_t size() const override { return static_cast<uint32_t>(trees_.size()); }
  uint32_t num_classes() const override { return kSentimentClasses; }
  std::vector<uint32_t> labels(uint32_t i) const override { return tree_labels(trees_.at(i)); }
  std::string math() const override {
    return "leaf:  as tree_lstm (E, W_i, W_o, W_u, b_i, b_o, b_u)\n"
           "inner: as tree_lstm with cell t's weights cellt.U_*, cellt.b_* (t = 1, 2), where\n"
           "       t = 1 + (splitmix64(seed, instance, node) & 1): a seeded coin per node\n"
           "loss:  sum over all nodes of -log softmax(W_out h)[label]";
  }
  // The cell (0 or 1) of inner node `node` of instance `instance`.
  uint32_t cell_of(uint32_t instance, uint32_t node) const {
    return static_cast<uint32_t>(
        mix64(mix64(options_.seed ^ (uint64_t(instance) << 32)) ^ node) & 1u);
  }

 protected:
  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const Tree& tree = checked_tree(trees_, instance);
    states_.resize(tree.nodes.size());
    losses_.clear();
    for (uint32_t k = 0; k < tree.nodes.size(); ++k) {
      const TreeNode& t = tree.nodes[k];
      states_[k] = t.leaf() ? tree_lstm_leaf(g, leaf_, t.word)
                            : tree_lstm_inner(g, cells_[cell_of(instance, k)], states_[t.left],
                                              states_[t.right]);
      losses_.push_back(node_loss(g, W_out_, states_[k].h, t.label, logits));
    }
    return sum_losses(losses_);
  }
  Expr build_blocks(zoo::Sink& s, uint32_t instance, std::vector<Expr>* logits) override {
    const Tree& tree = checked_tree(trees_, instance);
    if (!blocks_)
      blocks_ =
          std::make_unique<TreeLstmBlocks>(pc_, name(), options_.hidden, leaf_, cells_, 2, W_out_);
    return blocks_->build(s, tree, logits, [&](uint32_t node) { return cell_of(instance, node); });
  }

 private:
  const std::vector<Tree>& trees_;
  TreeLstmLeafWeights leaf_;
  TreeLstmInnerWeights cells_[2];
  Parameter W_out_;
  std::unique_ptr<TreeLstmBlocks> blocks_;  // made on the first block build
  std::vector<CellState> states_;
  std::vector<Expr> losses_;
};

}  // namespace

std::unique_ptr<Model> make_tree_lstm(ParameterCollection& pc, const Dataset& data,
                                      const ModelOptions& o) {
  return std::make_unique<TreeLstm>(pc, data, o);
}

std::unique_ptr<Model> make_double_typed_tree_lstm(ParameterCollection& pc, const Dataset& data,
                                                   const ModelOptions& o) {
  return std::make_unique<DoubleTypedTreeLstm>(pc, data, o);
}

}  // namespace zoo
}  // namespace edbatch
