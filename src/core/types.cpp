#include "edbatch/types.h"

#include <atomic>
#include <cstring>
#include <stdexcept>

namespace edbatch {

uint64_t TypeTable::next_serial() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

TypeTable& TypeTable::operator=(const TypeTable& other) {
  pool_ = other.pool_;
  spans_ = other.spans_;
  names_ = other.names_;
  slots_ = other.slots_;
  serial_ = next_serial();
  return *this;
}

namespace {
uint64_t hash_key(const uint32_t* key, uint32_t len) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ len;
  for (uint32_t i = 0; i < len; ++i) {
    h ^= key[i];
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h;
}
}  // namespace

TypeTable::Interned TypeTable::intern(const uint32_t* key, uint32_t len) {
  if (slots_.empty()) slots_.assign(64, 0);
  const uint64_t h = hash_key(key, len);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    uint32_t s = slots_[i];
    if (s == 0) break;
    const Span& sp = spans_[s - 1];
    if (sp.hash == h && sp.len == len &&
        std::memcmp(pool_.data() + sp.begin, key, len * sizeof(uint32_t)) == 0)
      return {s - 1, false};
  }
  const uint32_t id = static_cast<uint32_t>(spans_.size());
  spans_.push_back({static_cast<uint32_t>(pool_.size()), len, h});
  pool_.insert(pool_.end(), key, key + len);
  names_.emplace_back();
  if (spans_.size() * 2 > slots_.size())
    grow();
  else
    place(id);
  return {id, true};
}

void TypeTable::place(uint32_t type) {
  const size_t mask = slots_.size() - 1;
  for (size_t i = spans_[type].hash & mask;; i = (i + 1) & mask)
    if (slots_[i] == 0) {
      slots_[i] = type + 1;
      return;
    }
}

void TypeTable::grow() {
  slots_.assign(slots_.size() * 2, 0);
  for (uint32_t t = 0; t < spans_.size(); ++t) place(t);
}

void TypeTable::set_name(uint32_t type, std::string name) { names_.at(type) = std::move(name); }

uint32_t TypeTable::find(std::string_view name) const {
  for (uint32_t t = 0; t < names_.size(); ++t)
    if (names_[t] == name) return t;
  return UINT32_MAX;
}

}  // namespace edbatch
