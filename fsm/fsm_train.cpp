// The FSM policy trainer: a beam search bounded by the lower bound teaches the table first
// (imitation by majority vote per state), then tabular Q-learning with n-step returns and
// epsilon-greedy exploration refines it. Rollouts run on a replica of the scheduler's frontier
// (fsm_sim.h), in parallel over TBB, each with its own seeded generator, and updates are applied
// in rollout order, so a seed gives one result whatever the thread count. The table kept is the
// best by batches on the validation mini-batches.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "edbatch/fsm.h"
#include "edbatch/graph.h"
#include "edbatch/types.h"
#include "fsm/fsm_sim.h"

namespace edbatch {

namespace {

// The action "no entry: the fallback chooses", in Q tables and during the table search.
constexpr uint32_t kFallback = FsmTable::kNone - 1;

// Coordinate descent over the table on the training mini-batches: for each state the table
// visits (most visited first), try every ready type and "no entry" (the fallback), and keep a
// change when it lowers the total batches of the mini-batches that visit the state. Teaches the
// table what the teacher's plans cannot: one action per state that is best on average.
struct Visits {
  std::vector<std::vector<FsmKey>> keys;  // per graph: the states visited, in order
  std::vector<double> batches;  // costs
};

void visit(const TrainGraph& tg, const SimPolicy& p, std::vector<FsmKey>& keys, double& cost,
           std::vector<uint64_t>* options) {
  SimState s(tg.sim);
  SimScratch k;
  keys.clear();
  while (!s.finished()) {
    keys.push_back(s.key(p.encoding, k.keys));
    if (options) {
      uint64_t ready = 0;  // trainer indices < 64 only; others stay reachable through no entry
      for (uint32_t t : s.ready_types)
        if (tg.sim.index[t] < 64) ready |= 1ull << tg.sim.index[t];
      options->push_back(ready);
    }
    s.run(policy_choice(tg, s, p, k));
  }
  cost = s.cost;
}

FsmTable refine(const std::vector<TrainGraph>& tgs, FsmTable table, const FsmScorer* scorer,
                const FsmTrainOptions& o, const std::function<bool()>& out_of_time) {
  const size_t n = tgs.size();
  Visits v{std::vector<std::vector<FsmKey>>(n), std::vector<double>(n)};
  const SimPolicy policy{o.encoding, &table, scorer};
  auto rerun = [&](const std::vector<uint32_t>& which, std::vector<double>& batches,
                   std::vector<std::vector<FsmKey>>& keys) {
    tbb::parallel_for(size_t(0), which.size(), [&](size_t i) {
      visit(tgs[which[i]], policy, keys[i], batches[i], nullptr);
    });
  };
  // Later graphs may start visiting a state after its graph list was made, so a pass is only
  // mostly monotone: keep the best table seen at pass boundaries.
  FsmTable best_table = table;
  double best_total = HUGE_VAL;
  for (uint32_t pass = 0; pass <= o.refine_passes; ++pass) {
    // Index the states: which graphs visit them, how often, which actions are possible.
    std::vector<std::vector<uint64_t>> ready(n);
    tbb::parallel_for(size_t(0), n, [&](size_t i) {
      visit(tgs[i], policy, v.keys[i], v.batches[i], &ready[i]);
    });
    double total = 0;
    for (double b : v.batches) total += b;
    if (total < best_total) {
      best_total = total;
      best_table = table;
    }
    if (pass == o.refine_passes) break;
    std::unordered_map<FsmKey, std::pair<uint64_t, std::vector<uint32_t>>, FsmKeyHash> index;
    std::vector<FsmKey> order;
    for (uint32_t i = 0; i < n; ++i)
      for (size_t j = 0; j < v.keys[i].size(); ++j) {
        auto [it, is_new] = index.try_emplace(v.keys[i][j]);
        if (is_new) order.push_back(v.keys[i][j]);
        it->second.first |= ready[i][j];
        if (it->second.second.empty() || it->second.second.back() != i)
          it->second.second.push_back(i);
      }
    std::stable_sort(order.begin(), order.end(), [&](const FsmKey& a, const FsmKey& b) {
      return index[a].second.size() > index[b].second.size();
    });
    if (order.size() > o.refine_states) order.resize(o.refine_states);
    bool improved = false;
    std::vector<double> batches;
    std::vector<std::vector<FsmKey>> keys;
    for (const FsmKey& key : order) {
      if (out_of_time()) break;
      const auto& [mask, graphs] = index[key];
      double before = 0;
      for (uint32_t g : graphs) before += v.batches[g];
      const uint32_t current = table.find(key);
      std::vector<uint32_t> actions{kFallback};
      for (uint64_t m = mask; m; m &= m - 1) actions.push_back(__builtin_ctzll(m));
      uint32_t best_action = current == FsmTable::kNone ? kFallback : current;
      double best = before;
      for (uint32_t a : actions) {
        if (a == best_action) continue;
        table.insert(key, a);
        batches.resize(graphs.size());
        keys.resize(graphs.size());
        rerun(graphs, batches, keys);
        double after = 0;
        for (double b : batches) after += b;
        if (after < best) {
          best = after;
          best_action = a;
        }
      }
      table.insert(key, best_action);
      if (best < before) {
        improved = true;
        batches.resize(graphs.size());
        keys.resize(graphs.size());
        rerun(graphs, batches, keys);  // visits of other states change: refresh these graphs
        for (size_t i = 0; i < graphs.size(); ++i) v.batches[graphs[i]] = batches[i];
      }
    }
    if (!improved) break;
  }
  // "No entry" entries go: the fallback is what an absent state gets.
  FsmTable out;
  best_table.for_each([&](const FsmKey& k, uint32_t a) {
    if (a != kFallback) out.insert(k, a);
  });
  return out;
}

struct QEntry {
  uint32_t action;
  double q;
};
using QTable = std::unordered_map<FsmKey, std::vector<QEntry>, FsmKeyHash>;

const QEntry* best_entry(const std::vector<QEntry>& entries) {
  const QEntry* best = nullptr;
  for (const QEntry& e : entries)
    if (!best || e.q > best->q || (e.q == best->q && e.action < best->action)) best = &e;
  return best;
}

FsmTable greedy_table(const QTable& q) {
  FsmTable table;
  // Insert in key order so that equal Q tables give equal tables.
  std::vector<std::pair<FsmKey, uint32_t>> rows;
  for (const auto& [key, entries] : q)
    if (const QEntry* b = best_entry(entries); b && b->action != kFallback)
      rows.emplace_back(key, b->action);
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.first.lo != b.first.lo ? a.first.lo < b.first.lo : a.first.hi < b.first.hi;
  });
  for (const auto& [key, action] : rows) table.insert(key, action);
  return table;
}

struct Step {
  FsmKey key;
  uint32_t action;  // trainer type index
  double reward;
};

struct Rollout {
  std::vector<Step> steps;
  uint32_t batches = 0;
  double cost = 0;
};

Rollout rollout(const TrainGraph& tg, const QTable& q, const SimPolicy& p,
                const FsmTrainOptions& o, double epsilon, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  SimState s(tg.sim);
  SimScratch k;
  Rollout out;
  while (!s.finished()) {
    const FsmKey key = s.key(o.encoding, k.keys);
    const uint32_t fallback = fallback_choice(s, p, k);
    uint32_t t = UINT32_MAX;
    if (coin(rng) < epsilon) {
      t = s.ready_types[rng() % s.ready_types.size()];
    } else if (auto it = q.find(key); it != q.end()) {
      const QEntry* best = nullptr;
      for (const QEntry& e : it->second) {
        const uint32_t l = e.action == kFallback ? fallback : tg.local_of_index[e.action];
        if (l == UINT32_MAX || s.ready[l].empty()) continue;
        if (!best || e.q > best->q || (e.q == best->q && e.action < best->action)) best = &e;
      }
      if (best) t = best->action == kFallback ? fallback : tg.local_of_index[best->action];
    }
    if (t == UINT32_MAX) t = fallback;
    const double coverage = s.coverage(t);
    s.run(t);
    // 0 when the batch takes every critical node of its type (the bound allows no fuller batch);
    // with costs, scaled by the type's launch cost.
    const double reward = tg.sim.launch_cost[t] * (-1.0 + coverage);
    // The fallback's choice is learned as "no entry", so an action tried only by exploration
    // must beat it to enter the table.
    out.steps.push_back({key, t == fallback ? kFallback : tg.sim.index[t], reward});
  }
  out.batches = s.batches;
  out.cost = s.cost;
  return out;
}

// n-step Q-learning targets; a state the table has not seen bootstraps with the rollout's own
// remaining return (Monte Carlo) rather than an arbitrary initial value.
void update(QTable& q, const Rollout& r, const FsmTrainOptions& o) {
  const size_t T = r.steps.size();
  std::vector<double> to_go(T + 1, 0.0);
  for (size_t t = T; t-- > 0;) to_go[t] = r.steps[t].reward + o.gamma * to_go[t + 1];
  double gamma_n = 1;
  for (uint32_t i = 0; i < o.n_step; ++i) gamma_n *= o.gamma;
  for (size_t t = 0; t < T; ++t) {
    double target;
    if (t + o.n_step >= T) {
      target = to_go[t];
    } else {
      const size_t u = t + o.n_step;
      target = to_go[t] - gamma_n * to_go[u];
      auto it = q.find(r.steps[u].key);
      const QEntry* b = it == q.end() ? nullptr : best_entry(it->second);
      target += gamma_n * (b ? b->q : to_go[u]);
    }
    std::vector<QEntry>& entries = q[r.steps[t].key];
    auto e = std::find_if(entries.begin(), entries.end(),
                          [&](const QEntry& x) { return x.action == r.steps[t].action; });
    if (e == entries.end()) entries.push_back({r.steps[t].action, target});
    else e->q += o.alpha * (target - e->q);
  }
}

}  // namespace

FsmTrainResult train_fsm_policy(const std::vector<const Graph*>& train,
                                const std::vector<const Graph*>& validation,
                                const FsmTrainOptions& o,
                                const std::function<void(const FsmCurvePoint&)>& progress) {
  if (train.empty() || validation.empty())
    throw std::invalid_argument("[train_fsm_policy] no training or no validation mini-batches");
  if (o.beam_width == 0 || o.rollouts_per_round == 0 || o.n_step == 0)
    throw std::invalid_argument(
        "[train_fsm_policy] beam_width, rollouts_per_round and n_step must be positive");
  const TypeTable& types = train.front()->types();
  // The trainer's type indices: every scheduled type present, in type-id order.
  std::vector<uint32_t> index_of(types.size(), UINT32_MAX);
  for (const auto* list : {&train, &validation})
    for (const Graph* g : *list) {
      if (&g->types() != &types)
        throw std::invalid_argument(
            "[train_fsm_policy] all mini-batches must share one ParameterCollection");
      for (const Node& n : g->nodes())
        if (is_scheduled(n.op)) index_of[n.type] = 0;
    }
  FsmTrainResult result;
  FsmPolicyInfo& info = result.policy.info;
  info.encoding = o.encoding;
  for (uint32_t t = 0; t < index_of.size(); ++t) {
    if (index_of[t] == UINT32_MAX) continue;
    index_of[t] = static_cast<uint32_t>(info.types.size());
    info.types.push_back(types.name(t));
  }
  const uint32_t num_indices = static_cast<uint32_t>(info.types.size());
  // The scorer alone needs no keys: an encoding that names every type keeps the file valid.
  if (!o.table && num_indices > fsm_encoding_max_types(info.encoding))
    info.encoding = FsmEncoding::Sorted;
  if (num_indices > fsm_encoding_max_types(info.encoding))
    throw std::invalid_argument("[train_fsm_policy] " + std::to_string(num_indices) +
                                " types, more than encoding " + fsm_encoding_name(o.encoding) +
                                " supports (" +
                                std::to_string(fsm_encoding_max_types(o.encoding)) + ")");
  const auto start = std::chrono::steady_clock::now();
  const std::function<bool()> out_of_time = [&] {
    return (o.stop && o.stop()) ||
           (o.time_budget_s > 0 &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
                o.time_budget_s);
  };

  std::vector<TrainGraph> tgs, vgs;
  for (const Graph* g : train) tgs.emplace_back(*g, index_of, num_indices);
  for (const Graph* g : validation) vgs.emplace_back(*g, index_of, num_indices);
  if (!o.costs.empty())
    for (auto* list : {&tgs, &vgs})
      for (TrainGraph& tg : *list) tg.sim.set_costs(o.costs, info.types);
  uint64_t bound = 0;
  double bound_cost = 0;  // the cost of a schedule at the chain bound in every type
  for (const TrainGraph& v : vgs) {
    bound += v.sim.lower_bound;
    bound_cost += v.sim.bound_cost + v.sim.fixed_cost;
  }
  const double nv = static_cast<double>(vgs.size());
  info.validation_lower_bound = bound / nv;
  const SimPolicy encoding_only{info.encoding, nullptr, nullptr};

  // Candidates: lb-greedy alone, the scorer, the teacher's table, Q-learning's and the table
  // search's (the last three with the best fallback so far).
  FsmTable best_table;
  FsmScorer best_scorer;
  double best = evaluate(vgs, encoding_only);
  result.best_source = "lb-greedy";
  auto consider = [&](const FsmTable& table, const FsmScorer& scorer, double cost,
                      const char* source) {
    if (cost >= best) return;
    best = cost;
    best_table = table;
    best_scorer = scorer;
    result.best_source = source;
  };
  auto good_enough = [&] { return best <= (1.0 + o.early_stop) * bound_cost || out_of_time(); };
  // A learning-curve point for a candidate: its mean over the training mini-batches too.
  auto report = [&](const SimPolicy& p, double validation_total, const char* stage) {
    const double mean = evaluate(tgs, p) / tgs.size();
    FsmCurvePoint pt{stage, result.episodes_run, mean, validation_total / nv, bound_cost / nv};
    result.curve.push_back(pt);
    if (progress) progress(pt);
  };
  report(encoding_only, best, "lb-greedy");

  std::vector<std::vector<uint32_t>> plans;
  if (o.teacher && !good_enough()) {
    plans.resize(tgs.size());
    tbb::parallel_for(size_t(0), tgs.size(),
                      [&](size_t i) { plans[i] = beam_search(tgs[i], o.beam_width, out_of_time); });
    std::vector<uint32_t> val_plans(vgs.size());
    std::vector<double> val_costs(vgs.size());
    std::atomic<bool> cut{false};
    tbb::parallel_for(size_t(0), vgs.size(), [&](size_t i) {
      SimState s(vgs[i].sim);
      const std::vector<uint32_t> plan = beam_search(vgs[i], o.beam_width, out_of_time);
      if (plan.empty() && vgs[i].sim.num_nodes > 0) cut = true;
      for (uint32_t t : plan) s.run(t);
      val_plans[i] = s.batches;
      val_costs[i] = s.cost;
    });
    // A search cut short by the budget leaves no teacher: no plans to imitate or vote with.
    for (size_t i = 0; i < plans.size(); ++i)
      cut = cut || (plans[i].empty() && tgs[i].sim.num_nodes > 0);
    if (cut) {
      plans.clear();
    } else {
      uint64_t teacher_total = 0;
      for (uint32_t b : val_plans) teacher_total += b;
      result.teacher_batches = teacher_total / nv;
      for (double c : val_costs) result.teacher_cost += c / nv;
    }
  }
  if (o.scorer && !good_enough()) {
    const FsmScorer scorer =
        train_scorer(tgs, plans, num_indices, info.encoding, o, out_of_time);
    const SimPolicy p{info.encoding, nullptr, &scorer};
    const double v = evaluate(vgs, p);
    consider(FsmTable(), scorer, v, "scorer");
    report(p, v, "scorer");
  }
  // The tables' fallback: the scorer when it beat lb-greedy.
  const FsmScorer fallback = best_scorer;
  const SimPolicy with_fallback{info.encoding, nullptr, &fallback};

  QTable q;
  if (o.table && !plans.empty() && !good_enough()) {
    // Votes per state, in graph order.
    std::unordered_map<FsmKey, std::map<uint32_t, uint32_t>, FsmKeyHash> votes;
    KeyScratch k;
    for (size_t i = 0; i < tgs.size(); ++i) {
      SimState s(tgs[i].sim);
      for (uint32_t t : plans[i]) {
        ++votes[s.key(info.encoding, k)][tgs[i].sim.index[t]];
        s.run(t);
      }
    }
    for (const auto& [key, count] : votes) {
      const auto top = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) {
        return a.second < b.second;  // the first maximum: the lowest index among ties
      });
      std::vector<QEntry>& entries = q[key];
      for (const auto& [action, n] : count)
        entries.push_back({action, action == top->first ? 0.0 : -1.0});
    }
    const FsmTable table = greedy_table(q);
    const SimPolicy p{info.encoding, &table, &fallback};
    const double v = evaluate(vgs, p);
    consider(table, fallback, v, "teacher");
    report(p, v, "teacher");
  }

  std::mt19937_64 rng(o.seed);
  const uint32_t rounds =
      o.table ? (o.episodes + o.rollouts_per_round - 1) / o.rollouts_per_round : 0;
  std::vector<Rollout> rollouts;
  std::vector<uint32_t> picks;
  for (uint32_t round = 0; round < rounds && !good_enough(); ++round) {
    const uint32_t first = round * o.rollouts_per_round;
    const uint32_t count = std::min(o.rollouts_per_round, o.episodes - first);
    const double progress_frac = rounds > 1 ? double(round) / (rounds - 1) : 1.0;
    const double epsilon = o.epsilon_start + (o.epsilon_end - o.epsilon_start) * progress_frac;
    picks.resize(count);
    for (uint32_t& p : picks) p = static_cast<uint32_t>(rng() % tgs.size());
    rollouts.assign(count, {});
    tbb::parallel_for(uint32_t(0), count, [&](uint32_t r) {
      rollouts[r] = rollout(tgs[picks[r]], q, with_fallback, o, epsilon,
                            o.seed * 0x9E3779B97F4A7C15ull + first + r);
    });
    double mean = 0;
    for (const Rollout& r : rollouts) {
      update(q, r, o);
      mean += r.cost;
    }
    result.episodes_run = first + count;
    if ((round + 1) % std::max(o.eval_every, 1u) != 0 && round + 1 != rounds) continue;
    const FsmTable table = greedy_table(q);
    const double v = evaluate(vgs, {info.encoding, &table, &fallback});
    consider(table, fallback, v, "q-learning");
    FsmCurvePoint p{"q-learning", result.episodes_run, mean / count, v / nv, bound_cost / nv};
    result.curve.push_back(p);
    if (progress) progress(p);
  }

  if (o.table && o.refine_passes > 0 && !good_enough()) {
    const FsmTable table = refine(tgs, best_table, &fallback, o, out_of_time);
    const SimPolicy p{info.encoding, &table, &fallback};
    const double v = evaluate(vgs, p);
    consider(table, fallback, v, "search");
    report(p, v, "search");
  }
  result.validation_cost = best / nv;
  {
    // Batches of the kept policy (its cost is batches unless costs were given).
    double batches = 0;
    const SimPolicy kept{info.encoding, &best_table, &best_scorer};
    for (const TrainGraph& v : vgs) {
      SimState s(v.sim);
      SimScratch k;
      while (!s.finished()) s.run(policy_choice(v, s, kept, k));
      batches += s.batches;
    }
    info.validation_batches = batches / nv;
  }
  // Past the budget (or asked to stop) at the end: a stage was cut short or skipped on the way
  // (a budget once passed stays passed, and a stop once asked stays asked).
  result.out_of_time = out_of_time();
  result.policy.scorer = std::move(best_scorer);
  result.policy.costs = o.costs;
  result.policy.table = std::move(best_table);
  nlohmann::json settings = {{"encoding", fsm_encoding_name(o.encoding)},
                             {"episodes", o.episodes},
                             {"episodes_run", result.episodes_run},
                             {"rollouts_per_round", o.rollouts_per_round},
                             {"n_step", o.n_step},
                             {"alpha", o.alpha},
                             {"gamma", o.gamma},
                             {"epsilon_start", o.epsilon_start},
                             {"epsilon_end", o.epsilon_end},
                             {"teacher", o.teacher},
                             {"beam_width", o.beam_width},
                             {"refine_passes", o.refine_passes},
                             {"refine_states", o.refine_states},
                             {"early_stop", o.early_stop},
                             {"seed", o.seed},
                             {"training_minibatches", train.size()},
                             {"validation_minibatches", validation.size()},
                             {"scorer", o.scorer},
                             {"scorer_steps", o.scorer_steps},
                             {"scorer_search", o.scorer_search},
                             {"table", o.table},
                             {"time_budget_s", o.time_budget_s},
                             {"interrupted", o.stop && o.stop()},
                             {"reward", o.costs.empty() ? "batches" : "time on " + o.costs.device},
                             {"best", result.best_source}};
  info.training = settings.dump();
  return result;
}

}  // namespace edbatch
