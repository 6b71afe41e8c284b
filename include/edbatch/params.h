// Named parameters and lookup tables, their gradients, and a plain SGD update.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "edbatch/dim.h"
#include "edbatch/types.h"

namespace edbatch {

// A handle into a ParameterCollection. Lookup tables are parameters of shape dim x vocab whose
// columns are the embeddings.
struct Parameter {
  uint32_t id = UINT32_MAX;
  bool valid() const { return id != UINT32_MAX; }
};
struct LookupParameter {
  uint32_t id = UINT32_MAX;
  bool valid() const { return id != UINT32_MAX; }
};

class ParameterCollection {
 public:
  explicit ParameterCollection(uint64_t seed = 1) : seed_(seed) {}

  // Uniform Glorot initialisation from the collection's seed and the parameter's name, so a
  // parameter's initial values do not depend on the order parameters were added.
  Parameter add_parameters(const std::string& name, Dim dim, float init_scale = 0.0f);
  LookupParameter add_lookup_parameters(const std::string& name, uint32_t vocab, uint32_t dim);

  uint32_t size() const { return static_cast<uint32_t>(entries_.size()); }
  const std::string& name(uint32_t id) const;
  Dim dim(uint32_t id) const;
  bool is_lookup(uint32_t id) const;
  uint32_t find(const std::string& name) const;  // UINT32_MAX when absent

  float* values(uint32_t id);
  const float* values(uint32_t id) const;
  float* grads(uint32_t id);
  const float* grads(uint32_t id) const;

  // Lookup gradients are sparse: backward marks the columns it touched.
  void mark_lookup_row(uint32_t id, uint32_t row);

  // values -= lr * grads, then zero the gradients (only touched columns of lookup tables).
  void sgd_update(float lr);
  void zero_grads();
  // Sum of squares of all gradients (for clipping and tests).
  double grad_squared_norm() const;

  // Batching types are interned per collection: their keys name this collection's parameters,
  // and their ids stay stable across the graphs built over it.
  TypeTable& types() { return types_; }
  const TypeTable& types() const { return types_; }

 private:
  struct Entry {
    std::string name;
    Dim dim;
    bool lookup = false;
    std::vector<float> values, grads;
    std::vector<uint32_t> touched;      // lookup columns with nonzero gradient
    std::vector<uint8_t> touched_flag;  // per column
  };
  const Entry& entry(uint32_t id) const;
  uint32_t add(const std::string& name, Dim dim, bool lookup, float scale);

  uint64_t seed_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, uint32_t> by_name_;
  TypeTable types_;
};

}  // namespace edbatch
