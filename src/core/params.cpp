#include "edbatch/params.h"

#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>

#include "src/core/huge_pages.h"

namespace edbatch {

namespace {
// FNV-1a of the name mixed with the seed: a parameter's initial values depend on its name only.
uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Reserves n floats, with huge pages where the buffer is large (src/core/huge_pages.h), before
// anything touches them.
void reserve_floats(std::vector<float>& v, size_t n) {
  v.reserve(n);
  advise_huge_pages(v.data(), n * sizeof(float));
}
}  // namespace

void ParameterCollection::fetch_from_device() const {
  if (!fetch_) return;
  std::function<void()> f = std::move(fetch_);
  fetch_ = nullptr;  // the fetch itself reads and writes through the host storages
  f();
}

void ParameterCollection::set_device_fetch(const void* owner, std::function<void()> fetch) {
  if (fetch_ && fetch_owner_ != owner) fetch_from_device();
  fetch_ = std::move(fetch);
  fetch_owner_ = owner;
}

void ParameterCollection::updated_on_device(const void* owner, std::function<void()> fetch) {
  set_device_fetch(owner, std::move(fetch));
  for (Entry& e : entries_) {
    for (uint32_t row : e.touched) e.touched_flag[row] = 0;
    e.touched.clear();
  }
  changed();
}

uint32_t ParameterCollection::add(const std::string& name, Dim dim, bool lookup, float scale) {
  fetch_from_device();  // storages may move
  if (name.empty()) throw std::invalid_argument("[add_parameters] empty parameter name");
  if (by_name_.count(name))
    throw std::invalid_argument("[add_parameters] parameter '" + name + "' already exists");
  if (dim.rows == 0 || dim.cols == 0)
    throw std::invalid_argument("[add_parameters] parameter '" + name + "' has empty shape " +
                                to_string(dim));
  if (static_cast<uint64_t>(dim.rows) * dim.cols > UINT32_MAX)
    throw std::invalid_argument("[add_parameters] parameter '" + name + "' of shape " +
                                to_string(dim) + " has more than 2^32 - 1 entries");
  Entry e;
  e.name = name;
  e.dim = dim;
  e.lookup = lookup;
  e.storage = static_cast<uint32_t>(storages_.size());
  storages_.emplace_back();
  Storage& st = storages_.back();
  reserve_floats(st.values, dim.size());
  reserve_floats(st.grads, dim.size());
  st.values.resize(dim.size());
  st.grads.assign(dim.size(), 0.0f);
  if (lookup) e.touched_flag.assign(dim.cols, 0);
  if (std::isnan(scale) || std::isinf(scale))
    throw std::invalid_argument("[add_parameters] parameter '" + name +
                                "': init_scale must be finite (0: Glorot's)");
  if (scale <= 0) {
    // Glorot uniform; a lookup table's fan is its embedding size.
    float fan = lookup ? static_cast<float>(dim.rows) : static_cast<float>(dim.rows + dim.cols);
    scale = std::sqrt(6.0f / fan);
  }
  std::mt19937_64 rng(name_seed(seed_, name));
  std::uniform_real_distribution<float> u(-scale, scale);
  for (float& v : st.values) v = u(rng);
  uint32_t id = static_cast<uint32_t>(entries_.size());
  entries_.push_back(std::move(e));
  by_name_[name] = id;
  changed();
  return id;
}

namespace {
uint64_t next_uid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}
}  // namespace

ParameterCollection::ParameterCollection(uint64_t seed) : seed_(seed), uid_(next_uid()) {}

ParameterCollection::ParameterCollection(ParameterCollection&& other) : uid_(next_uid()) {
  *this = std::move(other);
}

ParameterCollection& ParameterCollection::operator=(ParameterCollection&& other) {
  if (this == &other) return *this;
  for (const ParameterCollection* c : {this, &other})
    for (size_t i = 0; i < c->blocks_.size(); ++i)
      if (c->blocks_[i])
        throw std::logic_error("[ParameterCollection] cannot move a collection while block '" +
                               c->block_names_[i] +
                               "' is declared over it (it keeps the "
                               "collection's address)");
  other.fetch_from_device();  // a device's newer values, fetched into the storages moved
  fetch_from_device();
  // Every member (a new one must be added here).
  seed_ = other.seed_;
  version_ = other.version_ + 1;
  values_version_ = other.values_version_ + 1;
  uid_ = other.uid_;
  other.uid_ = next_uid();
  fetch_owner_ = nullptr;
  entries_ = std::move(other.entries_);
  storages_ = std::move(other.storages_);
  blocks_ = std::move(other.blocks_);
  block_names_ = std::move(other.block_names_);
  by_name_ = std::move(other.by_name_);
  types_ = std::move(other.types_);
  other.entries_.clear();
  other.storages_.clear();
  other.blocks_.clear();
  other.block_names_.clear();
  other.by_name_.clear();
  other.types_ = TypeTable();
  other.changed();
  return *this;
}

Parameter ParameterCollection::add_parameters(const std::string& name, Dim dim, float init_scale) {
  return Parameter{add(name, dim, false, init_scale), uid_};
}

LookupParameter ParameterCollection::add_lookup_parameters(const std::string& name, uint32_t vocab,
                                                           uint32_t dim) {
  if (vocab == 0 || dim == 0)
    throw std::invalid_argument("[add_lookup_parameters] lookup table '" + name + "' of vocab " +
                                std::to_string(vocab) + " and dim " + std::to_string(dim) +
                                " is empty");
  return LookupParameter{add(name, Dim{dim, vocab}, true, 0.0f), uid_};
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
  return const_cast<float*>(static_cast<const ParameterCollection*>(this)->values(id));
}
const float* ParameterCollection::values(uint32_t id) const {
  fetch_from_device();
  const Entry& e = entry(id);
  return storages_[e.storage].values.data() + e.offset;
}
float* ParameterCollection::grads(uint32_t id) {
  return const_cast<float*>(static_cast<const ParameterCollection*>(this)->grads(id));
}
const float* ParameterCollection::grads(uint32_t id) const {
  fetch_from_device();
  const Entry& e = entry(id);
  return storages_[e.storage].grads.data() + e.offset;
}

uint32_t ParameterCollection::register_block(const std::string& name, const Block* block) {
  if (name.empty()) throw std::invalid_argument("[Block] empty block name");
  for (size_t i = 0; i < block_names_.size(); ++i)
    if (block_names_[i] == name && blocks_[i] != nullptr)
      throw std::invalid_argument("[Block] a block named '" + name +
                                  "' already exists in this collection");
  blocks_.push_back(block);
  block_names_.push_back(name);
  return static_cast<uint32_t>(blocks_.size() - 1);
}

void ParameterCollection::unregister_block(uint32_t id) {
  if (id < blocks_.size()) blocks_[id] = nullptr;
}

const Block* ParameterCollection::block(uint32_t id) const {
  return id < blocks_.size() ? blocks_[id] : nullptr;
}

const std::string& ParameterCollection::block_name(uint32_t id) const {
  if (id >= block_names_.size())
    throw std::invalid_argument("[ParameterCollection] no block with id " + std::to_string(id));
  return block_names_[id];
}

bool ParameterCollection::is_view(uint32_t id) const { return entry(id).view; }

Parameter ParameterCollection::add_view(const std::string& name, Parameter base,
                                        uint32_t col_begin, uint32_t cols) {
  const Entry& b = entry(base.id);
  if (b.lookup || b.view)
    throw std::invalid_argument("[add_view] '" + b.name + "' is a lookup table or a view");
  if (cols == 0 || col_begin + cols > b.dim.cols)
    throw std::invalid_argument("[add_view] columns " + std::to_string(col_begin) + "+" +
                                std::to_string(cols) + " out of range for '" + b.name + "' " +
                                to_string(b.dim));
  if (by_name_.count(name))
    throw std::invalid_argument("[add_view] parameter '" + name + "' already exists");
  Entry e;
  e.name = name;
  e.dim = Dim{b.dim.rows, cols};
  e.view = true;
  e.storage = b.storage;
  e.base = base.id;
  e.base_offset = static_cast<size_t>(col_begin) * b.dim.rows;  // columns are contiguous
  e.offset = b.offset + e.base_offset;
  const uint32_t id = static_cast<uint32_t>(entries_.size());
  entries_.push_back(std::move(e));
  by_name_[name] = id;
  changed();
  return Parameter{id, uid_};
}

bool ParameterCollection::adjacent(uint32_t a, uint32_t b) const {
  const Entry &ea = entry(a), &eb = entry(b);
  return ea.storage == eb.storage && ea.offset + ea.dim.size() == eb.offset;
}

bool ParameterCollection::stack(const std::vector<uint32_t>& ids) {
  if (ids.empty()) return true;
  for (uint32_t id : ids) {
    const Entry& e = entry(id);
    if (e.lookup || e.view || e.dim != entry(ids[0]).dim) return false;
  }
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (ids[i] == ids[j]) return false;
  bool already = true;
  for (size_t i = 1; i < ids.size(); ++i) already &= adjacent(ids[i - 1], ids[i]);
  if (already) return true;
  fetch_from_device();
  const uint32_t sid = static_cast<uint32_t>(storages_.size());
  storages_.emplace_back();
  size_t total = 0;
  for (uint32_t id : ids) total += entry(id).dim.size();
  reserve_floats(storages_[sid].values, total);
  reserve_floats(storages_[sid].grads, total);
  size_t offset = 0;
  for (uint32_t id : ids) {
    Storage& st = storages_[sid];
    const size_t n = entry(id).dim.size();
    st.values.insert(st.values.end(), values(id), values(id) + n);
    st.grads.insert(st.grads.end(), grads(id), grads(id) + n);
    Entry& e = entries_[id];
    const uint32_t old = e.storage;
    e.storage = sid;
    e.offset = offset;
    offset += n;
    // A storage no parameter reads any more (each starts in one of its own; an earlier stack
    // may still hold others) is freed at once, so a model holds each stacked weight once and
    // the stack itself needs one parameter's memory more, not the whole group's. Views follow
    // their bases below; storage ids stay as they are.
    bool read = false;
    for (const Entry& other : entries_) read |= !other.view && other.storage == old;
    if (!read) storages_[old] = Storage{};
  }
  for (Entry& v : entries_)
    if (v.view) {
      v.storage = entries_[v.base].storage;
      v.offset = entries_[v.base].offset + v.base_offset;
    }
  changed();
  return true;
}

uint32_t ParameterCollection::view_base(uint32_t id) const {
  const Entry& e = entry(id);
  return e.view ? e.base : id;
}

void ParameterCollection::mark_lookup_row(uint32_t id, uint32_t row) {
  Entry& e = entries_[id];
  if (!e.touched_flag[row]) {
    e.touched_flag[row] = 1;
    e.touched.push_back(row);
  }
}

void ParameterCollection::sgd_update(float lr) {
  if (!std::isfinite(lr))
    throw std::invalid_argument("[sgd_update] lr = " + std::to_string(lr) +
                                ": needs a finite number (it would make every parameter NaN)");
  fetch_from_device();
  for (uint32_t id = 0; id < entries_.size(); ++id) {
    const Entry& e = entries_[id];
    if (e.view) continue;  // updated through its base
    float* v = values(id);
    const float* g = grads(id);
    if (e.lookup) {
      const uint32_t d = e.dim.rows;
      for (uint32_t row : e.touched)
        for (uint32_t i = 0; i < d; ++i) v[row * d + i] -= lr * g[row * d + i];
    } else {
      for (size_t i = 0; i < e.dim.size(); ++i) v[i] -= lr * g[i];
    }
  }
  changed();
  zero_grads();
}

void ParameterCollection::zero_grads() {
  fetch_from_device();
  ++version_;  // the values stay: values_version() does not change
  for (uint32_t id = 0; id < entries_.size(); ++id) {
    Entry& e = entries_[id];
    if (e.view) continue;
    float* g = grads(id);
    if (e.lookup) {
      const uint32_t d = e.dim.rows;
      for (uint32_t row : e.touched) {
        std::fill(g + row * d, g + (row + 1) * d, 0.0f);
        e.touched_flag[row] = 0;
      }
      e.touched.clear();
    } else {
      std::fill(g, g + e.dim.size(), 0.0f);
    }
  }
}

double ParameterCollection::grad_squared_norm() const {
  double s = 0;
  for (uint32_t id = 0; id < entries_.size(); ++id) {
    if (entries_[id].view) continue;
    const float* g = grads(id);
    for (size_t i = 0; i < entries_[id].dim.size(); ++i) s += static_cast<double>(g[i]) * g[i];
  }
  return s;
}

}  // namespace edbatch
