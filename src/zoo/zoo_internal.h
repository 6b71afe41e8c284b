// Internal to the model zoo: one factory per model family, and helpers the families share.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/models.h"
#include "edbatch/zoo.h"

namespace edbatch::zoo {

std::unique_ptr<Model> make_tree_lstm(ParameterCollection& pc, const Dataset& data,
                                      const ModelOptions& o);
std::unique_ptr<Model> make_double_typed_tree_lstm(ParameterCollection& pc, const Dataset& data,
                                                   const ModelOptions& o);
std::unique_ptr<Model> make_tree_gru(ParameterCollection& pc, const Dataset& data,
                                     const ModelOptions& o);
std::unique_ptr<Model> make_mvrnn(ParameterCollection& pc, const Dataset& data,
                                  const ModelOptions& o);
std::unique_ptr<Model> make_lattice_lstm(ParameterCollection& pc, const Dataset& data,
                                         const ModelOptions& o);
std::unique_ptr<Model> make_lattice_gru(ParameterCollection& pc, const Dataset& data,
                                        const ModelOptions& o);
std::unique_ptr<Model> make_bilstm_tagger(ParameterCollection& pc, const Dataset& data,
                                          const ModelOptions& o);
std::unique_ptr<Model> make_lstm_nmt(ParameterCollection& pc, const Dataset& data,
                                     const ModelOptions& o);
std::unique_ptr<Model> make_random_dag(ParameterCollection& pc, const Dataset& data,
                                       const ModelOptions& o);

// A deterministic 64-bit mix (splitmix64) for seeded per-node coins and derived ids.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---- The cells ----
// Each cell's math, defined once over a Graph and its weights: the instance graph (the op path),
// a block body (the block path), or the PyTorch adapter's blocks (src/torch/cell_models.cpp),
// where an input x stands for the embedding the zoo looks up. Every call adds its own parameter
// nodes. The callers add the weights, under their own names and shapes.

// The Tree-LSTM leaf from its embedding e (tree_lstm_leaf looks e up, then calls this). The inner
// cell is tree_lstm_inner (models.h).
CellState tree_lstm_leaf_cell(Graph& g, const TreeLstmLeafWeights& w, const Expr& e);

// Tree-GRU (tree_gru.cpp): the leaf's U_r, U_z, U_c; the inner cell's per child k U_rk, U_zk,
// U_ck; biases shared by both.
struct TreeGruWeights {
  Parameter U_r, U_z, U_c;
  Parameter U_rk[2], U_zk[2], U_ck[2];
  Parameter b_r, b_z, b_c;
};
// r = sigmoid(U_r e + b_r); z = sigmoid(U_z e + b_z); c = tanh(U_c (r.e) + b_c); z.e + (1-z).c
Expr tree_gru_leaf(Graph& g, const TreeGruWeights& w, const Expr& e);
// Per child k: the leaf's update with U_rk, U_zk, U_ck on h_k; the two averaged.
Expr tree_gru_inner(Graph& g, const TreeGruWeights& w, const Expr& h1, const Expr& h2);

// MV-RNN (mvrnn.cpp).
struct MvrnnWeights {
  Parameter W_v, b_v, W_M, b_M;
};
// v = tanh(W_v [M2 v1; M1 v2] + b_v)
Expr mvrnn_v(Graph& g, const MvrnnWeights& w, const Expr& v1, const Expr& M1, const Expr& v2,
             const Expr& M2);
// M = W_M [M1; M2] + b_M
Expr mvrnn_M(Graph& g, const MvrnnWeights& w, const Expr& M1, const Expr& M2);

// Lattice arc cells (lattice.cpp), per arc type t (0 char, 1 word) and gate; h0 (and c0) is the
// learned state of a node without arcs.
struct LatticeLstmWeights {
  Parameter U[2][4], W[2][4], b[2][4];  // gates f, c, i, o; U on x, W on h
  Parameter h0, c0;
};
struct LatticeGruWeights {
  Parameter U[2][3], W[2][3], b[2][3];  // gates r, z, c; U on h, W on x
  Parameter h0;
};
// The arc cell of type t from state `from` with input x: the new (h, c) of the arc.
CellState lattice_lstm_arc(Graph& g, const LatticeLstmWeights& w, int t, const CellState& from,
                           const Expr& x);
// As lattice_lstm_arc, without c (the result's c is empty).
CellState lattice_gru_arc(Graph& g, const LatticeGruWeights& w, int t, const CellState& from,
                          const Expr& x);

// Random-DAG state cell (random_dag.cpp): A<a> per arc type, W<t> and b<t> per state type, s0
// the arc sum of a state without arcs.
struct RandomDagWeights {
  std::vector<Parameter> A, W, b;
  Parameter s0;
};
// h = tanh(W<t> [s; x] + b<t>)
Expr random_dag_state(Graph& g, const RandomDagWeights& w, uint32_t t, const Expr& s,
                      const Expr& x);

// A standard LSTM layer (bilstm_tagger.cpp): gates i, f, o and candidate g from
// W_* x + U_* h_prev + b_*, the weights named prefix + "W_i" etc.
struct LstmWeights {
  Parameter W[4], U[4], b[4];  // i, f, o, g
};
LstmWeights add_lstm(ParameterCollection& pc, const std::string& prefix, uint32_t in,
                     uint32_t hidden);
// One step; the first step of a sequence (prev == nullptr) starts from h = c = 0, so its
// recurrent terms and forget gate are left out.
CellState lstm_step(Graph& g, const LstmWeights& w, const Expr& x, const CellState* prev);

// ---- Blocks ----

// Where a model's block build puts its nodes: straight into the graph through Block::call and the
// Expr builders (per node), or into a PackedGraph that Model::build appends in bulk. The two give
// the same graph node for node (tests/test_packed.cpp).
class Sink {
 public:
  Sink(Graph& g, PackedGraph* run) : g_(g), run_(run) {}
  Graph& graph() const { return g_; }
  void call(const Block& b, const Expr* in, uint32_t nin, const uint32_t* ints, uint32_t nints,
            Expr* out) {
    if (run_)
      run_->call(b, in, nin, ints, nints, out);
    else
      b.call(g_, in, nin, ints, nints, out);
  }
  Expr sum(const std::vector<Expr>& xs) { return reduce(PackedGraph::Reduce::Sum, xs); }
  Expr average(const std::vector<Expr>& xs) { return reduce(PackedGraph::Reduce::Average, xs); }
  Expr sum_losses(const std::vector<Expr>& xs) {
    return reduce(PackedGraph::Reduce::SumLosses, xs);
  }
  Expr lookup(LookupParameter table, uint32_t index) {
    return run_ ? run_->expr(run_->lookup(table, index)) : edbatch::lookup(g_, table, index);
  }
  Expr reshape(const Expr& x, Dim dim) {
    return run_ ? run_->expr(run_->reshape(x.id, dim)) : edbatch::reshape(x, dim);
  }

 private:
  Expr reduce(PackedGraph::Reduce r, const std::vector<Expr>& xs) {
    if (run_) return run_->reduce(r, xs);
    switch (r) {
      case PackedGraph::Reduce::Average:
        return edbatch::average(xs);
      case PackedGraph::Reduce::Maximum:
        return edbatch::maximum(xs);
      case PackedGraph::Reduce::SumLosses:
        return edbatch::sum_losses(xs);
      default:
        return edbatch::sum(xs);
    }
  }

  Graph& g_;
  PackedGraph* run_;
};

// A block named `name`, its body declared by `declare`, then frozen.
template <class Declare>
std::unique_ptr<Block> make_block(ParameterCollection& pc, const std::string& name,
                                  Declare declare) {
  auto blk = std::make_unique<Block>(pc, name);
  declare(*blk);
  blk->freeze();
  return blk;
}

// Declares the node loss in a block body as its next two outputs (the last ones by convention):
// "loss", the -log softmax(W_out h)[label] of Model::node_loss with the label in integer slot
// `label`, and "logits", W_out h.
void output_node_loss(Block& blk, Parameter W_out, const Expr& h, uint32_t label);

// The block path's node_loss: the call's "loss" and "logits" outputs (the last two of `out`);
// records the logits when asked and returns the loss.
inline Expr call_loss(const Expr* out, uint32_t num_outputs, std::vector<Expr>* logits) {
  if (logits) logits->push_back(out[num_outputs - 1]);
  return out[num_outputs - 2];
}

}  // namespace edbatch::zoo
