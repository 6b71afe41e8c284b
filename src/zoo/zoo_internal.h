// Internal to the model zoo: one factory per model family, and helpers the families share.
#pragma once
#include <memory>
#include <string>

#include "edbatch/models.h"

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

// What every build_blocks throws until the block path of `model` is built.
[[noreturn]] void block_path_missing(const std::string& model);

// A deterministic 64-bit mix (splitmix64) for seeded per-node coins and derived ids.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Sums the per-node losses of one instance.
inline Expr instance_loss(const std::vector<Expr>& losses) { return sum_losses(losses); }

}  // namespace edbatch::zoo
