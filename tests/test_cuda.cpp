// The CUDA backend against the CPU backend (itself checked against the double reference): every
// op in every operand layout, every zoo model op by op and through blocks, random trees,
// lattices, chains and DAGs under every policy, SGD training, and asynchronous errors. Without a
// GPU (or without CUDA in the build) every case here is skipped, and one case says so.
#include <doctest/doctest.h>
#include <unistd.h>
#ifdef EDBATCH_TEST_CUDA_RUNTIME
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "edbatch/options.h"
#include "edbatch/zoo.h"
#include "kernels/op_math.h"
#include "tests/check.h"
#include "tests/cli_run.h"
#include "tests/models.h"

using namespace edbatch;
using namespace edbatch::testing;

namespace {

const std::string kNoGpu = device_unavailable("cuda");
const bool kSkip = !kNoGpu.empty();
constexpr double kTol = 2e-4;  // float32, summed in another order (atomics, cuBLAS)

// A scalar within kTol of the reference, relative where the reference is above 1.
bool near(double got, double want) {
  return std::fabs(got - want) <= kTol * std::max(1.0, std::fabs(want));
}

// Everything one engine computes for a graph: the loss, every value and adjoint, every
// parameter gradient.
struct Run {
  double loss = 0;
  std::vector<std::vector<float>> values, adjoints, grads;
  uint64_t batches = 0, kernels = 0, stages = 0;
};

bool compared(const Node& n) {
  return n.op != Op::Parameter && n.op != Op::Call;
}

Run run_on(const std::string& device, Graph& g, const Expr& loss, const std::string& policy,
           bool blocks_ordered = true, const CudaOptions& cuda = {}) {
  ParameterCollection& pc = g.params();
  EngineOptions o;
  o.device = device;
  o.policy = policy;
  o.order_for_consumers = blocks_ordered;
  o.cuda = cuda;
  Engine e(pc, o);
  Run r;
  r.loss = as_scalar(e.forward(g, loss));
  r.values.resize(g.size());
  for (uint32_t v = 0; v < g.size(); ++v)
    if (compared(g.node(v))) r.values[v] = as_vector(e.value(g.expr(v)));
  e.backward(g, loss);
  r.adjoints.resize(g.size());
  for (uint32_t v = 0; v < g.size(); ++v)
    if (compared(g.node(v))) r.adjoints[v] = as_vector(e.gradient(g.expr(v)));
  r.grads.resize(pc.size());
  for (uint32_t p = 0; p < pc.size(); ++p)
    if (!pc.is_view(p)) r.grads[p].assign(pc.grads(p), pc.grads(p) + pc.dim(p).size());
  r.batches = e.stats().batches;
  r.kernels = e.stats().kernels;
  r.stages = e.stats().stages;
  pc.zero_grads();
  return r;
}

void check_same(const Run& gpu, const Run& cpu, const Graph& g) {
  const double scale = std::max(1.0, std::fabs(cpu.loss));
  CHECK(std::fabs(gpu.loss - cpu.loss) <= kTol * scale);
  for (uint32_t v = 0; v < g.size(); ++v) {
    if (!compared(g.node(v))) continue;
    const std::string what = std::string(op_name(g.node(v).op)) + " node " + std::to_string(v);
    REQUIRE(gpu.values[v].size() == cpu.values[v].size());
    check_close(gpu.values[v], cpu.values[v], cpu.values[v].size(), kTol, "value of " + what);
    check_close(gpu.adjoints[v], cpu.adjoints[v], cpu.adjoints[v].size(), kTol,
                "adjoint of " + what);
  }
  for (size_t p = 0; p < cpu.grads.size(); ++p)
    check_close(gpu.grads[p], cpu.grads[p], cpu.grads[p].size(), kTol,
                "gradient of " + g.params().name(static_cast<uint32_t>(p)));
}

void check_policies(Graph& g, const Expr& loss) {
  const Run cpu = run_on("cpu", g, loss, "agenda");
  for (const std::string policy : {"none", "depth", "agenda", "lb-greedy"}) {
    CAPTURE(policy);
    check_same(run_on("cuda", g, loss, policy), cpu, g);
  }
}

// ---- ops: k instances whose operands are laid out in order (views), reversed (index lists),
// shared by all, or parameters ----

enum class Layout { InOrder, Reversed, Shared, Param };

struct OpGraph {
  explicit OpGraph(uint64_t seed, ParameterCollection* shared = nullptr)
      : own(seed), pc(shared ? *shared : own), g(pc), rng(seed) {}
  ParameterCollection own;
  ParameterCollection& pc;  // own, or the caller's (whose blocks the graph calls)
  Graph g;
  std::mt19937_64 rng;
  uint32_t made = 0;

  std::vector<float> values(size_t n) {
    std::uniform_real_distribution<float> u(0.1f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = (rng() & 1 ? 1.0f : -1.0f) * u(rng);
    return v;
  }
  Expr param(Dim d) {
    const Parameter p = pc.add_parameters("p" + std::to_string(made++), d);
    const std::vector<float> v = values(d.size());
    std::copy(v.begin(), v.end(), pc.values(p.id));
    return parameter(g, p);
  }
  std::vector<Expr> operand(Dim d, Layout l, uint32_t k) {
    if (l == Layout::Shared) return std::vector<Expr>(k, input(g, d, values(d.size())));
    if (l == Layout::Param) return std::vector<Expr>(k, param(d));
    std::vector<Expr> xs;
    for (uint32_t i = 0; i < k; ++i) xs.push_back(input(g, d, values(d.size())));
    if (l == Layout::Reversed) std::reverse(xs.begin(), xs.end());
    return xs;
  }
  // A scalar from y: u^T y v with fresh inputs u, v.
  Expr reduce(const Expr& y) {
    const Dim d = g.node(y.id).dim;
    return matmul(matmul(input(g, Dim{1, d.rows}, values(d.rows)), y),
                  input(g, Dim{d.cols, 1}, values(d.cols)));
  }
};

using OpFn = Expr (*)(OpGraph&, const std::vector<Expr>&, uint32_t instance);

struct OpCase {
  const char* name;
  std::vector<Dim> slots;  // operand shapes
  OpFn build;
};

void check_op(const OpCase& c, Layout l, uint32_t k, uint64_t seed) {
  OpGraph og(seed);
  std::vector<std::vector<Expr>> per_slot;
  for (const Dim d : c.slots) per_slot.push_back(og.operand(d, l, k));
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < k; ++i) {
    std::vector<Expr> args;
    for (const auto& xs : per_slot) args.push_back(xs[i]);
    losses.push_back(og.reduce(c.build(og, args, i)));
  }
  const Expr loss = sum_losses(losses);
  check_same(run_on("cuda", og.g, loss, "agenda"), run_on("cpu", og.g, loss, "agenda"), og.g);
}

const Dim kV{13, 3};
const std::vector<OpCase> kOps = {
    {"tanh", {kV}, [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return tanh(a[0]); }},
    {"sigmoid", {kV}, [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return sigmoid(a[0]); }},
    {"relu", {kV}, [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return relu(a[0]); }},
    {"softplus",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return softplus(a[0]); }},
    {"scalar affine",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return 0.75f - a[0] * 1.5f; }},
    {"subtract",
     {kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return a[0] - a[1]; }},
    {"cmult",
     {kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return cmult(a[0], a[1]); }},
    {"sum of 3",
     {kV, kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return sum({a[0], a[1], a[2]});
     }},
    {"ragged sum",
     {kV, kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t i) {
       return i % 3 == 0 ? sum({a[0]}) : i % 3 == 1 ? sum({a[0], a[2]}) : sum({a[2], a[1], a[0]});
     }},
    // Nodes of two elements summing 100 and 70 arguments (a warp per element) beside a node
    // summing 3, in one batch.
    {"ragged sum of many small arguments", std::vector<Dim>(100, Dim{2, 1}),
     [](OpGraph&, const std::vector<Expr>& a, uint32_t i) {
       if (i % 3 == 1) return sum({a[5], a[0], a[99]});
       std::vector<Expr> xs(a.rbegin(), a.rend());
       if (i % 3 == 2) xs.resize(70);
       return sum(xs);
     }},
    {"concat",
     {Dim{5, 3}, Dim{1, 3}, Dim{7, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return concat({a[0], a[1], a[2]});
     }},
    // Argument sizes past 16 bits (the PyTorch adapter's seed concatenates every output).
    {"wide concat",
     {Dim{65541, 1}, Dim{3, 1}, Dim{65536, 1}, Dim{2, 1}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return concat({a[0], a[1], a[2], a[3]});
     }},
    {"pick",
     {Dim{11, 1}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t i) { return pick(a[0], (i * 5) % 11); }},
    {"pick_neg_log_softmax",
     {Dim{11, 1}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t i) {
       return pick_neg_log_softmax(a[0], (i * 7) % 11);
     }},
    // A warp per column: labels in the first, middle and last of 300 rows.
    {"pick_neg_log_softmax of 300 rows",
     {Dim{300, 1}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t i) {
       return pick_neg_log_softmax(a[0], i % 3 == 0 ? 0 : i % 3 == 1 ? 150 : 299);
     }},
    {"lookup",
     {},
     [](OpGraph& og, const std::vector<Expr>&, uint32_t i) {
       if (og.pc.find("table") == UINT32_MAX) og.pc.add_lookup_parameters("table", 5, 17);
       return tanh(lookup(og.g, LookupParameter{og.pc.find("table")}, (i * 3) % 5));
     }},
    {"affine",
     {Dim{17, 3}, Dim{17, 13}, Dim{13, 3}, Dim{17, 7}, Dim{7, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return affine({a[0], a[1], a[2], a[3], a[4]});
     }},
    {"matmul",
     {Dim{17, 13}, Dim{13, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return matmul(a[0], a[1]); }},
    {"reshape",
     {Dim{12, 1}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return tanh(reshape(tanh(a[0]), Dim{4, 3}));
     }},
    {"exp", {kV}, [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return exp(a[0]); }},
    // log and sqrt of positive values.
    {"log", {kV}, [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return log(1.5f + a[0]); }},
    {"sqrt",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return sqrt(1.5f + a[0]); }},
    {"gelu", {kV}, [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return gelu(a[0]); }},
    {"leaky_relu, elu, abs",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return leaky_relu(a[0], 0.1f) + elu(a[0], 0.7f) + abs(a[0]);
     }},
    {"sin, cos, erf, atan",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return sin(a[0] * 3.0f) + cos(a[0]) + erf(a[0] * 2.0f) + atan(a[0] * 4.0f);
     }},
    {"sinh, cosh, asinh, atanh, asin, acos",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return sinh(a[0] * 3.0f) + cosh(a[0]) + asinh(a[0] * 4.0f) + atanh(a[0] * 0.9f) +
              asin(a[0] * 0.8f) + acos(a[0] * 0.7f);
     }},
    {"floor, round, stop_gradient, atan2, hypot",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return cmult(floor(a[0] * 3.0f), a[0]) + cmult(round(a[0] * 2.5f), a[0]) + round(a[0]) +
              cmult(stop_gradient(a[0]), a[0]) + atan2(a[0], a[0] * -0.5f + 0.3f) +
              hypot(a[0], a[0] * 0.5f - 0.2f);
     }},
    {"erfc, lgamma, digamma, erfinv, fmod, remainder, copysign",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return erfc(a[0] * 2.0f) + lgamma(a[0] * 0.4f + 1.5f) + lgamma(a[0] * 0.4f - 0.5f) +
              digamma(a[0] * 0.4f + 1.5f) + digamma(a[0] * 0.4f - 0.5f) + erfinv(a[0] * 0.95f) +
              fmod(a[0] * 0.4f + 2.5f, a[0] * 0.02f - 1.0f) +
              remainder(a[0] * 0.4f - 2.5f, a[0] * 0.02f + 1.0f) + copysign(a[0], 0.5f - a[0]);
     }},
    {"step, keep",
     {kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return keep(a[0], a[1]) + keep(cmult(a[1], a[0]), step(a[0], true)) +
              cmult(step(a[1]), a[0]);
     }},
    {"scalar_divide",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return 0.5f / a[0]; }},
    {"divide",
     {kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return a[0] / a[1]; }},
    {"average of 3",
     {kV, kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return average({a[0], a[1], a[2]});
     }},
    {"ragged average and maximum",
     {kV, kV, kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t i) {
       return i % 3 == 0   ? average({a[0], a[1]})
              : i % 3 == 1 ? maximum({a[0], a[2]}) + average({a[2], a[1], a[0]})
                           : maximum({a[2], a[1], a[0]});
     }},
    {"slice_rows",
     {Dim{17, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return slice_rows(a[0], 3, 14); }},
    // Columns shorter and longer than a warp (32 rows).
    {"softmax",
     {Dim{7, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return softmax(a[0]); }},
    {"log_softmax",
     {Dim{77, 2}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return log_softmax(a[0]); }},
    {"layer_norm",
     {Dim{45, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return layer_norm(a[0], 1e-5f); }},
    {"softmax, layer_norm of one row",
     {Dim{1, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return softmax(a[0]) + layer_norm(a[0], 1e-3f);
     }},
    {"dropout",
     {kV},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t i) { return dropout(a[0], 0.3f, 17 * i); }},
    {"max_index",
     {Dim{77, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return max_index(a[0]); }},
    {"max_index of short columns, after log_softmax",
     {Dim{5, 2}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) { return max_index(log_softmax(a[0])); }},
    // Columns shorter and longer than a warp; the sum broadcast back over other rows.
    {"column_sum, broadcast",
     {Dim{77, 3}, Dim{5, 3}},
     [](OpGraph&, const std::vector<Expr>& a, uint32_t) {
       return cmult(a[1], broadcast_rows(column_sum(a[0]) + column_sum(a[1]), 5));
     }},
};

std::unique_ptr<Model> zoo_model(const std::string& name, ParameterCollection& pc, Dataset& data,
                                 uint32_t hidden, bool blocks) {
  data = load_dataset(model_data_kind(name), "synthetic:5", 23, 7);
  // The lattice models' unnormalised arc sums grow along a lattice, and float32 gradients with
  // them (the CPU is off the double reference by 1e-3 on a full-length one): keep them short.
  for (Lattice& l : data.lattices) {
    const uint32_t keep = std::min<uint32_t>(l.length(), 23);
    l.tags.resize(keep);
    l.arc_begin.resize(keep + 1);
    l.arcs.resize(l.arc_begin.back());
  }
  ModelOptions o;
  o.hidden = hidden;
  o.vocab = 23;
  o.blocks = blocks;
  o.seed = 3;
  o.char_embeddings = name == "bilstm_tagger";
  o.char_vocab = 7;
  o.rare_below = 2;
  return make_model(name, pc, data, o);
}

Expr build_model(Model& m, Graph& g) {
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < m.size(); ++i) losses.push_back(m.build(g, i));
  return sum_losses(losses);
}

// A zoo model through blocks over synthetic data (`data_spec`, words folded to `vocab`, drawn
// with `data_seed`), a collection seeded 3 and model options seeded `seed`, and its graph with the
// summed loss.
struct BlockModel {
  BlockModel(const std::string& name, const char* data_spec, uint32_t vocab, uint64_t data_seed,
             uint32_t hidden, uint64_t seed)
      : data(load_dataset(model_data_kind(name), data_spec, vocab, data_seed)) {
    ModelOptions o;
    o.hidden = hidden;
    o.vocab = vocab;
    o.blocks = true;
    o.seed = seed;
    m = make_model(name, pc, data, o);
    loss = build_model(*m, g);
  }
  ParameterCollection pc{3};
  Dataset data;
  std::unique_ptr<Model> m;
  Graph g{pc};
  Expr loss;
};

// One zoo model (hidden 6, through blocks) twice, over collections of one seed (so the same
// initial weights): a copy to train on the CPU and a copy to train on the GPU.
struct Twins {
  explicit Twins(const std::string& name)
      : m_cpu(zoo_model(name, pc_cpu, d_cpu, 6, true)), m_gpu(zoo_model(name, pc_gpu, d_gpu, 6, true)) {}
  // The GPU copy's weights (fetched from the device where newer) equal the CPU copy's.
  void check_trained() {
    for (uint32_t p = 0; p < pc_cpu.size(); ++p)
      check_close(pc_gpu.values(p), pc_cpu.values(p), pc_cpu.dim(p).size(), 1e-3,
                  "trained " + pc_cpu.name(p));
  }
  ParameterCollection pc_cpu{5}, pc_gpu{5};
  Dataset d_cpu, d_gpu;
  std::unique_ptr<Model> m_cpu, m_gpu;
  Graph g_cpu{pc_cpu}, g_gpu{pc_gpu};
};

#define CUDA_CASE(name) TEST_CASE(name* doctest::skip(kSkip))

}  // namespace

TEST_CASE("cuda: the GPU tests run only with a GPU") {
  if (kSkip) {
    MESSAGE("CUDA tests skipped: " << kNoGpu);
    return;
  }
  const std::unique_ptr<Backend> b = make_backend("cuda", {});
  CHECK(std::string(b->name()) == "cuda");
}

CUDA_CASE("cuda: maximum and max_index take NaN as the largest; maximum's gradient to the first") {
  testing::check_maximum_nan("cuda", 1);
}

CUDA_CASE("cuda: the rectifiers keep NaN and map the infinities as PyTorch does") {
  testing::check_rectifiers_nan("cuda", 1);
}

CUDA_CASE("cuda: sums and means of 10^5 arguments keep float32's precision") {
  testing::check_wide_sums("cuda", 1);
}

CUDA_CASE("cuda: log_softmax and pick_neg_log_softmax far from 0 and under a mask") {
  testing::check_log_softmax_far("cuda", 1);
}

CUDA_CASE("cuda: nodes the loss does not depend on leave the gradients alone") {
  testing::check_unused_nodes("cuda", 1);
}

CUDA_CASE("cuda: edbatch run reports the device time of a forward pass") {
  test::TempDir dir;
  for (const std::string args :
       {"--model tree_lstm --data synthetic:40", "--model lstm_nmt --data synthetic:24 --decode"}) {
    CAPTURE(args);
    const test::CliResult r =
        test::run_cli(dir, "run " + args + " --device cuda --batch 8 --hidden 32 --json '" +
                               dir / "m.json" + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("device time of a forward") != std::string::npos);
    const nlohmann::json m = nlohmann::json::parse(test::slurp(dir / "m.json"));
    REQUIRE(m.contains("device_forward_ms"));
    const double device = m["device_forward_ms"]["median"].get<double>();
    CHECK(device > 0);  // the forward's kernels take time on the device
    CHECK(device <= m["ms_per_minibatch"]["median"].get<double>());  // and the host waits
  }
}

CUDA_CASE("cuda: every op in every operand layout = cpu") {
  uint64_t seed = 1;
  for (const OpCase& c : kOps)
    for (Layout l : {Layout::InOrder, Layout::Reversed, Layout::Shared, Layout::Param})
      for (uint32_t k : {1u, 2u, 7u}) {
        CAPTURE(c.name);
        CAPTURE(static_cast<int>(l));
        CAPTURE(k);
        check_op(c, l, k, seed++);
      }
}

CUDA_CASE("cuda: every zoo model, op by op and through blocks, = cpu under every policy") {
  for (const std::string& name : model_names())
    for (bool blocks : {false, true})
      for (uint32_t hidden : {1u, 7u}) {
        CAPTURE(name);
        CAPTURE(blocks);
        CAPTURE(hidden);
        ParameterCollection pc(3);
        Dataset data;
        const std::unique_ptr<Model> m = zoo_model(name, pc, data, hidden, blocks);
        Graph g(pc);
        const Expr loss = build_model(*m, g);
        check_policies(g, loss);
      }
}

// The models, op by op and through blocks, at hidden 7 under `policy`, on cuda with the
// backend switches `cuda` and on the cpu: equal.
static void models_equal_with(const CudaOptions& cuda, std::initializer_list<const char*> names,
                              const std::string& policy) {
  for (const std::string name : names)
    for (bool blocks : {false, true}) {
      CAPTURE(name);
      CAPTURE(blocks);
      ParameterCollection pc(3);
      Dataset data;
      const std::unique_ptr<Model> m = zoo_model(name, pc, data, 7, blocks);
      Graph g(pc);
      const Expr loss = build_model(*m, g);
      check_same(run_on("cuda", g, loss, policy, true, cuda), run_on("cpu", g, loss, policy), g);
    }
}

// Forward, then every parameter scaled by 1.25 (the change a backward seed or an optimizer step
// between the passes makes), then backward: the gradients of both devices use the new values.
static std::vector<std::vector<float>> grads_after_change(const std::string& device, Graph& g,
                                                          const Expr& loss) {
  ParameterCollection& pc = g.params();
  EngineOptions o;
  o.device = device;
  o.policy = "lb-greedy";
  Engine e(pc, o);
  e.forward(g, loss);
  std::vector<std::vector<float>> saved(pc.size()), grads(pc.size());
  for (uint32_t p = 0; p < pc.size(); ++p) {
    if (pc.is_view(p)) continue;
    float* v = pc.values(p);
    saved[p].assign(v, v + pc.dim(p).size());
    for (float& x : saved[p]) x *= 1.25f;
    std::swap_ranges(saved[p].begin(), saved[p].end(), v);  // saved now holds the old values
  }
  pc.mark_changed();
  e.backward(g, loss);
  for (uint32_t p = 0; p < pc.size(); ++p) {
    if (pc.is_view(p)) continue;
    grads[p].assign(pc.grads(p), pc.grads(p) + pc.dim(p).size());
    std::copy(saved[p].begin(), saved[p].end(), pc.values(p));
  }
  pc.mark_changed();
  pc.zero_grads();
  return grads;
}

// The ops that are neither GEMMs nor functions of one element, in a block's fused groups (where
// column reductions share a thread block with other steps) and op by op, at k = 1, 7 and 64.
CUDA_CASE("cuda: a block of pooling, normalisation, slices and dropout = cpu") {
  ParameterCollection pc(4);
  const Dim h{40, 1};
  const Parameter W = pc.add_parameters("W", Dim{40, 40}), b = pc.add_parameters("b", h);
  auto cell = [&](Graph& g, const std::vector<Expr>& in, const std::function<Expr(Expr)>& drop) {
    const Expr m = maximum({in[0], in[1], in[2]}), a = average({in[1], in[2]});
    const Expr z = layer_norm(affine({parameter(g, b), parameter(g, W), m}), 1e-5f);
    return std::vector<Expr>{drop(gelu(z)), softmax(slice_rows(z + a, 3, 37)),
                             log_softmax(a / (2.0f + exp(in[0])))};
  };
  Block blk(pc, "pooled");
  std::vector<Expr> ins;
  for (int j = 0; j < 3; ++j) ins.push_back(blk.input("in" + std::to_string(j), h));
  const uint32_t key = blk.index("key");
  const auto outs = cell(blk.body(), ins, [&](Expr x) { return blk.dropout(x, 0.2f, key); });
  for (size_t o = 0; o < outs.size(); ++o) blk.output("out" + std::to_string(o), outs[o]);
  blk.freeze();
  for (uint32_t k : {1u, 7u, 64u})
    for (bool blocks : {true, false}) {
      CAPTURE(k);
      CAPTURE(blocks);
      OpGraph og(k, &pc);  // over the block's collection
      std::vector<Expr> losses;
      for (uint32_t i = 0; i < k; ++i) {
        std::vector<Expr> in;
        for (int j = 0; j < 3; ++j) in.push_back(tanh(input(og.g, h, og.values(h.size()))));
        const uint32_t drop_key = math::dropout_key(5, i, 0);
        const std::vector<Expr> y =
            blocks ? blk(og.g, in, {drop_key})
                   : cell(og.g, in, [&](Expr x) { return dropout(x, 0.2f, drop_key); });
        for (const Expr& e : y) losses.push_back(og.reduce(e));
      }
      const Expr loss = sum_losses(losses);
      check_same(run_on("cuda", og.g, loss, "agenda"), run_on("cpu", og.g, loss, "agenda"), og.g);
    }
}

// A block whose elementwise steps form one group of more than kMaxFusedSteps (24): it runs as
// several launches, which backward must take in reverse order (the later steps' adjoints first).
CUDA_CASE("cuda: a block's elementwise group longer than one launch holds = cpu") {
  ParameterCollection pc(6);
  const Dim h{19, 1};
  Block blk(pc, "long");
  const Expr x = blk.input("x", h), m = blk.input("m", h);
  Expr y = x;
  for (int i = 0; i < 40; ++i) y = i % 3 == 0 ? tanh(y) + m : (i % 3 == 1 ? y * 0.9f : cmult(y, m));
  blk.output("y", y);
  blk.freeze();
  REQUIRE(blk.plan().groups.size() == 1);
  REQUIRE(blk.plan().groups[0].step_count > 24);  // kernels/cuda/device.h: kMaxFusedSteps
  for (uint32_t k : {1u, 9u, 200u}) {
    CAPTURE(k);
    OpGraph og(k, &pc);
    std::vector<Expr> losses;
    for (uint32_t i = 0; i < k; ++i) {
      const Expr xi = tanh(input(og.g, h, og.values(h.size())));
      const Expr mi = sigmoid(input(og.g, h, og.values(h.size())));
      losses.push_back(og.reduce(blk(og.g, {xi, mi})[0]));
    }
    const Expr loss = sum_losses(losses);
    check_same(run_on("cuda", og.g, loss, "agenda"), run_on("cpu", og.g, loss, "agenda"), og.g);
  }
}

// A block for pointwise runs (kernels/cuda/device.h): slices of a column stored before the run,
// steps of two members whose successors read them across member positions, a weight vector, a
// sum of three, a value the run reads and the block outputs (its adjoint from both), and slices
// of the run's values, which read other elements than their own (so a run ends before them).
struct RunsBlock {
  RunsBlock() {
    Graph& body = blk.body();
    const Expr x = blk.input("x", Dim{26, 1}), m = blk.input("m", h);
    top = slice_rows(x, 0, 13);
    bottom = slice_rows(x, 13, 26);
    s1 = sigmoid(top);
    s2 = sigmoid(m);
    p1 = cmult(s2, bottom);
    p2 = cmult(s1, s2);
    c = sum({p1, p2, cmult(parameter(body, w), m)});
    out = cmult(tanh(c), s1);
    t = tanh(slice_rows(p2, 0, 6));
    blk.output("h", out);
    blk.output("c", c);
    blk.output("t", cmult(t, t) - slice_rows(s2, 0, 6));
    blk.freeze();
  }
  ParameterCollection pc{8};
  const Dim h{13, 1};
  const Parameter w = pc.add_parameters("w", h);
  Block blk{pc, "runs"};
  Expr top, bottom, s1, s2, p1, p2, c, out, t;
};

CUDA_CASE("cuda: pointwise runs of a block's elementwise steps = cpu") {
  RunsBlock rb;
  ParameterCollection& pc = rb.pc;
  Block& blk = rb.blk;
  const Dim h = rb.h;
  for (uint32_t k : {1u, 7u, 300u}) {
    CAPTURE(k);
    OpGraph og(k, &pc);
    std::vector<Expr> losses;
    for (uint32_t i = 0; i < k; ++i) {
      const Expr xi = tanh(input(og.g, Dim{26, 1}, og.values(26)));
      const Expr mi = tanh(input(og.g, h, og.values(h.size())));
      for (const Expr& e : blk(og.g, {xi, mi})) losses.push_back(og.reduce(e));
    }
    const Expr loss = sum_losses(losses);
    check_same(run_on("cuda", og.g, loss, "agenda"), run_on("cpu", og.g, loss, "agenda"), og.g);
  }
}

#ifdef EDBATCH_TEST_CUDA_RUNTIME  // pointwise runs are CUDA backend code
// Block group bg's steps for k invocations as the CUDA encoder describes them to
// mark_pointwise_runs (operands all views), marked.
cuda::StepGroup marked_group(const BlockPlan& bp, const BlockGroup& bg, uint32_t k) {
  cuda::StepGroup g{};
  MemoryPlan plan;
  std::vector<cuda::RunStep> rs;
  for (uint32_t q = 0; q < bg.step_count; ++q) {
    const BlockStep& st = bp.steps[bg.step_begin + q];
    const Node& n = bp.body->node(bp.members[st.member_begin]);
    cuda::StepDesc& d = g.steps[g.step_count++];
    d.op = static_cast<uint32_t>(st.op);
    d.k = k;
    d.count = st.member_count * k;
    d.out_size = n.dim.size();
    d.rows = n.dim.rows;
    d.operand_begin = static_cast<uint32_t>(plan.operands.size());
    d.operand_count = n.num_args;
    d.attr = st.op == Op::SliceRows ? n.aux : 0;
    for (uint32_t j = 0; j < n.num_args; ++j)
      plan.operands.push_back({OperandMode::Contiguous, 0, 0, 0, 0});
    rs.push_back({&bp, &st});
  }
  cuda::mark_pointwise_runs(g, rs.data(), plan, true);
  return g;
}

// What every run of a marked group must be: steps of one element size and invocation count,
// slots numbered through the run, register operands from earlier slots of the same run, and
// the run's list of memory reads in the order its steps read them.
void check_runs(const cuda::StepGroup& g) {
  for (uint32_t f = 0; f < g.step_count; f += g.steps[f].run_len) {
    const uint32_t len = g.steps[f].run_len;
    REQUIRE(len >= 1);
    if (len == 1) continue;
    const uint32_t base = g.steps[f].run_slot, k = g.steps[f].k;
    uint32_t slot = base, reads = 0;
    for (uint32_t q = f; q < f + len; ++q) {
      const cuda::StepDesc& s = g.steps[q];
      CHECK(s.out_size == g.steps[f].out_size);
      CHECK(s.k == k);
      CHECK(s.run_slot == slot);
      for (uint32_t m = 0; m < s.count / s.k; ++m, ++slot) {
        CHECK(g.run_step[slot] == q);
        CHECK(g.run_read_begin[slot] == reads);
        for (uint32_t j = 0; j < s.operand_count; ++j) {
          const uint8_t src = g.run_src[slot][j];
          if (src != cuda::kFromMemory) {
            CHECK(src >= base);
            CHECK(src < s.run_slot);
            continue;
          }
          REQUIRE(reads < cuda::kMaxRunReads);
          CHECK(g.run_reads[f][reads++] == (slot - base) * cuda::kMaxRunArgs + j);
        }
      }
    }
    CHECK(slot - base <= cuda::kMaxRunLocal);
    if (reads < cuda::kMaxRunReads) CHECK(g.run_reads[f][reads] == cuda::kFromMemory);
  }
}

// The runs the CUDA encoder marks in RunsBlock (host code: no GPU needed), and in a block whose
// elementwise steps change size.
TEST_CASE("cuda: pointwise runs take what a thread may evaluate alone, and end where not") {
  RunsBlock rb;
  const Block& blk = rb.blk;
  ParameterCollection& pc = rb.pc;
  const Dim h = rb.h;
  const Expr &top = rb.top, &bottom = rb.bottom, &s1 = rb.s1, &s2 = rb.s2, &p1 = rb.p1;
  const Expr &p2 = rb.p2, &c = rb.c, &out = rb.out, &t = rb.t;
  const BlockPlan& bp = blk.plan();
  const uint32_t k = 5;
  bool found = false;
  for (const BlockGroup& bg : bp.groups) {
    if (bg.step_count > cuda::kMaxFusedSteps) continue;
    const cuda::StepGroup g = marked_group(bp, bg, k);
    check_runs(g);
    // The run of a body node's step: the first step of its run (the runs follow each other).
    auto run_of = [&](const Expr& e) {
      for (uint32_t f = 0; f < g.step_count; f += g.steps[f].run_len)
        for (uint32_t q = f; q < f + g.steps[f].run_len; ++q) {
          const BlockStep& st = bp.steps[bg.step_begin + q];
          for (uint32_t mi = 0; mi < st.member_count; ++mi)
            if (bp.members[st.member_begin + mi] == e.id) return int(f);
        }
      return -1;
    };
    if (run_of(s1) < 0) continue;  // another group
    found = true;
    // The slices, both sigmoids, both products, the sum, tanh(c) and the output's product: one
    // run; the slice of p2 reads other elements of it, so neither it nor tanh of it is.
    const int run = run_of(s1);
    for (const Expr& e : {top, bottom, s2, p1, p2, c, out}) CHECK(run_of(e) == run);
    CHECK(g.steps[run].run_len >= 7);
    CHECK(run_of(t) != run);
  }
  CHECK(found);

  // Two chains of other sizes side by side: no run may take steps of both.
  Block mixed(pc, "mixed");
  const Expr a = tanh(mixed.input("a", h)), b = tanh(mixed.input("b", Dim{26, 1}));
  mixed.output("a", cmult(sigmoid(a), a));
  mixed.output("b", cmult(sigmoid(b), b));
  mixed.freeze();
  for (const BlockGroup& bg : mixed.plan().groups)
    if (bg.step_count <= cuda::kMaxFusedSteps) check_runs(marked_group(mixed.plan(), bg, 3));
}
#endif

// A fused GEMM step whose bias is each node's own value, as a user cell's per-row projection is
// (LinearDesc::bias_per_node: the bias gradient per node and element), with some bias values read
// by two calls, in batches from one call to more than a thread block's worth of elements.
CUDA_CASE("cuda: a GEMM step whose bias is each node's own value = cpu") {
  ParameterCollection pc(5);
  const Dim h{24, 1};
  const Parameter W = pc.add_parameters("W", Dim{24, 24});
  Block blk(pc, "biased");
  const Expr x = blk.input("x", h), b = blk.input("b", h);
  blk.output("y", tanh(affine({b, parameter(blk.body(), W), x})));
  blk.freeze();
  for (uint32_t k : {1u, 7u, 300u}) {
    CAPTURE(k);
    OpGraph og(k, &pc);
    std::vector<Expr> losses;
    Expr bias;
    for (uint32_t i = 0; i < k; ++i) {
      const Expr xi = tanh(input(og.g, h, og.values(h.size())));
      if (i % 3 != 2) bias = sigmoid(input(og.g, h, og.values(h.size())));  // else the last one
      losses.push_back(og.reduce(blk(og.g, {xi, bias})[0]));
    }
    const Expr loss = sum_losses(losses);
    check_same(run_on("cuda", og.g, loss, "agenda"), run_on("cpu", og.g, loss, "agenda"), og.g);
  }
}

// A chained GEMM stage loads W before waiting only when W is a parameter; a weight the same pass
// computes (here tanh of an input, shared by the batch, and computed again from the first for a
// second product) is read after the waits, forward and in dX. Zeros or stale values read early
// would differ from the CPU's.
CUDA_CASE("cuda: a GEMM step whose weight the pass computes reads it after its waits = cpu") {
  const Dim h{29, 1}, wd{37, 29};
  for (uint32_t k : {1u, 7u, 70u}) {
    CAPTURE(k);
    OpGraph og(k + 11);
    const Expr w = tanh(input(og.g, wd, og.values(wd.size())));
    const Expr w2 = sigmoid(w);
    const Expr b = og.param(Dim{37, 1});
    std::vector<Expr> losses;
    for (uint32_t i = 0; i < k; ++i) {
      const Expr xi = tanh(input(og.g, h, og.values(h.size())));
      const Expr zi = tanh(input(og.g, h, og.values(h.size())));
      losses.push_back(og.reduce(tanh(affine({b, w, xi, w2, zi}))));
    }
    const Expr loss = sum_losses(losses);
    check_same(run_on("cuda", og.g, loss, "agenda"), run_on("cpu", og.g, loss, "agenda"), og.g);
  }
}

// A bias shared by the batch, where its GEMM step goes through cuBLAS (above the fused kernel's
// size, or with that kernel off): its gradient is the sum of the batch's columns of dY
// (launch_sum_columns), here at bias sizes off the thread block's width and batches from one
// node to more columns than one chunk of the sum holds.
CUDA_CASE("cuda: a shared bias's gradient summed over the batch's columns = cpu") {
  struct Shape {
    Dim w;
    uint32_t k;
    bool fused;
  };
  // 1030 x 260 x 1100 multiply-adds is above the fused kernel's 2^28 in backward.
  for (const Shape s : {Shape{Dim{1030, 260}, 1100, true}, Shape{Dim{1, 5}, 1, false},
                        Shape{Dim{7, 13}, 3000, false}, Shape{Dim{129, 5}, 40, false},
                        Shape{Dim{300, 9}, 777, false}}) {
    CAPTURE(s.w.rows);
    CAPTURE(s.k);
    CudaOptions cuda;
    cuda.fused_linear = s.fused;
    OpGraph og(s.w.rows + s.k);
    const Expr w = og.param(s.w), b = og.param(Dim{s.w.rows, 1});
    std::vector<Expr> losses;
    for (uint32_t i = 0; i < s.k; ++i) {
      const Expr x = input(og.g, Dim{s.w.cols, 1}, og.values(s.w.cols));
      losses.push_back(og.reduce(tanh(affine({b, w, x}))));
    }
    const Expr loss = sum_losses(losses);
    check_same(run_on("cuda", og.g, loss, "agenda", true, cuda),
               run_on("cpu", og.g, loss, "agenda"), og.g);
  }
}

CUDA_CASE("cuda: a backward reads parameters changed after its forward, as the cpu does") {
  for (bool blocks : {false, true}) {
    CAPTURE(blocks);
    ParameterCollection pc(3);
    Dataset data;
    const std::unique_ptr<Model> m = zoo_model("tree_lstm", pc, data, 7, blocks);
    Graph g(pc);
    const Expr loss = build_model(*m, g);
    const auto gpu = grads_after_change("cuda", g, loss), cpu = grads_after_change("cpu", g, loss);
    for (size_t p = 0; p < cpu.size(); ++p)
      check_close(gpu[p], cpu[p], cpu[p].size(), kTol,
                  "gradient of " + pc.name(static_cast<uint32_t>(p)));
  }
}

CUDA_CASE("cuda: GEMM steps through cuBLAS (gathers, batched GEMMs over members) = cpu") {
  CudaOptions cuda;
  cuda.fused_linear = false;
  models_equal_with(cuda, {"tree_lstm", "double_typed_tree_lstm", "lattice_gru", "random_dag"},
                    "lb-greedy");
}

CUDA_CASE("cuda: one launch per kernel, or chained forward passes only, = cpu") {
  for (const CudaOptions::Chain chain : {CudaOptions::Chain::None, CudaOptions::Chain::Forward}) {
    CAPTURE(std::string(chain == CudaOptions::Chain::None ? "none" : "forward"));
    CudaOptions cuda;
    cuda.chain = chain;
    models_equal_with(cuda, {"tree_lstm", "lattice_lstm", "bilstm_tagger", "random_dag"},
                      "agenda");
  }
}

CUDA_CASE("cuda: chained stages waiting for the one before, or always for their producers, = cpu") {
  for (const auto waits : {CudaOptions::StageWaits::InOrder, CudaOptions::StageWaits::Always}) {
    CAPTURE(waits == CudaOptions::StageWaits::Always);
    CudaOptions cuda;
    cuda.stage_waits = waits;
    models_equal_with(cuda, {"tree_lstm", "lattice_lstm", "mvrnn", "random_dag", "bilstm_tagger"},
                      "lb-greedy");
  }
}

// 64 trees at hidden 96 (every GEMM step small enough for the fused kernel, so nothing breaks
// the chain): the chained forward and backward launches have thousands of thread blocks, more
// than the GPU holds at once, so most of them start while earlier stages run and wait for theirs.
// Chained, the stages wait for the stages they read from (a level's loss head runs beside the
// next level's cell), or each for the one before it.
CUDA_CASE("cuda: chained launches of more thread blocks than the GPU holds = cpu") {
  BlockModel bm("tree_lstm", "synthetic:64", 23, 7, 96, 3);
  Graph& g = bm.g;
  const Expr loss = bm.loss;
  const Run cpu = run_on("cpu", g, loss, "agenda");
  uint64_t in_order_stages = 0, waits_stages = 0;
  for (const char* mode : {"in order", "waits", "auto", "unchained"}) {
    CAPTURE(mode);
    CudaOptions cuda;
    cuda.chain =
        std::string(mode) == "unchained" ? CudaOptions::Chain::None : CudaOptions::Chain::All;
    cuda.stage_waits = std::string(mode) == "waits"  ? CudaOptions::StageWaits::Always
                       : std::string(mode) == "auto" ? CudaOptions::StageWaits::Auto
                                                     : CudaOptions::StageWaits::InOrder;
    const Run gpu = run_on("cuda", g, loss, "agenda", true, cuda);
    check_same(gpu, cpu, g);
    // Chained: a few launches for the whole forward and backward, each running many stages;
    // otherwise several launches per batch, a stage each.
    if (std::string(mode) == "in order") {
      CHECK(gpu.kernels < gpu.batches);
      CHECK(gpu.stages > 2 * gpu.batches);
      in_order_stages = gpu.stages;
    } else if (std::string(mode) == "waits") {
      CHECK(gpu.kernels < gpu.batches);
      CHECK(gpu.stages < in_order_stages);  // the dependent ones: fewer
      waits_stages = gpu.stages;
    } else if (std::string(mode) == "auto") {
      CHECK(gpu.stages == waits_stages);  // a whole graph: the waits of Always
    } else {
      CHECK(gpu.kernels > gpu.batches);
      CHECK(gpu.stages == gpu.kernels);
    }
  }
}

// GEMM -> elementwise fusion (CudaOptions::gemm_epilogue): a block call's elementwise steps run
// in the stage of the GEMM step(s) before them, each column tile of invocations by the thread
// block that adds the tile's last share of the products. 64 instances at hidden 96: levels of
// several tiles of 32 invocations and a partial last tile, six row tiles of the stacked gates,
// more thread blocks than the GPU holds at once; per-member weights (the double-typed cell), two
// GEMM steps in one stage (the Tree-LSTM's), lattices' two arc kinds. Fused and apart, the values,
// adjoints and gradients equal the CPU's; fused, the passes have fewer dependent stages.
CUDA_CASE("cuda: a block call's elementwise steps in its GEMM stage = cpu, in fewer stages") {
  for (const std::string name :
       {"tree_lstm", "double_typed_tree_lstm", "tree_gru", "lattice_lstm", "random_dag"}) {
    CAPTURE(name);
    BlockModel bm(name, "synthetic:64", 23, 7, 96, 3);
    Graph& g = bm.g;
    const Expr loss = bm.loss;
    const Run cpu = run_on("cpu", g, loss, "lb-greedy");
    CudaOptions fused;
    fused.gemm_epilogue = true;
    const Run fused_run = run_on("cuda", g, loss, "lb-greedy", true, fused);
    const Run apart_run = run_on("cuda", g, loss, "lb-greedy", true, CudaOptions{});
    check_same(fused_run, cpu, g);
    check_same(apart_run, cpu, g);
    CHECK(fused_run.kernels == apart_run.kernels);
    CHECK(fused_run.stages < apart_run.stages);
  }
}

#ifdef EDBATCH_TEST_CUDA_RUNTIME  // the chunk choice is CUDA backend code
// The chunk choice itself (host code, no GPU needed): 32 while doubling would leave fewer thread
// blocks than asked for, never wider than the inner size needs, and the grid it leaves counted
// the way the kernels count it.
TEST_CASE(
    "cuda: a fused GEMM step's inner chunks widen while its grid keeps the blocks asked for") {
  cuda::LinearDesc l{};
  l.count = 128;  // 128 invocations of one member, one column each: 4 column tiles
  l.k = 128;
  l.cols = 1;
  l.m = 500;  // 8 row tiles
  l.products = 2;
  l.n[0] = 100;  // 4 chunks of 32, 2 of 64, 1 of 128
  l.n[1] = 300;  // 10 chunks of 32, 5 of 64, 3 of 128, 2 of 256, 1 of 512
  l.max_n = 300;
  cuda::linear_chunk_sizes(l, UINT32_MAX);
  CHECK(l.kc == 32);
  CHECK(l.kcx == 32);
  CHECK(cuda::linear_forward_blocks(l) == 8 * 4 * (4 + 10));
  CHECK(cuda::linear_backward_x_blocks(l) == 5 * 4 * 2 * 16);  // 5 row tiles of 300, m / 32
  cuda::linear_chunk_sizes(l, 8 * 4 * (2 + 5));                // 64 keeps exactly that many
  CHECK(l.kc == 64);
  cuda::linear_chunk_sizes(l, 1);
  CHECK(l.kc == 512);  // the first width that covers 300: one chunk per product
  CHECK(cuda::linear_forward_blocks(l) == 8 * 4 * 2);
  CHECK(l.kcx == 512);  // covers m = 500
  CHECK(cuda::linear_backward_x_blocks(l) == 5 * 4 * 2 * 1);
  cuda::linear_chunk_sizes(l, 8 * 4 * (2 + 5) + 1);  // one more than 64 leaves: stays at 32
  CHECK(l.kc == 32);
}
#endif

// Fused GEMM steps whose thread blocks take inner chunks of every width: 32 (min blocks above
// any grid), the widest (one block per tile takes the whole inner dimension: min blocks 1) and
// widths between; inner sizes and rows that are not multiples of the chunk or the tile (hidden
// 100: gates of 400 and 500 rows, inner sizes 100 and 200); with the elementwise steps fused
// into the GEMM stages too.
CUDA_CASE("cuda: fused GEMM steps over inner chunks of every width = cpu") {
  for (const std::string name :
       {"tree_lstm", "double_typed_tree_lstm", "lattice_lstm", "random_dag"}) {
    CAPTURE(name);
    BlockModel bm(name, "synthetic:48", 29, 5, 100, 5);
    Graph& g = bm.g;
    const Expr loss = bm.loss;
    const Run cpu = run_on("cpu", g, loss, "lb-greedy");
    for (const uint32_t min_blocks : {UINT32_MAX, 1u, 24u, 96u}) {
      for (const bool epilogue : {false, true}) {
        CAPTURE(min_blocks);
        CAPTURE(epilogue);
        CudaOptions c;
        c.linear_min_blocks = min_blocks;
        c.gemm_epilogue = epilogue;
        check_same(run_on("cuda", g, loss, "lb-greedy", true, c), cpu, g);
      }
    }
  }
}

CUDA_CASE("cuda: random trees, lattices, chains and DAGs = cpu under every policy") {
  std::mt19937_64 rng(17);
  ParameterCollection pc(4);
  TestModels tm(pc, 9, 11);
  Graph g(pc);
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < 3; ++i) {
    losses.push_back(tm.tree_rnn(g, random_tree(rng, 1 + rng() % 9, 11)));
    losses.push_back(tm.lattice(g, rng, 1 + rng() % 13));
    losses.push_back(tm.chain(g, rng, 1 + rng() % 7));
    losses.push_back(tm.dag(g, rng, 1 + rng() % 17));
  }
  check_policies(g, sum_losses(losses));
}

CUDA_CASE("cuda: SGD training on the GPU follows the CPU") {
  for (const std::string name : {"tree_lstm", "lattice_lstm", "bilstm_tagger"}) {
    CAPTURE(name);
    Twins t(name);
    auto& [pc_cpu, pc_gpu, d_cpu, d_gpu, m_cpu, m_gpu, g_cpu, g_gpu] = t;
    Engine e_cpu(pc_cpu, EngineOptions{"agenda", "cpu", 1});
    Engine e_gpu(pc_gpu, EngineOptions{"agenda", "cuda", 1});
    for (int step = 0; step < 3; ++step) {
      g_cpu.clear();
      g_gpu.clear();
      const Expr l_cpu = build_model(*m_cpu, g_cpu), l_gpu = build_model(*m_gpu, g_gpu);
      const float loss_cpu = as_scalar(e_cpu.forward(g_cpu, l_cpu));
      const float loss_gpu = as_scalar(e_gpu.forward(g_gpu, l_gpu));
      CHECK(near(loss_gpu, loss_cpu));
      e_cpu.backward(g_cpu, l_cpu);
      e_gpu.backward(g_gpu, l_gpu);
      pc_cpu.sgd_update(0.1f);
      pc_gpu.sgd_update(0.1f);
    }
    t.check_trained();
    CHECK(e_gpu.stats().arena_growths <= 8);  // grows at the start, not every step
  }
}

// Pipelined training as a throughput loop runs it: each mini-batch is submitted, back-propagated
// and updated on the device before the previous loss is read, every graph built while the
// device still works on the last one. Losses and final weights follow the CPU trained the plain
// way (forward, backward, host SGD), including lookup tables (sparse host updates, dense on the
// device).
CUDA_CASE("cuda: pipelined training (submit, backward, device SGD) follows the cpu") {
  for (const std::string name : {"tree_lstm", "lattice_lstm", "bilstm_tagger"}) {
    CAPTURE(name);
    Twins t(name);
    auto& [pc_cpu, pc_gpu, d_cpu, d_gpu, m_cpu, m_gpu, g_cpu, g_gpu] = t;
    Engine e_cpu(pc_cpu, EngineOptions{"agenda", "cpu", 1});
    Engine e_gpu(pc_gpu, EngineOptions{"lb-greedy", "cuda", 1});
    // Mini-batches of 1 to 3 instances out of 5, differently shaped each step.
    const std::vector<std::vector<uint32_t>> batches = {{0, 1}, {2}, {3, 4, 0}, {1, 3}, {4}, {2, 0}};
    auto build = [](Model& m, Graph& g, const std::vector<uint32_t>& ids) {
      g.clear();
      std::vector<Expr> losses;
      for (uint32_t i : ids) losses.push_back(m.build(g, i));
      return sum_losses(losses);
    };
    std::vector<float> loss_cpu, loss_gpu;
    for (const auto& ids : batches) {
      const Expr l = build(*m_cpu, g_cpu, ids);
      loss_cpu.push_back(as_scalar(e_cpu.forward(g_cpu, l)));
      e_cpu.backward(g_cpu, l);
      pc_cpu.sgd_update(0.1f);
    }
    std::vector<uint64_t> tickets;
    for (size_t step = 0; step < batches.size(); ++step) {
      const Expr l = build(*m_gpu, g_gpu, batches[step]);
      tickets.push_back(e_gpu.submit(g_gpu, l));
      e_gpu.backward(g_gpu, l);
      e_gpu.sgd_update(0.1f);
      if (step > 0) loss_gpu.push_back(as_scalar(e_gpu.result(tickets[step - 1])));
    }
    loss_gpu.push_back(as_scalar(e_gpu.result(tickets.back())));
    CHECK_THROWS_WITH_AS(e_gpu.result(tickets[0]), doctest::Contains("spent"),
                         std::invalid_argument);
    REQUIRE(loss_gpu.size() == loss_cpu.size());
    for (size_t i = 0; i < loss_cpu.size(); ++i) CHECK(near(loss_gpu[i], loss_cpu[i]));
    // Host reads fetch the device's newer parameters.
    t.check_trained();
    // After the fetch the host may change a weight: the next pass uses the host's numbers.
    const uint32_t w = 0;
    pc_cpu.values(w)[0] += 0.25f;
    pc_cpu.mark_changed();
    pc_gpu.values(w)[0] += 0.25f;
    pc_gpu.mark_changed();
    const Expr l_cpu = build(*m_cpu, g_cpu, {0, 1, 2, 3, 4});
    const Expr l_gpu = build(*m_gpu, g_gpu, {0, 1, 2, 3, 4});
    const float a = as_scalar(e_cpu.forward(g_cpu, l_cpu)), b = as_scalar(e_gpu.forward(g_gpu, l_gpu));
    CHECK(near(b, a));
    // Gradients left on the device by a backward are fetched by host code that reads them.
    e_cpu.backward(g_cpu, l_cpu);
    e_gpu.backward(g_gpu, l_gpu);
    for (uint32_t p = 0; p < pc_cpu.size(); ++p)
      if (!pc_cpu.is_view(p))
        check_close(pc_gpu.grads(p), pc_cpu.grads(p), pc_cpu.dim(p).size(), 1e-3,
                    "gradient " + pc_cpu.name(p));
  }
}

// Forward passes queued ahead of their reads for longer than the staging ring has buffers
// and the timing ring has events, with no wait for the whole stream: each staging buffer is
// reused once the start event of the pass its copy fed has completed.
CUDA_CASE("cuda: more pipelined forwards than the staging and timing rings hold = cpu") {
  Twins t("lattice_lstm");
  auto& [pc_cpu, pc_gpu, d_cpu, d_gpu, m_cpu, m_gpu, g_cpu, g_gpu] = t;
  Engine e_cpu(pc_cpu, EngineOptions{"agenda", "cpu", 1});
  Engine e_gpu(pc_gpu, EngineOptions{"lb-greedy", "cuda", 1});
  std::vector<std::vector<uint32_t>> batches;  // 1 to 3 of the 5 instances, shapes changing
  for (uint32_t step = 0; step < 40; ++step) {
    batches.push_back({step % 5});
    for (uint32_t k = 1; k <= step % 3; ++k) batches.back().push_back((step * 3 + k) % 5);
  }
  auto build = [](Model& m, Graph& g, const std::vector<uint32_t>& ids) {
    g.clear();
    std::vector<Expr> losses;
    for (uint32_t i : ids) losses.push_back(m.build(g, i));
    return sum_losses(losses);
  };
  // Each result read three passes behind, so up to four are queued (Backend::kStagedSlots).
  constexpr size_t kBehind = 3;
  std::vector<uint64_t> tickets;
  std::vector<float> loss_gpu;
  for (size_t step = 0; step < batches.size(); ++step) {
    tickets.push_back(e_gpu.submit(g_gpu, build(*m_gpu, g_gpu, batches[step])));
    if (step >= kBehind) loss_gpu.push_back(as_scalar(e_gpu.result(tickets[step - kBehind])));
  }
  for (size_t step = batches.size() - kBehind; step < batches.size(); ++step)
    loss_gpu.push_back(as_scalar(e_gpu.result(tickets[step])));
  for (size_t step = 0; step < batches.size(); ++step) {
    CAPTURE(step);
    const float a = as_scalar(e_cpu.forward(g_cpu, build(*m_cpu, g_cpu, batches[step])));
    CHECK(near(loss_gpu[step], a));
  }
  CHECK(e_gpu.stats().device_forward_ms > 0);
}

// Engine::prepare encodes the forward pass ahead (Backend::prepare_forward), on another thread
// as the PyTorch adapter's prefetching does; the forward that follows runs it. A graph changed
// after its preparation, or another graph, is encoded afresh.
CUDA_CASE("cuda: a forward encoded ahead by prepare() = cpu, and never for a changed graph") {
  for (const std::string name : {"tree_lstm", "lattice_lstm"}) {
    CAPTURE(name);
    Twins t(name);
    auto& [pc_cpu, pc_gpu, d_cpu, d_gpu, m_cpu, m_gpu, g_cpu, g_gpu] = t;
    Engine e_cpu(pc_cpu, EngineOptions{"agenda", "cpu", 1});
    Engine e_gpu(pc_gpu, EngineOptions{"lb-greedy", "cuda", 1});
    auto build = [](Model& m, Graph& g, const std::vector<uint32_t>& ids) {
      g.clear();
      std::vector<Expr> losses;
      for (uint32_t i : ids) losses.push_back(m.build(g, i));
      return sum_losses(losses);
    };
    // Growing and shrinking mini-batches: the arena grows at some preparations.
    const std::vector<std::vector<uint32_t>> batches = {{0}, {1, 2}, {3, 4, 0, 1}, {2}, {4, 3}};
    uint64_t prepared = 0;
    for (size_t step = 0; step < batches.size(); ++step) {
      CAPTURE(step);
      const Expr l_cpu = build(*m_cpu, g_cpu, batches[step]);
      const Expr l_gpu = build(*m_gpu, g_gpu, batches[step]);
      std::thread([&] { e_gpu.prepare(g_gpu); }).join();
      const float want = as_scalar(e_cpu.forward(g_cpu, l_cpu));
      const float got = as_scalar(e_gpu.forward(g_gpu, l_gpu));
      CHECK(near(got, want));
      CHECK(e_gpu.stats().prepared_passes == ++prepared);
      e_cpu.backward(g_cpu, l_cpu);
      e_gpu.backward(g_gpu, l_gpu);
      pc_cpu.sgd_update(0.1f);
      e_gpu.sgd_update(0.1f);
    }
    t.check_trained();
    // Changed after its preparation: one more instance (the graph's version moves) ...
    Expr l_cpu = build(*m_cpu, g_cpu, {0, 1});
    Expr l_gpu = build(*m_gpu, g_gpu, {0});
    e_gpu.prepare(g_gpu);
    l_gpu = sum_losses({l_gpu, m_gpu->build(g_gpu, 1)});
    CHECK(as_scalar(e_gpu.forward(g_gpu, l_gpu)) ==
          doctest::Approx(as_scalar(e_cpu.forward(g_cpu, l_cpu))).epsilon(kTol));
    CHECK(e_gpu.stats().prepared_passes == prepared);
    // ... cleared and built again (a new generation), or another graph run instead.
    e_gpu.prepare(g_gpu);
    l_cpu = build(*m_cpu, g_cpu, {2, 3});
    l_gpu = build(*m_gpu, g_gpu, {2, 3});
    CHECK(as_scalar(e_gpu.forward(g_gpu, l_gpu)) ==
          doctest::Approx(as_scalar(e_cpu.forward(g_cpu, l_cpu))).epsilon(kTol));
    Graph other(pc_gpu);
    const Expr l_other = build(*m_gpu, other, {4});
    e_gpu.prepare(g_gpu);
    l_cpu = build(*m_cpu, g_cpu, {4});
    CHECK(as_scalar(e_gpu.forward(other, l_other)) ==
          doctest::Approx(as_scalar(e_cpu.forward(g_cpu, l_cpu))).epsilon(kTol));
    CHECK(e_gpu.stats().prepared_passes == prepared);
  }
  // Switched off (CudaOptions::prepare_ahead), the forward encodes.
  Twins t("tree_lstm");
  EngineOptions o{"lb-greedy", "cuda", 1};
  o.cuda.prepare_ahead = false;
  Engine e(t.pc_gpu, o);
  const Expr l = t.m_gpu->build(t.g_gpu, 0);
  e.prepare(t.g_gpu);
  e.forward(t.g_gpu, l);
  CHECK(e.stats().prepared_passes == 0);
}

// A forward whose plan reads far outside the arena: the error surfaces at the pass's sync as an
// exception. In the child (re-run of this binary) the message is printed; the parent checks it.
CUDA_CASE("cuda: an asynchronous error surfaces as an exception naming the kernel") {
  if (std::getenv("EDBATCH_CUDA_FAULT_CHILD")) {
    ParameterCollection pc;
    Graph g(pc);
    const Expr y = tanh(input(g, Dim{5, 1}, std::vector<float>(5, 0.5f)));
    Schedule s;
    Scheduler scheduler;
    const std::unique_ptr<Policy> policy = make_policy("agenda");
    scheduler.run(g, *policy, s);
    MemoryPlan plan;
    plan_memory(g, s, plan);
    Operand& x = plan.operands[plan.batches[0].operand_begin];
    x.mode = OperandMode::Contiguous;
    x.offset = 0xF0000000u;  // 15 GiB past the arena
    // The parent sets EDBATCH_CUDA_SYNC for this child process.
    BackendOptions options;
    options.cuda = apply_debug_env(options.cuda);
    const std::unique_ptr<Backend> b = make_backend("cuda", options);
    try {
      b->forward(PlanRef{g, s, plan, pc});  // queued: the error surfaces at the read
      b->value(plan, y.id);
      std::printf("FAULT: none\n");
    } catch (const std::runtime_error& e) {
      std::printf("FAULT: %s\n", e.what());
    }
    std::fflush(stdout);
    std::_Exit(0);  // the context is unusable after the fault
  }
  char self[4096] = {0};
  REQUIRE(readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  auto child = [&self](const char* env) {
    const std::string cmd = std::string("EDBATCH_CUDA_FAULT_CHILD=1 ") + env + " '" + self +
                            "' --no-skip -tc='cuda: an asynchronous error*' 2>&1";
    std::string out;
    FILE* f = popen(cmd.c_str(), "r");
    REQUIRE(f != nullptr);
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
    return out;
  };
  const std::string exact = child("EDBATCH_CUDA_SYNC=1");
  INFO(exact);
  CHECK(exact.find("FAULT: [cuda]") != std::string::npos);
  CHECK(exact.find("kernel 'steps forward' of the forward pass (batch 0)") != std::string::npos);
  const std::string async = child("EDBATCH_CUDA_SYNC=0");
  INFO(async);
  CHECK(async.find("FAULT: [cuda] forward: asynchronous error") != std::string::npos);
  // The queued pass's description, made only when the error needs it.
  CHECK(async.find("kernels from kernel 'steps forward' of the forward pass (batch 0)") !=
        std::string::npos);
}

#ifdef EDBATCH_TEST_CUDA_RUNTIME
// ---- DeviceInterop: a caller's device memory in and out ----

namespace {

struct DeviceFloats {
  explicit DeviceFloats(const std::vector<float>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  explicit DeviceFloats(size_t floats) : DeviceFloats(std::vector<float>(floats, -7.0f)) {}
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> host() const {
    std::vector<float> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  float* p = nullptr;
  size_t n;
};

// Seeded floats uniform in [-1, 1): random(n) gives the next n.
struct RandomFloats {
  explicit RandomFloats(uint64_t seed) : rng(seed) {}
  std::vector<float> operator()(size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = u(rng);
    return v;
  }
  std::mt19937_64 rng;
  std::uniform_real_distribution<float> u{-1.0f, 1.0f};
};

// Parameters W (rows x cols), b and h0, and a seed row over the outputs; x_i are inputs.
struct InteropModel {
  static constexpr uint32_t kRows = 6, kCols = 5, kInstances = 7;
  InteropModel() : pc(11), g(pc) {
    W = pc.add_parameters("W", Dim{kRows, kCols});
    b = pc.add_parameters("b", Dim{kRows, 1});
    h0 = pc.add_parameters("h0", Dim{kRows, 1});
  }
  // Outputs of instance i: y_i, the input x_i, the parameter h0, a view of a value computed from
  // a view of y_i, and y_i + h0; the loss is seed . [every output].
  Expr build(const std::vector<float>& x) {
    for (uint32_t i = 0; i < kInstances; ++i) {
      xs.push_back(input(g, Dim{kCols, 1}, std::vector<float>(x.begin() + i * kCols,
                                                             x.begin() + (i + 1) * kCols)));
      const Expr y = tanh(affine({parameter(g, b), parameter(g, W), xs.back()}));
      const Expr r = reshape(tanh(reshape(y, Dim{2, kRows / 2})), Dim{kRows, 1});
      for (const Expr& o : {y, xs.back(), parameter(g, h0), r, sum({y, parameter(g, h0)})})
        outputs.push_back(o);
    }
    uint32_t floats = 0;
    for (const Expr& o : outputs) floats += g.node(o.id).dim.size();
    seed = pc.add_parameters("seed", Dim{1, floats});
    std::vector<Expr> parts;
    for (size_t i = 0; i < outputs.size(); i += 5)
      parts.push_back(concat(std::vector<Expr>(outputs.begin() + i, outputs.begin() + i + 5)));
    return matmul(parameter(g, seed), concat(parts));
  }
  std::vector<uint32_t> ids() const {
    std::vector<uint32_t> v;
    for (const Expr& o : outputs) v.push_back(o.id);
    return v;
  }
  ParameterCollection pc;
  Graph g;
  Parameter W, b, h0, seed;
  std::vector<Expr> xs, outputs;
};

std::vector<float> transposed(const std::vector<float>& m, uint32_t rows, uint32_t cols) {
  std::vector<float> t(m.size());
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  return t;  // row-major rows x cols -> column-major
}

}  // namespace

CUDA_CASE("cuda: DeviceInterop moves parameters, inputs, node values and gradients in device "
          "memory, = cpu") {
  using M = InteropModel;
  RandomFloats random(5);
  const std::vector<float> W_rows = random(M::kRows * M::kCols), b = random(M::kRows),
                           h0 = random(M::kRows), x = random(M::kInstances * M::kCols);

  // The CPU: values set on the host, x in the graph.
  M cpu;
  const Expr cpu_loss = cpu.build(x);
  const std::vector<float> seed = random(cpu.pc.dim(cpu.seed.id).size());
  const std::vector<float> W_cols = transposed(W_rows, M::kRows, M::kCols);
  std::copy(W_cols.begin(), W_cols.end(), cpu.pc.values(cpu.W.id));
  std::copy(b.begin(), b.end(), cpu.pc.values(cpu.b.id));
  std::copy(h0.begin(), h0.end(), cpu.pc.values(cpu.h0.id));
  std::copy(seed.begin(), seed.end(), cpu.pc.values(cpu.seed.id));
  EngineOptions o;
  o.device = "cpu";
  Engine ce(cpu.pc, o);
  ce.forward(cpu.g, cpu_loss);
  std::vector<float> want_values, want_adjoints;
  for (const Expr& e : cpu.outputs) {
    const std::vector<float> v = as_vector(ce.value(e));
    want_values.insert(want_values.end(), v.begin(), v.end());
  }
  ce.backward(cpu.g, cpu_loss);
  for (const Expr& e : cpu.outputs) {
    const std::vector<float> v = as_vector(ce.gradient(e));
    want_adjoints.insert(want_adjoints.end(), v.begin(), v.end());
  }

  // The GPU: parameters and x from device memory (the graph's own x values are zeros), twice,
  // so the second round reads what the first left behind only through the interop.
  M gpu;
  const Expr gpu_loss = gpu.build(std::vector<float>(x.size(), 0.0f));
  o.device = "cuda";
  Engine ge(gpu.pc, o);
  DeviceInterop* io = ge.device_interop();
  REQUIRE(io != nullptr);
  const DeviceFloats dW(W_rows), db(b), dh0(h0), dseed(seed), dx(x);
  DeviceFloats values(want_values.size()), adjoints(want_adjoints.size()),
      gW(W_rows.size()), gh0(h0.size());
  // The node adjoints and gradients read back into device memory, against the CPU's.
  const std::vector<float> cpu_gW = as_vector(Tensor{cpu.pc.grads(cpu.W.id), Dim{M::kRows, M::kCols}});
  const std::vector<float> cpu_gh0(cpu.pc.grads(cpu.h0.id), cpu.pc.grads(cpu.h0.id) + M::kRows);
  auto check_backward = [&](const std::string& what) {
    check_close(adjoints.host(), want_adjoints, want_adjoints.size(), kTol, what + "node adjoints");
    check_close(gW.host(), transposed(cpu_gW, M::kCols, M::kRows), W_rows.size(), kTol,
                what + "gradient of W, row-major");
    check_close(gh0.host(), cpu_gh0, M::kRows, kTol, what + "gradient of h0");
  };
  // Round 0 moves parameters one by one, round 1 in one batch (write_parameters, read_gradients).
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    if (round == 0) {
      io->write_parameter(gpu.pc, gpu.W.id, dW.p, 0, W_rows.size(), true);
      io->write_parameter(gpu.pc, gpu.b.id, db.p, 0, b.size(), false);
      io->write_parameter(gpu.pc, gpu.h0.id, dh0.p, 0, h0.size(), false);
      io->write_parameter(gpu.pc, gpu.seed.id, dseed.p, 0, seed.size(), false);
    } else {
      io->write_parameters(gpu.pc, {{gpu.W.id, dW.p, true}, {gpu.b.id, db.p, false},
                                    {gpu.h0.id, dh0.p, false}, {gpu.seed.id, dseed.p, false}});
    }
    io->inputs_from_device(dx.p, x.size(), 0);
    ge.forward(gpu.g, gpu_loss);
    io->read_nodes(gpu.g, ge.plan(), gpu.ids(), values.p, false);
    io->zero_gradients(gpu.pc);
    ge.backward(gpu.g, gpu_loss);
    io->read_nodes(gpu.g, ge.plan(), gpu.ids(), adjoints.p, true);
    if (round == 0) {
      io->read_gradient(gpu.pc, gpu.W.id, gW.p, true);
      io->read_gradient(gpu.pc, gpu.h0.id, gh0.p, false);
    } else {
      io->read_gradients(gpu.pc, {{gpu.W.id, gW.p, true}, {gpu.h0.id, gh0.p, false}});
    }
    ge.synchronize();
    check_close(values.host(), want_values, want_values.size(), kTol, "node values");
    check_backward("");
  }
  // Backward from the outputs' adjoints (Engine::backward with seeds), from host and from device
  // memory, equals the backward of the seed row above.
  const DeviceFloats dseeds(seed);
  for (bool on_device : {false, true}) {
    CAPTURE(on_device);
    io->zero_gradients(gpu.pc);
    ge.backward(gpu.g, gpu.outputs, on_device ? dseeds.p : seed.data(), on_device);
    io->read_nodes(gpu.g, ge.plan(), gpu.ids(), adjoints.p, true);
    io->read_gradient(gpu.pc, gpu.W.id, gW.p, true);
    io->read_gradient(gpu.pc, gpu.h0.id, gh0.p, false);
    ge.synchronize();
    check_backward("seeded ");
  }
  // Host code sees the device's parameters and gradients (the pending fetch).
  check_close(std::vector<float>(gpu.pc.values(gpu.W.id), gpu.pc.values(gpu.W.id) + W_cols.size()),
              W_cols, W_cols.size(), 0, "W on the host after device writes");
  check_close(std::vector<float>(gpu.pc.grads(gpu.b.id), gpu.pc.grads(gpu.b.id) + M::kRows),
              std::vector<float>(cpu.pc.grads(cpu.b.id), cpu.pc.grads(cpu.b.id) + M::kRows),
              M::kRows, kTol, "gradient of b on the host");
}

// prepare() also writes the forward's upload ahead, input values included. The forward must
// read the values as they are when it runs: new ones written after the preparation, and the
// first ones from device memory (two copies around them), as a CPU engine reads them.
CUDA_CASE("cuda: a forward's upload written ahead by prepare() holds the inputs it runs with") {
  const Dim h{13, 1};
  constexpr uint32_t kInstances = 7, kFromDevice = 3;  // the first 3 x_i from device memory
  RandomFloats random(17);
  ParameterCollection pc(23);
  const Parameter W = pc.add_parameters("W", Dim{11, 13}), b = pc.add_parameters("b", Dim{11, 1});
  Graph g(pc);
  std::vector<Expr> losses;
  for (uint32_t i = 0; i < kInstances; ++i) {
    const Expr x = input(g, h, random(h.size()));
    const Expr y = tanh(affine({parameter(g, b), parameter(g, W), x}));
    losses.push_back(matmul(input(g, Dim{1, 11}, random(11)), y));
  }
  const Expr loss = sum_losses(losses);
  const size_t floats = g.input_values().size();
  Engine gpu(pc, EngineOptions{"lb-greedy", "cuda", 1}), cpu(pc, EngineOptions{"agenda", "cpu", 1});
  auto same = [&](const std::string& what) {
    INFO(what);
    const float want = as_scalar(cpu.forward(g, loss));  // after the GPU's: the values it ran on
    const float got = as_scalar(gpu.forward(g, loss));
    CHECK(near(got, want));
  };
  std::thread([&] { gpu.prepare(g); }).join();
  same("as prepared");
  gpu.prepare(g);
  g.write_inputs(0, random(floats).data(), floats);
  same("input values written after the preparation");
  CHECK(gpu.stats().prepared_passes == 2);
  // Device memory gives the first x_i; the graph's host copies of them are stale until the
  // CPU's reference writes them.
  auto from_device = [&](const std::string& what) {
    INFO(what);
    const std::vector<float> on_device = random(kFromDevice * h.size());
    const DeviceFloats dx(on_device);
    gpu.device_interop()->inputs_from_device(dx.p, on_device.size(), 0);
    const float got = as_scalar(gpu.forward(g, loss));
    g.write_inputs(0, on_device.data(), on_device.size());
    const float want = as_scalar(cpu.forward(g, loss));
    CHECK(near(got, want));
  };
  g.write_inputs(0, random(floats).data(), floats);
  gpu.prepare(g);
  from_device("the first inputs from device memory, prepared");
  CHECK(gpu.stats().prepared_passes == 3);
  // A graph that ran and did not change since: new device inputs still make its forward run.
  same("the host copies of the device inputs");
  from_device("the same graph again, new inputs from device memory");
}

// A decoding step's x rows come from device memory: an incremental forward takes the inputs of
// the nodes it adds from there, between host inputs of its own on both sides, and earlier values
// stay. A range outside the inputs of the nodes a forward runs first is refused and dropped.
CUDA_CASE("cuda: an incremental forward takes its new nodes' inputs from device memory = cpu") {
  const Dim h{13, 1};
  constexpr uint32_t kRows = 5;
  RandomFloats random(29);
  ParameterCollection pc(31);
  const Parameter W = pc.add_parameters("W", Dim{13, 13}), b = pc.add_parameters("b", Dim{13, 1});
  Graph g_gpu(pc), g_cpu(pc);  // the same nodes; g_gpu's x rows hold junk on the host
  Engine gpu(pc, EngineOptions{"lb-greedy", "cuda", 1}), cpu(pc, EngineOptions{"agenda", "cpu", 1});
  std::vector<Expr> s_gpu, s_cpu;
  for (uint32_t i = 0; i < kRows; ++i) {
    const std::vector<float> v = random(h.size());
    s_gpu.push_back(input(g_gpu, h, v));
    s_cpu.push_back(input(g_cpu, h, v));
  }
  // One step on both graphs; returns where g_gpu's x rows begin among its input values.
  auto step = [&](const std::vector<float>& x) {
    const std::vector<float> before = random(h.size()), after = random(h.size());
    const std::vector<float> junk(h.size(), 1e30f);
    size_t first = 0;
    for (Graph* g : {&g_gpu, &g_cpu}) {
      std::vector<Expr>& s = g == &g_gpu ? s_gpu : s_cpu;
      const Expr head = input(*g, h, before);
      if (g == &g_gpu) first = g->input_values().size();
      std::vector<Expr> xs;
      for (uint32_t i = 0; i < kRows; ++i)
        xs.push_back(input(*g, h, g == &g_gpu ? junk.data() : x.data() + i * h.size()));
      const Expr tail = input(*g, h, after);
      for (uint32_t i = 0; i < kRows; ++i)
        s[i] = tanh(affine({parameter(*g, b), parameter(*g, W), xs[i]}) + s[i] + head) + tail;
    }
    return first;
  };
  auto same = [&](const std::vector<Expr>& got_nodes, const std::vector<Expr>& want_nodes,
                  const std::string& what) {
    INFO(what);
    gpu.fetch(got_nodes);
    for (uint32_t i = 0; i < kRows; ++i)
      check_close(as_vector(gpu.value(got_nodes[i])), as_vector(cpu.value(want_nodes[i])), h.size(),
                  1e-5f, "state " + std::to_string(i));
  };
  gpu.forward_through(g_gpu, s_gpu);
  cpu.forward_through(g_cpu, s_cpu);
  std::vector<Expr> first_gpu, first_cpu;
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const std::vector<float> x = random(kRows * h.size());
    const DeviceFloats dx(x);
    const size_t first = step(x);
    gpu.device_interop()->inputs_from_device(dx.p, x.size(), first);
    gpu.forward_through(g_gpu, s_gpu);
    cpu.forward_through(g_cpu, s_cpu);
    same(s_gpu, s_cpu, "after the step");
    if (round == 0) first_gpu = s_gpu, first_cpu = s_cpu;
  }
  same(first_gpu, first_cpu, "the first step's values, after the later steps");

  // Refused: past the graph's inputs; across the inputs of the nodes that ran first (inputs of
  // nodes that ran make the whole graph run again). Each time the graph runs on after it.
  const std::vector<float> x = random(kRows * h.size());
  const DeviceFloats dx(x);
  const size_t first = step(x);
  const size_t graph_inputs = g_gpu.input_values().size();
  for (const auto& [begin, floats, why] :
       {std::tuple<size_t, size_t, std::string>{first, graph_inputs, "but the graph has"},
        {0, kRows * h.size() + 1,
         "but the inputs of the nodes this forward runs first are [0, "}}) {
    CAPTURE(begin);
    gpu.device_interop()->inputs_from_device(dx.p, floats, begin);
    CHECK(gpu.device_interop()->pending_inputs_begin() == begin);
    const std::string message = "[cuda] inputs_from_device: input floats [" +
                                std::to_string(begin) + ", " + std::to_string(begin + floats) +
                                "), " + why;
    CHECK_THROWS_WITH_AS(gpu.forward_through(g_gpu, s_gpu), doctest::Contains(message.c_str()),
                         std::invalid_argument);
    CHECK(gpu.device_interop()->pending_inputs_begin() == SIZE_MAX);
  }
  gpu.device_interop()->inputs_from_device(dx.p, x.size(), first);
  gpu.forward_through(g_gpu, s_gpu);
  cpu.forward_through(g_cpu, s_cpu);
  same(s_gpu, s_cpu, "after the refusals");
}
#endif

CUDA_CASE("cuda: incremental forwards and lstm_nmt's greedy decoding = cpu") {
  for (bool blocks : {false, true}) {
    CAPTURE(blocks);
    ParameterCollection pc_cpu(9), pc_gpu(9);
    Dataset d_cpu, d_gpu;
    const auto m_cpu = zoo_model("lstm_nmt", pc_cpu, d_cpu, 7, blocks);
    const auto m_gpu = zoo_model("lstm_nmt", pc_gpu, d_gpu, 7, blocks);
    Engine cpu(pc_cpu, EngineOptions{"lb-greedy", "cpu", 1});
    Engine gpu(pc_gpu, EngineOptions{"lb-greedy", "cuda", 1});
    Graph g_cpu(pc_cpu), g_gpu(pc_gpu);
    const std::vector<uint32_t> ids = {0, 1, 2, 3, 4};
    const DecodeOptions o{13};
    const std::vector<Decoded> a = m_cpu->decode(cpu, g_cpu, ids, o);
    const std::vector<Decoded> b = m_gpu->decode(gpu, g_gpu, ids, o);
    for (size_t i = 0; i < ids.size(); ++i) {
      CAPTURE(i);
      CHECK(a[i].tokens == b[i].tokens);
      CHECK(std::fabs(a[i].score - b[i].score) <= 1e-4 * std::max(1.0, std::fabs(a[i].score)));
    }
    // The training graph built one instance per increment, then one backward.
    Engine* engines[2] = {&cpu, &gpu};
    Model* models[2] = {m_cpu.get(), m_gpu.get()};
    Graph* graphs[2] = {&g_cpu, &g_gpu};
    for (int k = 0; k < 2; ++k) {
      graphs[k]->clear();
      std::vector<Expr> losses;
      for (uint32_t i : ids) {
        losses.push_back(models[k]->build(*graphs[k], i));
        engines[k]->forward(*graphs[k], losses.back());
      }
      const Expr loss = sum_losses(losses);
      engines[k]->forward(*graphs[k], loss);
      engines[k]->backward(*graphs[k], loss);
    }
    for (uint32_t p = 0; p < pc_cpu.size(); ++p)
      check_close(pc_gpu.grads(p), pc_cpu.grads(p), pc_cpu.dim(p).size(), 1e-3,
                  "incremental gradient of " + pc_cpu.name(p));
    // Device time (CUDA events, read once the reads above waited): the forward's increments
    // summed, and the backward's; none on the CPU.
    CHECK(gpu.stats().device_forward_ms > 0);
    CHECK(gpu.stats().device_backward_ms > 0);
    CHECK(cpu.stats().device_forward_ms == 0);
    pc_cpu.zero_grads();
    pc_gpu.zero_grads();
    // The whole graph built first, then run through each instance's loss (prefixes), then all.
    for (int k = 0; k < 2; ++k) {
      graphs[k]->clear();
      std::vector<Expr> losses;
      for (uint32_t i : ids) losses.push_back(models[k]->build(*graphs[k], i));
      const Expr loss = sum_losses(losses);
      for (const Expr& l : losses) engines[k]->forward_through(*graphs[k], l);
      engines[k]->forward(*graphs[k], loss);
      CHECK(engines[k]->plan().segments.size() == ids.size() + 1);
      engines[k]->backward(*graphs[k], loss);
    }
    for (uint32_t p = 0; p < pc_cpu.size(); ++p)
      check_close(pc_gpu.grads(p), pc_cpu.grads(p), pc_cpu.dim(p).size(), 1e-3,
                  "forward_through gradient of " + pc_cpu.name(p));
  }
}
