#include "fsm/fsm_sim.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <random>
#include <unordered_set>

#include "edbatch/graph.h"
#include "edbatch/schedule.h"
#include "fsm/lb_greedy.h"

namespace edbatch {

SimGraph::SimGraph(const Graph& g, const std::vector<uint32_t>& index_of) {
  const uint32_t n = g.size();
  std::vector<uint32_t> compact(n, UINT32_MAX), local_of;
  std::vector<uint32_t> type_count;
  for (uint32_t v = 0; v < n; ++v) {
    const Node& nd = g.node(v);
    if (!is_scheduled(nd.op)) continue;
    compact[v] = num_nodes++;
    if (nd.type >= local_of.size()) local_of.resize(nd.type + 1, UINT32_MAX);
    if (local_of[nd.type] == UINT32_MAX) {
      local_of[nd.type] = num_types++;
      global.push_back(nd.type);
      index.push_back(nd.type < index_of.size() ? index_of[nd.type] : UINT32_MAX);
      type_count.push_back(0);
    }
    type.push_back(local_of[nd.type]);
    ++type_count[type.back()];
  }
  // Inputs, consumers (CSR) and depths in compact ids (compact order = graph order).
  pending.assign(num_nodes, 0);
  consumer_begin.assign(num_nodes + 1, 0);
  std::vector<uint32_t> depth(num_nodes, 0);
  std::vector<std::pair<uint32_t, uint32_t>> edges;  // (producer, consumer)
  for (uint32_t v = 0; v < n; ++v) {
    if (compact[v] == UINT32_MAX) continue;
    const Node& nd = g.node(v);
    const uint32_t* a = g.args(nd);
    uint32_t d = 0;
    for (uint32_t i = 0; i < nd.num_args; ++i) {
      const uint32_t p = scheduled_producer(g, a[i]);
      if (p == UINT32_MAX) continue;
      ++pending[compact[v]];
      ++consumer_begin[compact[p] + 1];
      edges.emplace_back(compact[p], compact[v]);
      d = std::max(d, depth[compact[p]]);
    }
    depth[compact[v]] = d + 1;
  }
  for (uint32_t v = 0; v < num_nodes; ++v) consumer_begin[v + 1] += consumer_begin[v];
  consumers.resize(edges.size());
  {
    std::vector<uint32_t> fill(consumer_begin.begin(), consumer_begin.end() - 1);
    for (const auto& [p, c] : edges) consumers[fill[p]++] = c;
  }
  // Chain heights per (node, local type), as the scheduler computes them.
  const uint32_t T = std::max(num_types, 1u);
  std::vector<uint32_t> chain(static_cast<size_t>(num_nodes) * T, 0);
  height.assign(num_nodes, 0);
  // Consumers have larger ids than their producers: one reverse pass pulls their chains in.
  for (uint32_t v = num_nodes; v-- > 0;) {
    uint32_t* hv = chain.data() + static_cast<size_t>(v) * T;
    for (uint32_t c = consumer_begin[v]; c < consumer_begin[v + 1]; ++c) {
      const uint32_t* hc = chain.data() + static_cast<size_t>(consumers[c]) * T;
      for (uint32_t t = 0; t < T; ++t) hv[t] = std::max(hv[t], hc[t]);
    }
    height[v] = ++hv[type[v]];
  }
  top.assign(num_types, 0);
  avg_depth.assign(num_types, 0.0);
  for (uint32_t v = 0; v < num_nodes; ++v) {
    top[type[v]] = std::max(top[type[v]], height[v]);
    avg_depth[type[v]] += depth[v];
  }
  level_base.assign(num_types, 0);
  uint32_t total = 0;
  for (uint32_t t = 0; t < num_types; ++t) {
    level_base[t] = total;
    total += top[t] + 1;
    avg_depth[t] /= type_count[t];
    lower_bound += top[t];
  }
  remaining_at.assign(total, 0);
  for (uint32_t v = 0; v < num_nodes; ++v) ++remaining_at[level_base[type[v]] + height[v]];
  std::mt19937_64 rng(0x5eed);
  zobrist.resize(num_nodes);
  for (uint64_t& z : zobrist) z = rng();
  launch_cost.assign(num_types, 1.0);
  node_cost.assign(num_types, 0.0);
  bound_cost = lower_bound;
}

void SimGraph::set_costs(const FsmCostModel& costs, const std::vector<std::string>& names) {
  bound_cost = 0;
  for (uint32_t t = 0; t < num_types; ++t) {
    const FsmTypeCost c = costs.of(names.at(index[t]));
    launch_cost[t] = c.launch_us;
    node_cost[t] = c.node_us;
    bound_cost += top[t] * c.launch_us;
  }
  fixed_cost = 0;
  chain = costs.chain;
  batch_cost = chain ? costs.batch_us : 0.0;
  if (chain) {  // per node, the longest path from it to a sink; consumers have larger ids
    std::vector<double> tail(num_nodes, 0.0);
    bound_cost = 0;
    for (uint32_t v = num_nodes; v-- > 0;) {
      double after = 0;
      for (uint32_t c = consumer_begin[v]; c < consumer_begin[v + 1]; ++c)
        after = std::max(after, tail[consumers[c]]);
      tail[v] = launch_cost[type[v]] + node_cost[type[v]] + after;
      bound_cost = std::max(bound_cost, tail[v]);
    }
    bound_cost += batch_cost * lower_bound;
    return;
  }
  for (uint32_t v = 0; v < num_nodes; ++v) fixed_cost += node_cost[type[v]];
}

SimState::SimState(const SimGraph& graph)
    : g(&graph),
      pending(graph.pending),
      ready(graph.num_types),
      ready_at(graph.remaining_at.size(), 0),
      remaining_at(graph.remaining_at),
      top(graph.top),
      bound_left(graph.lower_bound),
      bound_cost_left(graph.bound_cost) {
  if (graph.chain) start_at.assign(graph.num_nodes, 0.0);
  for (uint32_t v = 0; v < graph.num_nodes; ++v) {
    if (pending[v] != 0) continue;
    const uint32_t t = graph.type[v];
    if (ready[t].empty()) ready_types.push_back(t);
    ready[t].push_back(v);
    ++ready_at[graph.level_base[t] + graph.height[v]];
  }
}

uint32_t SimState::run(uint32_t t) {
  std::vector<uint32_t> nodes;
  nodes.swap(ready[t]);
  ready_types.erase(std::find(ready_types.begin(), ready_types.end(), t));
  const uint32_t base = g->level_base[t];
  for (uint32_t v : nodes) {
    --remaining_at[base + g->height[v]];
    --ready_at[base + g->height[v]];
    hash ^= g->zobrist[v];
  }
  while (top[t] > 0 && remaining_at[base + top[t]] == 0) {
    --top[t];
    --bound_left;
    bound_cost_left -= g->launch_cost[t];
  }
  const uint32_t count = static_cast<uint32_t>(nodes.size());
  const double took = g->launch_cost[t] + g->node_cost[t] * count;
  double finish = 0;
  if (g->chain) {
    for (uint32_t v : nodes) finish = std::max(finish, start_at[v]);
    finish += took;
    end = std::max(end, finish);
    cost = end + g->batch_cost * (batches + 1);
  } else {
    cost += took;
  }
  for (uint32_t v : nodes) {
    for (uint32_t c = g->consumer_begin[v]; c < g->consumer_begin[v + 1]; ++c) {
      const uint32_t w = g->consumers[c];
      if (g->chain) start_at[w] = std::max(start_at[w], finish);
      if (--pending[w] != 0) continue;
      const uint32_t tw = g->type[w];
      if (ready[tw].empty()) ready_types.push_back(tw);
      ready[tw].push_back(w);
      ++ready_at[g->level_base[tw] + g->height[w]];
    }
  }
  ++batches;
  done += count;
  nodes.clear();
  if (ready[t].empty()) ready[t].swap(nodes);  // keep the capacity
  return count;
}

double SimState::least_cost() const {
  return cost + bound_cost_left;
}

uint32_t SimState::lb_greedy() const {
  LbGreedyChoice best;
  for (uint32_t t : ready_types) best.offer(t, g->global[t], coverage(t), g->avg_depth[t]);
  return best.type;
}

uint32_t SimState::scored(const FsmScorer& s, std::vector<ReadyView>& views,
                         std::vector<double>& features) const {
  const uint32_t r = static_cast<uint32_t>(ready_types.size());
  views.resize(r);
  features.resize(static_cast<size_t>(r) * kFsmFeatures);
  for (uint32_t i = 0; i < r; ++i) {
    const uint32_t t = ready_types[i];
    views[i] = {t,
                g->global[t],
                g->index[t],
                static_cast<uint32_t>(ready[t].size()),
                critical_ready(t),
                critical_total(t),
                top[t],
                g->avg_depth[t]};
  }
  return views[fsm_score_choice(s, views.data(), r, features.data())].type;
}

FsmKey SimState::key(FsmEncoding e, KeyScratch& k) const {
  const uint32_t r = static_cast<uint32_t>(ready_types.size());
  k.ids.resize(r);
  k.counts.resize(r);
  k.levels.resize(r);
  k.order.resize(r);
  for (uint32_t i = 0; i < r; ++i) {
    const uint32_t t = ready_types[i];
    k.ids[i] = g->index[t];
    k.counts[i] = static_cast<uint32_t>(ready[t].size());
    k.levels[i] = fsm_coverage_level(critical_ready(t), critical_total(t));
  }
  return fsm_encode(e, k.ids.data(), k.counts.data(), k.levels.data(), r, k.order.data());
}

}  // namespace edbatch

namespace edbatch {

uint32_t fallback_choice(const SimState& s, const SimPolicy& p, SimScratch& k) {
  return p.scorer && !p.scorer->empty() ? s.scored(*p.scorer, k.views, k.features)
                                        : s.lb_greedy();
}

uint32_t policy_choice(const TrainGraph& tg, const SimState& s, const SimPolicy& p,
                       SimScratch& k) {
  if (p.table && p.table->size() > 0) {
    const uint32_t a = p.table->find(s.key(p.encoding, k.keys));
    if (a != FsmTable::kNone && a < tg.local_of_index.size()) {
      const uint32_t t = tg.local_of_index[a];
      if (t != UINT32_MAX && !s.ready[t].empty()) return t;
    }
  }
  return fallback_choice(s, p, k);
}

double run_policy(const TrainGraph& tg, const SimPolicy& p) {
  SimState s(tg.sim);
  SimScratch k;
  while (!s.finished()) s.run(policy_choice(tg, s, p, k));
  return s.cost;
}

double evaluate(const std::vector<TrainGraph>& graphs, const SimPolicy& p) {
  std::vector<double> cost(graphs.size());
  tbb::parallel_for(size_t(0), graphs.size(),
                    [&](size_t i) { cost[i] = run_policy(graphs[i], p); });
  double total = 0;
  for (double c : cost) total += c;
  return total;
}

std::vector<uint32_t> beam_search(const TrainGraph& tg, uint32_t width,
                                  const std::function<bool()>& stop) {
  // Chain costs: a bound such as the longest chain through the ready nodes stays the same for
  // most choices (they add batches beside it), so the beam would rank by its tie-breaks. There
  // a candidate is ranked by the cost of lb-greedy's schedule from it on.
  SimState completion(tg.sim);
  auto rank = [&](const SimState& c) {
    if (!tg.sim.chain) return c.least_cost();
    completion = c;
    while (!completion.finished()) completion.run(completion.lb_greedy());
    return completion.cost;
  };
  struct Entry {
    uint32_t parent, action;
  };
  std::vector<std::vector<Entry>> levels;
  std::vector<SimState> beam{SimState(tg.sim)}, next;
  struct Candidate {
    double key;  // rank() (the cost when finished)
    uint32_t left, parent, action;
    uint64_t hash;
  };
  std::vector<Candidate> cand;
  std::unordered_set<uint64_t> seen;
  // A finished state stays in the beam (action UINT32_MAX) until none ranks above it.
  while (!beam.front().finished()) {
    if (stop && stop()) return {};
    cand.clear();
    for (uint32_t i = 0; i < beam.size(); ++i) {
      // Each entry ranks every ready type by a schedule finished with lb-greedy: on a large
      // graph one step of the search takes seconds, so stopping is checked per entry.
      if (i > 0 && stop && stop()) return {};
      if (beam[i].finished()) {
        cand.push_back({beam[i].cost, 0, i, UINT32_MAX, beam[i].hash});
        continue;
      }
      for (uint32_t t : beam[i].ready_types) {
        SimState c = beam[i];
        c.run(t);
        cand.push_back({rank(c), tg.sim.num_nodes - c.done, i, t, c.hash});
      }
    }
    std::sort(cand.begin(), cand.end(), [](const Candidate& a, const Candidate& b) {
      if (a.key != b.key) return a.key < b.key;
      if (a.left != b.left) return a.left < b.left;
      if (a.hash != b.hash) return a.hash < b.hash;
      return a.parent < b.parent;
    });
    seen.clear();
    next.clear();
    levels.emplace_back();
    for (const Candidate& c : cand) {
      if (next.size() == width) break;
      if (!seen.insert(c.hash).second) continue;
      next.push_back(beam[c.parent]);
      if (c.action != UINT32_MAX) next.back().run(c.action);
      levels.back().push_back({c.parent, c.action});
    }
    beam.swap(next);
  }
  std::vector<uint32_t> plan;
  for (uint32_t l = static_cast<uint32_t>(levels.size()), i = 0; l-- > 0;) {
    if (levels[l][i].action != UINT32_MAX) plan.push_back(levels[l][i].action);
    i = levels[l][i].parent;
  }
  std::reverse(plan.begin(), plan.end());
  SimState greedy(tg.sim);
  std::vector<uint32_t> greedy_plan;
  while (!greedy.finished()) {
    greedy_plan.push_back(greedy.lb_greedy());
    greedy.run(greedy_plan.back());
  }
  return greedy.cost < beam.front().cost ? greedy_plan : plan;
}

}  // namespace edbatch
