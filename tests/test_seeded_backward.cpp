// Engine::backward from given adjoints of several outputs (a vector-Jacobian product, as the
// PyTorch adapter needs): equal to the backward of the scalar seed . [outputs] built in the
// graph, for outputs that are computed values, inputs, parameters, views, repeated nodes and
// block outputs, under several policies; seeds in device memory are refused on the CPU.
#include <doctest/doctest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/engine.h"
#include "tests/check.h"

using namespace edbatch;
using edbatch::testing::check_close;

namespace {

struct Model {
  explicit Model(uint64_t seed) : pc(seed), g(pc) {
    W = pc.add_parameters("W", Dim{6, 5});
    b = pc.add_parameters("b", Dim{6, 1});
    h0 = pc.add_parameters("h0", Dim{6, 1});
    cell = std::make_unique<Block>(pc, "cell");
    const Expr x = cell->input("x", Dim{6, 1});
    const Expr v = cell->input("v", Dim{5, 1});
    cell->output("y", cmult(tanh(affine({parameter(cell->body(), b), parameter(cell->body(), W), v})), x));
    cell->freeze();
  }
  // Outputs of instance i: a computed value, its input, the parameter h0, a view of a computed
  // value, a block output, and the first output again.
  void build(uint32_t n, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (uint32_t i = 0; i < n; ++i) {
      std::vector<float> v(5);
      for (float& f : v) f = u(rng);
      const Expr x = input(g, Dim{5, 1}, v);
      const Expr y = tanh(affine({parameter(g, b), parameter(g, W), x}));
      Expr o;
      const Expr in[2] = {y, x};
      cell->call(g, in, 2, nullptr, 0, &o);
      const Expr r = reshape(tanh(reshape(y, Dim{2, 3})), Dim{6, 1});
      for (const Expr& e : {y, x, parameter(g, h0), r, o, y}) outputs.push_back(e);
    }
    for (const Expr& e : outputs) floats += g.node(e.id).dim.size();
  }
  ParameterCollection pc;
  Graph g;
  Parameter W, b, h0;
  std::unique_ptr<Block> cell;
  std::vector<Expr> outputs;
  uint32_t floats = 0;
};

}  // namespace

TEST_CASE("seeded backward: adjoints of many outputs = backward of seed . [outputs]") {
  std::mt19937_64 rng(31);
  for (uint32_t n : {1u, 4u, 13u}) {
    CAPTURE(n);
    Model m(7);
    m.build(n, rng);
    std::vector<float> seeds(m.floats);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& f : seeds) f = u(rng);

    // The reference: seed . concat(outputs), with the seeds as a parameter row.
    const Parameter S = m.pc.add_parameters("S", Dim{1, m.floats});
    std::copy(seeds.begin(), seeds.end(), m.pc.values(S.id));
    std::vector<Expr> parts;
    for (size_t i = 0; i < m.outputs.size(); i += 6)
      parts.push_back(concat(std::vector<Expr>(m.outputs.begin() + i, m.outputs.begin() + i + 6)));
    const Expr loss = matmul(parameter(m.g, S), concat(parts));

    for (const char* policy : {"none", "agenda", "lb-greedy"}) {
      CAPTURE(policy);
      Engine e(m.pc, EngineOptions{policy, "cpu", 2, 1.0});
      e.forward(m.g, loss);
      m.pc.zero_grads();
      e.backward(m.g, loss);
      std::vector<std::vector<float>> want;
      for (uint32_t p : {m.W.id, m.b.id, m.h0.id})
        want.emplace_back(m.pc.grads(p), m.pc.grads(p) + m.pc.dim(p).size());
      std::vector<std::vector<float>> want_inputs;
      for (size_t i = 1; i < m.outputs.size(); i += 6)
        want_inputs.push_back(as_vector(e.gradient(m.outputs[i])));

      m.pc.zero_grads();
      e.backward(m.g, m.outputs, seeds.data());
      size_t k = 0;
      for (uint32_t p : {m.W.id, m.b.id, m.h0.id}) {
        check_close(m.pc.grads(p), want[k], want[k].size(), 1e-5,
                    "gradient of " + m.pc.name(p));
        ++k;
      }
      for (size_t i = 1, j = 0; i < m.outputs.size(); i += 6, ++j)
        check_close(as_vector(e.gradient(m.outputs[i])), want_inputs[j], 5, 1e-5,
                    "adjoint of input " + std::to_string(j));
      CHECK(m.pc.grads(S.id)[0] == 0.0f);  // the seed row is not part of this backward
    }
  }
}

TEST_CASE("seeded backward: seeds in device memory need a device backend") {
  std::mt19937_64 rng(3);
  Model m(5);
  m.build(2, rng);
  std::vector<float> seeds(m.floats, 1.0f);
  Engine e(m.pc, EngineOptions{"agenda", "cpu", 1, 1.0});
  e.forward(m.g, m.outputs[0]);
  try {
    e.backward(m.g, m.outputs, seeds.data(), true);
    FAIL("no exception");
  } catch (const std::invalid_argument& ex) {
    CHECK(std::string(ex.what()).find("device") != std::string::npos);
  }
  CHECK_THROWS_AS(e.backward(m.g, m.outputs, nullptr), std::invalid_argument);
}
