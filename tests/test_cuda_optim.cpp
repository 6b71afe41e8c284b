// Optimizer steps on the CUDA device against the same steps on the CPU (itself checked against
// the double reference in tests/test_optim.cpp): every optimizer with weight decay, clipping and
// lazy or dense lookup tables on zoo models through blocks; the parameters and the state stay on
// the device until host code reads them; host and device steps mixed; state files written from
// the device; engines and optimizers destroyed in either order. Without a GPU (or without CUDA
// in the build) every case is skipped.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "edbatch/safetensors.h"
#include "tests/check.h"
#include "tests/cli_run.h"

using namespace edbatch;
using edbatch::testing::check_close;

namespace {

const bool kSkip = !device_unavailable("cuda").empty();
#define CUDA_OPTIM_CASE(name) TEST_CASE(name* doctest::skip(kSkip))

// A zoo model over six seeded instances, through blocks.
struct Twin {
  explicit Twin(const std::string& name)
      : data(load_dataset(model_data_kind(name), "synthetic:6", 32, 9)) {
    ModelOptions mo;
    mo.hidden = 6;
    mo.vocab = 32;
    model = make_model(name, pc, data, mo);
  }
  // Forward and backward of step `step`'s mini-batch (three instances).
  void backward(Engine& e, int step) {
    g.clear();
    std::vector<Expr> losses;
    for (int k : {0, 1, 3})
      losses.push_back(model->build(g, static_cast<uint32_t>((step + k) % 6)));
    const Expr loss = sum_losses(losses);
    e.forward(g, loss);
    e.backward(g, loss);
  }
  ParameterCollection pc{5};
  Dataset data;
  std::unique_ptr<Model> model;
  Graph g{pc};
};

void check_same(const Twin& gpu, const Optimizer& og, const Twin& cpu, const Optimizer& oc,
                const std::string& what) {
  for (uint32_t p = 0; p < cpu.pc.size(); ++p) {
    check_close(gpu.pc.values(p), cpu.pc.values(p), cpu.pc.dim(p).size(), 1e-3,
                what + ": " + cpu.pc.name(p));
    if (cpu.pc.is_view(p)) continue;
    for (uint32_t k = 0; k < oc.state().slots(); ++k)
      check_close(og.state().slot(k, p), oc.state().slot(k, p), cpu.pc.dim(p).size(), 1e-3,
                  what + ": " + cpu.pc.name(p) + " slot " + std::to_string(k));
  }
  CHECK(og.steps() == oc.steps());
}

struct Config {
  const char* name;
  std::string optimizer;
  OptimizerOptions o;
};

std::vector<Config> configs() {
  std::vector<Config> c;
  auto add = [&](const char* name, const std::string& opt, float lr, float wd, float clip,
                 bool sparse) {
    OptimizerOptions o;
    o.lr = lr;
    o.weight_decay = wd;
    o.clip_norm = clip;
    o.sparse_lookups = sparse;
    c.push_back({name, opt, o});
  };
  add("sgd", "sgd", 0.1f, 0, 0, true);
  add("momentum, weight decay, clipped", "momentum", 0.05f, 0.01f, 0.5f, true);
  add("adam, weight decay, clipped", "adam", 0.01f, 0.01f, 0.5f, true);
  add("adam, dense lookups", "adam", 0.01f, 0.01f, 0, false);
  add("adagrad, clipped", "adagrad", 0.1f, 0, 0.5f, true);
  add("adagrad, dense lookups, weight decay", "adagrad", 0.1f, 0.01f, 0, false);
  return c;
}

}  // namespace

CUDA_OPTIM_CASE(
    "cuda optim: device steps follow the cpu, state and parameters stay on the device") {
  for (const std::string model : {"tree_lstm", "lattice_lstm", "bilstm_tagger"}) {
    for (const Config& c : configs()) {
      CAPTURE(model);
      CAPTURE(c.name);
      Twin cpu(model), gpu(model);
      Engine e_cpu(cpu.pc, EngineOptions{"agenda", "cpu", 1});
      Engine e_gpu(gpu.pc, EngineOptions{"lb-greedy", "cuda", 1});
      std::unique_ptr<Optimizer> o_cpu = make_optimizer(c.optimizer, cpu.pc, c.o);
      std::unique_ptr<Optimizer> o_gpu = make_optimizer(c.optimizer, gpu.pc, c.o);
      for (int step = 0; step < 4; ++step) {
        cpu.backward(e_cpu, step);
        gpu.backward(e_gpu, step);
        o_cpu->step(e_cpu, 1.0f / 3);
        o_gpu->step(e_gpu, 1.0f / 3);
        // Nothing came back to the host: the collection and the state wait for a fetch.
        CHECK(gpu.pc.device_fetch_owner() != nullptr);
        if (o_gpu->state().slots() > 0) CHECK(o_gpu->state().device_fetch_owner() != nullptr);
      }
      check_same(gpu, *o_gpu, cpu, *o_cpu, c.name);
      // Host steps between device steps: the device uploads the host's numbers again.
      for (int step = 4; step < 7; ++step) {
        cpu.backward(e_cpu, step);
        gpu.backward(e_gpu, step);
        o_cpu->step(e_cpu, 0.5f);
        if (step == 5)
          o_gpu->step(0.5f);  // on the host, after fetching
        else
          o_gpu->step(e_gpu, 0.5f);
      }
      check_same(gpu, *o_gpu, cpu, *o_cpu, std::string(c.name) + ", mixed");
    }
  }
}

CUDA_OPTIM_CASE("cuda optim: state saved from the device continues on the cpu") {
  test::TempDir dir;
  const std::string state = dir / "state", weights = dir / "weights";
  OptimizerOptions o;
  o.weight_decay = 0.01f;
  o.clip_norm = 1.0f;
  Twin a("tree_lstm"), b("tree_lstm");
  Engine e_a(a.pc, EngineOptions{"agenda", "cpu", 1});
  AdamOptimizer o_a(a.pc, o);
  {
    Engine e_gpu(b.pc, EngineOptions{"agenda", "cuda", 1});
    AdamOptimizer o_gpu(b.pc, o);
    for (int step = 0; step < 3; ++step) {
      a.backward(e_a, step);
      o_a.step(e_a, 0.5f);
      b.backward(e_gpu, step);
      o_gpu.step(e_gpu, 0.5f);
    }
    save_parameters(weights, b.pc);  // fetched from the device
    save_optimizer_state(state, o_gpu);
  }
  Twin c("tree_lstm");
  Engine e_c(c.pc, EngineOptions{"agenda", "cuda", 1});
  AdamOptimizer o_c(c.pc, o);
  load_parameters(weights, c.pc);
  load_optimizer_state(state, o_c);  // uploaded by the next device step
  for (int step = 3; step < 5; ++step) {
    a.backward(e_a, step);
    o_a.step(e_a, 0.5f);
    c.backward(e_c, step);
    o_c.step(e_c, 0.5f);
  }
  check_same(c, o_c, a, o_a, "continued");
}

CUDA_OPTIM_CASE("cuda optim: engine and optimizer destroyed in either order") {
  // The engine first: its backend fetches the state it holds.
  {
    Twin t("lattice_gru");
    AdagradOptimizer opt(t.pc, {});
    {
      Engine e(t.pc, EngineOptions{"agenda", "cuda", 1});
      t.backward(e, 0);
      opt.step(e);
      CHECK(opt.state().device_fetch_owner() != nullptr);
    }
    CHECK(opt.state().device_fetch_owner() == nullptr);
    double sum = 0;
    for (uint32_t p = 0; p < t.pc.size(); ++p)
      if (!t.pc.is_view(p))
        for (size_t i = 0; i < t.pc.dim(p).size(); ++i) sum += opt.state().slot(0, p)[i];
    CHECK(sum > 0);  // squared gradients arrived
  }
  // The optimizer first: the backend frees its copy; later steps of another optimizer work.
  {
    Twin t("lattice_gru");
    Engine e(t.pc, EngineOptions{"agenda", "cuda", 1});
    {
      AdamOptimizer opt(t.pc, {});
      t.backward(e, 0);
      opt.step(e);
    }
    AdamOptimizer again(t.pc, {});
    t.backward(e, 1);
    again.step(e);
    CHECK(again.steps() == 1);
    CHECK(std::isfinite(t.pc.values(0)[0]));
  }
}
