// The ready frontier per type with O(1) updates per node, the per-type chain lower bound, and the
// three scheduling modes (node by node, static depth groups, frontier policies).
#include <algorithm>
#include <atomic>
#include <iterator>
#include <stdexcept>
#include <string>

#include "edbatch/graph.h"
#include "edbatch/schedule.h"
#include "edbatch/types.h"

namespace edbatch {

namespace {
bool is_source(const Node& n) { return !is_scheduled(n.op); }
uint32_t producer(const Graph& g, uint32_t a) { return scheduled_producer(g, a); }
}  // namespace

uint32_t scheduled_producer(const Graph& g, uint32_t a, uint32_t* output) {
  const Node* n = &g.node(a);
  while (op_info(n->op).rule == BatchRule::View) {
    if (output && n->op == Op::Output) *output = n->aux;
    a = g.args(*n)[0];
    n = &g.node(a);
  }
  return is_scheduled(n->op) ? a : UINT32_MAX;
}

namespace {

// Chain heights over the scheduled nodes in reverse order: chain[s][t] = most type-t nodes on a
// path from s to a sink, s included, the maximum over s's consumers plus s itself. Each row is
// written once (T compile-time where it is small, so the loops over a row unroll).
template <uint32_t kT>
void chain_heights(uint32_t T_, uint32_t S, const uint32_t* types, const uint32_t* bucket,
                   const uint32_t* consumer_begin, const uint32_t* consumers, uint32_t* chain,
                   uint32_t* height) {
  const uint32_t T = kT > 0 ? kT : T_;
  for (uint32_t s = S; s-- > 0;) {
    uint32_t* hv = chain + static_cast<size_t>(s) * T;
    for (uint32_t t = 0; t < T; ++t) hv[t] = 0;
    for (uint32_t c = consumer_begin[s]; c < consumer_begin[s + 1]; ++c) {
      const uint32_t* hc = chain + static_cast<size_t>(consumers[c]) * T;
      for (uint32_t t = 0; t < T; ++t) hv[t] = std::max(hv[t], hc[t]);
    }
    height[s] = ++hv[bucket[types[s]]];
  }
}

}  // namespace

void Scheduler::prepare(const Graph& g) {
  // Nodes before first_ have run (an incremental forward): they are neither scheduled nor
  // waited for. The segment's scheduled nodes get compact ids s (in node order; sources and
  // views, most of a graph's nodes, get none), and the per-node arrays below are indexed by
  // them, so a segment costs its own size and its sources only one pass.
  const uint32_t f = first_, n = end_ - f;
  const uint32_t num_types = g.types().size();
  const Node* nodes = g.nodes().data() + f;

  // The per-type arrays are indexed by global type id and only grow; only the entries of the
  // types present in the last segment are reset, so a segment costs its own types, not every
  // type the table ever interned (a program may intern one per mini-batch).
  if (type_count_.size() < num_types) {
    type_count_.resize(num_types, 0);
    bucket_.resize(num_types, UINT32_MAX);
    avg_depth_.resize(num_types, 0.0);
    top_.resize(num_types, 0);
    level_base_.resize(num_types, 0);
    ready_pos_.resize(num_types, UINT32_MAX);
    ready_.resize(num_types);
  }
  for (const uint32_t t : present_) {
    type_count_[t] = 0;
    bucket_[t] = UINT32_MAX;
    avg_depth_[t] = 0.0;
    top_[t] = 0;
    level_base_[t] = 0;
    ready_pos_[t] = UINT32_MAX;
    ready_[t].clear();
  }
  present_.clear();
  ready_types_.clear();
  // One pass in node order gives compact ids, and types present in this segment compact local
  // ids (bucket_, in order of first appearance, the order of present_) for the chain computation.
  // Views get the compact id of the node they view (a view's argument comes before it), so that
  // an argument is one lookup, not a walk over views; with reads, also the producer's node id and
  // the call output read (kNoOutput: none). A scheduled node's arguments are resolved in the same
  // pass, their producers having come before it: producer_[k] for argument k of the segment's
  // nodes, in argument order, as a compact id (UINT32_MAX: a source, or it ran before), pending
  // inputs, depth, the types' summed depths, consumer counts, and the (producer, consumer) arcs
  // that fill the consumer lists below.
  constexpr uint32_t kNoOutput = UINT32_MAX;
  const uint32_t arg_base = n > 0 ? nodes[0].arg_begin : 0;
  const size_t arg_end = end_ < g.size() ? g.node(end_).arg_begin : g.all_args().size();
  arg_base_ = arg_base;
  producer_.resize(arg_end - arg_base);  // the scheduled nodes' entries are written below
  local_.resize(n);
  sched_.resize(n);
  sched_type_.resize(n);
  pending_.resize(n);
  depth_.resize(n);
  consumer_begin_.assign(static_cast<size_t>(n) + 1, 0);
  arcs_.clear();
  if (reading_) {
    resolved_.resize(n);
    view_output_.resize(n);
    output_.resize(arg_end - arg_base);
    read_producer_.resize(arg_end - arg_base);
  }
  uint32_t local_types = 0, S = 0;
  for (uint32_t v = 0; v < n; ++v) {
    const Node& nd = nodes[v];
    const BatchRule rule = op_info(nd.op).rule;
    if (rule == BatchRule::Source || rule == BatchRule::View) {
      uint32_t id = UINT32_MAX, sp = UINT32_MAX, output = kNoOutput;
      if (rule == BatchRule::View) {
        const uint32_t a = g.args(nd)[0];
        if (a >= f) {
          id = local_[a - f];
          if (reading_) {
            sp = resolved_[a - f];
            output = view_output_[a - f];
          }
        } else if (reading_) {  // it ran before: only reads need its producer
          sp = scheduled_producer(g, a, &output);
        }
        if (output == kNoOutput && nd.op == Op::Output) output = nd.aux;
      }
      local_[v] = id;
      if (reading_) {
        resolved_[v] = sp;
        view_output_[v] = output;
      }
      continue;
    }
    if (reading_) {
      resolved_[v] = v + f;
      view_output_[v] = kNoOutput;
    }
    const uint32_t t = nd.type, s = S++;
    local_[v] = s;
    sched_type_[s] = t;
    sched_[s] = v;
    if (type_count_[t]++ == 0) {
      bucket_[t] = local_types++;
      present_.push_back(t);
    }
    const uint32_t* a = g.args(nd);
    const uint32_t k = nd.arg_begin - arg_base;
    uint32_t* pr = producer_.data() + k;
    // With reads: also the producers that ran before, and the outputs read.
    uint32_t* out = reading_ ? output_.data() + k : nullptr;
    uint32_t d = 0, pending = 0;
    for (uint32_t i = 0; i < nd.num_args; ++i) {
      const uint32_t ai = a[i];
      uint32_t p = UINT32_MAX;  // it ran before when ai < f
      if (ai >= f) {
        p = local_[ai - f];
        if (out) {
          read_producer_[k + i] = resolved_[ai - f];
          const uint32_t o = view_output_[ai - f];
          out[i] = o == kNoOutput ? Schedule::kWholeBatch : o;
        }
      } else if (out) {
        out[i] = Schedule::kWholeBatch;
        read_producer_[k + i] = scheduled_producer(g, ai, out + i);
      }
      pr[i] = p;
      if (p == UINT32_MAX) continue;
      ++pending;
      ++consumer_begin_[p + 1];
      arcs_.push_back({p, s});
      d = std::max(d, depth_[p]);
    }
    pending_[s] = pending;
    depth_[s] = d + 1;
    avg_depth_[t] += d + 1;
  }
  sched_.resize(S);
  sched_type_.resize(S);
  pending_.resize(S);
  depth_.resize(S);
  consumer_begin_.resize(static_cast<size_t>(S) + 1);  // counts only ever went to ids below S

  // Consumer lists (CSR): each scheduled node's consumers in node order, each as often as it
  // reads the node.
  for (uint32_t s = 0; s < S; ++s) consumer_begin_[s + 1] += consumer_begin_[s];
  consumers_.resize(consumer_begin_[S]);
  {
    std::vector<uint32_t>& fill = height_;  // reused as a cursor before heights are computed
    fill.assign(consumer_begin_.begin(), consumer_begin_.end() - 1);
    for (const Arc& arc : arcs_) consumers_[fill[arc.producer]++] = arc.consumer;
  }

  // Chain heights: chain[s][t] = most type-t nodes on a path from s to a sink, s included.
  const uint32_t T = std::max(local_types, 1u);
  chain_.resize(static_cast<size_t>(S) * T);
  height_.resize(S);
  using Heights = void (*)(uint32_t, uint32_t, const uint32_t*, const uint32_t*, const uint32_t*,
                          const uint32_t*, uint32_t*, uint32_t*);
  static constexpr Heights kByWidth[] = {chain_heights<0>, chain_heights<1>, chain_heights<2>,
                                         chain_heights<3>, chain_heights<4>, chain_heights<0>,
                                         chain_heights<0>, chain_heights<0>, chain_heights<8>};
  (T < std::size(kByWidth) ? kByWidth[T] : chain_heights<0>)(
      T, S, sched_type_.data(), bucket_.data(), consumer_begin_.data(), consumers_.data(),
      chain_.data(), height_.data());

  // Per-type histograms of unscheduled and ready nodes by height, and mean depth. Slot 0 of
  // the histograms stays 0: the level of every absent type (top 0, base 0) reads it.
  for (uint32_t s = 0; s < S; ++s) {
    const uint32_t t = sched_type_[s];
    top_[t] = std::max(top_[t], height_[s]);
  }
  uint32_t total = 1;
  for (const uint32_t t : present_) {
    level_base_[t] = total;
    total += top_[t] + 1;
    avg_depth_[t] /= type_count_[t];
  }
  remaining_at_.assign(total, 0);
  ready_at_.assign(total, 0);
  for (uint32_t s = 0; s < S; ++s) ++remaining_at_[level_base_[sched_type_[s]] + height_[s]];
}

void Scheduler::push_ready(uint32_t s, uint32_t type) {
  if (ready_[type].empty()) {
    ready_pos_[type] = static_cast<uint32_t>(ready_types_.size());
    ready_types_.push_back(type);
  }
  ready_[type].push_back(s);
  ++ready_at_[level_base_[type] + height_[s]];
}

void Scheduler::run(const Graph& g, Policy& policy, Schedule& out) {
  out.clear();
  extend(g, policy, out, 0);
}

void Scheduler::extend(const Graph& g, Policy& policy, Schedule& out, uint32_t first_node,
                       uint32_t end_node) {
  end_ = std::min(end_node, g.size());
  if (first_node > end_)
    throw std::invalid_argument("[Scheduler::extend] first node " + std::to_string(first_node) +
                                " is past the end, node " + std::to_string(end_) + " of " +
                                std::to_string(g.size()));
  first_ = first_node;
  reading_ = reads_ == BatchReads::Always || (reads_ == BatchReads::WholeGraphs && first_ == 0);
  prepare(g);
  for (const uint32_t t : present_) out.lower_bound += top_[t];
  const uint32_t first_batch = static_cast<uint32_t>(out.batches.size());
  switch (policy.kind()) {
    case Policy::Kind::NodeByNode: run_node_by_node(g, out); break;
    case Policy::Kind::Depth: run_depth(g, out); break;
    case Policy::Kind::Frontier: run_frontier(g, policy, out); break;
  }
  if (reading_) collect_reads(g, out, first_batch);
}

void Scheduler::collect_reads(const Graph& g, Schedule& out, uint32_t first_batch) {
  // The batch of every node scheduled so far: this extend's, and those before it, kept from the
  // extend before when it made this same schedule (its id says so; a copy of it, as the plan
  // cache serves, has the same content), else found again.
  const uint32_t nb = static_cast<uint32_t>(out.batches.size());
  batch_of_.resize(g.size());
  static std::atomic<uint64_t> next_id{1};
  const uint32_t from =
      out.reads_id == reads_id_ && first_batch == reads_batches_ ? first_batch : 0;
  for (uint32_t b = from; b < nb; ++b)
    for (uint32_t i = 0; i < out.batches[b].count; ++i)
      batch_of_[out.nodes[out.batches[b].begin + i]] = b;
  out.reads_id = reads_id_ = next_id++;
  reads_batches_ = nb;
  out.read_begin.resize(first_batch + 1, static_cast<uint32_t>(out.reads.size() / 2));
  // Every argument's (reader batch, producer batch, output), in node order (the nodes, their
  // producers and arguments lie in memory in that order; batch by batch they would be scattered
  // over the graph), then grouped by reader batch, where each pair is kept once: per producer
  // batch, a mask of what the reader reads of it (bit o for output o, bit kWholeBatch for all of
  // it, which covers every output).
  // Most arguments repeat a triple met shortly before (the nodes of one instance read the same
  // few batches): a direct-mapped filter of recent triples keeps most repeats out of the sort.
  const Node* nodes = g.nodes().data() + first_;
  triples_.resize(3 * read_producer_.size());
  uint32_t bits = 6;  // a filter of about the arguments' count, at most kRecentBits wide
  while (bits < kRecentBits && (size_t{1} << bits) < read_producer_.size()) ++bits;
  recent_.assign(size_t{2} << bits, UINT64_MAX);  // per slot: reader batch, (producer, output)
  size_t count = 0;
  for (const uint32_t v : sched_) {
    const Node& nd = nodes[v];
    const uint32_t b = batch_of_[v + first_];
    const uint32_t* rp = read_producer_.data() + (nd.arg_begin - arg_base_);
    const uint32_t* o = output_.data() + (nd.arg_begin - arg_base_);
    for (uint32_t k = 0; k < nd.num_args; ++k) {
      if (rp[k] == UINT32_MAX) continue;
      const uint32_t pb = batch_of_[rp[k]], output = std::min(o[k], Schedule::kWholeBatch);
      const uint64_t read = uint64_t{pb} << 6 | output;  // output < 64
      uint64_t* slot = recent_.data() +
                       2 * (((read ^ uint64_t{b} << 40) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
      if (slot[0] == b && slot[1] == read) continue;
      slot[0] = b;
      slot[1] = read;
      uint32_t* t = triples_.data() + 3 * count++;
      t[0] = b;
      t[1] = pb;
      t[2] = output;
    }
  }
  triples_.resize(3 * count);
  const uint32_t new_batches = nb - first_batch;
  cursor_.assign(new_batches + 1, 0);
  for (size_t t = 0; t < triples_.size(); t += 3) ++cursor_[triples_[t] - first_batch + 1];
  for (uint32_t b = 0; b < new_batches; ++b) cursor_[b + 1] += cursor_[b];
  sorted_.resize(2 * (triples_.size() / 3));
  for (size_t t = 0; t < triples_.size(); t += 3) {
    const uint32_t at = cursor_[triples_[t] - first_batch]++;
    sorted_[2 * at] = triples_[t + 1];
    sorted_[2 * at + 1] = triples_[t + 2];
  }
  seen_.assign(nb, UINT32_MAX);
  mask_.resize(nb);
  constexpr uint64_t kWhole = uint64_t{1} << Schedule::kWholeBatch;
  for (uint32_t b = first_batch, r = 0; b < nb; ++b) {
    for (const uint32_t end = cursor_[b - first_batch]; r < end; ++r) {  // cursor: the end now
      const uint32_t pb = sorted_[2 * r], output = sorted_[2 * r + 1];
      const uint64_t bit = uint64_t{1} << output;
      if (seen_[pb] != b) {
        seen_[pb] = b;
        mask_[pb] = 0;
      }
      if (mask_[pb] & (bit | kWhole)) continue;
      mask_[pb] |= bit;
      out.reads.push_back(pb);
      out.reads.push_back(output);
    }
    out.read_begin.push_back(static_cast<uint32_t>(out.reads.size() / 2));
  }
}

void Scheduler::run_node_by_node(const Graph& g, Schedule& out) {
  for (uint32_t v = first_; v < end_; ++v) {
    const Node& nd = g.node(v);
    if (is_source(nd)) continue;
    out.batches.push_back({nd.type, static_cast<uint32_t>(out.nodes.size()), 1});
    out.nodes.push_back(v);
  }
}

void Scheduler::run_depth(const Graph& g, Schedule& out) {
  // Counting sort by (depth, type): one batch per group, in order of depth.
  const uint32_t S = static_cast<uint32_t>(sched_.size());
  const uint32_t base = static_cast<uint32_t>(out.nodes.size());
  uint32_t max_depth = 0;
  for (uint32_t s = 0; s < S; ++s) max_depth = std::max(max_depth, depth_[s]);
  std::vector<uint32_t>& start = consumer_begin_;  // consumer lists are not needed here
  start.assign(max_depth + 2, 0);
  for (uint32_t s = 0; s < S; ++s) ++start[depth_[s] + 1];
  for (uint32_t d = 0; d <= max_depth; ++d) start[d + 1] += start[d];
  out.nodes.resize(base + start[max_depth + 1]);
  for (uint32_t s = 0; s < S; ++s) out.nodes[base + start[depth_[s]]++] = sched_[s] + first_;
  // Within one depth, group by type (stable, so node order is kept inside a batch).
  uint32_t begin = base;
  for (uint32_t d = 1; d <= max_depth; ++d) {
    const uint32_t end = base + start[d];
    std::stable_sort(out.nodes.begin() + begin, out.nodes.begin() + end,
                     [&](uint32_t a, uint32_t b) { return g.node(a).type < g.node(b).type; });
    for (uint32_t i = begin; i < end;) {
      uint32_t j = i;
      const uint32_t t = g.node(out.nodes[i]).type;
      while (j < end && g.node(out.nodes[j]).type == t) ++j;
      out.batches.push_back({t, i, j - i});
      i = j;
    }
    begin = end;
  }
}

void Scheduler::run_frontier(const Graph& g, Policy& policy, Schedule& out) {
  const uint32_t S = static_cast<uint32_t>(sched_.size());
  for (uint32_t s = 0; s < S; ++s)
    if (pending_[s] == 0) push_ready(s, sched_type_[s]);
  policy.begin(g);
  out.nodes.reserve(out.nodes.size() + S);
  while (!ready_types_.empty()) {
    const uint32_t t = policy.choose(*this);
    if (t >= ready_.size() || ready_[t].empty())
      throw std::runtime_error(std::string("[Scheduler::run] policy '") + policy.name() +
                               "' chose type " + std::to_string(t) + ", which has no ready nodes");
    const uint32_t begin = static_cast<uint32_t>(out.nodes.size());
    // The batch's nodes move to taken_ (ready_[t] gets its emptied buffer): a consumer of type t
    // may join ready_[t] while they are released below.
    taken_.swap(ready_[t]);
    ready_[t].clear();
    const uint32_t count = static_cast<uint32_t>(taken_.size());
    // Swap-remove t from the ready type list.
    const uint32_t pos = ready_pos_[t], last = ready_types_.back();
    ready_types_[pos] = last;
    ready_pos_[last] = pos;
    ready_types_.pop_back();
    ready_pos_[t] = UINT32_MAX;

    const uint32_t base = level_base_[t];
    for (const uint32_t s : taken_) {
      out.nodes.push_back(sched_[s] + first_);
      --remaining_at_[base + height_[s]];
      --ready_at_[base + height_[s]];
    }
    while (top_[t] > 0 && remaining_at_[base + top_[t]] == 0) --top_[t];
    out.batches.push_back({t, begin, count});
    for (const uint32_t s : taken_)
      for (uint32_t c = consumer_begin_[s]; c < consumer_begin_[s + 1]; ++c) {
        const uint32_t w = consumers_[c];
        if (--pending_[w] == 0) push_ready(w, sched_type_[w]);
      }
    policy.on_batch(t, count);
  }
}

void validate_schedule(const Graph& g, const Schedule& s) {
  const uint32_t n = g.size();
  std::vector<uint32_t> step(n, UINT32_MAX);
  for (uint32_t b = 0; b < s.batches.size(); ++b) {
    const Batch& batch = s.batches[b];
    if (batch.count == 0 || batch.begin + batch.count > s.nodes.size())
      throw std::runtime_error("[validate_schedule] batch " + std::to_string(b) +
                               " is empty or out of range");
    for (uint32_t i = batch.begin; i < batch.begin + batch.count; ++i) {
      const uint32_t v = s.nodes[i];
      if (v >= n) throw std::runtime_error("[validate_schedule] unknown node " + std::to_string(v));
      const Node& nd = g.node(v);
      if (is_source(nd))
        throw std::runtime_error("[validate_schedule] source node " + std::to_string(v) +
                                 " was scheduled");
      if (nd.type != batch.type)
        throw std::runtime_error("[validate_schedule] node " + std::to_string(v) + " of type '" +
                                 g.types().name(nd.type) + "' in a batch of type '" +
                                 g.types().name(batch.type) + "'");
      if (step[v] != UINT32_MAX)
        throw std::runtime_error("[validate_schedule] node " + std::to_string(v) +
                                 " runs twice (batches " + std::to_string(step[v]) + " and " +
                                 std::to_string(b) + ")");
      step[v] = b;
    }
    for (uint32_t i = batch.begin; i < batch.begin + batch.count; ++i) {
      const Node& nd = g.node(s.nodes[i]);
      const uint32_t* a = g.args(nd);
      for (uint32_t k = 0; k < nd.num_args; ++k) {
        const uint32_t p = producer(g, a[k]);
        if (p != UINT32_MAX && (step[p] == UINT32_MAX || step[p] >= b))
          throw std::runtime_error("[validate_schedule] node " + std::to_string(s.nodes[i]) +
                                   " runs in batch " + std::to_string(b) + " before its input " +
                                   std::to_string(p));
      }
    }
  }
  for (uint32_t v = 0; v < n; ++v)
    if (!is_source(g.node(v)) && step[v] == UINT32_MAX)
      throw std::runtime_error("[validate_schedule] node " + std::to_string(v) + " never runs");
}

}  // namespace edbatch
