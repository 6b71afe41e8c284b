// Named parameters and lookup tables, their gradients, and a plain SGD update.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "edbatch/dim.h"
#include "edbatch/types.h"

namespace edbatch {

class Block;

// A handle into a ParameterCollection. Lookup tables are parameters of shape dim x vocab whose
// columns are the embeddings. `owner` is the uid() of the collection that made the handle, so a
// graph over another collection refuses it (0: not known, as for handles made from an id).
struct Parameter {
  uint32_t id = UINT32_MAX;
  uint64_t owner = 0;
  bool valid() const { return id != UINT32_MAX; }
};
struct LookupParameter {
  uint32_t id = UINT32_MAX;
  uint64_t owner = 0;
  bool valid() const { return id != UINT32_MAX; }
};

class ParameterCollection {
 public:
  explicit ParameterCollection(uint64_t seed = 1);
  // Not copyable: a copy would hold the uid that tells collections apart, so one's handles would
  // read the other's parameters. Movable (the moved-from collection is empty, with a new uid)
  // before graphs, engines and blocks are made over it, which keep its address; moving one with
  // a live Block throws std::logic_error (graphs and engines are not tracked: move it first).
  ParameterCollection(const ParameterCollection&) = delete;
  ParameterCollection& operator=(const ParameterCollection&) = delete;
  ParameterCollection(ParameterCollection&& other);
  ParameterCollection& operator=(ParameterCollection&& other);

  // Tells collections apart (Parameter::owner): unique in the process, kept by moves.
  //
  // One thread at a time: building graphs over a collection registers batching types in it
  // (types()), so graphs over one collection are built and run on one thread at a time (or
  // under the caller's lock); engines over separate collections run in parallel.
  uint64_t uid() const { return uid_; }

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

  // A column range of parameter `base` under its own name, sharing base's values and gradients
  // (blocks split W [a; b] products into W_a a + W_b b). Views are not saved or updated on their
  // own; their base is.
  Parameter add_view(const std::string& name, Parameter base, uint32_t col_begin, uint32_t cols);
  bool is_view(uint32_t id) const;
  uint32_t view_base(uint32_t id) const;  // the viewed parameter (id itself if not a view)
  // Moves the given same-shaped parameters into one contiguous buffer, in the given order, so a
  // batched GEMM can address them with one stride. Returns false (and changes nothing) when one
  // is a lookup table or a view, or shapes differ. Values and gradients are kept; views of the
  // stacked parameters follow them.
  bool stack(const std::vector<uint32_t>& ids);
  // True when parameter b's storage directly follows a's in one buffer.
  bool adjacent(uint32_t a, uint32_t b) const;

  // Lookup gradients are sparse: backward marks the columns it touched.
  void mark_lookup_row(uint32_t id, uint32_t row);
  // The columns of lookup table `id` marked since the gradients were last zeroed, in the order
  // they were first marked (empty for other parameters).
  const std::vector<uint32_t>& touched_columns(uint32_t id) const { return entry(id).touched; }

  // values -= lr * grads, then zero the gradients (only touched columns of lookup tables).
  void sgd_update(float lr);
  void zero_grads();
  // Sum of squares of all gradients (for clipping and tests).
  double grad_squared_norm() const;

  // Changes whenever the collection changes values, gradients or storage itself (adding, views,
  // stacking, sgd_update, zero_grads, loading weights). Code that writes through values() or
  // grads() between passes calls mark_changed(), so device backends upload again and the CPU
  // backend packs weights again between the increments of one graph (it always does at a
  // graph's first forward).
  uint64_t version() const { return version_; }
  // Changes with version() except at zero_grads(): what a forward read is still current after
  // gradients alone were cleared.
  uint64_t values_version() const { return values_version_; }
  void mark_changed() { changed(); }

  // A device backend that holds newer values or gradients than the host (gradients a backward
  // left on the device, an update done there) leaves here how to copy them back. Every host
  // access of values or gradients (values(), grads(), sgd_update, zero_grads, stacking, adding)
  // runs it first, once, so host code always sees current numbers. A fetch left by another
  // owner runs before it is replaced.
  void set_device_fetch(const void* owner, std::function<void()> fetch);
  void fetch_from_device() const;
  const void* device_fetch_owner() const { return fetch_ ? fetch_owner_ : nullptr; }
  // After an update made on the device (values -= lr * grads, gradients zeroed there): a new
  // version, the lookup columns' touched marks cleared, and `fetch` left as above.
  void updated_on_device(const void* owner, std::function<void()> fetch);

  // Blocks declared over this collection, by id. A block's id stays valid (its entry becomes null)
  // after the block is destroyed, so stale calls are caught.
  uint32_t register_block(const std::string& name, const Block* block);
  void unregister_block(uint32_t id);
  const Block* block(uint32_t id) const;  // nullptr once destroyed
  const std::string& block_name(uint32_t id) const;

  // Batching types are interned per collection: their keys name this collection's parameters,
  // and their ids stay stable across the graphs built over it.
  TypeTable& types() { return types_; }
  const TypeTable& types() const { return types_; }

 private:
  // Values and gradients live in storages; an entry is a span of one. Stacked parameters share
  // a storage, views alias part of their base's.
  struct Storage {
    std::vector<float> values, grads;
  };
  struct Entry {
    std::string name;
    Dim dim;
    bool lookup = false;
    bool view = false;
    uint32_t base = UINT32_MAX;  // views: the viewed parameter
    size_t base_offset = 0;      // views: floats from the base's start
    uint32_t storage = 0;
    size_t offset = 0;
    std::vector<uint32_t> touched;      // lookup columns with nonzero gradient
    std::vector<uint8_t> touched_flag;  // per column
  };
  const Entry& entry(uint32_t id) const;
  uint32_t add(const std::string& name, Dim dim, bool lookup, float scale);
  void changed() {  // values, and so gradients' layout too, may have changed
    ++version_;
    ++values_version_;
  }

  uint64_t seed_;
  uint64_t version_ = 0, values_version_ = 0;
  uint64_t uid_ = 0;
  mutable std::function<void()> fetch_;
  const void* fetch_owner_ = nullptr;
  std::vector<Entry> entries_;
  std::vector<Storage> storages_;
  std::vector<const Block*> blocks_;
  std::vector<std::string> block_names_;
  std::unordered_map<std::string, uint32_t> by_name_;
  TypeTable types_;
};

}  // namespace edbatch
