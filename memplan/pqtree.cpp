// PQ-tree reduction (Booth and Lueker's templates) with a journal for rollback. The read-only
// queries (admitted orders, printing) are in pqtree_orders.cpp.
#include "memplan/pqtree.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace edbatch {

PQTree::PQTree(uint32_t n) : n_(n) {
  nodes_.resize(n);
  scratch_.resize(n);
  logged_.resize(n, 0);
  if (n == 1) root_ = 0;
  if (n < 2) return;
  root_ = new_node(Kind::P);
  for (uint32_t i = 0; i < n; ++i) append_child(root_, i, 1);
}

// ---- structure edits ----------------------------------------------------------------------

PQTree::Node& PQTree::edit(uint32_t id) {
  if (journaling_ && id < base_size_ && logged_[id] != epoch_) {
    logged_[id] = epoch_;
    journal_.push_back({id, nodes_[id]});
  }
  return nodes_[id];
}

uint32_t PQTree::new_node(Kind kind) {
  uint32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
    if (journaling_) free_log_.push_back({id, false});
  } else {
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
    if (scratch_.size() < nodes_.size()) scratch_.emplace_back();
    if (logged_.size() < nodes_.size()) logged_.push_back(0);
  }
  edit(id) = Node{};
  nodes_[id].kind = kind;
  reset_scratch(id);
  return id;
}

void PQTree::free_node(uint32_t id) {
  free_.push_back(id);
  if (journaling_) free_log_.push_back({id, true});
}

void PQTree::replace_sib(uint32_t x, uint32_t from, uint32_t to) {
  Node& n = edit(x);
  if (n.sib[0] == from) {
    n.sib[0] = to;
  } else if (n.sib[1] == from) {
    n.sib[1] = to;
  } else {
    throw std::runtime_error("[PQTree::replace_sib] node " + std::to_string(x) +
                             " is not linked to " + std::to_string(from));
  }
}

void PQTree::remove_child(uint32_t c) {
  const Node cn = nodes_[c];
  if (cn.sib[0] != kNil) replace_sib(cn.sib[0], c, cn.sib[1]);
  if (cn.sib[1] != kNil) replace_sib(cn.sib[1], c, cn.sib[0]);
  Node& p = edit(cn.parent);
  for (uint32_t& e : p.end) {
    if (e == c) e = cn.sib[0] != kNil ? cn.sib[0] : cn.sib[1];
  }
  --p.nchild;
  Node& cc = edit(c);
  cc.parent = kNil;
  cc.sib[0] = cc.sib[1] = kNil;
}

void PQTree::append_child(uint32_t p, uint32_t c, uint32_t side) {
  Node& pn = edit(p);
  const uint32_t e = pn.end[side];
  pn.end[side] = c;
  if (e == kNil) pn.end[1 - side] = c;
  ++pn.nchild;
  Node& cn = edit(c);
  cn.parent = p;
  cn.sib[0] = e;
  cn.sib[1] = kNil;
  if (e != kNil) replace_sib(e, kNil, c);
}

// new_id takes old_id's place among its siblings (or as the root); old_id is left detached.
void PQTree::replace_node(uint32_t old_id, uint32_t new_id) {
  const Node o = nodes_[old_id];
  Node& nn = edit(new_id);
  nn.parent = o.parent;
  nn.sib[0] = o.sib[0];
  nn.sib[1] = o.sib[1];
  if (o.parent == kNil) {
    root_ = new_id;
  } else {
    for (uint32_t s : o.sib) {
      if (s != kNil) replace_sib(s, old_id, new_id);
    }
    for (uint32_t& e : edit(o.parent).end) {
      if (e == old_id) e = new_id;
    }
  }
  Node& od = edit(old_id);
  od.parent = kNil;
  od.sib[0] = od.sib[1] = kNil;
}

void PQTree::set_parents(uint32_t x, uint32_t skip, uint32_t parent) {
  for (uint32_t prev = kNil, c = nodes_[x].end[0]; c != kNil;) {
    const uint32_t next = other_sib(c, prev);
    if (c != skip) edit(c).parent = parent;
    prev = c;
    c = next;
  }
}

uint32_t PQTree::other_sib(uint32_t c, uint32_t prev) const {
  const Node& n = nodes_[c];
  return n.sib[0] == prev ? n.sib[1] : n.sib[0];
}

std::vector<uint32_t> PQTree::children(uint32_t x) const {
  std::vector<uint32_t> out;
  for (uint32_t prev = kNil, c = nodes_[x].end[0]; c != kNil;) {
    out.push_back(c);
    const uint32_t next = other_sib(c, prev);
    prev = c;
    c = next;
  }
  return out;
}

PQTree::Mark PQTree::mark() const {
  return {journal_.size(), free_log_.size(), static_cast<uint32_t>(nodes_.size()), root_};
}

// Restores every journaled node newest first, so the oldest copy of a node wins.
void PQTree::undo(const Mark& m) {
  for (size_t i = journal_.size(); i-- > m.journal;) nodes_[journal_[i].id] = journal_[i].node;
  nodes_.resize(m.size);
  for (size_t i = free_log_.size(); i-- > m.free_log;) {
    if (free_log_[i].pushed) {
      free_.pop_back();
    } else {
      free_.push_back(free_log_[i].id);
    }
  }
  journal_.resize(m.journal);
  free_log_.resize(m.free_log);
  root_ = m.root;
}

void PQTree::checkpoint() {
  if (checkpoint_open_) {
    throw std::invalid_argument("[PQTree::checkpoint] a checkpoint is already open");
  }
  checkpoint_open_ = true;
  checkpoint_ = mark();
}

void PQTree::rollback_to_checkpoint() {
  if (!checkpoint_open_) {
    throw std::invalid_argument("[PQTree::rollback_to_checkpoint] no checkpoint is open");
  }
  undo(checkpoint_);
  checkpoint_open_ = false;
}

void PQTree::release_checkpoint() {
  if (!checkpoint_open_) {
    throw std::invalid_argument("[PQTree::release_checkpoint] no checkpoint is open");
  }
  checkpoint_open_ = false;
  journal_.clear();
  free_log_.clear();
}

// ---- reduction ----------------------------------------------------------------------------

void PQTree::begin_epoch() {
  if (++epoch_ != 0) return;
  for (Scratch& s : scratch_) s.epoch = 0;
  std::fill(logged_.begin(), logged_.end(), 0);
  epoch_ = 1;
}

void PQTree::reset_scratch(uint32_t id) {
  scratch_[id] = Scratch{};
  scratch_[id].epoch = epoch_;
}

PQTree::Label PQTree::label(uint32_t id) const {
  return scratch_[id].epoch == epoch_ ? scratch_[id].label : Label::Empty;
}

void PQTree::set_label(uint32_t id, Label l) {
  if (scratch_[id].epoch != epoch_) reset_scratch(id);
  scratch_[id].label = l;
}

// The end (0 or 1) of a partial Q-node that holds its full children.
uint32_t PQTree::full_side(uint32_t z) const {
  return label(nodes_[z].end[0]) == Label::Full ? 0 : 1;
}

bool PQTree::reduce(const std::vector<uint32_t>& subset) {
  begin_epoch();
  for (uint32_t v : subset) {
    if (v >= n_) {
      throw std::invalid_argument("[PQTree::reduce] leaf " + std::to_string(v) +
                                  " out of range for " + std::to_string(n_) + " leaves");
    }
    if (scratch_[v].epoch == epoch_) {
      throw std::invalid_argument("[PQTree::reduce] duplicate leaf " + std::to_string(v));
    }
    reset_scratch(v);
  }
  if (subset.size() <= 1 || subset.size() == n_) return true;
  bubble(subset);
  const Mark before = mark();
  journaling_ = true;
  base_size_ = before.size;
  bool ok = false;
  try {
    ok = reduce_pertinent(subset);
  } catch (...) {
    journaling_ = false;
    undo(before);
    throw;
  }
  journaling_ = false;
  if (!ok) undo(before);
  if (!checkpoint_open_) {  // the journal outlives a reduce only for a checkpoint
    journal_.clear();
    free_log_.clear();
  }
  return ok;
}

// Marks the pertinent subtree and counts each node's pertinent children. The walk may pass the
// pertinent root, but by at most as many nodes as it visits below it.
void PQTree::bubble(const std::vector<uint32_t>& subset) {
  queue_.assign(subset.begin(), subset.end());
  size_t head = 0;
  size_t off_top = 0;
  while (queue_.size() - head + off_top > 1) {
    const uint32_t x = queue_[head++];
    const uint32_t y = nodes_[x].parent;
    if (y == kNil) {
      off_top = 1;
      continue;
    }
    if (scratch_[y].epoch != epoch_) {
      reset_scratch(y);
      queue_.push_back(y);
    }
    ++scratch_[y].pert_children;
  }
}

// Applies the templates bottom-up; the first node holding every subset leaf is the root.
bool PQTree::reduce_pertinent(const std::vector<uint32_t>& subset) {
  const uint32_t total = static_cast<uint32_t>(subset.size());
  queue_.assign(subset.begin(), subset.end());
  for (uint32_t v : subset) scratch_[v].pert_leaves = 1;
  for (size_t head = 0; head < queue_.size(); ++head) {
    const uint32_t x = queue_[head];
    const uint32_t leaves = scratch_[x].pert_leaves;
    if (leaves == total) return reduce_root(x);
    const uint32_t y = nodes_[x].parent;
    const uint32_t r = reduce_below(x);
    if (r == kNil) return false;
    Scratch& sy = scratch_[y];
    sy.pert_leaves += leaves;
    if (label(r) == Label::Full) {
      scratch_[r].next = sy.full_head;
      sy.full_head = r;
      ++sy.full_count;
    } else {
      scratch_[r].next = sy.partial_head;
      sy.partial_head = r;
      ++sy.partial_count;
    }
    if (--sy.pert_children == 0) queue_.push_back(y);
  }
  throw std::runtime_error("[PQTree::reduce] pertinent root not found");
}

// Templates for a node below the pertinent root: the result is full, or a Q-node with its
// full children at one end (L1, P1, P3, P5, Q1, Q2). Returns kNil when none applies.
uint32_t PQTree::reduce_below(uint32_t x) {
  const Kind kind = nodes_[x].kind;
  const uint32_t partial_count = scratch_[x].partial_count;
  if (kind == Kind::Leaf || scratch_[x].full_count == nodes_[x].nchild) {
    set_label(x, Label::Full);
    return x;
  }
  uint32_t r = kNil;
  if (kind == Kind::P) {
    if (partial_count == 0) r = template_p3(x);
    if (partial_count == 1) r = template_p5(x);
  } else {
    r = template_q(x, false);
  }
  if (r != kNil) set_label(r, Label::Partial);
  return r;
}

// Templates for the pertinent root (P1, P2, P4, P6, Q1, Q2, Q3).
bool PQTree::reduce_root(uint32_t x) {
  if (scratch_[x].full_count == nodes_[x].nchild) return true;
  if (nodes_[x].kind == Kind::Q) return template_q(x, true) != kNil;
  switch (scratch_[x].partial_count) {
    case 0:  // P2
      append_child(x, make_full_group(x), 1);
      return true;
    case 1:
      template_p4(x);
      return true;
    case 2:
      template_p6(x);
      return true;
    default:
      return false;
  }
}

// Detaches the full children of P-node x; returns them as one node (kNil when there are none).
uint32_t PQTree::make_full_group(uint32_t x) {
  const uint32_t head = scratch_[x].full_head;
  scratch_[x].full_head = kNil;
  scratch_[x].full_count = 0;
  if (head == kNil) return kNil;
  if (scratch_[head].next == kNil) {
    remove_child(head);
    return head;
  }
  const uint32_t g = new_node(Kind::P);
  set_label(g, Label::Full);
  for (uint32_t c = head; c != kNil; c = scratch_[c].next) {
    remove_child(c);
    append_child(g, c, 1);
  }
  return g;
}

// x is a detached P-node whose remaining children are all empty: returns it, its only child,
// or kNil, freeing x unless it keeps two or more children.
uint32_t PQTree::collapse_empty(uint32_t x) {
  if (nodes_[x].nchild >= 2) {
    set_label(x, Label::Empty);
    return x;
  }
  const uint32_t only = nodes_[x].end[0];
  if (only != kNil) remove_child(only);
  free_node(x);
  return only;
}

uint32_t PQTree::template_p3(uint32_t x) {
  const uint32_t y = new_node(Kind::Q);
  replace_node(x, y);
  const uint32_t full = make_full_group(x);
  append_child(y, collapse_empty(x), 0);
  append_child(y, full, 1);
  return y;
}

uint32_t PQTree::template_p5(uint32_t x) {
  const uint32_t z = scratch_[x].partial_head;
  remove_child(z);
  replace_node(x, z);
  const uint32_t side = full_side(z);
  const uint32_t full = make_full_group(x);
  if (full != kNil) append_child(z, full, side);
  const uint32_t empty = collapse_empty(x);
  if (empty != kNil) append_child(z, empty, 1 - side);
  return z;
}

void PQTree::template_p4(uint32_t x) {
  const uint32_t z = scratch_[x].partial_head;
  const uint32_t side = full_side(z);
  const uint32_t full = make_full_group(x);
  if (full != kNil) append_child(z, full, side);
  if (nodes_[x].nchild == 1) {
    remove_child(z);
    replace_node(x, z);
    free_node(x);
  }
}

void PQTree::template_p6(uint32_t x) {
  const uint32_t z1 = scratch_[x].partial_head;
  const uint32_t z2 = scratch_[z1].next;
  const uint32_t side = full_side(z1);
  const uint32_t full = make_full_group(x);
  if (full != kNil) append_child(z1, full, side);
  const uint32_t w = concat_partials(z1, z2);
  if (nodes_[x].nchild == 1) {
    remove_child(w);
    replace_node(x, w);
    free_node(x);
  }
}

// Joins two partial Q-siblings full end to full end; the one with more children survives so
// that parent updates cost the smaller side.
uint32_t PQTree::concat_partials(uint32_t z1, uint32_t z2) {
  if (nodes_[z1].nchild < nodes_[z2].nchild) std::swap(z1, z2);
  const uint32_t s1 = full_side(z1);
  const uint32_t s2 = full_side(z2);
  const uint32_t a = nodes_[z1].end[s1];
  const uint32_t b = nodes_[z2].end[s2];
  remove_child(z2);
  set_parents(z2, kNil, z1);
  replace_sib(a, kNil, b);
  replace_sib(b, kNil, a);
  Node& n1 = edit(z1);
  n1.end[s1] = nodes_[z2].end[1 - s2];
  n1.nchild += nodes_[z2].nchild;
  free_node(z2);
  return z1;
}

// Q2 and Q3: the pertinent children of Q-node x must be consecutive, with partial children only
// at the ends of that run; below the root the run must also reach an end of x.
uint32_t PQTree::template_q(uint32_t x, bool is_root) {
  const Scratch& s = scratch_[x];
  const uint32_t start = s.full_head != kNil ? s.full_head : s.partial_head;
  uint32_t ends[2];
  uint32_t beyond[2];
  uint32_t run = 1;
  for (uint32_t d = 0; d < 2; ++d) {
    uint32_t prev = start;
    uint32_t cur = nodes_[start].sib[d];
    while (cur != kNil && label(cur) != Label::Empty) {
      ++run;
      const uint32_t next = other_sib(cur, prev);
      prev = cur;
      cur = next;
    }
    ends[d] = prev;
    beyond[d] = cur;
  }
  if (run != s.full_count + s.partial_count) return kNil;
  std::vector<uint32_t> partials;
  for (uint32_t p = s.partial_head; p != kNil; p = scratch_[p].next) {
    if (p != ends[0] && p != ends[1]) return kNil;
    partials.push_back(p);
  }
  if (!is_root) {
    bool empty_side[2];
    for (uint32_t d = 0; d < 2; ++d) {
      empty_side[d] = beyond[d] != kNil || (ends[0] != ends[1] && label(ends[d]) == Label::Partial);
    }
    if (empty_side[0] && empty_side[1]) return kNil;
  }
  for (uint32_t p : partials) x = splice_partial(x, p);
  return x;
}

// Replaces partial child z of Q-node x by z's children, empty end outward. The node with more
// children survives (it may be z, which then takes x's place); returns the survivor.
uint32_t PQTree::splice_partial(uint32_t x, uint32_t z) {
  const Node nz = nodes_[z];
  const bool inner0 = nz.sib[0] != kNil && label(nz.sib[0]) != Label::Empty;
  const bool inner1 = nz.sib[1] != kNil && label(nz.sib[1]) != Label::Empty;
  if (inner0 && inner1) {
    throw std::runtime_error("[PQTree::splice_partial] partial node " + std::to_string(z) +
                             " inside a pertinent run");
  }
  // With no pertinent neighbour, empties go to a side that already has some (or either side).
  const uint32_t outer = inner0 || (!inner1 && nz.sib[0] == kNil) ? nz.sib[1] : nz.sib[0];
  const uint32_t inner = outer == nz.sib[0] ? nz.sib[1] : nz.sib[0];
  const uint32_t side = full_side(z);
  const uint32_t e_full = nz.end[side];
  const uint32_t e_empty = nz.end[1 - side];
  uint32_t new_end[2];
  for (uint32_t k = 0; k < 2; ++k) {
    const uint32_t e = nodes_[x].end[k];
    new_end[k] = e != z ? e : (outer == kNil ? e_empty : e_full);
  }
  const uint32_t total = nodes_[x].nchild - 1 + nz.nchild;
  const bool keep_x = nz.nchild <= nodes_[x].nchild - 1;
  if (keep_x) {
    set_parents(z, kNil, x);
  } else {
    set_parents(x, z, z);
  }
  if (outer != kNil) {
    replace_sib(outer, z, e_empty);
    replace_sib(e_empty, kNil, outer);
  }
  if (inner != kNil) {
    replace_sib(inner, z, e_full);
    replace_sib(e_full, kNil, inner);
  }
  const uint32_t keep = keep_x ? x : z;
  if (!keep_x) replace_node(x, z);
  Node& nk = edit(keep);
  nk.end[0] = new_end[0];
  nk.end[1] = new_end[1];
  nk.nchild = total;
  free_node(keep_x ? z : x);
  return keep;
}

}  // namespace edbatch
