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
std::unique_ptr<Model> make_random_dag(ParameterCollection& pc, const Dataset& data,
                                       const ModelOptions& o);

// A deterministic 64-bit mix (splitmix64) for seeded per-node coins and derived ids.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The Tree-LSTM leaf from its embedding e (tree_lstm_leaf looks e up, then calls this).
CellState tree_lstm_leaf_cell(Graph& g, const TreeLstmLeafWeights& w, const Expr& e);

// ---- Blocks ----

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
