// Seeded random structures and small op-level models over them, for invariance tests.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "edbatch/data.h"
#include "edbatch/graph.h"
#include "edbatch/zoo.h"

namespace edbatch::testing {

// A random binary tree with `leaves` leaves (post-order), random words and labels.
Tree random_tree(std::mt19937_64& rng, uint32_t leaves, uint32_t vocab);

// The summed losses of `count` random trees of 1 to max_leaves leaves (vocabulary 11) under the
// op-level Tree-LSTM `m`.
Expr random_tree_losses(Graph& g, const TreeLstmOps& m, std::mt19937_64& rng, uint32_t count,
                        uint32_t max_leaves);

// Models over a shared collection. Each adds one instance to the graph and returns its loss.
struct TestModels {
  explicit TestModels(ParameterCollection& pc, uint32_t hidden = 7, uint32_t vocab = 11);
  // Tree RNN: h = tanh(W E[w] + b) at leaves, tanh(U1 h1 + U2 h2 + b) inside, a loss per node.
  // Its per-type chain levels are consistent, so the chain lower bound is attainable.
  Expr tree_rnn(Graph& g, const Tree& tree) const;
  // Lattice: node k sums an arc cell over its incoming arcs from earlier nodes (variable fan-in,
  // char arcs from k-1 and word arcs from further back); nodes without arcs take a learned h0.
  Expr lattice(Graph& g, std::mt19937_64& rng, uint32_t nodes) const;
  // Gated chain: h_t = z.h_{t-1} + (1-z).tanh(W x_t + U h_{t-1} + b).
  Expr chain(Graph& g, std::mt19937_64& rng, uint32_t length) const;
  // Random DAG: each state reads 1..4 earlier states; three state types with their own weights;
  // some states go through a per-node matrix product and relu.
  Expr dag(Graph& g, std::mt19937_64& rng, uint32_t nodes) const;

  ParameterCollection& pc;
  uint32_t hidden, vocab;
  LookupParameter E;
  Parameter h0, arc_U[2], arc_W[2], arc_b[2], chain_W, chain_U, chain_b, chain_z, dag_W[3],
      dag_V[3], dag_b[3], out_W, out_b, mat_W, rnn_W, rnn_U1, rnn_U2, rnn_b;
};

}  // namespace edbatch::testing
