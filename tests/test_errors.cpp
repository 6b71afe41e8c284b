// Caller mistakes raise exceptions whose message names the problem.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "edbatch/dump.h"
#include "edbatch/edbatch.h"
#include "edbatch/options.h"

using namespace edbatch;

namespace {
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("errors: shape mismatches name the op, node and shapes") {
  ParameterCollection pc;
  const Parameter W = pc.add_parameters("W", Dim{4, 3});
  const Parameter b = pc.add_parameters("b", Dim{4, 1});
  Graph g(pc);
  const Expr x5 = input(g, Dim{5, 1}, std::vector<float>(5, 1.0f));
  const Expr x4 = input(g, Dim{4, 1}, std::vector<float>(4, 1.0f));
  std::string m = message_of([&] { affine({parameter(g, b), parameter(g, W), x5}); });
  CHECK(contains(m, "[affine]"));
  CHECK(contains(m, "4x3"));
  CHECK(contains(m, "5"));
  CHECK(contains(m, "node "));
  m = message_of([&] { cmult(x5, x4); });
  CHECK(contains(m, "[cmult]"));
  CHECK(contains(m, "shape 4"));
  CHECK(contains(m, "shape 5"));
  m = message_of([&] { keep(x5, x4); });  // the mask must have the value's shape
  CHECK(contains(m, "[keep]"));
  CHECK(contains(m, "shape 4"));
  m = message_of([&] { matmul(parameter(g, W), x4); });
  CHECK(contains(m, "[matmul] node"));
  CHECK(contains(m, "cannot multiply 4x3 by 4"));
  m = message_of([&] { concat({x5, input(g, Dim{2, 2}, std::vector<float>(4, 0.0f))}); });
  CHECK(contains(m, "[concat]"));
  CHECK(contains(m, "columns"));
  m = message_of([&] { input(g, Dim{3, 1}, std::vector<float>(2, 0.0f)); });
  CHECK(contains(m, "needs 3 values, got 2"));
  CHECK_THROWS_AS(affine({x4, x4}), std::invalid_argument);
}

TEST_CASE("errors: arguments of slices, layer norm, dropout, broadcasts, average and maximum") {
  ParameterCollection pc;
  Graph g(pc);
  const Expr x = input(g, Dim{5, 2}, std::vector<float>(10, 1.0f));
  const Expr v = input(g, Dim{5, 1}, std::vector<float>(5, 1.0f));
  std::string m = message_of([&] { slice_rows(x, 3, 6); });
  CHECK(contains(m, "[slice_rows] node "));
  CHECK(contains(m, "rows [3, 6) of 5x2 are out of range"));
  m = message_of([&] { slice_rows(x, 2, 2); });
  CHECK(contains(m, "rows [2, 2) of 5x2 are empty"));
  CHECK_NOTHROW(slice_rows(x, 0, 5));
  m = message_of([&] { dropout(v, 1.0f, 3); });
  CHECK(contains(m, "[dropout] node "));
  CHECK(contains(m, "p = 1 (of a 5 value) is outside [0, 1)"));
  CHECK(contains(message_of([&] { dropout(v, -0.1f, 3); }), "p = -0.1 (of a 5 value)"));
  CHECK_NOTHROW(dropout(v, 0.0f, 3));
  Block drop(pc, "drop");  // inside a block body: named by the block, not by a body node
  const Expr bx = drop.input("x", Dim{5, 1});
  drop.index("key");
  CHECK(contains(message_of([&] { drop.dropout(bx, 1.0f, 0); }),
                 "[Block::dropout] block 'drop': p = 1 is outside [0, 1)"));
  m = message_of([&] { layer_norm(x, -1e-5f); });
  CHECK(contains(m, "[layer_norm] node "));
  CHECK(contains(m, "eps = -1e-05 for 5x2"));
  CHECK_NOTHROW(layer_norm(input(g, 2.0f), 1e-5f));  // one row: variance 0
  m = message_of([&] { broadcast_rows(x, 4); });
  CHECK(contains(m, "[broadcast] node "));
  CHECK(contains(m, "broadcasts 5x2 to 4 rows: needs one row"));
  CHECK(contains(message_of([&] { broadcast_rows(column_sum(x), 0); }), "1x2 to 0 rows"));
  CHECK(g.node(broadcast_rows(column_sum(x), 4).id).dim == Dim{4, 2});
  CHECK(g.node(column_sum(x).id).dim == Dim{1, 2});
  m = message_of([&] { average({v, x}); });
  CHECK(contains(m, "[average] node "));
  CHECK(contains(m, "argument 2 has shape 5x2 but argument 1 has shape 5"));
  CHECK(contains(message_of([&] { maximum({v, v, x}); }), "[maximum] node "));
  CHECK(contains(message_of([&] { maximum({}); }), "[maximum] needs at least one argument"));
  // One argument is the argument itself, as for sum.
  CHECK(average({v}).id == v.id);
  CHECK(maximum({v}).id == v.id);
}

TEST_CASE("errors: expressions from another graph or from before clear()") {
  ParameterCollection pc;
  Graph g1(pc), g2(pc);
  const Expr a = input(g1, 1.0f);
  const Expr b = input(g2, 2.0f);
  CHECK(contains(message_of([&] { add(a, b); }), "[add] argument 2 belongs to another graph"));
  CHECK(contains(message_of([&] { add(b, Expr{}); }), "argument 2 is an uninitialised"));
  CHECK(contains(message_of([&] { sum({b, b, Expr{}}); }), "[sum] argument 3 is an uninit"));
  g1.clear();
  CHECK(contains(message_of([&] { tanh(a); }), "before Graph::clear()"));
  CHECK(contains(message_of([&] { tanh(Expr{}); }), "uninitialised"));
  // A table of another collection, whether or not its id exists in this one.
  ParameterCollection other;
  const LookupParameter E = other.add_lookup_parameters("E", 4, 2);
  Graph g3(pc);
  CHECK(contains(message_of([&] { lookup(g3, E, 1); }),
                 "the handle of table 0 was made by another ParameterCollection"));
  pc.add_lookup_parameters("mine", 4, 2);
  CHECK(contains(message_of([&] { lookup(g3, E, 1); }), "another ParameterCollection"));
  CHECK(contains(message_of([&] { lookup(g3, LookupParameter{}, 1); }), "uninitialised"));
}

TEST_CASE("errors: backward before forward, non-scalar loss, engine misuse") {
  ParameterCollection pc;
  const Parameter W = pc.add_parameters("W", Dim{3, 3});
  Graph g(pc);
  const Expr x = input(g, Dim{3, 1}, {1, 2, 3});
  const Expr y = tanh(matmul(parameter(g, W), x));
  const Expr loss = pick_neg_log_softmax(y, 1);
  Engine e(pc);
  CHECK(contains(message_of([&] { e.backward(g, loss); }), "run forward()"));
  e.forward(g, loss);
  CHECK(contains(message_of([&] { e.backward(g, y); }), "not a scalar"));
  CHECK(contains(message_of([&] { e.gradient(x); }), "run backward() first"));
  e.backward(g, loss);
  // Adding a node after forward invalidates the forward for backward.
  const Expr more = pick(y, 0);
  CHECK(contains(message_of([&] { e.backward(g, more); }), "run forward()"));
  ParameterCollection other;
  Graph g2(other);
  const Expr z = tanh(input(g2, 1.0f));
  CHECK(contains(message_of([&] { e.forward(g2, z); }), "another ParameterCollection"));
}

TEST_CASE("errors: handles of another ParameterCollection") {
  ParameterCollection a, b;
  const Parameter wa = a.add_parameters("w", Dim{2, 1});
  const Parameter wb = b.add_parameters("w", Dim{2, 1});
  const LookupParameter eb = b.add_lookup_parameters("E", 4, 2);
  Graph g(a);
  parameter(g, wa);
  // Same ids in both collections: without the owner check b's handle would read a's values.
  CHECK(contains(message_of([&] { parameter(g, wb); }), "another ParameterCollection"));
  a.add_lookup_parameters("E", 4, 2);
  CHECK(contains(message_of([&] { lookup(g, eb, 1); }), "another ParameterCollection"));
}

TEST_CASE("errors: label, index and name ranges") {
  ParameterCollection pc;
  const LookupParameter E = pc.add_lookup_parameters("E", 10, 4);
  Graph g(pc);
  const Expr x = input(g, Dim{5, 1}, std::vector<float>(5, 0.5f));
  std::string m = message_of([&] { pick_neg_log_softmax(x, 5); });
  CHECK(contains(m, "[pick_neg_log_softmax]"));
  CHECK(contains(m, "label 5 out of range for a vector of 5"));
  CHECK(contains(message_of([&] { pick(x, 7); }), "index 7 out of range"));
  m = message_of([&] { lookup(g, E, 10); });
  CHECK(contains(m, "[lookup]"));
  CHECK(contains(m, "index 10 out of range for 'E' with 10 entries"));
  CHECK(contains(message_of([&] { pc.add_parameters("E", Dim{2, 1}); }), "already exists"));
  CHECK(contains(message_of([&] { make_policy("fastest"); }), "unknown policy 'fastest'"));
  CHECK(contains(message_of([&] { make_backend("tpu", {}); }), "unknown device 'tpu'"));
  // Without a usable GPU (or without CUDA in the build) the CUDA backend refuses, saying why.
  if (!device_unavailable("cuda").empty())
    CHECK(contains(message_of([&] { make_backend("cuda", {}); }), "[cuda]"));
  CHECK(contains(message_of([&] { parameter(g, Parameter{E.id}); }), "is a lookup table"));
  CHECK(contains(message_of([&] { sum_losses({x}); }), "not a scalar"));
  // Named by their place in the list (and their node), and by the arguments given.
  const Expr one = input(g, 1.0f);
  CHECK(contains(message_of([&] {
                   sum_losses({one, x});
                 }),
                 "losses[1] (node " + std::to_string(x.id) + ") is"));
  CHECK(contains(message_of([&] { pc.add_lookup_parameters("E0", 0, 4); }),
                 "[add_lookup_parameters] lookup table 'E0' of vocab 0 and dim 4 is empty"));
}

TEST_CASE("engine: a new graph at a recycled address is recomputed, not served from cache") {
  ParameterCollection pc;
  const Parameter W = pc.add_parameters("W", Dim{2, 2});
  Engine e(pc);
  float first = 0, second = 0;
  for (int step = 0; step < 2; ++step) {
    Graph g(pc);  // same stack slot, same node count each step
    const Expr loss = pick_neg_log_softmax(matmul(parameter(g, W), input(g, Dim{2, 1}, {1, 2})), 0);
    (step == 0 ? first : second) = as_scalar(e.forward(g, loss));
    e.backward(g, loss);
    pc.sgd_update(0.5f);
  }
  CHECK(second < first);
}

TEST_CASE("errors: EDBATCH_CUDA_STAGE_WAITS is read as 0, auto or 1, anything else refused") {
  using Waits = CudaOptions::StageWaits;
  const std::pair<const char*, Waits> cases[] = {
      {"0", Waits::InOrder}, {"auto", Waits::Auto}, {"1", Waits::Always}};
  for (const auto& [value, expected] : cases) {
    CAPTURE(value);
    CudaOptions o;
    o.stage_waits = expected == Waits::Auto ? Waits::InOrder : Waits::Auto;
    setenv("EDBATCH_CUDA_STAGE_WAITS", value, 1);
    CHECK(apply_debug_env(o).stage_waits == expected);
  }
  setenv("EDBATCH_CUDA_STAGE_WAITS", "yes", 1);
  CHECK(contains(message_of([] { apply_debug_env(CudaOptions{}); }),
                 "EDBATCH_CUDA_STAGE_WAITS='yes': expected 0, auto or 1"));
  unsetenv("EDBATCH_CUDA_STAGE_WAITS");
  CHECK(apply_debug_env(CudaOptions{}).stage_waits == Waits::Auto);
}

TEST_CASE("errors: on/off switches read the usual words and refuse others") {
  for (const char* on : {"1", "true", "TRUE", "yes", "On"}) {
    CAPTURE(on);
    setenv("EDBATCH_CUDA_SYNC", on, 1);
    CHECK(env_flag("EDBATCH_CUDA_SYNC"));
  }
  for (const char* off : {"", "0", "false", "No", "OFF"}) {
    CAPTURE(off);
    setenv("EDBATCH_CUDA_SYNC", off, 1);
    CHECK_FALSE(env_flag("EDBATCH_CUDA_SYNC"));
  }
  // "false" turned profiling on before: any value but "" and "0" did.
  setenv("EDBATCH_TORCH_PROFILE", "false", 1);
  CHECK_FALSE(adapter_debug_env().profile);
  setenv("EDBATCH_CUDA_SYNC", "2", 1);
  CHECK(contains(message_of([] { apply_debug_env(CudaOptions{}); }),
                 "EDBATCH_CUDA_SYNC='2': expected 1, true, yes or on, or 0, false, no or off"));
  unsetenv("EDBATCH_CUDA_SYNC");
  unsetenv("EDBATCH_TORCH_PROFILE");
  CHECK_FALSE(env_flag("EDBATCH_CUDA_SYNC"));
}

TEST_CASE(
    "errors: EDBATCH_CUDA_CHAIN, _LINEAR, _EPILOGUE, _LINEAR_BLOCKS: their values, empty, and "
    "refusals") {
  using Chain = CudaOptions::Chain;
  const std::pair<const char*, Chain> chains[] = {
      {"0", Chain::None}, {"forward", Chain::Forward}, {"1", Chain::All}, {"all", Chain::All}};
  for (const auto& [value, expected] : chains) {
    CAPTURE(value);
    CudaOptions o;
    o.chain = expected == Chain::Forward ? Chain::None : Chain::Forward;
    setenv("EDBATCH_CUDA_CHAIN", value, 1);
    CHECK(apply_debug_env(o).chain == expected);
  }
  setenv("EDBATCH_CUDA_CHAIN", "", 1);  // empty: the option as it was
  CudaOptions forward;
  forward.chain = Chain::Forward;
  CHECK(apply_debug_env(forward).chain == Chain::Forward);
  setenv("EDBATCH_CUDA_CHAIN", "2", 1);
  CHECK(contains(message_of([] { apply_debug_env(CudaOptions{}); }),
                 "EDBATCH_CUDA_CHAIN='2': expected 0, forward, 1 or all"));
  unsetenv("EDBATCH_CUDA_CHAIN");

  CudaOptions o;
  setenv("EDBATCH_CUDA_LINEAR", "cublas", 1);
  CHECK_FALSE(apply_debug_env(o).fused_linear);
  o.fused_linear = false;
  setenv("EDBATCH_CUDA_LINEAR", "fused", 1);
  CHECK(apply_debug_env(o).fused_linear);
  setenv("EDBATCH_CUDA_LINEAR", "cudnn", 1);
  CHECK(contains(message_of([] { apply_debug_env(CudaOptions{}); }),
                 "EDBATCH_CUDA_LINEAR='cudnn': expected cublas or fused"));
  unsetenv("EDBATCH_CUDA_LINEAR");

  CHECK_FALSE(CudaOptions{}.gemm_epilogue);
  setenv("EDBATCH_CUDA_EPILOGUE", "1", 1);
  CHECK(apply_debug_env(CudaOptions{}).gemm_epilogue);
  o.gemm_epilogue = true;
  setenv("EDBATCH_CUDA_EPILOGUE", "0", 1);
  CHECK_FALSE(apply_debug_env(o).gemm_epilogue);
  unsetenv("EDBATCH_CUDA_EPILOGUE");
  CHECK(apply_debug_env(o).gemm_epilogue);  // unset: the option as it was

  CHECK(CudaOptions{}.pointwise_runs);
  setenv("EDBATCH_CUDA_RUNS", "0", 1);
  CHECK_FALSE(apply_debug_env(CudaOptions{}).pointwise_runs);
  unsetenv("EDBATCH_CUDA_RUNS");
  CHECK(apply_debug_env(CudaOptions{}).pointwise_runs);

  CHECK(CudaOptions{}.prepare_ahead);
  setenv("EDBATCH_CUDA_PREPARE", "0", 1);
  CHECK_FALSE(apply_debug_env(CudaOptions{}).prepare_ahead);
  unsetenv("EDBATCH_CUDA_PREPARE");
  CHECK(apply_debug_env(CudaOptions{}).prepare_ahead);

  CHECK(CudaOptions{}.linear_min_blocks == 0);
  setenv("EDBATCH_CUDA_LINEAR_BLOCKS", "7", 1);
  CHECK(apply_debug_env(CudaOptions{}).linear_min_blocks == 7);
  for (const char* bad : {"-1", "seven", "7x", "4294967296"}) {
    setenv("EDBATCH_CUDA_LINEAR_BLOCKS", bad, 1);
    CHECK(
        contains(message_of([] { apply_debug_env(CudaOptions{}); }),
                 std::string("EDBATCH_CUDA_LINEAR_BLOCKS='") + bad + "': expected a whole number"));
  }
  unsetenv("EDBATCH_CUDA_LINEAR_BLOCKS");
}

// max_index returns each column's row as a float, exact up to 2^24. (Its refusal of an empty
// argument is a guard: no builder makes an empty value, as the first check shows.)
TEST_CASE("errors: max_index refuses columns of more than 2^24 rows") {
  ParameterCollection pc;
  Graph g(pc);
  std::string m = message_of([&] { max_index(input(g, Dim{0, 3}, std::vector<float>{})); });
  CHECK(contains(m, "[input] empty shape 0x3"));
  const std::vector<float> column((1u << 24) + 1, 0.0f);
  m = message_of([&] { max_index(input(g, Dim{(1u << 24) + 1, 1}, column)); });
  CHECK(contains(m, "[max_index] node "));
  CHECK(contains(m, "columns of 16777217 rows; at most 16777216"));
  CHECK_NOTHROW(max_index(input(g, Dim{1u << 24, 1}, column.data())));
}

// Dim::size() is 32 bits: a shape of 2^32 or more entries would wrap to a small size, be
// allocated so, and be written past its end. Each way in refuses it.
TEST_CASE("errors: shapes of 2^32 entries or more, null inputs and too many threads") {
  ParameterCollection pc;
  std::string m = message_of([&] { pc.add_parameters("big", Dim{65536, 65537}); });
  CHECK(contains(m, "[add_parameters] parameter 'big' of shape 65536x65537 has more than 2^32"));
  m = message_of([&] { pc.add_lookup_parameters("E", 65537, 65536); });
  CHECK(contains(m, "parameter 'E' of shape 65536x65537 has more than 2^32"));
  CHECK(pc.size() == 0);
  Graph g(pc);
  const std::vector<float> few(65536, 1.0f);
  m = message_of([&] { input(g, Dim{65536, 65537}, few); });
  CHECK(contains(m, "[input] shape 65536x65537 has more than 2^32"));
  m = message_of([&] { input(g, Dim{65536, 65536}, few.data()); });  // wraps to 0
  CHECK(contains(m, "[input] shape 65536x65536 has more than 2^32"));
  m = message_of([&] { input(g, Dim{7, 1}, static_cast<const float*>(nullptr)); });
  CHECK(contains(m, "[input] no values (a null pointer) for shape 7"));
  const Expr row = input(g, Dim{1, 65537}, std::vector<float>(65537, 1.0f));
  m = message_of([&] { broadcast_rows(row, 65536); });
  CHECK(contains(m, "shape 65536x65537 has more than 2^32"));
  CHECK(g.size() == 1);
  for (int threads : {0, 4097, 70000}) {
    m = message_of([&] { Engine e(pc, EngineOptions{"lb-greedy", "cpu", threads}); });
    CHECK(contains(m, "threads must be in 1..4096, got " + std::to_string(threads)));
  }
}

TEST_CASE("errors: collections are not copied, moved only without blocks, and keep their id") {
  static_assert(!std::is_copy_constructible_v<ParameterCollection>);
  static_assert(!std::is_copy_assignable_v<ParameterCollection>);
  ParameterCollection a;
  const Parameter w = a.add_parameters("w", Dim{2, 1});
  const uint64_t uid = a.uid();
  ParameterCollection b(std::move(a));
  CHECK(b.uid() == uid);  // a's handles are b's now
  CHECK(b.size() == 1);
  CHECK(a.uid() != uid);  // NOLINT(bugprone-use-after-move): the moved-from collection is empty
  CHECK(a.size() == 0);
  Graph g(b);
  CHECK_NOTHROW(parameter(g, w));
  {
    Block blk(b, "cell");
    CHECK(contains(message_of([&] { ParameterCollection c(std::move(b)); }),
                   "cannot move a collection while block 'cell' is declared over it"));
  }
  CHECK_NOTHROW([&] { ParameterCollection c(std::move(b)); }());  // the block is gone
}

TEST_CASE("errors: a graph truncated below what an engine ran is run afresh") {
  ParameterCollection pc;
  const Parameter W = pc.add_parameters("W", Dim{3, 3});
  Graph g(pc);
  const Expr x = input(g, Dim{3, 1}, {0.5f, -1, 2});
  const Expr y = tanh(matmul(parameter(g, W), x));
  Engine e(pc);
  e.forward(g, y);
  const uint32_t keep = y.id;  // x, W and the product stay; the tanh goes
  g.truncate(keep);
  const Expr product = g.expr(keep - 1);
  CHECK(contains(message_of([&] { e.value(product); }), "truncated since the last forward"));
  const Expr z = column_sum(cmult(product, product));  // another node where y was, and more
  e.forward(g, z);
  Engine fresh(pc);
  fresh.forward(g, z);
  CHECK(as_vector(e.value(z)) == as_vector(fresh.value(z)));
  // Null inputs and plans of another graph are refused, not read.
  CHECK(contains(message_of([&] { g.write_inputs(0, nullptr, 3); }), "values is null"));
  Graph other(pc);
  const Expr one = tanh(input(other, 1.0f));
  Engine e2(pc);
  e2.forward(other, one);
  CHECK(contains(message_of([&] { dump_plan_json(other, e.schedule(), e.plan()); }),
                 "[dump_plan_json] the schedule and memory plan are not of this graph"));
  CHECK_NOTHROW(dump_plan_dot(other, e2.schedule(), e2.plan()));
}

TEST_CASE("errors: NaN settings that would make every value NaN are refused") {
  ParameterCollection pc;
  Graph g(pc);
  const Expr x = input(g, Dim{3, 1}, {1, 2, 3});
  const float nan = std::nanf("");
  CHECK(contains(message_of([&] { leaky_relu(x, nan); }), "[leaky_relu]"));
  CHECK(contains(message_of([&] { elu(x, nan); }), "needs a finite number"));
  CHECK(contains(message_of([&] { pc.sgd_update(nan); }), "[sgd_update] lr = nan"));
  CHECK(contains(message_of([&] {
                   pc.add_parameters("w", Dim{2, 1}, nan);
                 }),
                 "init_scale must be finite"));
  pc.add_parameters("v", Dim{2, 1});
  const std::unique_ptr<Optimizer> opt = make_optimizer("sgd", pc);
  CHECK(contains(message_of([&] { opt->step(nan); }), "[Optimizer::step] grad_scale = nan"));
}
