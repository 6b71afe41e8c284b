#include "edbatch/params.h"

#include <cmath>
#include <random>
#include <stdexcept>

namespace edbatch {

namespace {
// FNV-1a of the name mixed with the seed: a parameter's initial values depend on its name only.
uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

uint32_t ParameterCollection::add(const std::string& name, Dim dim, bool lookup, float scale) {
  if (name.empty()) throw std::invalid_argument("[add_parameters] empty parameter name");
  if (by_name_.count(name))
    throw std::invalid_argument("[add_parameters] parameter '" + name + "' already exists");
  if (dim.rows == 0 || dim.cols == 0)
    throw std::invalid_argument("[add_parameters] parameter '" + name + "' has empty shape " +
                                to_string(dim));
  Entry e;
  e.name = name;
  e.dim = dim;
  e.lookup = lookup;
  e.values.resize(dim.size());
  e.grads.assign(dim.size(), 0.0f);
  if (lookup) e.touched_flag.assign(dim.cols, 0);
  if (scale <= 0) {
    // Glorot uniform; a lookup table's fan is its embedding size.
    float fan = lookup ? static_cast<float>(dim.rows) : static_cast<float>(dim.rows + dim.cols);
    scale = std::sqrt(6.0f / fan);
  }
  std::mt19937_64 rng(name_seed(seed_, name));
  std::uniform_real_distribution<float> u(-scale, scale);
  for (float& v : e.values) v = u(rng);
  uint32_t id = static_cast<uint32_t>(entries_.size());
  entries_.push_back(std::move(e));
  by_name_[name] = id;
  return id;
}

Parameter ParameterCollection::add_parameters(const std::string& name, Dim dim, float init_scale) {
  return Parameter{add(name, dim, false, init_scale)};
}

LookupParameter ParameterCollection::add_lookup_parameters(const std::string& name, uint32_t vocab,
                                                           uint32_t dim) {
  return LookupParameter{add(name, Dim{dim, vocab}, true, 0.0f)};
}

const ParameterCollection::Entry& ParameterCollection::entry(uint32_t id) const {
  if (id >= entries_.size())
    throw std::invalid_argument("[ParameterCollection] no parameter with id " +
                                std::to_string(id) + " (collection has " +
                                std::to_string(entries_.size()) + ")");
  return entries_[id];
}

const std::string& ParameterCollection::name(uint32_t id) const { return entry(id).name; }
Dim ParameterCollection::dim(uint32_t id) const { return entry(id).dim; }
bool ParameterCollection::is_lookup(uint32_t id) const { return entry(id).lookup; }
uint32_t ParameterCollection::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? UINT32_MAX : it->second;
}
float* ParameterCollection::values(uint32_t id) {
  return const_cast<float*>(entry(id).values.data());
}
const float* ParameterCollection::values(uint32_t id) const { return entry(id).values.data(); }
float* ParameterCollection::grads(uint32_t id) { return const_cast<float*>(entry(id).grads.data()); }
const float* ParameterCollection::grads(uint32_t id) const { return entry(id).grads.data(); }

void ParameterCollection::mark_lookup_row(uint32_t id, uint32_t row) {
  Entry& e = entries_[id];
  if (!e.touched_flag[row]) {
    e.touched_flag[row] = 1;
    e.touched.push_back(row);
  }
}

void ParameterCollection::sgd_update(float lr) {
  for (Entry& e : entries_) {
    if (e.lookup) {
      const uint32_t d = e.dim.rows;
      for (uint32_t row : e.touched)
        for (uint32_t i = 0; i < d; ++i) e.values[row * d + i] -= lr * e.grads[row * d + i];
    } else {
      for (size_t i = 0; i < e.values.size(); ++i) e.values[i] -= lr * e.grads[i];
    }
  }
  zero_grads();
}

void ParameterCollection::zero_grads() {
  for (Entry& e : entries_) {
    if (e.lookup) {
      const uint32_t d = e.dim.rows;
      for (uint32_t row : e.touched) {
        std::fill(e.grads.begin() + row * d, e.grads.begin() + (row + 1) * d, 0.0f);
        e.touched_flag[row] = 0;
      }
      e.touched.clear();
    } else {
      std::fill(e.grads.begin(), e.grads.end(), 0.0f);
    }
  }
}

double ParameterCollection::grad_squared_norm() const {
  double s = 0;
  for (const Entry& e : entries_)
    for (float g : e.grads) s += static_cast<double>(g) * g;
  return s;
}

}  // namespace edbatch
