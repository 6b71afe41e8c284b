// Block compilation: rewrite the body, batch it internally (exact search for small bodies),
// stack the weights of batched GEMMs, lay the values out with the layout planner, and group
// elementwise steps into fused passes.
#include "src/core/block_compile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "memplan/layout.h"

namespace edbatch {

namespace {

[[noreturn]] void fail(const BlockPlan& p, const std::string& msg) {
  throw std::invalid_argument("[Block::freeze] block '" + p.name + "': " + msg);
}

// Affine argument j (a weight) times argument j+1 (a concat of computed values) splits into one
// product per concat piece over column ranges of the weight, so the concat is never built.
bool splittable(const Graph& g, const Node& n, uint32_t j) {
  const uint32_t* a = g.args(n);
  const Node& w = g.node(a[j]);
  const Node& x = g.node(a[j + 1]);
  if (w.op != Op::Parameter || g.params().is_view(w.aux) || x.op != Op::Concat) return false;
  const uint32_t* pieces = g.args(x);
  for (uint32_t k = 0; k < x.num_args; ++k)
    if (!is_scheduled(g.node(pieces[k]).op) && g.node(pieces[k]).op != Op::Input) return false;
  return true;
}

std::vector<uint8_t> live_nodes(const BlockPlan& p) {
  const Graph& g = *p.source;
  std::vector<uint8_t> live(g.size(), 0);
  for (uint32_t o : p.source_outputs) live[o] = 1;
  for (uint32_t v = g.size(); v-- > 0;) {
    if (!live[v]) continue;
    const Node& n = g.node(v);
    const uint32_t* a = g.args(n);
    for (uint32_t k = 0; k < n.num_args; ++k) {
      if (n.op == Op::Affine && k % 2 == 1 && k + 1 < n.num_args && splittable(g, n, k)) {
        live[a[k]] = 1;
        const Node& x = g.node(a[k + 1]);
        for (uint32_t q = 0; q < x.num_args; ++q) live[g.args(x)[q]] = 1;
        ++k;  // the concat itself is not needed
        continue;
      }
      live[a[k]] = 1;
    }
  }
  return live;
}

Parameter column_view(ParameterCollection& pc, uint32_t w, uint32_t c0, uint32_t cols) {
  const std::string name = pc.name(w) + "[:," + std::to_string(c0) + ":" +
                           std::to_string(c0 + cols) + "]";
  const uint32_t found = pc.find(name);
  if (found != UINT32_MAX) return Parameter{found};
  return pc.add_view(name, Parameter{w}, c0, cols);
}

// Copies the live source nodes into p.body, splitting W [a; b] products.
void rewrite(BlockPlan& p) {
  const Graph& src = *p.source;
  ParameterCollection& pc = *p.params;
  const std::vector<uint8_t> live = live_nodes(p);
  p.body = std::make_unique<Graph>(pc);
  Graph& body = *p.body;
  std::vector<uint32_t> map(src.size(), UINT32_MAX);
  std::vector<uint32_t> args;
  p.slot.clear();
  p.input_of.clear();
  auto note = [&](uint32_t id, uint32_t slot, int32_t input) {
    p.slot.resize(body.size(), UINT32_MAX);
    p.input_of.resize(body.size(), -1);
    p.slot[id] = slot;
    if (input >= 0) p.input_of[id] = input;
  };
  for (uint32_t v = 0; v < src.size(); ++v) {
    if (!live[v]) continue;
    const Node& n = src.node(v);
    if (n.op == Op::Call || n.op == Op::Output) fail(p, "a block body cannot call blocks");
    if (n.op == Op::Reshape)
      fail(p, "reshape inside a block body is not supported yet; reshape the block's inputs or "
              "outputs in the graph instead");
    if (n.op == Op::Input) {
      const std::vector<float> zeros(n.dim.size(), 0.0f);
      map[v] = body.add_input(n.dim, zeros.data());
      const auto it = std::find(p.source_inputs.begin(), p.source_inputs.end(), v);
      if (it == p.source_inputs.end())
        fail(p, "node " + std::to_string(v) + " is an input() of the body graph; declare block "
                "inputs with Block::input");
      note(map[v], UINT32_MAX, static_cast<int32_t>(it - p.source_inputs.begin()));
      continue;
    }
    if (n.op == Op::Parameter) {
      map[v] = body.add_parameter(n.aux);
      note(map[v], UINT32_MAX, -1);
      continue;
    }
    const uint32_t* a = src.args(n);
    args.clear();
    for (uint32_t k = 0; k < n.num_args; ++k) {
      if (n.op == Op::Affine && k % 2 == 1 && k + 1 < n.num_args && splittable(src, n, k)) {
        const Node& x = src.node(a[k + 1]);
        uint32_t c0 = 0;
        for (uint32_t q = 0; q < x.num_args; ++q) {
          const uint32_t piece = src.args(x)[q];
          const uint32_t rows = src.node(piece).dim.rows;
          args.push_back(body.add_parameter(column_view(pc, src.node(a[k]).aux, c0, rows).id));
          note(args.back(), UINT32_MAX, -1);
          args.push_back(map[piece]);
          c0 += rows;
        }
        ++k;
        continue;
      }
      args.push_back(map[a[k]]);
    }
    map[v] = body.add_node(n.op, n.dim, args.data(), static_cast<uint32_t>(args.size()), n.aux,
                           n.aux2, n.alpha, n.beta);
    note(map[v], p.source_slot[v], -1);
  }
  p.input_node.clear();
  for (uint32_t in : p.source_inputs) p.input_node.push_back(map[in]);  // UINT32_MAX if unused
  p.output_node.clear();
  for (uint32_t o : p.source_outputs) p.output_node.push_back(map[o]);
}

// Internal batching types: as the graph's, but GEMM weights only by shape ("any weights").
std::vector<uint32_t> local_types(const BlockPlan& p, uint32_t* count) {
  const Graph& g = *p.body;
  std::map<std::vector<uint32_t>, uint32_t> ids;
  std::vector<uint32_t> type(g.size(), UINT32_MAX), key;
  for (uint32_t v = 0; v < g.size(); ++v) {
    const Node& n = g.node(v);
    if (!is_scheduled(n.op)) continue;
    key = {static_cast<uint32_t>(n.op), n.dim.rows, n.dim.cols, n.num_args, float_bits(n.alpha),
           float_bits(n.beta), n.op == Op::Lookup || n.op == Op::SliceRows ? n.aux : 0u,
           p.slot[v] == UINT32_MAX ? n.aux2 : UINT32_MAX};
    const bool weights_any = n.op == Op::Affine || n.op == Op::MatMul;
    for (uint32_t k = 0; k < n.num_args; ++k) {
      const Node& a = g.node(g.args(n)[k]);
      const bool param = a.op == Op::Parameter;
      key.push_back(param ? (weights_any ? 1u : 2u + a.aux) : 0u);
      key.push_back(a.dim.rows);
      key.push_back(a.dim.cols);
    }
    type[v] = ids.emplace(key, static_cast<uint32_t>(ids.size())).first->second;
  }
  *count = static_cast<uint32_t>(ids.size());
  return type;
}

// The internal schedule: a sequence of types; each step runs every ready node of its type.
class BodySearch {
 public:
  BodySearch(const Graph& g, const std::vector<uint32_t>& type, uint32_t num_types)
      : type_(type), T_(num_types) {
    for (uint32_t v = 0; v < g.size(); ++v)
      if (is_scheduled(g.node(v).op)) nodes_.push_back(v);
    std::vector<uint32_t> local(g.size(), UINT32_MAX);
    for (uint32_t i = 0; i < nodes_.size(); ++i) local[nodes_[i]] = i;
    preds_.resize(nodes_.size());
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      const Node& n = g.node(nodes_[i]);
      for (uint32_t k = 0; k < n.num_args; ++k)
        if (local[g.args(n)[k]] != UINT32_MAX) preds_[i].push_back(local[g.args(n)[k]]);
    }
  }

  // Per-type longest chain: no schedule can use fewer steps.
  uint32_t lower_bound() const {
    const uint32_t N = static_cast<uint32_t>(nodes_.size());
    std::vector<uint32_t> chain(static_cast<size_t>(N) * T_, 0);
    uint32_t total = 0;
    std::vector<uint32_t> best(T_, 0);
    for (uint32_t i = 0; i < N; ++i) {
      uint32_t* c = &chain[static_cast<size_t>(i) * T_];
      for (uint32_t q : preds_[i])
        for (uint32_t t = 0; t < T_; ++t) c[t] = std::max(c[t], chain[static_cast<size_t>(q) * T_ + t]);
      ++c[type_[nodes_[i]]];
      for (uint32_t t = 0; t < T_; ++t) best[t] = std::max(best[t], c[t]);
    }
    for (uint32_t t = 0; t < T_; ++t) total += best[t];
    return total;
  }

  // Exact minimum over type choices (memoised on the set of done nodes) when the body has at most
  // 64 scheduled nodes and the search stays within budget; otherwise lowest-depth-first greedy.
  std::vector<std::vector<uint32_t>> run(bool* exact) {
    *exact = false;
    if (nodes_.size() <= 64) {
      budget_ = 200000;
      if (solve(0) != kFail) {
        *exact = true;
        return replay();
      }
    }
    return greedy();
  }

 private:
  static constexpr uint32_t kFail = UINT32_MAX;

  uint64_t ready_of(uint64_t done, uint32_t t) const {
    uint64_t r = 0;
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      if ((done >> i) & 1u || type_[nodes_[i]] != t) continue;
      bool ok = true;
      for (uint32_t q : preds_[i]) ok &= ((done >> q) & 1u) != 0;
      if (ok) r |= 1ull << i;
    }
    return r;
  }

  std::vector<uint32_t> ready_types(uint64_t done) const {
    std::vector<uint32_t> ts;
    for (uint32_t t = 0; t < T_; ++t)
      if (ready_of(done, t)) ts.push_back(t);
    return ts;
  }

  uint32_t solve(uint64_t done) {
    const uint64_t all = nodes_.size() == 64 ? ~0ull : (1ull << nodes_.size()) - 1;
    if (done == all) return 0;
    auto it = memo_.find(done);
    if (it != memo_.end()) return it->second.first;
    if (budget_-- == 0) return kFail;
    uint32_t best = kFail, choice = 0;
    for (uint32_t t : ready_types(done)) {
      const uint32_t r = solve(done | ready_of(done, t));
      if (r == kFail) return kFail;
      if (r + 1 < best) {
        best = r + 1;
        choice = t;
      }
    }
    memo_[done] = {best, choice};
    return best;
  }

  // The memoised choices from the start, as steps of body node ids.
  std::vector<std::vector<uint32_t>> replay() {
    std::vector<std::vector<uint32_t>> steps;
    const uint64_t all = nodes_.size() == 64 ? ~0ull : (1ull << nodes_.size()) - 1;
    for (uint64_t done = 0; done != all;) {
      const uint64_t r = ready_of(done, memo_.at(done).second);
      steps.emplace_back();
      for (uint32_t i = 0; i < nodes_.size(); ++i)
        if ((r >> i) & 1u) steps.back().push_back(nodes_[i]);
      done |= r;
    }
    return steps;
  }

  std::vector<std::vector<uint32_t>> greedy() {
    // Large bodies: node-level frontier without the 64-bit state.
    std::vector<std::vector<uint32_t>> steps;
    std::vector<uint8_t> done(nodes_.size(), 0);
    uint32_t left = static_cast<uint32_t>(nodes_.size());
    while (left > 0) {
      uint32_t pick_type = UINT32_MAX;
      for (uint32_t i = 0; i < nodes_.size() && pick_type == UINT32_MAX; ++i) {
        if (done[i]) continue;
        bool ok = true;
        for (uint32_t q : preds_[i]) ok &= done[q] != 0;
        if (ok) pick_type = type_[nodes_[i]];
      }
      std::vector<uint32_t> step;
      for (uint32_t i = 0; i < nodes_.size(); ++i) {
        if (done[i] || type_[nodes_[i]] != pick_type) continue;
        bool ok = true;
        for (uint32_t q : preds_[i]) ok &= done[q] != 0;
        if (ok) step.push_back(i);
      }
      for (uint32_t i : step) done[i] = 1;
      left -= static_cast<uint32_t>(step.size());
      steps.emplace_back();
      for (uint32_t i : step) steps.back().push_back(nodes_[i]);
    }
    return steps;
  }

  const std::vector<uint32_t>& type_;
  uint32_t T_;
  std::vector<uint32_t> nodes_;
  std::vector<std::vector<uint32_t>> preds_;
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> memo_;
  uint64_t budget_ = 0;
};

bool is_gemm(Op op) { return op == Op::Affine || op == Op::MatMul; }

// Weights of a batched GEMM step differ per member: store them stacked (bases of views).
bool stack_weights(BlockPlan& p, const std::vector<uint32_t>& members) {
  const Graph& g = *p.body;
  const Node& first = g.node(members[0]);
  bool differ = false;
  for (uint32_t k = 0; k < first.num_args; ++k) {
    if (g.node(g.args(first)[k]).op != Op::Parameter) continue;
    std::vector<uint32_t> ids;
    for (uint32_t m : members) ids.push_back(g.node(g.args(g.node(m))[k]).aux);
    bool same = true;
    for (uint32_t id : ids) same &= id == ids[0];
    if (same) continue;
    differ = true;
    std::vector<uint32_t> bases;
    for (uint32_t id : ids) {
      const uint32_t b = p.params->view_base(id);
      if (std::find(bases.begin(), bases.end(), b) == bases.end()) bases.push_back(b);
    }
    p.params->stack(bases);  // best effort: refused stacks still run as a loop of GEMMs
  }
  return differ;
}

// Orders each step's members so its consumers read them as views, consumers first.
void order_members(BlockPlan& p, std::vector<std::vector<uint32_t>>& steps) {
  const Graph& g = *p.body;
  std::vector<uint32_t> step_of(g.size(), UINT32_MAX), pos(g.size(), 0);
  for (uint32_t s = 0; s < steps.size(); ++s)
    for (uint32_t i = 0; i < steps[s].size(); ++i) {
      step_of[steps[s][i]] = s;
      pos[steps[s][i]] = i;
    }
  std::vector<std::vector<SequenceWant>> wants(steps.size());
  for (uint32_t s = static_cast<uint32_t>(steps.size()); s-- > 0;) {
    // Steps after s are ordered; their wants on s are complete.
    if (!wants[s].empty()) {
      const GroupOrder o = order_group(static_cast<uint32_t>(steps[s].size()), wants[s]);
      std::vector<uint32_t> ordered;
      for (uint32_t e : o.order) ordered.push_back(steps[s][e]);
      steps[s] = ordered;
      for (uint32_t i = 0; i < steps[s].size(); ++i) pos[steps[s][i]] = i;
    }
    const Node& first = g.node(steps[s][0]);
    for (uint32_t k = 0; k < first.num_args; ++k) {
      const uint32_t a0 = g.args(first)[k];
      const uint32_t producer = step_of[a0];
      if (producer == UINT32_MAX || steps[s].size() < 2) continue;
      SequenceWant w;
      bool one_step = true;
      for (uint32_t m : steps[s]) {
        const uint32_t a = g.args(g.node(m))[k];
        one_step &= step_of[a] == producer;
        w.elems.push_back(pos[a]);
      }
      std::vector<uint32_t> sorted = w.elems;
      std::sort(sorted.begin(), sorted.end());
      if (!one_step || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) continue;
      w.bytes = static_cast<uint64_t>(steps[s].size()) * g.node(a0).dim.size() * sizeof(float) *
                (is_gemm(first.op) ? 2 : 1);
      wants[producer].push_back(std::move(w));
    }
  }
}

// Moves elementwise steps later, past GEMM (and other non-elementwise) steps that do not read
// them: a step that would then sit just before the next elementwise run joins it (one fused
// group, so one launch fewer on a GPU), and a lone elementwise step between two GEMM steps
// moves out of their way (independent GEMM steps next to each other share a launch on a GPU).
// A step that ends an elementwise run stays unless it joins the next run, so no run is split
// into more groups. The order stays topological: a step moves only past steps that do not
// read it.
void gather_elementwise(const BlockPlan& p, std::vector<std::vector<uint32_t>>& steps) {
  const Graph& g = *p.body;
  auto elementwise = [&](size_t s) { return op_info(g.node(steps[s][0]).op).elementwise; };
  std::vector<uint8_t> in_step(g.size(), 0);
  auto reads = [&](size_t s) {  // step s has an argument marked in in_step
    for (uint32_t m : steps[s]) {
      const Node& n = g.node(m);
      for (uint32_t k = 0; k < n.num_args; ++k)
        if (in_step[g.args(n)[k]]) return true;
    }
    return false;
  };
  for (size_t i = 0; i + 1 < steps.size();) {
    if (elementwise(i) && !elementwise(i + 1)) {
      for (uint32_t m : steps[i]) in_step[m] = 1;
      size_t j = i + 1;
      while (j < steps.size() && !elementwise(j) && !reads(j)) ++j;
      for (uint32_t m : steps[i]) in_step[m] = 0;
      const bool joins = j < steps.size() && elementwise(j);
      const bool alone = i == 0 || !elementwise(i - 1);
      if (j > i + 1 && (joins || alone)) {
        std::rotate(steps.begin() + i, steps.begin() + i + 1, steps.begin() + j);
        if (i > 0) --i;  // the step before may now move too
        continue;
      }
    }
    ++i;
  }
}

void assign_layout(BlockPlan& p, const std::vector<std::vector<uint32_t>>& steps) {
  const Graph& g = *p.body;
  p.base.assign(g.size(), UINT32_MAX);
  p.members.clear();
  p.steps.clear();
  p.groups.clear();
  uint32_t cursor = 0;
  for (const auto& members : steps) {
    BlockStep st;
    st.op = g.node(members[0]).op;
    st.member_begin = static_cast<uint32_t>(p.members.size());
    st.member_count = static_cast<uint32_t>(members.size());
    st.stacked = is_gemm(st.op) && members.size() > 1 && stack_weights(p, members);
    st.group = 0;
    // Each step starts on 16 floats (64 bytes): with an aligned region, its k columns of member 0
    // (and of every member whose size is a multiple of 16) start aligned for vector kernels.
    cursor = (cursor + 15u) & ~15u;
    for (uint32_t m : members) {
      p.base[m] = cursor;
      cursor += g.node(m).dim.size();
      p.members.push_back(m);
    }
    p.steps.push_back(st);
  }
  p.floats_per_invocation = (cursor + 15u) & ~15u;
  // Elementwise runs become fused groups; GEMM steps stand alone.
  for (uint32_t s = 0; s < p.steps.size();) {
    uint32_t e = s + 1;
    if (op_info(p.steps[s].op).elementwise)
      while (e < p.steps.size() && op_info(p.steps[e].op).elementwise) ++e;
    const uint32_t group = static_cast<uint32_t>(p.groups.size());
    p.groups.push_back({s, e - s, e - s > 1});
    for (uint32_t i = s; i < e; ++i) p.steps[i].group = group;
    s = e;
  }
  // Internal operands: one view when the members' arguments are consecutive in member order.
  p.internal_views = p.internal_per_member = 0;
  for (const BlockStep& st : p.steps) {
    const Node& first = g.node(p.members[st.member_begin]);
    for (uint32_t k = 0; k < first.num_args; ++k) {
      if (p.base[g.args(first)[k]] == UINT32_MAX) continue;
      bool view = true;
      for (uint32_t j = 0; j < st.member_count; ++j) {
        const uint32_t a = g.args(g.node(p.members[st.member_begin + j]))[k];
        view &= p.base[a] != UINT32_MAX &&
                p.base[a] == p.base[g.args(first)[k]] + j * g.node(a).dim.size();
      }
      ++(view ? p.internal_views : p.internal_per_member);
    }
  }
}

}  // namespace

void compile_block(BlockPlan& p, const FreezeOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  rewrite(p);
  uint32_t num_types = 0;
  const std::vector<uint32_t> type = local_types(p, &num_types);
  BodySearch search(*p.body, type, num_types);
  p.lower_bound = search.lower_bound();
  std::vector<std::vector<uint32_t>> steps = search.run(&p.exact);
  gather_elementwise(p, steps);
  if (options.plan_layout) order_members(p, steps);
  assign_layout(p, steps);
  p.output_floats = 0;
  p.output_dims.clear();
  for (uint32_t o : p.output_node) {
    p.output_dims.push_back(p.body->node(o).dim);
    p.output_floats += p.output_dims.back().size();
  }
  p.freeze_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace edbatch
