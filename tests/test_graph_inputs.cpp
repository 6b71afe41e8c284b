// Graph::add_inputs: input nodes added in bulk are the nodes, types and values that one add_input
// per node gives, placeholders read as zeros until write_inputs fills them, and a failed bulk add
// leaves the graph as it was.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "edbatch/engine.h"
#include "edbatch/graph.h"

using namespace edbatch;

namespace {

// tanh(W [a; b]) per repetition of the pattern (a: 3 rows, b: 5), summed into one loss: every
// input value reaches the loss through its own product column.
Expr loss_over(Graph& g, Parameter W, const std::vector<Expr>& xs) {
  std::vector<Expr> terms;
  for (size_t k = 0; k + 1 < xs.size(); k += 2)
    terms.push_back(column_sum(tanh(parameter(g, W) * concat({xs[k], xs[k + 1]}))));
  return sum(terms);
}

// The same loss by hand, in double precision.
double loss_by_hand(const std::vector<float>& w, const std::vector<float>& x, uint32_t rows) {
  double total = 0;
  for (size_t at = 0; at < x.size(); at += 8)
    for (uint32_t r = 0; r < rows; ++r) {
      double dot = 0;
      for (uint32_t c = 0; c < 8; ++c) dot += double(w[c * rows + r]) * x[at + c];  // column-major
      total += std::tanh(dot);
    }
  return total;
}

}  // namespace

TEST_CASE("graph inputs: a bulk add equals one add_input per node, values and forward") {
  ParameterCollection pc;
  const uint32_t rows = 4, count = 7;
  Parameter W = pc.add_parameters("W", Dim{rows, 8});
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(rows * 8);
  for (float& v : w) v = u(rng);
  std::copy(w.begin(), w.end(), pc.values(W.id));
  std::vector<float> x(count * 8);
  for (float& v : x) v = u(rng);
  const Dim dims[2] = {Dim{3, 1}, Dim{5, 1}};

  Graph one_by_one(pc), bulk(pc);
  input(one_by_one, 0.5f);  // an input before: the bulk's offsets start after it
  input(bulk, 0.5f);
  std::vector<Expr> a, b;
  for (uint32_t r = 0; r < count; ++r) {
    a.push_back(input(one_by_one, dims[0], x.data() + r * 8));
    a.push_back(input(one_by_one, dims[1], x.data() + r * 8 + 3));
  }
  const uint32_t first = bulk.add_inputs(dims, 2, count, x.data());
  CHECK(first == 1);
  for (uint32_t k = 0; k < 2 * count; ++k) b.push_back(bulk.expr(first + k));
  REQUIRE(bulk.size() == one_by_one.size());
  for (uint32_t id = 0; id < bulk.size(); ++id) {
    const Node &p = one_by_one.node(id), &q = bulk.node(id);
    CHECK(p.op == q.op);
    CHECK(p.dim == q.dim);
    CHECK(p.type == q.type);
    CHECK(p.aux == q.aux);
  }
  CHECK(bulk.input_values() == one_by_one.input_values());

  const Expr la = loss_over(one_by_one, W, a), lb = loss_over(bulk, W, b);
  Engine ea(pc), eb(pc);
  const float va = as_scalar(ea.forward(one_by_one, la)), vb = as_scalar(eb.forward(bulk, lb));
  const double want = loss_by_hand(w, x, rows);
  CHECK(va == doctest::Approx(want).epsilon(1e-5));
  CHECK(vb == doctest::Approx(want).epsilon(1e-5));
  // An input added one by one after the bulk reads its own value.
  const Expr after = input(bulk, Dim{2, 1}, std::vector<float>{3.0f, -4.0f});
  CHECK(bulk.input_values().size() == 1 + count * 8 + 2);
  eb.forward(bulk, after);
  CHECK(as_vector(eb.value(after)) == std::vector<float>{3.0f, -4.0f});
}

TEST_CASE("graph inputs: placeholders are zeros until write_inputs fills them") {
  ParameterCollection pc;
  Graph g(pc);
  const Dim dim{3, 1};
  const uint32_t first = g.add_inputs(&dim, 1, 4, nullptr);
  CHECK(g.size() == 4);
  CHECK(g.input_values() == std::vector<float>(12, 0.0f));
  std::vector<Expr> xs;
  for (uint32_t k = 0; k < 4; ++k) xs.push_back(g.expr(first + k));
  const Expr total = column_sum(sum(xs));
  Engine e(pc);
  CHECK(as_scalar(e.forward(g, total)) == 0.0f);
  const std::vector<float> v{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  g.write_inputs(0, v.data(), v.size());
  CHECK(as_scalar(e.forward(g, total)) == doctest::Approx(78.0));
  CHECK(as_vector(e.value(xs[2])) == std::vector<float>{7, 8, 9});
}

TEST_CASE("graph inputs: nothing to add, and a failed bulk add leaves the graph as it was") {
  ParameterCollection pc;
  Graph g(pc);
  input(g, 1.0f);
  const Dim dim{2, 1};
  CHECK(g.add_inputs(&dim, 1, 0, nullptr) == 1);
  CHECK(g.add_inputs(nullptr, 0, 5, nullptr) == 1);
  CHECK(g.size() == 1);
  const uint64_t version = g.version();
  const Dim bad[2] = {Dim{2, 1}, Dim{0, 1}};
  CHECK_THROWS_WITH_AS(g.add_inputs(bad, 2, 3, nullptr), doctest::Contains("empty shape"),
                       std::invalid_argument);
  // 65536 x 65536 floats: past the 32-bit input offsets, refused before anything is allocated.
  const Dim wide{65536, 1};
  CHECK_THROWS_WITH_AS(g.add_inputs(&wide, 1, 65536, nullptr), doctest::Contains("2^32 - 1"),
                       std::invalid_argument);
  CHECK(g.size() == 1);
  CHECK(g.input_values().size() == 1);
  CHECK(g.version() == version);
}
