#include "tests/models.h"

#include <string>

namespace edbatch::testing {

Tree random_tree(std::mt19937_64& rng, uint32_t leaves, uint32_t vocab) {
  // Build bottom-up by merging random adjacent subtrees, emitting nodes in post-order.
  Tree t;
  std::vector<int32_t> frontier;
  for (uint32_t i = 0; i < leaves; ++i) {
    TreeNode leaf;
    leaf.word = static_cast<uint32_t>(rng() % vocab);
    leaf.label = static_cast<uint8_t>(rng() % 5);
    frontier.push_back(static_cast<int32_t>(t.nodes.size()));
    t.nodes.push_back(leaf);
  }
  while (frontier.size() > 1) {
    const size_t k = rng() % (frontier.size() - 1);
    TreeNode inner;
    inner.left = frontier[k];
    inner.right = frontier[k + 1];
    inner.label = static_cast<uint8_t>(rng() % 5);
    frontier[k] = static_cast<int32_t>(t.nodes.size());
    frontier.erase(frontier.begin() + static_cast<long>(k) + 1);
    t.nodes.push_back(inner);
  }
  return t;
}

Expr random_tree_losses(Graph& g, const TreeLstmOps& m, std::mt19937_64& rng, uint32_t count,
                        uint32_t max_leaves) {
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < count; ++i)
    losses.push_back(m.build(g, random_tree(rng, 1 + static_cast<uint32_t>(rng() % max_leaves), 11)));
  return sum_losses(losses);
}

TestModels::TestModels(ParameterCollection& p, uint32_t h, uint32_t v)
    : pc(p), hidden(h), vocab(v) {
  const Dim hh{h, h}, h1{h, 1};
  E = pc.add_lookup_parameters("t_E", v, h);
  h0 = pc.add_parameters("t_h0", h1);
  for (int t = 0; t < 2; ++t) {
    const std::string s = std::to_string(t);
    arc_U[t] = pc.add_parameters("t_arc_U" + s, hh);
    arc_W[t] = pc.add_parameters("t_arc_W" + s, hh);
    arc_b[t] = pc.add_parameters("t_arc_b" + s, h1);
  }
  chain_W = pc.add_parameters("t_chain_W", hh);
  chain_U = pc.add_parameters("t_chain_U", hh);
  chain_b = pc.add_parameters("t_chain_b", h1);
  chain_z = pc.add_parameters("t_chain_z", Dim{h, 2 * h});
  for (int t = 0; t < 3; ++t) {
    const std::string s = std::to_string(t);
    dag_W[t] = pc.add_parameters("t_dag_W" + s, hh);
    dag_V[t] = pc.add_parameters("t_dag_V" + s, hh);
    dag_b[t] = pc.add_parameters("t_dag_b" + s, h1);
  }
  out_W = pc.add_parameters("t_out_W", Dim{5, h});
  out_b = pc.add_parameters("t_out_b", Dim{5, 1});
  mat_W = pc.add_parameters("t_mat_W", Dim{h, h});
  rnn_W = pc.add_parameters("t_rnn_W", hh);
  rnn_U1 = pc.add_parameters("t_rnn_U1", hh);
  rnn_U2 = pc.add_parameters("t_rnn_U2", hh);
  rnn_b = pc.add_parameters("t_rnn_b", h1);
}

namespace {
Expr node_loss(Graph& g, const TestModels& m, const Expr& h, std::mt19937_64& rng) {
  return pick_neg_log_softmax(affine({parameter(g, m.out_b), parameter(g, m.out_W), h}),
                              static_cast<uint32_t>(rng() % 5));
}
}  // namespace

Expr TestModels::tree_rnn(Graph& g, const Tree& tree) const {
  std::vector<Expr> h(tree.nodes.size()), losses;
  for (size_t k = 0; k < tree.nodes.size(); ++k) {
    const TreeNode& n = tree.nodes[k];
    if (n.leaf())
      h[k] = tanh(affine({parameter(g, rnn_b), parameter(g, rnn_W), lookup(g, E, n.word)}));
    else
      h[k] = tanh(affine({parameter(g, rnn_b), parameter(g, rnn_U1), h[n.left],
                          parameter(g, rnn_U2), h[n.right]}));
    losses.push_back(pick_neg_log_softmax(
        affine({parameter(g, out_b), parameter(g, out_W), h[k]}), n.label));
  }
  return sum_losses(losses);
}

Expr TestModels::lattice(Graph& g, std::mt19937_64& rng, uint32_t nodes) const {
  std::vector<Expr> h(nodes), losses;
  for (uint32_t k = 0; k < nodes; ++k) {
    std::vector<Expr> arcs;
    if (k > 0 && rng() % 8 != 0) {  // a few nodes have no char arc
      const Expr x = lookup(g, E, static_cast<uint32_t>(rng() % vocab));
      arcs.push_back(tanh(affine({parameter(g, arc_b[0]), parameter(g, arc_U[0]), x,
                                  parameter(g, arc_W[0]), h[k - 1]})));
    }
    const uint32_t words = k >= 2 ? static_cast<uint32_t>(rng() % 3) : 0;
    for (uint32_t w = 0; w < words; ++w) {
      const uint32_t from = k - 2 - static_cast<uint32_t>(rng() % std::min<uint32_t>(k - 1, 3));
      const Expr x = lookup(g, E, static_cast<uint32_t>(rng() % vocab));
      arcs.push_back(sigmoid(affine({parameter(g, arc_b[1]), parameter(g, arc_U[1]), x,
                                     parameter(g, arc_W[1]), h[from]})));
    }
    h[k] = arcs.empty() ? parameter(g, h0) : sum(arcs);
    if (!arcs.empty()) losses.push_back(node_loss(g, *this, h[k], rng));
  }
  if (losses.empty()) losses.push_back(node_loss(g, *this, tanh(h[0]), rng));
  return sum_losses(losses);
}

Expr TestModels::chain(Graph& g, std::mt19937_64& rng, uint32_t length) const {
  Expr h = parameter(g, h0);
  std::vector<Expr> losses;
  for (uint32_t t = 0; t < length; ++t) {
    const Expr x = lookup(g, E, static_cast<uint32_t>(rng() % vocab));
    const Expr cand = tanh(affine({parameter(g, chain_b), parameter(g, chain_W), x,
                                   parameter(g, chain_U), h}));
    const Expr z = sigmoid(matmul(parameter(g, chain_z), concat({x, h})));
    h = cmult(z, h) + cmult(1.0f - z, cand);
    losses.push_back(node_loss(g, *this, h, rng));
  }
  return sum_losses(losses);
}

Expr TestModels::dag(Graph& g, std::mt19937_64& rng, uint32_t nodes) const {
  std::vector<Expr> state(nodes), losses;
  for (uint32_t k = 0; k < nodes; ++k) {
    const uint32_t t = static_cast<uint32_t>(rng() % 3);
    const Expr x = lookup(g, E, static_cast<uint32_t>(rng() % vocab));
    Expr in;
    if (k == 0) {
      in = parameter(g, h0);
    } else {
      const uint32_t deg = 1 + static_cast<uint32_t>(rng() % std::min<uint32_t>(k, 4));
      std::vector<Expr> preds;
      for (uint32_t d = 0; d < deg; ++d) preds.push_back(state[rng() % k]);
      in = sum(preds);
    }
    Expr s = tanh(affine({parameter(g, dag_b[t]), parameter(g, dag_W[t]), in,
                          parameter(g, dag_V[t]), x}));
    if (rng() % 4 == 0) {
      // A per-node matrix (an input) times the state: per-node GEMMs in one batch.
      std::vector<float> mv(hidden * hidden);
      for (float& v : mv) v = static_cast<float>(static_cast<int>(rng() % 17) - 8) / 16.0f;
      const Expr m = input(g, Dim{hidden, hidden}, mv);
      s = relu(matmul(m, s) - 0.1f * s) + s * 0.5f;
    }
    state[k] = s;
    if (rng() % 2 == 0) losses.push_back(node_loss(g, *this, s, rng));
  }
  if (losses.empty()) losses.push_back(node_loss(g, *this, state.back(), rng));
  return sum_losses(losses);
}

}  // namespace edbatch::testing
