// PQ-trees (Booth and Lueker, 1976): the set of leaf orders in which every reduced subset is
// consecutive. Nodes live in flat arrays addressed by 32-bit ids; leaf i is node i.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace edbatch {

class PQTree {
 public:
  static constexpr uint32_t kNil = 0xffffffffu;

  explicit PQTree(uint32_t n);  // universal tree over leaves 0..n-1 (one P-node)

  // Restricts the admitted orders to those where `subset` is consecutive. Returns false, and
  // leaves the tree unchanged, when that is impossible together with the earlier constraints.
  bool reduce(const std::vector<uint32_t>& subset);

  // Groups the reductions that follow: rollback_to_checkpoint() undoes all of them (accepted ones
  // too), release_checkpoint() keeps them. One checkpoint at a time.
  void checkpoint();
  void rollback_to_checkpoint();
  void release_checkpoint();

  std::vector<uint32_t> frontier() const;  // one admitted order (leaves left to right)
  // One admitted order where node x reads its children right to left iff reversed[x] != 0
  // (ids past the end of `reversed` read left to right).
  std::vector<uint32_t> frontier(const std::vector<uint8_t>& reversed) const;
  uint32_t size() const { return n_; }  // number of leaves

  // Read-only structure, for callers that choose orientations. Leaf i is node i; ids are below
  // node_capacity() and stay valid until the next reduce.
  uint32_t node_capacity() const { return static_cast<uint32_t>(nodes_.size()); }
  uint32_t parent(uint32_t id) const { return nodes_[id].parent; }  // kNil for the root
  std::vector<uint32_t> children(uint32_t x) const;                 // in stored (unreversed) order

  // Every admitted order; for tests and small trees (throws std::invalid_argument if n > 10).
  std::vector<std::vector<uint32_t>> admitted_orders() const;
  std::string to_string() const;  // e.g. "P(0 Q(1 2 3) 4)"

 private:
  enum class Kind : uint8_t { Leaf, P, Q };
  enum class Label : uint8_t { Empty, Full, Partial };

  // Siblings are stored unordered (sib[0], sib[1]) so that a Q-node reverses in O(1).
  struct Node {
    uint32_t parent = kNil;
    uint32_t sib[2] = {kNil, kNil};
    uint32_t end[2] = {kNil, kNil};  // endmost children
    uint32_t nchild = 0;
    Kind kind = Kind::Leaf;
  };
  // Per-reduce state; valid only while `epoch` equals the tree's current epoch.
  struct Scratch {
    uint32_t epoch = 0;
    uint32_t pert_children = 0;  // pertinent children not yet reduced
    uint32_t pert_leaves = 0;
    uint32_t full_head = kNil;  // intrusive lists of full / partial children
    uint32_t partial_head = kNil;
    uint32_t next = kNil;
    uint32_t full_count = 0;
    uint32_t partial_count = 0;
    Label label = Label::Empty;
  };
  struct JournalEntry {
    uint32_t id;
    Node node;
  };
  struct FreeOp {
    uint32_t id;
    bool pushed;
  };
  struct Mark {  // a state that undo() returns to
    size_t journal = 0;
    size_t free_log = 0;
    uint32_t size = 0;
    uint32_t root = kNil;
  };

  // Structure edits; every write to nodes_ goes through edit() so a failed reduce can roll back.
  Node& edit(uint32_t id);
  uint32_t new_node(Kind kind);
  void free_node(uint32_t id);
  void replace_sib(uint32_t x, uint32_t from, uint32_t to);
  void remove_child(uint32_t c);
  void append_child(uint32_t p, uint32_t c, uint32_t side);
  void replace_node(uint32_t old_id, uint32_t new_id);
  void set_parents(uint32_t x, uint32_t skip, uint32_t parent);
  uint32_t other_sib(uint32_t c, uint32_t prev) const;
  Mark mark() const;
  void undo(const Mark& m);

  // Reduction.
  void begin_epoch();
  void reset_scratch(uint32_t id);
  Label label(uint32_t id) const;
  void set_label(uint32_t id, Label l);
  uint32_t full_side(uint32_t z) const;
  void bubble(const std::vector<uint32_t>& subset);
  bool reduce_pertinent(const std::vector<uint32_t>& subset);
  uint32_t reduce_below(uint32_t x);
  bool reduce_root(uint32_t x);
  uint32_t make_full_group(uint32_t x);
  uint32_t collapse_empty(uint32_t x);
  uint32_t template_p3(uint32_t x);
  uint32_t template_p5(uint32_t x);
  void template_p4(uint32_t x);
  void template_p6(uint32_t x);
  uint32_t template_q(uint32_t x, bool is_root);
  uint32_t splice_partial(uint32_t x, uint32_t z);
  uint32_t concat_partials(uint32_t z1, uint32_t z2);

  std::vector<std::vector<uint32_t>> orders_of(uint32_t x) const;

  uint32_t n_;
  uint32_t root_ = kNil;
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;
  std::vector<Scratch> scratch_;
  std::vector<uint32_t> logged_;  // epoch in which a node was last journaled
  std::vector<uint32_t> queue_;
  uint32_t epoch_ = 1;

  bool journaling_ = false;
  uint32_t base_size_ = 0;  // nodes at the start of the current reduce; newer ones need no journal
  bool checkpoint_open_ = false;
  Mark checkpoint_;
  std::vector<JournalEntry> journal_;
  std::vector<FreeOp> free_log_;
};

}  // namespace edbatch
