// Optimizers (edbatch/optim.h) against a reference written here in double: SGD, momentum, Adam
// and AdaGrad over several steps with weight decay, bias correction, clipping, lazy and dense
// lookup tables, views and stacked storages; the global-norm clipping's exact scale; the state's
// round trip through a file (continuing equals not stopping); the engine's path with gradients of
// a real backward pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "edbatch/edbatch.h"
#include "edbatch/safetensors.h"
#include "tests/check.h"
#include "tests/cli_run.h"
#include "tests/models.h"

using namespace edbatch;
using edbatch::testing::check_close;

namespace {

// The formulas of edbatch/optim.h in double, parameter by parameter (views skipped: their base
// holds them).
struct Reference {
  UpdateRule rule;
  uint64_t t = 0;
  std::map<uint32_t, std::vector<double>> w, m, v;

  explicit Reference(const ParameterCollection& pc, const UpdateRule& r) : rule(r) {
    for (uint32_t id = 0; id < pc.size(); ++id) {
      if (pc.is_view(id)) continue;
      const size_t n = pc.dim(id).size();
      w[id].assign(pc.values(id), pc.values(id) + n);
      m[id].assign(n, 0.0);
      v[id].assign(n, 0.0);
    }
  }

  // The floats of parameter id the step reads: all, or the touched columns of a lazy table.
  std::vector<size_t> read(const ParameterCollection& pc, uint32_t id,
                           const std::vector<uint32_t>& touched) const {
    std::vector<size_t> at;
    if (pc.is_lookup(id) && rule.sparse_lookups) {
      const uint32_t d = pc.dim(id).rows;
      for (uint32_t c : touched)
        for (uint32_t i = 0; i < d; ++i) at.push_back(size_t(c) * d + i);
    } else {
      for (size_t i = 0; i < pc.dim(id).size(); ++i) at.push_back(i);
    }
    return at;
  }

  void step(const ParameterCollection& pc, const std::map<uint32_t, std::vector<double>>& grads,
            const std::map<uint32_t, std::vector<uint32_t>>& touched, double grad_scale) {
    ++t;
    double sum = 0;
    for (const auto& [id, g] : grads)
      for (size_t i : read(pc, id, touched.at(id))) sum += g[i] * g[i];
    double s = grad_scale;
    const double norm = std::fabs(grad_scale) * std::sqrt(sum);
    if (rule.clip_norm > 0 && norm > rule.clip_norm) s *= rule.clip_norm / norm;
    const double b1 = rule.beta1, b2 = rule.beta2, lr = rule.lr, eps = rule.eps;
    for (const auto& [id, grad] : grads) {
      std::vector<double>&W = w[id], &M = m[id], &V = v[id];
      for (size_t i : read(pc, id, touched.at(id))) {
        const double g = grad[i] * s + double(rule.weight_decay) * W[i];
        switch (rule.kind) {
          case UpdateRule::Kind::Sgd:
            if (rule.momentum > 0) {
              M[i] = rule.momentum * M[i] + g;
              W[i] -= lr * M[i];
            } else {
              W[i] -= lr * g;
            }
            break;
          case UpdateRule::Kind::Adam:
            M[i] = b1 * M[i] + (1 - b1) * g;
            V[i] = b2 * V[i] + (1 - b2) * g * g;
            W[i] -= lr * (M[i] / (1 - std::pow(b1, t))) /
                    (std::sqrt(V[i] / (1 - std::pow(b2, t))) + eps);
            break;
          case UpdateRule::Kind::Adagrad:
            M[i] += g * g;
            W[i] -= lr * g / (std::sqrt(M[i]) + eps);
            break;
        }
      }
    }
  }
};

// A collection with every kind of storage: a dense matrix with a view of its first columns, a
// bias, two stacked matrices, and a lookup table of 6 embeddings of size 3.
struct Params {
  ParameterCollection pc{7};
  Parameter W = pc.add_parameters("W", Dim{3, 4});
  Parameter W_left = pc.add_view("W_left", W, 0, 2);
  Parameter b = pc.add_parameters("b", Dim{3, 1});
  Parameter A = pc.add_parameters("A", Dim{2, 2}), B = pc.add_parameters("B", Dim{2, 2});
  LookupParameter E = pc.add_lookup_parameters("E", 6, 3);
  Params() { REQUIRE(pc.stack({A.id, B.id})); }

  // Seeded gradients of step `step` (a few touched columns of E), written into the collection
  // and returned, in double, with the touched columns.
  void gradients(uint64_t step, std::map<uint32_t, std::vector<double>>& grads,
                 std::map<uint32_t, std::vector<uint32_t>>& touched) {
    std::mt19937_64 rng(1000 + step);
    std::normal_distribution<double> n(0.0, 2.0);
    grads.clear();
    touched.clear();
    for (uint32_t id = 0; id < pc.size(); ++id) {
      if (pc.is_view(id)) continue;
      std::vector<double>& g = grads[id];
      g.assign(pc.dim(id).size(), 0.0);
      touched[id] = {};
      if (pc.is_lookup(id)) {
        const uint32_t d = pc.dim(id).rows;
        for (uint32_t c : {uint32_t(step % 6), uint32_t((step * 5 + 2) % 6)}) {
          if (std::find(touched[id].begin(), touched[id].end(), c) != touched[id].end()) continue;
          touched[id].push_back(c);
          pc.mark_lookup_row(id, c);
          for (uint32_t i = 0; i < d; ++i) g[size_t(c) * d + i] = n(rng);
        }
      } else {
        for (double& x : g) x = n(rng);
      }
      float* dst = pc.grads(id);
      for (size_t i = 0; i < g.size(); ++i) {
        dst[i] = static_cast<float>(g[i]);
        g[i] = dst[i];  // the reference sees the float gradient
      }
    }
    pc.mark_changed();
  }
};

struct Config {
  const char* name;
  std::string optimizer;
  OptimizerOptions options;
};

std::vector<Config> configs() {
  std::vector<Config> c;
  auto add = [&](const char* name, const std::string& opt, float lr, float wd, float clip,
                 bool sparse = true, float momentum = 0) {
    OptimizerOptions o;
    o.lr = lr;
    o.weight_decay = wd;
    o.clip_norm = clip;
    o.sparse_lookups = sparse;
    o.momentum = momentum;
    c.push_back({name, opt, o});
  };
  add("sgd", "sgd", 0.1f, 0, 0);
  add("sgd, weight decay, clipped", "sgd", 0.1f, 0.01f, 1.5f);
  add("sgd, dense lookups, weight decay", "sgd", 0.1f, 0.05f, 0, false);
  add("momentum", "momentum", 0.05f, 0, 0);
  add("momentum 0.5, weight decay, clipped", "sgd", 0.05f, 0.01f, 2.0f, true, 0.5f);
  add("momentum, dense lookups", "momentum", 0.05f, 0.01f, 0, false);
  add("adam", "adam", 0.01f, 0, 0);
  add("adam, weight decay, clipped", "adam", 0.01f, 0.02f, 1.0f);
  add("adam, dense lookups", "adam", 0.01f, 0.02f, 0, false);
  add("adagrad", "adagrad", 0.1f, 0, 0);
  add("adagrad, weight decay, clipped", "adagrad", 0.1f, 0.01f, 3.0f);
  add("adagrad, dense lookups", "adagrad", 0.1f, 0, 0, false);
  return c;
}

void check_against(const Params& p, const Optimizer& opt, const Reference& ref,
                   const std::string& what) {
  for (const auto& [id, w] : ref.w) {
    check_close(p.pc.values(id), w, w.size(), 1e-5, what + ": " + p.pc.name(id));
    const std::vector<std::string> slots = opt.slot_names();
    for (uint32_t k = 0; k < slots.size(); ++k)
      check_close(opt.state().slot(k, id), k == 0 ? ref.m.at(id) : ref.v.at(id), w.size(), 1e-5,
                  what + ": " + p.pc.name(id) + "." + slots[k]);
  }
}

}  // namespace

TEST_CASE("optim: every optimizer equals the reference formula over several steps") {
  for (const Config& c : configs()) {
    CAPTURE(c.name);
    Params p;
    std::unique_ptr<Optimizer> opt = make_optimizer(c.optimizer, p.pc, c.options);
    Reference ref(p.pc, opt->next_rule());
    std::map<uint32_t, std::vector<double>> grads;
    std::map<uint32_t, std::vector<uint32_t>> touched;
    for (uint64_t step = 0; step < 6; ++step) {
      CAPTURE(step);
      p.gradients(step, grads, touched);
      const double scale = step % 2 ? 0.5 : 1.0;
      ref.step(p.pc, grads, touched, scale);
      opt->step(static_cast<float>(scale));
      check_against(p, *opt, ref, c.name);
      // Gradients are zeroed after the step; lookup marks cleared.
      for (uint32_t id = 0; id < p.pc.size(); ++id) {
        for (size_t i = 0; i < p.pc.dim(id).size(); ++i) REQUIRE(p.pc.grads(id)[i] == 0.0f);
        CHECK(p.pc.touched_columns(id).empty());
      }
    }
    CHECK(opt->steps() == 6);
  }
}

TEST_CASE("optim: lazy lookup tables leave untouched columns and their state alone") {
  Params p;
  OptimizerOptions o;
  o.lr = 0.1f;
  o.weight_decay = 0.1f;
  AdamOptimizer opt(p.pc, o);
  std::vector<float> before(p.pc.values(p.E.id), p.pc.values(p.E.id) + 18);
  std::map<uint32_t, std::vector<double>> grads;
  std::map<uint32_t, std::vector<uint32_t>> touched;
  p.gradients(0, grads, touched);  // columns 0 and 2
  opt.step();
  const float* e = p.pc.values(p.E.id);
  for (uint32_t c = 0; c < 6; ++c)
    for (uint32_t i = 0; i < 3; ++i) {
      const bool was_touched = c == 0 || c == 2;
      CHECK((e[c * 3 + i] != before[c * 3 + i]) == was_touched);
      CHECK((opt.state().slot(1, p.E.id)[c * 3 + i] != 0.0f) == was_touched);
    }
}

TEST_CASE("optim: clipping scales the global norm exactly") {
  for (const float grad_scale : {1.0f, 0.25f}) {
    for (const double fraction : {0.3, 2.0}) {  // binding, and not
      CAPTURE(grad_scale);
      CAPTURE(fraction);
      Params p;
      std::map<uint32_t, std::vector<double>> grads;
      std::map<uint32_t, std::vector<uint32_t>> touched;
      p.gradients(3, grads, touched);
      double sum = 0;
      for (const auto& [id, g] : grads)
        for (double x : g) sum += x * x;
      const double norm = grad_scale * std::sqrt(sum);
      OptimizerOptions o;
      o.lr = 1.0f;
      o.clip_norm = static_cast<float>(fraction * norm);
      SgdOptimizer opt(p.pc, o);
      std::map<uint32_t, std::vector<float>> before;
      for (const auto& [id, g] : grads)
        before[id].assign(p.pc.values(id), p.pc.values(id) + g.size());
      opt.step(grad_scale);
      // The step is -lr times the clipped gradient: its norm is the clip norm when that binds.
      double step_sq = 0;
      for (const auto& [id, g] : grads)
        for (size_t i = 0; i < g.size(); ++i) {
          const double d = double(before[id][i]) - p.pc.values(id)[i];
          step_sq += d * d;
          // Every element scaled by one factor: the direction is kept.
          const double expected = g[i] * grad_scale * std::min(1.0, double(o.clip_norm) / norm);
          CHECK(std::fabs(d - expected) <= 1e-5 * std::max(1.0, std::fabs(double(before[id][i]))));
        }
      const double expected = std::min(norm, double(o.clip_norm));
      CHECK(std::fabs(std::sqrt(step_sq) - expected) <= 1e-5 * expected);
    }
  }
  // clip_scale itself: exact.
  CHECK(clip_scale(1.0f, 2.0f, 16.0) == 0.5f);
  CHECK(clip_scale(0.5f, 1.0f, 16.0) == 0.25f);
  CHECK(clip_scale(0.5f, 4.0f, 16.0) == 0.5f);
  CHECK(clip_scale(2.0f, 0.0f, 16.0) == 2.0f);
}

TEST_CASE("optim: state round-trips through a file; continuing equals not stopping") {
  test::TempDir dir;
  for (const std::string name : {"sgd", "momentum", "adam", "adagrad"}) {
    CAPTURE(name);
    OptimizerOptions o;
    o.weight_decay = 0.01f;
    o.clip_norm = 4.0f;
    std::map<uint32_t, std::vector<double>> grads;
    std::map<uint32_t, std::vector<uint32_t>> touched;
    // Six steps in one go.
    Params a;
    std::unique_ptr<Optimizer> opt_a = make_optimizer(name, a.pc, o);
    for (uint64_t s = 0; s < 6; ++s) {
      a.gradients(s, grads, touched);
      opt_a->step(0.5f);
    }
    // Three steps, saved, and three more in a new collection and optimizer that load them.
    const std::string weights = dir / (name + ".weights"), state = dir / (name + ".state");
    {
      Params b;
      std::unique_ptr<Optimizer> opt_b = make_optimizer(name, b.pc, o);
      for (uint64_t s = 0; s < 3; ++s) {
        b.gradients(s, grads, touched);
        opt_b->step(0.5f);
      }
      save_parameters(weights, b.pc);
      save_optimizer_state(state, *opt_b);
    }
    Params c;
    std::unique_ptr<Optimizer> opt_c = make_optimizer(name, c.pc, o);
    load_parameters(weights, c.pc);
    load_optimizer_state(state, *opt_c);
    CHECK(opt_c->steps() == 3);
    for (uint64_t s = 3; s < 6; ++s) {
      c.gradients(s, grads, touched);
      opt_c->step(0.5f);
    }
    CHECK(opt_c->steps() == 6);
    for (uint32_t id = 0; id < a.pc.size(); ++id) {
      CAPTURE(a.pc.name(id));
      const size_t n = a.pc.dim(id).size();
      CHECK(std::equal(a.pc.values(id), a.pc.values(id) + n, c.pc.values(id)));
      if (a.pc.is_view(id)) continue;
      for (uint32_t k = 0; k < opt_a->state().slots(); ++k)
        CHECK(std::equal(opt_a->state().slot(k, id), opt_a->state().slot(k, id) + n,
                         opt_c->state().slot(k, id)));
    }
  }
}

TEST_CASE("optim: a state file of another optimizer or model is refused, changing nothing") {
  test::TempDir dir;
  Params p;
  AdamOptimizer adam(p.pc, {});
  std::map<uint32_t, std::vector<double>> grads;
  std::map<uint32_t, std::vector<uint32_t>> touched;
  p.gradients(0, grads, touched);
  adam.step();
  const std::string file = dir / "adam.state";
  save_optimizer_state(file, adam);
  const std::map<std::string, std::string> meta = [&] {
    std::map<std::string, std::string> m;
    read_safetensors(file, &m);
    return m;
  }();
  CHECK(meta.at("optimizer") == "adam");
  CHECK(meta.at("step") == "1");
  CHECK(meta.at("format") == "edbatch-optimizer-state");

  Params q;
  AdagradOptimizer adagrad(q.pc, {});
  CHECK_THROWS_WITH_AS(load_optimizer_state(file, adagrad),
                       doctest::Contains("the state of a 'adam' optimizer, not of 'adagrad'"),
                       std::invalid_argument);
  // Another model: a parameter of another shape.
  ParameterCollection other(7);
  other.add_parameters("W", Dim{3, 5});
  AdamOptimizer adam_other(other, {});
  CHECK_THROWS_WITH_AS(load_optimizer_state(file, adam_other),
                       doctest::Contains("the state of other parameters: parameter 0 is"),
                       std::invalid_argument);
  CHECK(adam_other.steps() == 0);
  CHECK(adam_other.state().slot(0, 0)[0] == 0.0f);
  // Files without the list of parameters (written before it was kept) are checked by tensor.
  {
    std::map<std::string, std::string> m;
    std::vector<NamedTensor> tensors = read_safetensors(file, &m);
    m.erase("parameters");
    write_safetensors(dir / "old.state", tensors, m);
    CHECK_THROWS_WITH_AS(load_optimizer_state(dir / "old.state", adam_other),
                         doctest::Contains("'W.exp_avg'"), std::invalid_argument);
    load_optimizer_state(dir / "old.state", adam);
  }
  // The caller's own entries come back from loading; the format's own keys are not theirs.
  {
    save_optimizer_state(dir / "extra.state", adam, {{"mine.where", "epoch 3"}});
    std::map<std::string, std::string> m;
    load_optimizer_state(dir / "extra.state", adam, &m);
    CHECK(m.at("mine.where") == "epoch 3");
    CHECK(m.at("optimizer") == "adam");
    CHECK_THROWS_WITH_AS(save_optimizer_state(dir / "bad.state", adam, {{"step", "9"}}),
                         doctest::Contains("the extra metadata key 'step' is one of the format's"),
                         std::invalid_argument);
    CHECK_FALSE(std::filesystem::exists(dir / "bad.state"));
  }
  // Plain SGD keeps no tensors: the list alone refuses another model's state.
  SgdOptimizer sgd(p.pc, {}), sgd_other(other, {});
  save_optimizer_state(dir / "sgd.state", sgd);
  CHECK_THROWS_WITH_AS(load_optimizer_state(dir / "sgd.state", sgd_other),
                       doctest::Contains("the state of other parameters"), std::invalid_argument);
  load_optimizer_state(dir / "sgd.state", sgd);
  // Weights are not optimizer state.
  const std::string weights = dir / "w.safetensors";
  save_parameters(weights, p.pc);
  CHECK_THROWS_WITH_AS(load_optimizer_state(weights, adam),
                       doctest::Contains("not an optimizer state file"), std::invalid_argument);
  CHECK(adam.steps() == 1);
}

TEST_CASE("optim: the engine's step follows the reference on gradients of a real backward") {
  for (const std::string name : {"momentum", "adam", "adagrad"}) {
    CAPTURE(name);
    ParameterCollection pc(3);
    testing::TestModels models(pc);
    OptimizerOptions o;
    o.weight_decay = 0.001f;
    o.clip_norm = 5.0f;
    std::unique_ptr<Optimizer> opt = make_optimizer(name, pc, o);
    Engine engine(pc, EngineOptions{"agenda", "cpu", 1});
    Reference ref(pc, opt->next_rule());
    std::mt19937_64 rng(5);
    Graph g(pc);
    for (int step = 0; step < 4; ++step) {
      g.clear();
      std::vector<Expr> losses;
      for (int i = 0; i < 3; ++i)
        losses.push_back(models.tree_rnn(g, testing::random_tree(rng, 5, 11)));
      const Expr loss = sum_losses(losses);
      engine.forward(g, loss);
      engine.backward(g, loss);
      std::map<uint32_t, std::vector<double>> grads;
      std::map<uint32_t, std::vector<uint32_t>> touched;
      for (uint32_t id = 0; id < pc.size(); ++id) {
        if (pc.is_view(id)) continue;
        grads[id].assign(pc.grads(id), pc.grads(id) + pc.dim(id).size());
        touched[id] = pc.touched_columns(id);
      }
      CHECK(!touched[models.E.id].empty());
      ref.step(pc, grads, touched, 1.0 / 3);
      opt->step(engine, 1.0f / 3);
    }
    for (const auto& [id, w] : ref.w) check_close(pc.values(id), w, w.size(), 1e-5, pc.name(id));
  }
}

TEST_CASE("optim: names, defaults and bad hyperparameters") {
  ParameterCollection pc;
  pc.add_parameters("W", Dim{2, 2});
  CHECK(optimizer_names() == std::vector<std::string>{"sgd", "momentum", "adam", "adagrad"});
  for (const std::string& n : optimizer_names()) {
    std::unique_ptr<Optimizer> opt = make_optimizer(n, pc);
    CHECK(opt->learning_rate() == default_learning_rate(n));
  }
  CHECK(make_optimizer("momentum", pc)->hyperparameters().momentum == 0.9f);
  CHECK(make_optimizer("adam", pc)->hyperparameters().eps == 1e-8f);
  CHECK(make_optimizer("adagrad", pc)->hyperparameters().eps == 1e-10f);
  CHECK(std::string(make_optimizer("momentum", pc)->name()) == "sgd");
  CHECK_THROWS_WITH_AS(make_optimizer("rmsprop", pc), doctest::Contains("unknown optimizer"),
                       std::invalid_argument);
  OptimizerOptions bad;
  bad.lr = -1;
  CHECK_THROWS_AS(make_optimizer("adam", pc, bad), std::invalid_argument);
  bad = {};
  bad.momentum = 1.0f;
  CHECK_THROWS_AS(make_optimizer("sgd", pc, bad), std::invalid_argument);
  bad = {};
  bad.momentum = 0.5f;  // Adam and AdaGrad have no momentum: not silently ignored
  for (const char* name : {"adam", "adagrad"})
    CHECK_THROWS_WITH_AS(make_optimizer(name, pc, bad),
                         doctest::Contains("momentum applies to sgd"), std::invalid_argument);
  bad = {};
  bad.clip_norm = -1;
  CHECK_THROWS_AS(make_optimizer("adagrad", pc, bad), std::invalid_argument);
  SgdOptimizer sgd(pc);
  CHECK_THROWS_AS(sgd.set_learning_rate(0), std::invalid_argument);
  sgd.set_clip_norm(2);
  CHECK(sgd.clip_norm() == 2);
  // An engine over another collection is refused.
  ParameterCollection other;
  Engine e(other);
  CHECK_THROWS_WITH_AS(sgd.step(e), doctest::Contains("another ParameterCollection"),
                       std::invalid_argument);
}

TEST_CASE("optim: parameters added after the optimizer get state of their own") {
  ParameterCollection pc(2);
  const Parameter W = pc.add_parameters("W", Dim{2, 2});
  AdagradOptimizer opt(pc, {});
  const Parameter V = pc.add_parameters("V", Dim{3, 1});
  for (uint32_t id : {W.id, V.id})
    for (size_t i = 0; i < pc.dim(id).size(); ++i) pc.grads(id)[i] = 1.0f;
  opt.step();
  CHECK(opt.state().floats(V.id) == 3);
  CHECK(opt.state().slot(0, V.id)[0] == 1.0f);
  CHECK(pc.values(V.id)[0] != 0.0f);
}
