// Graph::add_inputs and Graph::repeat_nodes: input nodes added in bulk, and copies of a unit of
// nodes, are the nodes, types and values that building them one by one gives; placeholders read
// as zeros until write_inputs fills them; a refused bulk add or copy leaves the graph as it was.
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

namespace {

// One unit per row: h_r = tanh(W [x_r; s_r]) + c_r, with c_r a constant input the unit adds.
// Returns the unit's first node.
uint32_t unit(Graph& g, Parameter W, const Expr& x, const Expr& s, std::vector<Expr>& out) {
  const uint32_t begin = g.size();
  const Expr c = input(g, Dim{4, 1}, std::vector<float>{0.5f, -0.25f, 1.0f, 2.0f});
  out.push_back(tanh(parameter(g, W) * concat({x, s})) + c);
  return begin;
}

}  // namespace

TEST_CASE("graph repeat: copies of a unit equal the unit built again, nodes and values") {
  ParameterCollection pc;
  const uint32_t rows = 5;
  Parameter W = pc.add_parameters("W", Dim{4, 7});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint32_t k = 0; k < 28; ++k) pc.values(W.id)[k] = u(rng);
  std::vector<float> x(rows * 3), s(rows * 4);
  for (float& v : x) v = u(rng);
  for (float& v : s) v = u(rng);
  const Dim xd{3, 1}, sd{4, 1};

  Graph whole(pc), repeated(pc);
  std::vector<Expr> want, got;
  for (Graph* g : {&whole, &repeated}) {
    g->add_inputs(&xd, 1, rows, x.data());  // nodes 0..4: x rows; 5..9: states
    g->add_inputs(&sd, 1, rows, s.data());
  }
  for (uint32_t r = 0; r < rows; ++r) unit(whole, W, whole.expr(r), whole.expr(rows + r), want);
  // Rows 0 and 1 through the builders (row 0 adds the parameter node), rows 2.. as copies of 1.
  unit(repeated, W, repeated.expr(0), repeated.expr(rows), got);
  const uint32_t b0 = unit(repeated, W, repeated.expr(1), repeated.expr(rows + 1), got);
  const uint32_t b1 = repeated.size(), m = b1 - b0;
  const uint32_t a0 = repeated.node(b0).arg_begin;
  const std::vector<uint32_t> pattern(repeated.all_args().begin() + a0, repeated.all_args().end());
  std::vector<uint32_t> args;
  for (uint32_t r = 2; r < rows; ++r)
    for (uint32_t a : pattern) {
      if (a >= b0)
        a += (r - 1) * m;  // the unit's own nodes
      else if (a == 1)
        a = r;  // its x row
      else if (a == rows + 1)
        a = rows + r;     // its state
      args.push_back(a);  // else the parameter, shared
    }
  CHECK(repeated.repeat_nodes(b0, b1, rows - 2, args.data()) == b1);
  for (uint32_t r = 2; r < rows; ++r) got.push_back(repeated.expr(got[1].id + (r - 1) * m));

  REQUIRE(repeated.size() == whole.size());
  for (uint32_t id = 0; id < whole.size(); ++id) {
    const Node &p = whole.node(id), &q = repeated.node(id);
    CHECK(p.op == q.op);
    CHECK(p.type == q.type);
    CHECK(p.dim == q.dim);
    CHECK(p.aux == q.aux);
    CHECK(p.aux2 == q.aux2);
    REQUIRE(p.num_args == q.num_args);
    for (uint32_t k = 0; k < p.num_args; ++k) CHECK(whole.args(p)[k] == repeated.args(q)[k]);
  }
  CHECK(repeated.input_values() == whole.input_values());
  Engine ew(pc), er(pc);
  ew.forward_through(whole, want);
  er.forward_through(repeated, got);
  for (uint32_t r = 0; r < rows; ++r) {
    const std::vector<float> a = as_vector(ew.value(want[r])), b = as_vector(er.value(got[r]));
    CHECK(a == b);
    // By hand: tanh(W [x_r; s_r]) + c.
    const float c[4] = {0.5f, -0.25f, 1.0f, 2.0f};
    for (uint32_t i = 0; i < 4; ++i) {
      double dot = 0;
      for (uint32_t k = 0; k < 3; ++k) dot += double(pc.values(W.id)[k * 4 + i]) * x[r * 3 + k];
      for (uint32_t k = 0; k < 4; ++k)
        dot += double(pc.values(W.id)[(3 + k) * 4 + i]) * s[r * 4 + k];
      CHECK(b[i] == doctest::Approx(std::tanh(dot) + c[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("graph repeat: refused copies name why and leave the graph as it was") {
  ParameterCollection pc;
  Parameter W = pc.add_parameters("W", Dim{2, 2});
  Graph g(pc);
  const Expr x = input(g, Dim{2, 1}, std::vector<float>{1, 2});
  const Expr w = parameter(g, W);
  const uint32_t b0 = g.size();
  tanh(w * x);  // pattern: the product, then tanh
  const uint32_t b1 = g.size();
  const uint32_t size = g.size();
  const uint64_t version = g.version();
  const size_t floats = g.input_values().size();
  // The product's arguments (W, x), then tanh's (the product).
  const uint32_t later[3] = {w.id, b1 + 1, b1};  // x is the copy's own tanh: after the product
  CHECK_THROWS_WITH_AS(g.repeat_nodes(b0, b1, 1, later), doctest::Contains("not one before it"),
                       std::invalid_argument);
  const uint32_t swapped[3] = {x.id, x.id, b1};  // a value where the pattern reads W
  CHECK_THROWS_WITH_AS(g.repeat_nodes(b0, b1, 1, swapped),
                       doctest::Contains("is not a parameter where the pattern's is"),
                       std::invalid_argument);
  const uint32_t none[1] = {0};
  CHECK_THROWS_WITH_AS(g.repeat_nodes(w.id, b0, 1, none), doctest::Contains("is a parameter"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(g.repeat_nodes(b1, b0, 1, none), doctest::Contains("is not a range"),
                       std::invalid_argument);
  CHECK(g.size() == size);
  CHECK(g.version() == version);
  CHECK(g.input_values().size() == floats);
  CHECK(g.repeat_nodes(b0, b1, 0, none) == size);  // nothing to copy
  const uint32_t ok[3] = {w.id, x.id, b1};
  CHECK(g.repeat_nodes(b0, b1, 1, ok) == size);
  CHECK(g.size() == size + 2);
}
