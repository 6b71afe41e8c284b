// Incremental forward: a graph that grows between forwards runs only its new nodes; values and
// the gradients of one backward at the end equal those of the same graph built and run whole (and
// finite differences), for every policy, learned ones included, op by op and with blocks; the
// arena stops growing over a decoding loop; misuse is a clear error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/engine.h"
#include "edbatch/fsm.h"
#include "edbatch/optim.h"
#include "tests/check.h"
#include "tests/reference.h"
#include "tests/step_net.h"

using namespace edbatch;
using edbatch::testing::check_close;
using edbatch::testing::Reference;

namespace {

constexpr uint32_t H = 5, X = 3, V = 7;

// The step (h' = tanh(W h + U E[word] + b), as a block and op by op) and Wx for the first state.
struct Weights : edbatch::testing::StepNet {
  Parameter Wx;
  explicit Weights(ParameterCollection& pc) : StepNet(pc, H, V) {
    Wx = pc.add_parameters("Wx", Dim{H, X});
  }
};

Weights make_weights(ParameterCollection& pc) {
  return Weights(pc);
}

// A decoder-like mini-batch built step by step: instance i starts from an input x_i, runs
// steps[i] steps (op by op or through the block, by a coin per step) and adds a loss per step.
// The words fed back come from `word(i, t)`. Calls `between(g, loss nodes so far)` after every
// round of steps, where an incremental forward runs.
struct Builder {
  const Weights& w;
  std::vector<uint32_t> steps;
  uint64_t seed;

  template <class Between>
  Expr build(Graph& g, Between between) const {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    const size_t n = steps.size();
    std::vector<Expr> h(n), losses;
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> x(X);
      for (float& v : x) v = u(rng);
      const Expr xi = input(g, Dim{X, 1}, x);
      h[i] = tanh(affine({parameter(g, w.b), parameter(g, w.Wx), xi}));
    }
    uint32_t max_steps = 0;
    for (uint32_t s : steps) max_steps = std::max(max_steps, s);
    for (uint32_t t = 0; t < max_steps; ++t) {
      for (size_t i = 0; i < n; ++i) {
        if (t >= steps[i]) continue;
        const uint32_t word = static_cast<uint32_t>(rng() % V);
        if (rng() % 2) {
          Expr out;
          w.cell->call(g, &h[i], 1, &word, 1, &out);
          h[i] = out;
        } else {
          h[i] = tanh(affine({parameter(g, w.b), parameter(g, w.W), h[i], parameter(g, w.U),
                              lookup(g, w.E, word)}));
        }
        if (rng() % 3 == 0) {  // an input added mid-way
          std::vector<float> x(H);
          for (float& v : x) v = u(rng);
          h[i] = cmult(h[i], input(g, Dim{H, 1}, x));
        }
        losses.push_back(pick_neg_log_softmax(matmul(parameter(g, w.Wo), h[i]),
                                              static_cast<uint32_t>(rng() % V)));
      }
      between(g, losses);
    }
    return sum_losses(losses);
  }
};

std::vector<float> value_of(const Engine& e, Graph& g, uint32_t id) {
  return as_vector(e.value(g.expr(id)));
}

bool computed(const Graph& g, uint32_t id) {
  const Op op = g.node(id).op;
  return op != Op::Parameter && op != Op::Call;
}

struct Result {
  std::vector<std::vector<float>> values;  // per node (empty for parameters and calls)
  std::vector<std::vector<float>> grads;   // per parameter
  uint64_t batches = 0;
};

Result collect(Engine& e, Graph& g, const Expr& loss, ParameterCollection& pc) {
  Result r;
  for (uint32_t v = 0; v < g.size(); ++v)
    r.values.push_back(computed(g, v) ? value_of(e, g, v) : std::vector<float>{});
  e.backward(g, loss);
  for (uint32_t p = 0; p < pc.size(); ++p)
    r.grads.emplace_back(pc.grads(p), pc.grads(p) + pc.dim(p).size());
  pc.zero_grads();
  r.batches = e.stats().batches;
  return r;
}

void check_same(const Result& a, const Result& b, const std::string& what) {
  REQUIRE(a.values.size() == b.values.size());
  for (size_t v = 0; v < a.values.size(); ++v)
    if (!a.values[v].empty())
      check_close(a.values[v], b.values[v], a.values[v].size(), 1e-5,
                  what + ": value of node " + std::to_string(v));
  for (size_t p = 0; p < a.grads.size(); ++p)
    check_close(a.grads[p], b.grads[p], a.grads[p].size(), 1e-5,
                what + ": gradient of parameter " + std::to_string(p));
}

std::unique_ptr<Policy> policy_for(const std::string& name, const FsmPolicyData* learned) {
  if (name == "fsm") return std::make_unique<FsmPolicy>(*learned);
  return make_policy(name);
}

}  // namespace

TEST_CASE("incremental: values and gradients equal the graph built whole, every policy") {
  ParameterCollection pc(17);
  const Weights w = make_weights(pc);
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 3; ++trial) {
    Builder b{w, {}, 100 + static_cast<uint64_t>(trial)};
    const uint32_t n = trial == 0 ? 1 : 7 + 6 * trial;  // 1, 13, 19 instances
    for (uint32_t i = 0; i < n; ++i) b.steps.push_back(1 + static_cast<uint32_t>(rng() % 9));

    // A learned policy trained on the whole graph: increments meet states it never saw.
    Graph whole_for_fsm(pc);
    b.build(whole_for_fsm, [](Graph&, const std::vector<Expr>&) {});
    FsmTrainOptions fo;
    fo.episodes = 16;
    fo.rollouts_per_round = 8;
    fo.refine_passes = 1;
    fo.refine_states = 100;
    const FsmPolicyData learned =
        train_fsm_policy({&whole_for_fsm}, {&whole_for_fsm}, fo).policy;

    for (const std::string policy : {"none", "depth", "agenda", "lb-greedy", "fsm"}) {
      for (int threads : {1, 2}) {
        CAPTURE(trial);
        CAPTURE(policy);
        CAPTURE(threads);
        EngineOptions o;
        o.threads = threads;
        o.min_parallel_work = 1;
        Engine whole_engine(pc, policy_for(policy, &learned), o);
        Graph whole(pc);
        const Expr whole_loss = b.build(whole, [](Graph&, const std::vector<Expr>&) {});
        whole_engine.forward(whole, whole_loss);
        const Result expected = collect(whole_engine, whole, whole_loss, pc);

        Engine inc_engine(pc, policy_for(policy, &learned), o);
        Graph g(pc);
        std::vector<std::pair<uint32_t, std::vector<float>>> read;  // values read on the way
        uint32_t increments = 0;
        const Expr loss = b.build(g, [&](Graph& gg, const std::vector<Expr>& losses) {
          const uint32_t before = gg.size();
          inc_engine.forward(gg, losses.back());
          ++increments;
          for (uint32_t v = before > 40 ? before - 40 : 0; v < gg.size(); ++v)
            if (computed(gg, v)) read.emplace_back(v, value_of(inc_engine, gg, v));
        });
        inc_engine.forward(g, loss);
        CHECK(inc_engine.plan().segments.size() == increments + 1);
        validate_schedule(g, inc_engine.schedule());
        // Each segment meets its own bound at best, so the schedule is never below the sum.
        CHECK(inc_engine.stats().batches >= inc_engine.stats().lower_bound);
        CHECK(inc_engine.stats().nodes == expected.values.size() - [&] {
          uint32_t sources = 0;
          for (uint32_t v = 0; v < g.size(); ++v) sources += !is_scheduled(g.node(v).op);
          return sources;
        }());
        if (policy == "fsm") {
          const Stats& s = inc_engine.stats();
          CHECK(s.policy_hits + s.policy_misses == s.batches);
          CHECK(s.policy_misses > 0);
          // Every segment's unseen states count, those the scorer decided too.
          CHECK(s.policy_scored == (learned.scorer.empty() ? 0 : s.policy_misses));
        }
        for (const auto& [v, values] : read)
          check_close(values, expected.values[v], values.size(), 1e-5,
                      "value read after its increment, node " + std::to_string(v));
        check_same(collect(inc_engine, g, loss, pc), expected, "incremental vs whole");
      }
    }
  }
}

// On the GPU an increment uploads only its own segment's plan metadata, and a backward after
// increments the whole plan's; values come to the host one by one or many at once (fetch, read).
// Values read right after their increment and the gradients (of two backward passes in a row, then
// of a whole forward on the same engines) equal the CPU's.
TEST_CASE("incremental: on the GPU, values and gradients equal the CPU's" *
          doctest::skip(!device_unavailable("cuda").empty())) {
  ParameterCollection pc_cpu(19), pc_gpu(19);
  const Weights w_cpu = make_weights(pc_cpu), w_gpu = make_weights(pc_gpu);
  constexpr double kTol = 2e-4;  // float32, summed in another order
  auto check_grads = [&](const std::string& what) {
    for (uint32_t p = 0; p < pc_cpu.size(); ++p)
      check_close(pc_gpu.grads(p), pc_cpu.grads(p), pc_cpu.dim(p).size(), kTol,
                  what + ": gradient of " + pc_cpu.name(p));
    pc_cpu.zero_grads();
    pc_gpu.zero_grads();
  };
  for (uint64_t seed : {21, 22, 23}) {
    std::mt19937_64 rng(seed);
    // 64 instances: an arena of several of the host mirror's chunks.
    std::vector<uint32_t> steps(seed == 21 ? 1 : seed == 22 ? 11 : 64);
    for (uint32_t& s : steps) s = 1 + static_cast<uint32_t>(rng() % 9);
    for (const std::string policy : {"none", "lb-greedy"}) {
      CAPTURE(seed);
      CAPTURE(policy);
      const Builder bc{w_cpu, steps, seed}, bg{w_gpu, steps, seed};
      Engine cpu(pc_cpu, EngineOptions{policy, "cpu", 1});
      // Under lb-greedy the chained stages always wait for what they read, the backward passes'
      // stages for batches of earlier increments too; otherwise Auto (in order for increments).
      EngineOptions go{policy, "cuda", 1};
      if (policy == "lb-greedy") go.cuda.stage_waits = CudaOptions::StageWaits::Always;
      Engine gpu(pc_gpu, go);
      Graph gc(pc_cpu), gg(pc_gpu);
      std::vector<std::pair<uint32_t, std::vector<float>>> read;
      const Expr lc = bc.build(gc, [&](Graph& g, const std::vector<Expr>& l) {
        cpu.forward(g, l.back());
      });
      int way = 0;
      const Expr lg = bg.build(gg, [&](Graph& g, const std::vector<Expr>& l) {
        const uint32_t before = g.size();
        gpu.forward(g, l.back());
        // In turn, an increment's values come to the host one by one (value), at once first
        // (Engine::fetch), or copied out at once (Engine::read, each into its own buffer).
        std::vector<Expr> exprs;
        for (uint32_t v = before > 30 ? before - 30 : 0; v < g.size(); ++v)
          if (computed(g, v)) exprs.push_back(g.expr(v));
        way = (way + 1) % 3;
        if (way == 1) gpu.fetch(exprs);
        if (way == 2) {
          std::vector<std::vector<float>> bufs;
          std::vector<float*> outs;
          for (const Expr& e : exprs) bufs.emplace_back(g.node(e.id).dim.size());
          for (std::vector<float>& b : bufs) outs.push_back(b.data());
          gpu.read(exprs, 1, outs.data());
          for (size_t i = 0; i < exprs.size(); ++i) read.emplace_back(exprs[i].id, bufs[i]);
          return;
        }
        for (const Expr& e : exprs) read.emplace_back(e.id, value_of(gpu, g, e.id));
      });
      cpu.forward(gc, lc);
      gpu.forward(gg, lg);
      CHECK(gpu.plan().segments.size() > 1);
      for (const auto& [v, values] : read)
        check_close(values, value_of(cpu, gc, v), values.size(), kTol,
                    "value read after its increment, node " + std::to_string(v));
      // Read again after the last increment, fetched at once after value() has waited for the
      // device: host copies made earlier are kept, the rest copied now.
      std::vector<Expr> all;
      for (uint32_t v = 0; v < gg.size(); ++v)
        if (computed(gg, v)) all.push_back(gg.expr(v));
      CHECK(std::isfinite(as_scalar(gpu.value(lg))));
      // Values far apart come chunk by chunk; a span of many, into pinned memory of its own
      // (again and again within one pass: past the few such buffers, chunk by chunk again).
      const std::vector<Expr> apart = {all.front(), all[all.size() / 2], all.back()};
      gpu.fetch(apart);
      for (int again = 0; again < 6; ++again) gpu.fetch(all);
      for (const Expr& e : all)
        check_close(value_of(gpu, gg, e.id), value_of(cpu, gc, e.id), gg.node(e.id).dim.size(),
                    kTol, "value after the last increment, node " + std::to_string(e.id));
      for (int pass = 0; pass < 2; ++pass) {
        cpu.backward(gc, lc);
        gpu.backward(gg, lg);
      }
      check_grads("two backward passes after increments");
      gc.clear();
      gg.clear();
      const Expr wc = bc.build(gc, [](Graph&, const std::vector<Expr>&) {});
      const Expr wg = bg.build(gg, [](Graph&, const std::vector<Expr>&) {});
      check_close(as_vector(gpu.forward(gg, wg)), as_vector(cpu.forward(gc, wc)), 1, kTol,
                  "loss of the graph run whole");
      cpu.backward(gc, wc);
      gpu.backward(gg, wg);
      check_grads("whole graph after increments");
    }
  }
}

TEST_CASE("incremental: forward_through runs a prefix and the rest runs later, every policy") {
  ParameterCollection pc(23);
  const Weights w = make_weights(pc);
  const Builder b{w, {3, 7, 1, 5, 9, 2, 6, 4, 8, 5, 3}, 77};
  for (const std::string policy : {"none", "depth", "agenda", "lb-greedy"}) {
    for (int threads : {1, 2}) {
      CAPTURE(policy);
      CAPTURE(threads);
      EngineOptions o;
      o.threads = threads;
      o.min_parallel_work = 1;
      Engine whole_engine(pc, make_policy(policy), o);
      Graph whole(pc);
      const Expr whole_loss = b.build(whole, [](Graph&, const std::vector<Expr>&) {});
      whole_engine.forward(whole, whole_loss);
      const Result expected = collect(whole_engine, whole, whole_loss, pc);

      Engine e(pc, make_policy(policy), o);
      Graph g(pc);
      std::mt19937_64 pick(9);
      uint32_t covered = 0, partial = 0;
      const Expr loss = b.build(g, [&](Graph& gg, const std::vector<Expr>& losses) {
        // Through a loss of this round or an earlier one: the nodes after it wait.
        const Expr through = losses[pick() % losses.size()];
        const float v = as_scalar(e.forward_through(gg, through));
        CHECK(v == doctest::Approx(expected.values[through.id][0]).epsilon(1e-5));
        covered = std::max(covered, through.id + 1);
        for (uint32_t n = through.id > 30 ? through.id - 30 : 0; n <= through.id; ++n)
          if (computed(gg, n))
            check_close(
                value_of(e, gg, n), expected.values[n], expected.values[n].size(), 1e-5,
                "value through node " + std::to_string(through.id) + ", node " + std::to_string(n));
        if (gg.size() > covered) {
          ++partial;
          CHECK_THROWS_WITH_AS(e.value(gg.expr(gg.size() - 1)), doctest::Contains("has not run"),
                               std::invalid_argument);
        }
      });
      CHECK(partial > 0);  // some calls stopped short of the graph's end
      // Backward needs every node run; the vector form runs through the latest expression.
      CHECK_THROWS_WITH_AS(e.backward(g, loss), doctest::Contains("have not run"),
                           std::invalid_argument);
      e.forward_through(g, std::vector<Expr>{g.expr(covered - 1), loss, g.expr(0)});
      check_same(collect(e, g, loss, pc), expected, "forward_through vs whole");
      CHECK(e.plan().segments.size() > 2);
    }
  }
}

// A pass that fails inside the engine (EngineOptions::fail_forward_at: before its kernels, as a
// backend that fails there) throws naming the call and the pass; the values before it stay
// readable, the same forward again runs what the failed one did not, and the values and gradients
// end as the graph built whole gives them. Every pass in turn fails once, on every device here;
// with a failed backward (fail_backward_at) first, too.
TEST_CASE("incremental: a pass that fails inside the engine can be run again") {
  ParameterCollection pc(29);
  const Weights w = make_weights(pc);
  const Builder b{w, {4, 1, 6, 3, 5, 2, 6}, 31};
  Engine whole_engine(pc, make_policy("lb-greedy"));
  Graph whole(pc);
  const Expr whole_loss = b.build(whole, [](Graph&, const std::vector<Expr>&) {});
  whole_engine.forward(whole, whole_loss);
  const Result expected = collect(whole_engine, whole, whole_loss, pc);
  const uint64_t passes = 1 + *std::max_element(b.steps.begin(), b.steps.end());
  for (const std::string device : {"cpu", "cuda"}) {
    if (!device_unavailable(device).empty()) continue;
    for (uint64_t fail = 1; fail <= passes; ++fail) {
      CAPTURE(device);
      CAPTURE(fail);
      EngineOptions o{"lb-greedy", device, 1};
      o.fail_forward_at = fail;
      o.fail_backward_at = fail % 2;  // every other engine's first backward fails too
      Engine e(pc, make_policy("lb-greedy"), o);
      Graph g(pc);
      uint64_t pass = 0, failures = 0;
      uint32_t ran = 0;  // nodes that had run before the pass that failed
      const auto run = [&](Graph& gg, const Expr& through) {
        if (++pass == fail) {
          const std::string failed =
              "[Engine::forward] forward pass " + std::to_string(fail) + " failed: injected";
          CHECK_THROWS_WITH_AS(e.forward(gg, through), doctest::Contains(failed.c_str()),
                               std::runtime_error);
          ++failures;
          for (uint32_t v = 0; v < ran; ++v)
            if (computed(gg, v))
              check_close(value_of(e, gg, v), expected.values[v], expected.values[v].size(), 1e-5,
                          "value before the failed pass, node " + std::to_string(v));
        }
        const float v = as_scalar(e.forward(gg, through));
        CHECK(v == doctest::Approx(expected.values[through.id][0]).epsilon(1e-5));
        ran = gg.size();
      };
      const Expr loss =
          b.build(g, [&](Graph& gg, const std::vector<Expr>& losses) { run(gg, losses.back()); });
      run(g, loss);
      CHECK(pass == passes);
      CHECK(failures == 1);
      if (o.fail_backward_at == 1) {  // it adds to no gradient, and the next backward is right
        CHECK_THROWS_WITH_AS(e.backward(g, loss),
                             "[Engine::backward] backward pass 1 failed: injected "
                             "(EngineOptions::fail_backward_at)",
                             std::runtime_error);
        for (uint32_t p = 0; p < pc.size(); ++p)
          for (uint32_t k = 0; k < pc.dim(p).size(); ++k) REQUIRE(pc.grads(p)[k] == 0.0f);
      }
      check_same(collect(e, g, loss, pc), expected, "after a failed pass, vs whole");
    }
  }
}

// Engine::read copies the values of groups of expressions, each group into its own buffer, as
// value() gives them one by one: after each increment, every computed node so far and a
// parameter, in groups of several sizes.
TEST_CASE("incremental: read copies groups of values as value() gives them") {
  ParameterCollection pc(29);
  const Weights w = make_weights(pc);
  const Builder b{w, {4, 1, 6, 3, 5}, 31};
  Engine e(pc);
  Graph g(pc);
  uint32_t increments = 0;
  const Expr loss = b.build(g, [&](Graph& gg, const std::vector<Expr>& losses) {
    e.forward(gg, losses.back());
    ++increments;
    std::vector<Expr> exprs{parameter(gg, w.W)};
    std::vector<std::vector<float>> expected{value_of(e, gg, exprs[0].id)};
    for (uint32_t v = 0; v < gg.size(); ++v)
      if (computed(gg, v)) {  // not the parameter, read first
        exprs.push_back(gg.expr(v));
        expected.push_back(value_of(e, gg, v));
      }
    for (const size_t group : {size_t{1}, size_t{2}, size_t{3}}) {
      CAPTURE(group);
      std::vector<Expr> es(exprs.begin(), exprs.begin() + exprs.size() / group * group);
      std::vector<std::vector<float>> bufs(es.size() / group);
      std::vector<float*> outs;
      for (size_t k = 0; k < bufs.size(); ++k) {
        size_t floats = 0;
        for (size_t j = 0; j < group; ++j) floats += expected[k * group + j].size();
        bufs[k].assign(floats + 1, -7.0f);  // the float past the group stays as it was
        outs.push_back(bufs[k].data());
      }
      e.read(es, group, outs.data());
      for (size_t k = 0; k < bufs.size(); ++k) {
        std::vector<float> want;
        for (size_t j = 0; j < group; ++j)
          want.insert(want.end(), expected[k * group + j].begin(), expected[k * group + j].end());
        want.push_back(-7.0f);
        CHECK(bufs[k] == want);  // bit for bit: the same floats copied
      }
    }
  });
  CHECK(increments > 1);
  e.forward(g, loss);
  // Misuse: groups that do not divide the list, and a node that has not run.
  float sink[4 * H];
  float* outs[2] = {sink, sink + 2 * H};
  const Expr h = g.expr(g.size() - 1);
  CHECK_THROWS_WITH_AS(e.read({h, h, h}, 2, outs), doctest::Contains("are not groups of 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(e.read({h}, 0, outs), doctest::Contains("are not groups of 0"),
                       std::invalid_argument);
  const Expr later = tanh(h);
  CHECK_THROWS_WITH_AS(e.read({later}, 1, outs), doctest::Contains("[Engine::read] node"),
                       std::invalid_argument);
}

TEST_CASE("incremental: gradients after increments match finite differences") {
  ParameterCollection pc(3);
  const Weights w = make_weights(pc);
  Builder b{w, {2, 1, 3}, 7};
  Engine e(pc, EngineOptions{"lb-greedy", "cpu", 1});
  Graph g(pc);
  const Expr loss =
      b.build(g, [&](Graph& gg, const std::vector<Expr>& l) { e.forward(gg, l.back()); });
  e.forward(g, loss);
  e.backward(g, loss);
  Reference ref(g);
  ref.forward();
  const float l = as_scalar(e.value(loss));
  check_close(&l, &ref.values[loss.id][0], 1, 1e-5, "loss");
  for (uint32_t p = 0; p < pc.size(); ++p) {
    CAPTURE(pc.name(p));
    const uint32_t size = pc.dim(p).size();
    std::vector<double> fd(size);
    for (uint32_t k = 0; k < size; ++k) fd[k] = ref.fd_param(loss.id, p, k);
    check_close(pc.grads(p), fd, size, 2e-4, "gradient vs finite differences");
  }
}

TEST_CASE("incremental: only new nodes run, and the arena stops growing over a decoding loop") {
  ParameterCollection pc(4);
  const Weights w = make_weights(pc);
  Builder b{w, {6, 2, 9, 4, 1, 7, 3}, 11};
  for (const char* device : {"cpu", "null"}) {
    CAPTURE(device);
    Engine e(pc, EngineOptions{"lb-greedy", device, 1});
    Graph g(pc);
    uint64_t growths_after_first = 0;
    for (int iter = 0; iter < 4; ++iter) {
      g.clear();
      uint64_t kernels = e.stats().kernels, batches = 0;
      const Expr loss = b.build(g, [&](Graph& gg, const std::vector<Expr>& l) {
        e.forward(gg, l.back());
        // The kernels launched are those of the new batches alone.
        const Stats& s = e.stats();
        uint64_t expect = 0;
        for (size_t k = batches; k < s.batches; ++k) {
          const Node& first = gg.node(e.schedule().nodes[e.schedule().batches[k].begin]);
          expect += first.op == Op::Call ? w.cell->plan().groups.size() : 1;
        }
        CHECK(s.kernels - kernels == expect);
        kernels = s.kernels;
        batches = s.batches;
      });
      e.forward(g, loss);
      e.backward(g, loss);
      pc.zero_grads();
      if (iter == 0) growths_after_first = e.stats().arena_growths;
      if (iter > 0 && std::string(device) == "cpu")
        CHECK(e.stats().arena_growths == growths_after_first);
    }
  }
}

TEST_CASE("incremental: rewritten inputs run every segment again") {
  ParameterCollection pc(6);
  const Weights w = make_weights(pc);
  Builder b{w, {3, 2}, 13};
  Engine e(pc, EngineOptions{"agenda", "cpu", 1});
  Graph g(pc);
  const Expr loss =
      b.build(g, [&](Graph& gg, const std::vector<Expr>& l) { e.forward(gg, l.back()); });
  const float before = as_scalar(e.forward(g, loss));
  std::vector<float> zeros(g.input_values().size(), 0.25f);
  g.write_inputs(0, zeros.data(), zeros.size());
  const float after = as_scalar(e.forward(g, loss));
  CHECK(after != before);
  Engine fresh(pc, EngineOptions{"agenda", "cpu", 1});
  CHECK(as_scalar(fresh.forward(g, loss)) == doctest::Approx(after).epsilon(1e-6));
}

TEST_CASE("incremental: forward after the parameters changed computes again") {
  // One graph kept across training steps (a fixed structure): every forward after an update
  // sees the new parameters, as a fresh engine does; reading after rewritten inputs is refused.
  ParameterCollection pc(9);
  const Parameter W = pc.add_parameters("W", Dim{3, 3});
  Graph g(pc);
  const Expr x = input(g, Dim{3, 1}, {0.5f, -1.0f, 2.0f});
  const Expr loss = pick_neg_log_softmax(tanh(matmul(parameter(g, W), x)), 1);
  Engine e(pc);
  float last = as_scalar(e.forward(g, loss));
  for (int step = 0; step < 3; ++step) {
    e.backward(g, loss);
    CHECK(as_scalar(e.forward(g, loss)) == last);  // a backward changes no value
    pc.sgd_update(0.5f);
    const float now = as_scalar(e.forward(g, loss));
    Engine fresh(pc);
    CHECK(now == as_scalar(fresh.forward(g, loss)));
    CHECK(now < last);
    last = now;
  }
  // Cleared gradients change no value: nothing runs again. An optimizer's step does.
  e.backward(g, loss);
  const uint64_t kernels = e.stats().kernels;
  pc.zero_grads();
  CHECK(as_scalar(e.forward(g, loss)) == last);
  CHECK(e.stats().kernels == kernels);
  e.backward(g, loss);
  AdamOptimizer adam(pc, OptimizerOptions{0.05f});
  adam.step();
  CHECK(as_scalar(e.forward(g, loss)) == as_scalar(Engine(pc).forward(g, loss)));
  CHECK(e.stats().kernels > kernels);
  CHECK(as_scalar(e.value(loss)) != last);
  pc.values(W.id)[0] += 1.0f;  // written by hand, announced by mark_changed()
  pc.mark_changed();
  Engine fresh(pc);
  CHECK(as_scalar(e.forward(g, loss)) == as_scalar(fresh.forward(g, loss)));
  const std::vector<float> other{1.0f, 1.0f, 1.0f};
  g.write_inputs(0, other.data(), other.size());
  CHECK_THROWS_WITH_AS(e.value(loss), doctest::Contains("inputs were rewritten"),
                       std::invalid_argument);
  e.forward(g, loss);
  CHECK(as_scalar(e.value(loss)) == as_scalar(fresh.forward(g, loss)));
}

TEST_CASE("incremental: misuse is a clear error") {
  ParameterCollection pc(8);
  const Weights w = make_weights(pc);
  Engine e(pc);
  Graph g(pc);
  const Expr x = input(g, Dim{H, 1}, std::vector<float>(H, 0.5f));
  const Expr h = tanh(matmul(parameter(g, w.W), x));
  const Expr l1 = pick_neg_log_softmax(h, 1);
  e.forward(g, l1);
  // A node added after the forward has no value yet.
  const Expr h2 = tanh(matmul(parameter(g, w.W), h));
  const Expr l2 = pick_neg_log_softmax(h2, 2);
  CHECK_THROWS_WITH_AS(e.value(h2), doctest::Contains("added after the last forward"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(e.fetch({h, h2}), doctest::Contains("added after the last forward"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(e.fetch({h, h2}), doctest::Contains("[Engine::fetch] node"),
                       std::invalid_argument);
  // Backward while nodes have not run.
  CHECK_THROWS_WITH_AS(e.backward(g, l1), doctest::Contains("have not run: run forward()"),
                       std::invalid_argument);
  // Earlier values stay readable, and the next forward runs the rest.
  CHECK(e.value(h).data != nullptr);
  e.forward(g, l2);
  e.backward(g, l2);
  // A node added after the backward has no gradient; rewritten inputs make the adjoints stale.
  const Expr h3 = tanh(h2);
  CHECK_THROWS_WITH_AS(e.gradient(h3), doctest::Contains("[Engine::gradient] node"),
                       std::invalid_argument);
  CHECK(e.gradient(h2).data != nullptr);
  const std::vector<float> other(H, 0.25f);
  g.write_inputs(0, other.data(), other.size());
  CHECK_THROWS_WITH_AS(e.gradient(h), doctest::Contains("inputs were rewritten"),
                       std::invalid_argument);
  CHECK(e.gradient(parameter(g, w.W)).data != nullptr);  // the parameter's own gradient stays
  // After clear(), expressions from before cannot be built on or read.
  g.clear();
  CHECK_THROWS_WITH_AS(tanh(h2), doctest::Contains("from before Graph::clear()"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(e.value(h2), doctest::Contains("from before Graph::clear()"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(e.fetch({h2}), doctest::Contains("from before Graph::clear()"),
                       std::invalid_argument);
}
