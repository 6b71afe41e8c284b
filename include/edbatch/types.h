// Batching signatures ("types"): interned exact keys. Two nodes may run in one batch iff their
// type ids are equal. The key is compared word for word; the hash only finds the bucket.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "edbatch/op.h"

namespace edbatch {

// A float attribute as the word a key holds: equal keys mean bitwise equal attributes.
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

class TypeTable {
 public:
  TypeTable() : serial_(next_serial()) {}
  // A copy is another table: it gets its own serial.
  TypeTable(const TypeTable& other) { *this = other; }
  TypeTable& operator=(const TypeTable& other);
  TypeTable(TypeTable&&) = default;
  TypeTable& operator=(TypeTable&&) = default;

  struct Interned {
    uint32_t id;
    bool is_new;
  };
  // key[0] must hold the op in its low byte.
  Interned intern(const uint32_t* key, uint32_t len);
  void set_name(uint32_t type, std::string name);

  uint32_t size() const { return static_cast<uint32_t>(spans_.size()); }
  const std::string& name(uint32_t type) const { return names_.at(type); }
  Op op(uint32_t type) const { return static_cast<Op>(pool_[spans_.at(type).begin] & 0xff); }
  uint32_t find(std::string_view name) const;  // UINT32_MAX when absent
  // Unique per table made in the process (copies included): what keeps per-table maps apart
  // when a new table lies at a freed one's address.
  uint64_t serial() const { return serial_; }
  // Ragged types batch nodes with different numbers of arguments (key bit kRaggedKey).
  bool is_ragged(uint32_t type) const { return pool_[spans_.at(type).begin] & kRaggedKey; }
  static constexpr uint32_t kRaggedKey = 0x100;

 private:
  struct Span {
    uint32_t begin, len;
    uint64_t hash;
  };
  void grow();
  void place(uint32_t type);  // into the first free slot of its probe sequence
  std::vector<uint32_t> pool_;
  std::vector<Span> spans_;
  std::vector<std::string> names_;
  std::vector<uint32_t> slots_;  // open addressing: type id + 1, 0 = empty
  uint64_t serial_ = 0;
  static uint64_t next_serial();
};

}  // namespace edbatch
