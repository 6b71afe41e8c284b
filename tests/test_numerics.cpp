// Non-finite values: EngineOptions::check_numerics names the first one a pass computes (op, node,
// batch; inside blocks the body node and the call), and `edbatch run --train` stops at the first
// mini-batch whose loss is not finite.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/edbatch.h"
#include "tests/cli_run.h"

using namespace edbatch;
namespace test = edbatch::test;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

EngineOptions checked(bool on = true) {
  EngineOptions o;
  o.check_numerics = on;
  return o;
}

// The message of the NumericsError `f` throws ("" when it throws none).
template <class F>
std::string numerics_error(const F& f) {
  try {
    f();
  } catch (const NumericsError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("numerics: Engine::set_check_numerics turns the check on and off between passes") {
  ParameterCollection pc;
  Graph g(pc);
  const Expr x = input(g, 1.0f);
  const Expr y = tanh((x * 1e30f) * 1e30f);
  Engine engine(pc, checked(false));
  CHECK(as_scalar(engine.forward(g, y)) == 1.0f);
  engine.set_check_numerics(true);
  CHECK(engine.options().check_numerics);
  g.write_inputs(0, std::vector<float>{2.0f}.data(), 1);  // a new forward pass
  CHECK(contains(numerics_error([&] { engine.forward(g, y); }), "holds inf"));
  engine.set_check_numerics(false);
  g.write_inputs(0, std::vector<float>{3.0f}.data(), 1);
  CHECK(numerics_error([&] { engine.forward(g, y); }).empty());
}

TEST_CASE("numerics: an overflow hidden by tanh is found, naming its op, node and batch") {
  ParameterCollection pc;
  Graph g(pc);
  const Expr x = input(g, 1.0f);
  const Expr big = x * 1e30f;
  const Expr overflow = big * 1e30f;  // inf
  const Expr y = tanh(overflow);      // 1: the pass looks fine without the check
  Engine plain(pc, checked(false));
  CHECK(as_scalar(plain.forward(g, y)) == 1.0f);

  Engine engine(pc, checked());
  const std::string m = numerics_error([&] { engine.forward(g, y); });
  INFO(m);
  CHECK(contains(m, "[Engine::forward] non-finite value: node " + std::to_string(overflow.id) +
                        " (op scalar_affine"));
  CHECK(contains(m, "holds inf at element 0 of 1"));
  CHECK(contains(m, "computed by batch 1 of 3 of the forward pass"));
  // The engine stays usable: the values are there to inspect.
  CHECK(std::isinf(as_scalar(engine.value(overflow))));
}

TEST_CASE("numerics: an increment checks the nodes it ran, not those of the increments before") {
  ParameterCollection pc;
  Graph g(pc);
  const Expr x = input(g, 1.0f);
  const Expr overflow = (x * 1e30f) * 1e30f;  // inf
  Engine engine(pc, checked());
  const std::string first = numerics_error([&] { engine.forward(g, overflow); });
  INFO(first);
  CHECK(contains(first, "node " + std::to_string(overflow.id) + " (op scalar_affine"));
  // A later increment of finite values, reading the same input: nothing to report.
  const Expr y = x * 3.0f;
  std::string later;
  CHECK_NOTHROW(later = numerics_error([&] { CHECK(as_scalar(engine.forward(g, y)) == 3.0f); }));
  CHECK(later.empty());
  // One that overflows is named, not the node found before.
  const Expr again = (y * 1e30f) * 1e30f;
  const std::string second = numerics_error([&] { engine.forward(g, again); });
  INFO(second);
  CHECK(contains(second, "node " + std::to_string(again.id) + " (op scalar_affine"));
  // A whole forward from the start (new input values) checks every node again.
  const float two = 2.0f;
  g.write_inputs(0, &two, 1);
  const std::string whole = numerics_error([&] { engine.forward(g, again); });
  CHECK(contains(whole, "node " + std::to_string(overflow.id) + " (op scalar_affine"));
}

TEST_CASE("numerics: a gradient that overflows while the values are finite") {
  ParameterCollection pc;
  Graph g(pc);
  const Expr x = input(g, 1e-30f);
  const Expr a = x * 1.0f;
  const Expr loss = (a * 1e20f) * 1e20f;  // 1e10; d loss / d a = 1e40 = inf
  Engine engine(pc, checked());
  CHECK(as_scalar(engine.forward(g, loss)) == doctest::Approx(1e10));
  const std::string m = numerics_error([&] { engine.backward(g, loss); });
  INFO(m);
  CHECK(contains(m, "[Engine::backward] non-finite gradient: the gradient of node " +
                        std::to_string(a.id) + " (op scalar_affine"));
  CHECK(contains(m, "holds inf"));
}

TEST_CASE("numerics: parameters and inputs are checked before the pass") {
  ParameterCollection pc;
  const Parameter p = pc.add_parameters("p", Dim{3, 1});
  pc.values(p.id)[2] = std::numeric_limits<float>::quiet_NaN();
  pc.mark_changed();
  Graph g(pc);
  const Expr y = tanh(parameter(g, p));
  Engine engine(pc, checked());
  std::string m = numerics_error([&] { engine.forward(g, y); });
  CHECK(contains(m, "parameter 'p' holds nan at element 2 of 3, before the forward pass"));

  // A matrix and a lookup table: the element as their saved tensors (and PyTorch) index them,
  // [row, column] of a rows x cols matrix and [word, feature] of a table, not the position in
  // the collection's column-major storage.
  ParameterCollection pcm;
  const Parameter w = pcm.add_parameters("W", Dim{5, 4});
  pcm.values(w.id)[3 * 5 + 2] = std::numeric_limits<float>::infinity();  // column 3, row 2
  pcm.mark_changed();
  Graph gm(pcm);
  Engine em(pcm, checked());
  m = numerics_error([&] { em.forward(gm, tanh(parameter(gm, w))); });
  CHECK(contains(m, "parameter 'W' holds inf at element [2, 3] of shape [5, 4]"));
  ParameterCollection pcl;
  const LookupParameter e = pcl.add_lookup_parameters("E", 7, 3);         // 7 words of 3 features
  pcl.values(e.id)[4 * 3 + 1] = std::numeric_limits<float>::quiet_NaN();  // word 4, feature 1
  pcl.mark_changed();
  Graph gl(pcl);
  Engine el(pcl, checked());
  m = numerics_error([&] { el.forward(gl, tanh(lookup(gl, e, 0))); });
  CHECK(contains(m, "parameter 'E' holds nan at element [4, 1] of shape [7, 3]"));

  ParameterCollection pc2;
  Graph g2(pc2);
  const Expr x = input(g2, Dim{2, 1}, {1.0f, -std::numeric_limits<float>::infinity()});
  Engine engine2(pc2, checked());
  m = numerics_error([&] { engine2.forward(g2, tanh(x)); });
  CHECK(contains(m, "input node " + std::to_string(x.id) + " holds -inf at element 1 of 2"));
}

TEST_CASE("numerics: inside a block, the body node and the call are named") {
  ParameterCollection pc;
  Block blk(pc, "blow_up");
  const Expr h = blk.input("h", Dim{2, 1});
  blk.output("y", tanh(scalar_affine(scalar_affine(h, 1e30f, 0.0f), 1e30f, 0.0f)));
  blk.freeze();
  Graph g(pc);
  std::vector<Expr> ys;
  for (float v : {0.0f, 0.0f, 1.0f}) {  // the third call overflows
    const Expr x = input(g, Dim{2, 1}, {0.0f, v});
    ys.push_back(blk(g, {x}, {})[0]);
  }
  const Expr loss = sum_losses({pick(ys[0], 0), pick(ys[1], 1), pick(ys[2], 1)});
  Engine engine(pc, checked());
  const std::string m = numerics_error([&] { engine.forward(g, loss); });
  INFO(m);
  const uint32_t third_call = g.args(g.node(ys[2].id))[0];
  CHECK(contains(
      m, "(op scalar_affine) of block 'blow_up' in call node " + std::to_string(third_call)));
  CHECK(contains(m, "holds inf at element 1 of 2"));
}

TEST_CASE("numerics: finite passes are untouched by the check") {
  ParameterCollection pc(3);
  const Parameter W = pc.add_parameters("W", Dim{4, 4});
  Graph g(pc);
  Expr h = input(g, Dim{4, 1}, {0.1f, 0.2f, -0.3f, 0.4f});
  for (int i = 0; i < 5; ++i) h = tanh(parameter(g, W) * h);
  const Expr loss = pick_neg_log_softmax(h, 2);
  Engine on(pc, checked()), off(pc, checked(false));
  CHECK(as_scalar(on.forward(g, loss)) == as_scalar(off.forward(g, loss)));
  on.backward(g, loss);
}

TEST_CASE("numerics: edbatch run --train stops at a diverging mini-batch, naming it") {
  test::TempDir dir;
  const std::string diverging =
      "run --model mvrnn --data synthetic:24 --batch 8 --hidden 8 --train --lr 1e5 "
      "--clip 0 --epochs 2 --warmup 0 ";
  for (const char* mode : {"", "--pipeline"}) {
    CAPTURE(mode);
    const test::CliResult r = test::run_cli(dir, diverging + mode);
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "epoch 1, mini-batch "));
    CHECK(contains(r.err, "the training loss is "));
    CHECK(contains(r.err, "training stopped"));
  }
  // The full check names the first non-finite value's op and node.
  const test::CliResult r = test::run_cli(dir, diverging + "--check-numerics");
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(contains(r.err, "epoch 1, mini-batch "));
  CHECK(contains(r.err, "] non-finite "));
  CHECK(contains(r.err, "(op "));
  CHECK(contains(r.err, "node "));
  // A sane run passes the check, training or not.
  const std::string sane =
      "run --model tree_lstm --data synthetic:20 --batch 8 --hidden 6 --warmup 1 "
      "--check-numerics ";
  for (const char* mode : {"", "--train"}) {
    CAPTURE(mode);
    const test::CliResult ok = test::run_cli(dir, sane + mode);
    INFO(ok.err);
    CHECK(ok.code == 0);
  }
}
