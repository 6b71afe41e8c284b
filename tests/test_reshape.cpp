// reshape: a free view under another shape; batched results equal the double reference, and a
// reshape of a wrong size or of a parameter is refused.
#include <doctest/doctest.h>

#include <random>
#include <stdexcept>

#include "edbatch/engine.h"
#include "tests/check.h"
#include "tests/reference.h"

using namespace edbatch;
using edbatch::testing::check_close;

TEST_CASE("reshape: matrices made from computed vectors and inputs, batched = reference") {
  ParameterCollection pc(4);
  const Parameter W = pc.add_parameters("W", Dim{4, 3});
  const LookupParameter E = pc.add_lookup_parameters("E", 9, 6);
  std::mt19937_64 rng(8);
  for (uint32_t n : {1u, 5u, 17u}) {
    Graph g(pc);
    std::vector<Expr> losses;
    for (uint32_t i = 0; i < n; ++i) {
      std::vector<float> v(2);
      for (float& x : v) x = static_cast<float>(rng() % 100) / 50.0f - 1.0f;
      // A 3x2 matrix from a lookup (a computed vector), times a vector from an input reshaped.
      const Expr M = reshape(tanh(lookup(g, E, static_cast<uint32_t>(rng() % 9))), Dim{3, 2});
      const Expr x = reshape(input(g, Dim{1, 2}, v), Dim{2, 1});
      const Expr y = tanh(matmul(parameter(g, W), matmul(M, x)));
      losses.push_back(pick_neg_log_softmax(y, static_cast<uint32_t>(rng() % 4)));
    }
    const Expr loss = sum_losses(losses);
    testing::Reference ref(g);
    ref.forward();
    ref.backward(loss.id);
    for (const char* policy : {"none", "lb-greedy"}) {
      pc.zero_grads();
      Engine e(pc, EngineOptions{policy, "cpu", 2, 1.0});
      const double l = as_scalar(e.forward(g, loss));
      e.backward(g, loss);
      check_close(&l, &ref.values[loss.id][0], 1, 1e-5, "loss");
      check_close(pc.grads(W.id), ref.param_grads[W.id].data(), pc.dim(W.id).size(), 1e-5, "dW");
      check_close(pc.grads(E.id), ref.param_grads[E.id].data(), pc.dim(E.id).size(), 1e-5, "dE");
    }
  }
}

TEST_CASE("reshape: wrong sizes and parameters are refused") {
  ParameterCollection pc(4);
  const Parameter W = pc.add_parameters("W", Dim{4, 3});
  Graph g(pc);
  const Expr x = input(g, Dim{6, 1}, std::vector<float>(6, 1.0f));
  CHECK_THROWS_WITH_AS(reshape(x, Dim{4, 2}), doctest::Contains("cannot reshape 6 (6 values) to 4x2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(reshape(parameter(g, W), Dim{12, 1}), doctest::Contains("parameter 'W'"),
                       std::invalid_argument);
  CHECK(g.node(reshape(x, Dim{2, 3}).id).dim == (Dim{2, 3}));
}
