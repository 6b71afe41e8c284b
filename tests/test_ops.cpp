// The op harness: every op, forward and backward, at awkward sizes, with k instances per graph so
// the engine batches them, and operands laid out to hit every operand mode of the memory plan.
// The engine is checked against the double-precision reference, and the reference against
// central finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "edbatch/edbatch.h"
#include "kernels/op_math.h"
#include "tests/check.h"
#include "tests/reference.h"

using namespace edbatch;
using namespace edbatch::testing;

namespace {

// How one operand slot is laid out over the k instances of a graph. Any: the harness tries each
// of the four concrete layouts in turn.
enum class Layout { Contiguous, Indexed, Shared, Param, Any };
constexpr Layout kLayouts[] = {Layout::Contiguous, Layout::Indexed, Layout::Shared, Layout::Param};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::Indexed:
      return "indexed";
    case Layout::Shared:
      return "shared";
    case Layout::Param:
      return "param";
    case Layout::Any:
      return "any";
  }
  return "?";
}

OperandMode mode_of(Layout l) {
  switch (l) {
    case Layout::Contiguous:
      return OperandMode::Contiguous;
    case Layout::Indexed:
      return OperandMode::Indexed;
    case Layout::Shared:
      return OperandMode::Shared;
    default:
      return OperandMode::Param;
  }
}

struct Slot {
  Dim dim;
  Layout layout = Layout::Any;
  bool positive = false;  // values in [0.1, 1] (log, sqrt), else of either sign
  float scale = 1.0f;     // magnitudes times this (asin, acos, atanh: well inside [-1, 1])
};

// Makes operands: inputs and parameters with values of magnitude in [0.1, 1], so relu never sits
// near its kink, divisors stay away from 0 and finite differences stay clean.
struct Builder {
  Builder(ParameterCollection& params, Graph& graph, uint64_t seed)
      : pc(params), g(graph), rng(seed) {}
  ParameterCollection& pc;
  Graph& g;
  std::mt19937_64 rng;
  uint32_t params_made = 0;
  LookupParameter table;

  // scale: of the magnitudes (Slot::scale).
  std::vector<float> values(size_t n, bool positive = false, float scale = 1.0f) {
    std::uniform_real_distribution<float> mag(0.1f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = (positive || rng() & 1 ? 1.0f : -1.0f) * mag(rng) * scale;
    return v;
  }
  Expr new_input(Dim d, bool positive = false, float scale = 1.0f) {
    return input(g, d, values(d.size(), positive, scale));
  }
  void fill(uint32_t id, bool positive = false, float scale = 1.0f) {
    const std::vector<float> v = values(pc.dim(id).size(), positive, scale);
    std::copy(v.begin(), v.end(), pc.values(id));
  }
  Expr new_param(Dim d, bool positive = false, float scale = 1.0f) {
    const Parameter p = pc.add_parameters("p" + std::to_string(params_made++), d);
    fill(p.id, positive, scale);
    return parameter(g, p);
  }
  LookupParameter lookup_table(uint32_t rows) {
    if (!table.valid()) {
      table = pc.add_lookup_parameters("table", 5, rows);
      fill(table.id);
    }
    return table;
  }
  // One operand per instance. Contiguous: k inputs created in instance order; Indexed: created in
  // reverse order; Shared: one input read by every instance; Param: one parameter.
  std::vector<Expr> operand(Dim d, Layout l, uint32_t k, bool positive, float scale) {
    std::vector<Expr> xs;
    if (l == Layout::Shared || l == Layout::Param) {
      xs.assign(
          k, l == Layout::Shared ? new_input(d, positive, scale) : new_param(d, positive, scale));
      return xs;
    }
    for (uint32_t i = 0; i < k; ++i) xs.push_back(new_input(d, positive, scale));
    if (l == Layout::Indexed) std::reverse(xs.begin(), xs.end());
    return xs;
  }
};

using Args = std::vector<Expr>;

// One row of the harness: operand slots as a function of the row's free sizes (s.rows, s.cols),
// and the op applied to one instance's operands.
struct OpCase {
  const char* name;
  std::vector<Dim> sizes;
  std::function<std::vector<Slot>(Dim)> slots;
  std::function<Expr(Builder&, const Args&, uint32_t instance, Dim)> build;
  // The reference's gradients against finite differences; off for stop_gradient, whose gradient
  // is 0 by definition, not the slope of its value (closed forms check it instead).
  bool finite_differences = true;
};

struct Built {
  Expr loss;
  std::vector<uint32_t> outs;            // the op's output, per instance
  std::vector<uint32_t> operand_inputs;  // inputs read by the op (finite-difference sample)
};

// loss = sum_i u_i y_i v_i with random inputs u_i (1 x rows) and v_i (cols x 1).
Built build_graph(Builder& b, const OpCase& c, Dim s, uint32_t k,
                  const std::vector<Layout>& layouts) {
  const std::vector<Slot> slots = c.slots(s);
  std::vector<std::vector<Expr>> per_slot;
  Built r;
  for (size_t j = 0; j < slots.size(); ++j) {
    per_slot.push_back(b.operand(slots[j].dim, layouts[j], k, slots[j].positive, slots[j].scale));
    for (const Expr& x : per_slot.back())
      if (b.g.node(x.id).op == Op::Input) r.operand_inputs.push_back(x.id);
  }
  std::vector<Expr> ys, losses;
  for (uint32_t i = 0; i < k; ++i) {
    Args a;
    for (const auto& xs : per_slot) a.push_back(xs[i]);
    ys.push_back(c.build(b, a, i, s));
    r.outs.push_back(ys.back().id);
  }
  for (const Expr& y : ys) {
    const Dim d = b.g.node(y.id).dim;
    const Expr u = b.new_input(Dim{1, d.rows});
    const Expr v = b.new_input(Dim{d.cols, 1});
    losses.push_back(matmul(matmul(u, y), v));
  }
  r.loss = sum_losses(losses);
  return r;
}

// The layouts to try: all Any slots in one concrete layout, then (with several Any slots) mixes
// where the a-th Any slot is shifted by a, so every slot meets every layout next to others.
std::vector<std::vector<Layout>> layout_plans(const std::vector<Slot>& slots) {
  uint32_t any = 0;
  for (const Slot& s : slots) any += s.layout == Layout::Any;
  std::vector<std::vector<Layout>> plans;
  for (uint32_t shift = 0; shift < (any > 1 ? 2u : 1u); ++shift) {
    for (uint32_t m = 0; m < (any > 0 ? 4u : 1u); ++m) {
      std::vector<Layout> p;
      uint32_t a = 0;
      for (const Slot& s : slots)
        p.push_back(s.layout == Layout::Any ? kLayouts[(m + shift * a++) % 4] : s.layout);
      plans.push_back(p);
    }
  }
  return plans;
}

std::string plan_name(const std::vector<Layout>& p) {
  std::string s;
  for (Layout l : p) s += std::string(s.empty() ? "" : ",") + layout_name(l);
  return s;
}

// The reference's gradients against central finite differences, on a sample of the op's operand
// inputs and of all parameters.
void check_reference_fd(Graph& g, Reference& ref, const Built& bt, std::mt19937_64& rng) {
  struct Elem {
    bool param;
    uint32_t id, k;
  };
  std::vector<Elem> all;
  for (uint32_t p = 0; p < g.params().size(); ++p)
    for (uint32_t k = 0; k < g.params().dim(p).size(); ++k) all.push_back({true, p, k});
  std::vector<uint32_t> seen = bt.operand_inputs;
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  for (uint32_t v : seen)
    for (uint32_t k = 0; k < g.node(v).dim.size(); ++k) all.push_back({false, v, k});
  std::shuffle(all.begin(), all.end(), rng);
  if (all.size() > 20) all.resize(20);
  std::vector<double> fd, analytic;
  for (const Elem& e : all) {
    if (e.param) {
      fd.push_back(ref.fd_param(bt.loss.id, e.id, e.k));
      analytic.push_back(ref.param_grads[e.id][e.k]);
    } else {
      fd.push_back(ref.fd_input(bt.loss.id, g.node(e.id).aux + e.k));
      analytic.push_back(ref.adjoints[e.id][e.k]);
    }
  }
  check_close(fd, analytic, fd.size(), 1e-5, "reference gradient vs finite differences");
}

// The batch of the op's first output has all k instances and reads them in the intended modes.
void check_modes(Graph& g, const Engine& e, const Built& bt, const std::vector<Layout>& layouts) {
  const Schedule& s = e.schedule();
  const uint32_t v = bt.outs[0];
  const auto at = std::find(s.nodes.begin(), s.nodes.end(), v);
  REQUIRE(at != s.nodes.end());
  const uint32_t pos = static_cast<uint32_t>(at - s.nodes.begin());
  size_t b = 0;
  while (!(s.batches[b].begin <= pos && pos < s.batches[b].begin + s.batches[b].count)) ++b;
  const Node& first = g.node(v);
  bool one_type = true;
  for (uint32_t o : bt.outs) one_type &= g.node(o).type == first.type;
  if (one_type) CHECK(s.batches[b].count == bt.outs.size());
  const BatchPlan& bp = e.plan().batches[b];
  const Operand* ops = e.plan().operands.data() + bp.operand_begin;
  if (g.types().is_ragged(first.type)) {
    REQUIRE(bp.operand_count == 1);
    CHECK(ops[0].mode == OperandMode::Ragged);
    uint32_t most = 0;
    for (uint32_t i = 0; i < bp.count; ++i)
      most = std::max(most, g.node(s.nodes[s.batches[b].begin + i]).num_args);
    CHECK(e.plan().max_ragged_args(bp) == most);
  } else if (first.num_args == layouts.size()) {
    REQUIRE(bp.operand_count == layouts.size());
    for (size_t j = 0; j < layouts.size(); ++j) {
      INFO("operand " << j << " is " << operand_mode_name(ops[j].mode) << ", laid out "
                      << layout_name(layouts[j]));
      CHECK(ops[j].mode == mode_of(layouts[j]));
    }
  }
}

// Runs one engine; checks every node's value and adjoint and every parameter gradient against the
// reference. Returns the number of forward batches.
uint64_t check_engine(Graph& g, ParameterCollection& pc, const Built& bt, const Reference& ref,
                      const std::string& policy, int threads, const std::vector<Layout>& layouts) {
  EngineOptions o;
  o.policy = policy;
  o.threads = threads;
  o.min_parallel_work = 1;  // split every kernel that can be split
  Engine e(pc, o);
  e.forward(g, bt.loss);
  for (uint32_t v = 0; v < g.size(); ++v) {
    const std::vector<float> y = as_vector(e.value(g.expr(v)));
    check_close(y, ref.values[v], y.size(), 1e-5,
                "value of node " + std::to_string(v) + " (" + op_name(g.node(v).op) + ")");
  }
  if (policy == "agenda" && bt.outs.size() > 1) check_modes(g, e, bt, layouts);
  e.backward(g, bt.loss);
  for (uint32_t p = 0; p < pc.size(); ++p)
    check_close(pc.grads(p), ref.param_grads[p], pc.dim(p).size(), 1e-5,
                "gradient of parameter " + pc.name(p));
  for (uint32_t v = 0; v < g.size(); ++v) {
    if (g.node(v).op == Op::Parameter) continue;  // that is the parameter gradient, checked above
    const std::vector<float> dy = as_vector(e.gradient(g.expr(v)));
    check_close(dy, ref.adjoints[v], dy.size(), 1e-5,
                "adjoint of node " + std::to_string(v) + " (" + op_name(g.node(v).op) + ")");
  }
  pc.zero_grads();
  return e.stats().batches;
}

void run_cases(const std::vector<OpCase>& cases) {
  uint64_t seed = 1;
  for (const OpCase& c : cases) {
    for (const Dim s : c.sizes) {
      for (const std::vector<Layout>& layouts : layout_plans(c.slots(s))) {
        for (uint32_t k : {1u, 3u, 7u}) {
          const std::string op = c.name;
          CAPTURE(op);
          CAPTURE(to_string(s));
          CAPTURE(plan_name(layouts));
          CAPTURE(k);
          ParameterCollection pc(seed);
          Graph g(pc);
          Builder b(pc, g, seed++);
          const Built bt = build_graph(b, c, s, k, layouts);
          Reference ref(g);
          ref.forward();
          ref.backward(bt.loss.id);
          if (c.finite_differences) check_reference_fd(g, ref, bt, b.rng);
          uint64_t batches[2] = {0, 0};
          for (int policy = 0; policy < 2; ++policy) {
            for (int threads : {1, 2}) {
              const std::string policy_name = policy == 0 ? "agenda" : "none";
              CAPTURE(policy_name);
              CAPTURE(threads);
              batches[policy] = check_engine(g, pc, bt, ref, policy_name, threads, layouts);
            }
          }
          if (k == 7) CHECK(batches[0] < batches[1]);  // the agenda really batched
        }
      }
    }
  }
}

std::vector<Slot> same(Dim d, uint32_t n) {
  return std::vector<Slot>(n, Slot{d});
}

constexpr Layout P = Layout::Param;
const std::vector<Dim> kElementwiseSizes = {{1, 1}, {7, 1}, {13, 3}, {17, 1}};
const std::vector<Dim> kLinearSizes = {{1, 1}, {7, 13}, {17, 3}};  // W is rows x cols

std::vector<OpCase> unary_cases() {
  auto one = [](Dim s) { return same(s, 1); };
  return {
      {"tanh", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return tanh(a[0]); }},
      {"sigmoid", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return sigmoid(a[0]); }},
      {"relu", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return relu(a[0]); }},
      {"softplus", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return softplus(a[0]); }},
      {"x*a", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return a[0] * 1.5f; }},
      {"a-x", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return 0.75f - a[0]; }},
      {"x+a", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return a[0] + 0.5f; }},
      {"-x", kElementwiseSizes, one, [](Builder&, const Args& a, uint32_t, Dim) { return -a[0]; }},
  };
}

std::vector<OpCase> binary_cases() {
  return {
      {"subtract", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return a[0] - a[1]; }},
      {"cmult", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return cmult(a[0], a[1]); }},
      {"add", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return a[0] + a[1]; }},
      // One node read twice by the same op.
      {"x+x", kElementwiseSizes, [](Dim s) { return same(s, 1); },
       [](Builder&, const Args& a, uint32_t, Dim) { return a[0] + a[0]; }},
      {"cmult(x, x)", kElementwiseSizes, [](Dim s) { return same(s, 1); },
       [](Builder&, const Args& a, uint32_t, Dim) { return cmult(a[0], a[0]); }},
      {"sum of 3", kElementwiseSizes, [](Dim s) { return same(s, 3); },
       [](Builder&, const Args& a, uint32_t, Dim) { return sum(a); }},
      {"sum with a parameter", kElementwiseSizes,
       [](Dim s) {
         return std::vector<Slot>{{s}, {s, P}, {s}};
       },
       [](Builder&, const Args& a, uint32_t, Dim) { return sum(a); }},
      // Arity 2, 3, 4, 2, ... by instance: one ragged batch.
      {"sum ragged", kElementwiseSizes, [](Dim s) { return same(s, 4); },
       [](Builder&, const Args& a, uint32_t i, Dim) {
         return sum(Args(a.begin(), a.begin() + 2 + i % 3));
       }},
  };
}

std::vector<OpCase> linear_cases() {
  auto affine_op = [](Builder&, const Args& a, uint32_t, Dim) { return affine(a); };
  auto matmul_op = [](Builder&, const Args& a, uint32_t, Dim) { return matmul(a[0], a[1]); };
  return {
      {"affine W=param x=node", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{{s.rows, 1}, P}, {s, P}, {{s.cols, 1}}};
       },
       affine_op},
      {"affine W=param x=param", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{{s.rows, 1}, P}, {s, P}, {{s.cols, 1}, P}};
       },
       affine_op},
      {"affine bias node", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{{s.rows, 1}}, {s, P}, {{s.cols, 1}}};
       },
       affine_op},
      {"affine W=node (per-node GEMM)", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{{s.rows, 1}}, {s}, {{s.cols, 1}}};
       },
       affine_op},
      {"affine x with 2 columns", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{{s.rows, 2}}, {s, P}, {{s.cols, 2}}};
       },
       affine_op},
      {"affine two (W, x) pairs", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{{s.rows, 1}, P}, {s, P}, {{s.cols, 1}}, {{s.rows, 3}}, {{3, 1}}};
       },
       affine_op},
      {"matmul W=param", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{s, P}, {{s.cols, 1}}};
       },
       matmul_op},
      {"matmul W=param x=param", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{s, P}, {{s.cols, 2}, P}};
       },
       matmul_op},
      {"matmul per-node, x with 3 columns", kLinearSizes,
       [](Dim s) {
         return std::vector<Slot>{{s}, {{s.cols, 3}}};
       },
       matmul_op},
  };
}

std::vector<OpCase> indexing_cases() {
  return {
      {"concat vectors",
       {{1, 1}, {7, 1}, {13, 1}},
       [](Dim s) {
         return std::vector<Slot>{{s}, {{5, 1}}, {{1, 1}}};
       },
       [](Builder&, const Args& a, uint32_t, Dim) { return concat(a); }},
      {"concat matrices",
       {{1, 2}, {7, 3}},
       [](Dim s) {
         return std::vector<Slot>{{s}, {{5, s.cols}}};
       },
       [](Builder&, const Args& a, uint32_t, Dim) { return concat(a); }},
      {"pick",
       {{1, 1}, {7, 1}, {17, 1}},
       [](Dim s) { return same(s, 1); },
       [](Builder&, const Args& a, uint32_t i, Dim s) { return pick(a[0], (3 * i + 1) % s.rows); }},
      {"pick_neg_log_softmax",
       {{1, 1}, {3, 1}, {7, 1}, {17, 1}},
       [](Dim s) { return same(s, 1); },
       [](Builder&, const Args& a, uint32_t i, Dim s) {
         return pick_neg_log_softmax(a[0], (2 * i + 1) % s.rows);
       }},
      // Indices repeat across instances (vocabulary 5, up to 7 instances).
      {"lookup",
       {{1, 1}, {7, 1}, {13, 1}},
       [](Dim) { return std::vector<Slot>{}; },
       [](Builder& b, const Args&, uint32_t i, Dim s) {
         return lookup(b.g, b.lookup_table(s.rows), (2 * i) % 5);
       }},
  };
}

// The math ops added with kernels/op_math.h's structs; log and sqrt of positive inputs, divisors
// of magnitude at least 0.1.
std::vector<OpCase> math_cases() {
  auto one = [](Dim s) { return same(s, 1); };
  auto positive = [](Dim s) { return std::vector<Slot>{{s, Layout::Any, true}}; };
  // Magnitudes in [0.05, 0.5]: finite differences stay clean where the slope grows toward 1.
  auto inside = [](Dim s) { return std::vector<Slot>{{s, Layout::Any, false, 0.5f}}; };
  return {
      {"exp", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return exp(a[0]); }},
      {"log", kElementwiseSizes, positive,
       [](Builder&, const Args& a, uint32_t, Dim) { return log(a[0]); }},
      {"sqrt", kElementwiseSizes, positive,
       [](Builder&, const Args& a, uint32_t, Dim) { return sqrt(a[0]); }},
      {"gelu", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return gelu(a[0]); }},
      {"sin", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return sin(a[0]); }},
      {"cos", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return cos(a[0]); }},
      {"erf", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return erf(a[0]); }},
      {"atan", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return atan(a[0]); }},
      {"sinh", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return sinh(a[0]); }},
      {"cosh", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return cosh(a[0]); }},
      {"asinh", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return asinh(a[0]); }},
      {"atanh", kElementwiseSizes, inside,
       [](Builder&, const Args& a, uint32_t, Dim) { return atanh(a[0]); }},
      // floor jumps at 0 only, which inputs stay away from, and round at +-0.5, which magnitudes
      // below 0.45 do not reach (its values: closed forms below): finite differences are 0, as
      // their gradient; times x, the product carries x's.
      {"floor", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return floor(a[0]); }},
      {"round", kElementwiseSizes,
       [](Dim s) {
         return std::vector<Slot>{{s, Layout::Any, false, 0.45f}};
       },
       [](Builder&, const Args& a, uint32_t, Dim) { return round(a[0]); }},
      {"floor times x", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return cmult(floor(a[0]), a[0]); }},
      {"stop_gradient", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return stop_gradient(a[0]); }, false},
      {"stop_gradient times x", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return cmult(stop_gradient(a[0]), a[0]); },
       false},
      {"asin", kElementwiseSizes, inside,
       [](Builder&, const Args& a, uint32_t, Dim) { return asin(a[0]); }},
      {"acos", kElementwiseSizes, inside,
       [](Builder&, const Args& a, uint32_t, Dim) { return acos(a[0]); }},
      // Inputs are random values in (-1, 1): both sides of the kink at 0.
      {"leaky_relu", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return leaky_relu(a[0], 0.2f); }},
      {"leaky_relu of slope 0.01", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return leaky_relu(a[0], 0.01f); }},
      {"elu", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return elu(a[0], 1.0f); }},
      {"elu alpha 0.5", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return elu(a[0], 0.5f); }},
      {"abs", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return abs(a[0]); }},
      // Inputs at least 0.1 from 0: the masks' finite differences are 0, as their gradient.
      {"step", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return step(a[0]); }},
      {"step inclusive, times x", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return cmult(step(a[0], true), a[0]); }},
      {"keep", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return keep(a[0], a[1]); }},
      {"keep(x, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return keep(a[0], a[0]); }},
      {"a/x", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return 0.5f / a[0]; }},
      {"scalar_divide(-2, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return scalar_divide(-2.0f, a[0]); }},
      {"x/a", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return a[0] / 4.0f; }},
      {"divide", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return a[0] / a[1]; }},
      {"divide(x, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return divide(a[0], a[0]); }},
      // Magnitudes of at least 0.1 keep finite differences off the branch cut (a = 0, b < 0).
      {"atan2", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return atan2(a[0], a[1]); }},
      {"atan2(x, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return atan2(a[0], a[0]); }},
      {"hypot", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return hypot(a[0], a[1]); }},
      {"hypot(x, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return hypot(a[0], a[0]); }},
      // Special functions: lgamma and digamma on (0, 1] and past it, and between the poles 0 and
      // -1 (by reflection); erfinv inside and in the tail past 1/2 (through erfc).
      {"erfc", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return erfc(a[0]); }},
      {"lgamma", kElementwiseSizes, positive,
       [](Builder&, const Args& a, uint32_t, Dim) { return lgamma(a[0]); }},
      {"lgamma past 1 and below 0", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) {
         return lgamma(a[0] * 2.0f + 3.0f) + lgamma(a[0] * 0.4f - 0.5f);
       }},
      {"digamma", kElementwiseSizes, positive,
       [](Builder&, const Args& a, uint32_t, Dim) { return digamma(a[0]); }},
      {"digamma past 1 and below 0", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) {
         return digamma(a[0] * 6.0f + 8.0f) + digamma(a[0] * 0.4f - 0.5f);
       }},
      {"erfinv", kElementwiseSizes, inside,
       [](Builder&, const Args& a, uint32_t, Dim) { return erfinv(a[0]); }},
      {"erfinv in the tail", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) {
         return erfinv(a[0] * 0.1f + 0.85f) + erfinv(a[0] * 0.1f - 0.85f);
       }},
      // fmod and remainder jump where a / b is an integer: a / b stays within (2, 3) or
      // (-3, -2), so finite differences see no jump, and both signs of a and b are taken (the
      // cases end in a scale, so that the harness does not take the shifted operands for the
      // slots; of x by x, the ops meet their slots directly).
      {"fmod", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) {
         return (fmod(a[0] * 0.4f + 2.5f, a[1] * 0.02f + 1.0f) +
                 fmod(a[0] * 0.4f - 2.5f, a[1] * 0.02f - 1.0f)) *
                2.0f;
       }},
      {"fmod of a and -b", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) {
         return fmod(a[0] * 0.4f - 2.5f, a[1] * 0.02f + 1.0f) * 2.0f;
       }},
      {"remainder", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) {
         return (remainder(a[0] * 0.4f - 2.5f, a[1] * 0.02f + 1.0f) +
                 remainder(a[0] * 0.4f + 2.5f, a[1] * 0.02f - 1.0f)) *
                2.0f;
       }},
      {"remainder of like signs", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) {
         return remainder(a[0] * 0.4f + 2.5f, a[1] * 0.02f + 1.0f) * 2.0f;
       }},
      {"fmod(x, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return fmod(a[0], a[0]); }},
      {"remainder(x, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return remainder(a[0], a[0]); }},
      {"copysign", kElementwiseSizes, [](Dim s) { return same(s, 2); },
       [](Builder&, const Args& a, uint32_t, Dim) { return copysign(a[0], a[1]); }},
      {"copysign(x, x)", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return copysign(a[0], a[0]); }},
  };
}

// average and maximum batch like sum: fixed arity, ragged, and with a parameter argument (which
// makes the type exact). Maximum's arguments are distinct random values: no ties.
std::vector<OpCase> variadic_cases() {
  auto three = [](Dim s) { return same(s, 3); };
  auto with_param = [](Dim s) { return std::vector<Slot>{{s}, {s, P}, {s}}; };
  auto ragged = [](Dim s) { return same(s, 4); };
  auto first = [](const Args& a, uint32_t i) { return Args(a.begin(), a.begin() + 2 + i % 3); };
  return {
      {"average of 3", kElementwiseSizes, three,
       [](Builder&, const Args& a, uint32_t, Dim) { return average(a); }},
      {"average with a parameter", kElementwiseSizes, with_param,
       [](Builder&, const Args& a, uint32_t, Dim) { return average(a); }},
      {"average ragged", kElementwiseSizes, ragged,
       [first](Builder&, const Args& a, uint32_t i, Dim) { return average(first(a, i)); }},
      {"maximum of 3", kElementwiseSizes, three,
       [](Builder&, const Args& a, uint32_t, Dim) { return maximum(a); }},
      {"maximum with a parameter", kElementwiseSizes, with_param,
       [](Builder&, const Args& a, uint32_t, Dim) { return maximum(a); }},
      {"maximum ragged", kElementwiseSizes, ragged,
       [first](Builder&, const Args& a, uint32_t i, Dim) { return maximum(first(a, i)); }},
  };
}

// Slices, the reductions over each column's rows (1-row columns included: layer norm's variance
// is then 0) and dropout, whose key differs by instance.
std::vector<OpCase> row_cases() {
  auto one = [](Dim s) { return same(s, 1); };
  const std::vector<Dim> columns = {{1, 1}, {7, 1}, {13, 3}, {17, 1}, {37, 2}};
  return {
      {"slice_rows middle",
       {{3, 1}, {13, 3}, {17, 2}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim s) { return slice_rows(a[0], 1, s.rows - 1); }},
      {"slice_rows last row",
       {{1, 1}, {7, 2}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim s) {
         return slice_rows(a[0], s.rows - 1, s.rows);
       }},
      {"softmax", columns, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return softmax(a[0]); }},
      {"log_softmax", columns, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return log_softmax(a[0]); }},
      {"layer_norm", columns, one,
       [](Builder&, const Args& a, uint32_t, Dim) { return layer_norm(a[0], 1e-5f); }},
      {"layer_norm eps 0.5",
       {{7, 1}, {13, 3}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim) { return layer_norm(a[0], 0.5f); }},
      // Inputs are distinct random values, so the maximum is unique and finite differences
      // of row 0 see the maximal entry's gradient, and of row 1 (the index) none.
      {"max_index",
       {{1, 1}, {7, 1}, {13, 3}, {129, 1}, {37, 2}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim) { return max_index(a[0]); }},
      {"dropout", kElementwiseSizes, one,
       [](Builder&, const Args& a, uint32_t i, Dim) {
         return dropout(a[0], 0.3f, math::dropout_key(11, i, 0));
       }},
      {"column_sum",
       {{1, 1}, {7, 1}, {13, 3}, {129, 1}, {37, 2}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim) { return column_sum(a[0]); }},
      {"broadcast",
       {{1, 1}, {1, 3}, {1, 2}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim) { return broadcast_rows(a[0], 13); }},
      {"broadcast to one row",
       {{1, 1}, {1, 2}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim) { return broadcast_rows(a[0], 1); }},
      // x * (sum of x's rows), each column: a feature reduction that combines with the features
      // again, as a cell's x * x.sum(-1, keepdim=True) does.
      {"x times its broadcast column sum",
       {{1, 1}, {7, 1}, {13, 3}, {37, 2}},
       one,
       [](Builder&, const Args& a, uint32_t, Dim s) {
         return cmult(a[0], broadcast_rows(column_sum(a[0]), s.rows));
       }},
  };
}

}  // namespace

TEST_CASE("ops: unary elementwise (tanh, sigmoid, relu, softplus, scalar affine)") {
  run_cases(unary_cases());
}

TEST_CASE("ops: binary elementwise and sums (fixed and ragged arity)") {
  run_cases(binary_cases());
}

TEST_CASE("ops: affine and matmul") {
  run_cases(linear_cases());
}

TEST_CASE("ops: concat, pick, pick_neg_log_softmax, lookup") {
  run_cases(indexing_cases());
}

TEST_CASE("ops: exp, log, sqrt, gelu, leaky_relu, elu, abs, divide, scalar_divide") {
  run_cases(math_cases());
}

TEST_CASE("ops: average and maximum (fixed and ragged arity)") {
  run_cases(variadic_cases());
}

TEST_CASE(
    "ops: slice_rows, softmax, log_softmax, layer_norm, max_index, dropout, column_sum, "
    "broadcast") {
  run_cases(row_cases());
}

// A new op without a case above would be untested: every scheduled op of the enum but block
// calls (tests/test_blocks.cpp) must be the output of some case.
TEST_CASE("ops: every op of the enum has a case in the harness") {
  std::vector<bool> seen(static_cast<size_t>(Op::Count), false);
  for (const auto& cases : {unary_cases(), binary_cases(), linear_cases(), indexing_cases(),
                            math_cases(), variadic_cases(), row_cases()})
    for (const OpCase& c : cases) {
      ParameterCollection pc(1);
      Graph g(pc);
      Builder b(pc, g, 1);
      const Built bt = build_graph(b, c, c.sizes[0], 1, layout_plans(c.slots(c.sizes[0]))[0]);
      seen[static_cast<size_t>(g.node(bt.outs[0]).op)] = true;
    }
  for (size_t i = 0; i < seen.size(); ++i) {
    const Op op = static_cast<Op>(i);
    if (!is_scheduled(op) || op == Op::Call) continue;
    INFO("op '" << std::string(op_name(op)) << "' has no case in tests/test_ops.cpp");
    CHECK(seen[i]);
  }
}

// maximum is NaN where any argument is, whatever the order (torch.maximum), alone and in a
// batch of ragged arity; each element's gradient goes to the first argument holding the result
// (the first NaN where it is NaN). tests/test_cuda.cpp runs it on the GPU.
void testing::check_maximum_nan(const std::string& device, int threads) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ParameterCollection pc(1);
  Graph g(pc);
  const Expr a = input(g, Dim{4, 1}, {1, nan, 3, nan});
  const Expr b = input(g, Dim{4, 1}, {nan, 2, 1, nan});
  const Expr c = input(g, Dim{4, 1}, {0, 5, nan, 1});
  const Expr ab = maximum({a, b}), ba = maximum({b, a}), cab = maximum({c, a, b});
  const Expr loss = column_sum(ab) + column_sum(cab);
  Engine e(pc, EngineOptions{"lb-greedy", device, threads});
  CHECK(std::isnan(as_scalar(e.forward(g, loss))));
  for (const Expr& m : {ab, ba}) {
    const std::vector<float> v = as_vector(e.value(m));
    CHECK((std::isnan(v[0]) && std::isnan(v[1]) && v[2] == 3 && std::isnan(v[3])));
  }
  for (float v : as_vector(e.value(cab))) CHECK(std::isnan(v));
  e.backward(g, loss);
  CHECK(as_vector(e.gradient(a)) == std::vector<float>{0, 2, 1, 2});
  CHECK(as_vector(e.gradient(b)) == std::vector<float>{2, 0, 0, 0});
  CHECK(as_vector(e.gradient(c)) == std::vector<float>{0, 0, 1, 0});

  // max_index (and amax through it): a NaN is the largest value, the first NaN's row; on the
  // GPU, columns of 100 rows over a warp's lanes.
  Graph h(pc);
  std::vector<float> x(300);
  for (uint32_t i = 0; i < 300; ++i) x[i] = static_cast<float>((i * 37) % 101) - 50;
  x[55] = 60;
  x[100 + 70] = x[100 + 37] = nan;
  x[200 + 99] = nan;
  x[200 + 3] = std::numeric_limits<float>::infinity();
  const Expr m = max_index(input(h, Dim{100, 3}, x));
  const std::vector<float> v = as_vector(e.forward(h, m));
  CHECK(v[0] == 60);
  CHECK(v[1] == 55);
  CHECK((std::isnan(v[2]) && v[3] == 37 && std::isnan(v[4]) && v[5] == 99));
}

// The rectifiers at NaN and the infinities, as PyTorch gives them: NaN stays NaN (relu(NaN) is
// NaN, not 0), over a column long enough for the CPU's vector lanes and a scalar tail. Gradients
// pass where x > 0 only (relu's at NaN is 0). tests/test_cuda.cpp runs it on the GPU.
void testing::check_rectifiers_nan(const std::string& device, int threads) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> pattern{nan, inf, -inf, -3.0f, 2.0f, 0.0f};
  const double e3 = std::exp(-3.0);
  const std::vector<std::pair<std::string, std::vector<double>>> expected{
      {"relu", {NAN, INFINITY, 0, 0, 2, 0}},
      {"leaky_relu", {NAN, INFINITY, -INFINITY, -0.3, 2, 0}},
      {"elu", {NAN, INFINITY, -0.5, 0.5 * (e3 - 1), 2, 0}},
      {"softplus",
       {NAN, INFINITY, 0, std::log1p(e3), 2 + std::log1p(std::exp(-2.0)), std::log(2.0)}}};
  const uint32_t n = 19;
  std::vector<float> xs(n);
  for (uint32_t i = 0; i < n; ++i) xs[i] = pattern[i % pattern.size()];
  ParameterCollection pc(1);
  Graph g(pc);
  const Expr x = input(g, Dim{n, 1}, xs);
  const std::vector<Expr> ys{relu(x), leaky_relu(x, 0.1f), elu(x, 0.5f), softplus(x)};
  const Expr finite = column_sum(keep(ys[0], step(x)));  // relu where x > 0: 2 per pattern, and inf
  Engine e(pc, EngineOptions{"lb-greedy", device, threads});
  e.forward(g, finite);  // runs every node of g
  for (size_t k = 0; k < ys.size(); ++k) {
    const std::vector<float> v = as_vector(e.value(ys[k]));
    for (uint32_t i = 0; i < n; ++i) {
      const double want = expected[k].second[i % pattern.size()];
      CAPTURE(expected[k].first);
      CAPTURE(i);
      if (std::isnan(want))
        CHECK(std::isnan(v[i]));
      else if (std::isinf(want))
        CHECK(v[i] == want);
      else
        CHECK(v[i] == doctest::Approx(want).epsilon(1e-6));
    }
  }
  e.backward(g, finite);
  const std::vector<float> dx = as_vector(e.gradient(x));
  for (uint32_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const float xi = xs[i];
    CHECK(dx[i] == (xi > 0 ? 1.0f : 0.0f));
  }
}

TEST_CASE("ops: the rectifiers keep NaN and map the infinities as PyTorch does") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    testing::check_rectifiers_nan("cpu", threads);
  }
}

// stop_gradient passes values, infinities and NaN included, and no gradient: of
// sum(stop_gradient(x) * x + stop_gradient(x * x) + x) the gradient is x + 1 exactly, where
// without it it would be 3x + 1.
TEST_CASE("ops: stop_gradient passes the value and no gradient") {
  const float inf = std::numeric_limits<float>::infinity();
  const uint32_t n = 21;
  std::vector<float> xs(n);
  for (uint32_t i = 0; i < n; ++i) xs[i] = 0.37f * static_cast<float>(i) - 3.1f;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    ParameterCollection pc(1);
    Graph g(pc);
    const Expr x = input(g, Dim{n, 1}, xs);
    const Expr y = cmult(stop_gradient(x), x) + stop_gradient(cmult(x, x)) + x;
    const Expr odd = stop_gradient(input(g, Dim{3, 1}, {inf, -inf, std::nanf("")}));
    Engine e(pc, EngineOptions{"lb-greedy", "cpu", threads});
    const Expr loss = column_sum(y);
    e.forward(g, loss);
    const std::vector<float> v = as_vector(e.value(y)),
                             dx = (e.backward(g, loss), as_vector(e.gradient(x)));
    for (uint32_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(v[i] == doctest::Approx(2.0 * xs[i] * xs[i] + xs[i]).epsilon(1e-6));
      CHECK(dx[i] == xs[i] + 1.0f);
    }
    e.forward(g, odd);
    const std::vector<float> o = as_vector(e.value(odd));
    CHECK(o[0] == inf);
    CHECK(o[1] == -inf);
    CHECK(std::isnan(o[2]));
  }
  CHECK(math::StopGradient::value<math::ScalarMath>(-0.0, math::Attr{}) == 0.0);
  CHECK(std::signbit(math::StopGradient::value<math::ScalarMath>(-0.0f, math::Attr{})));
  CHECK(math::StopGradient::gradient<math::ScalarMath>(inf, 1.0f, 1.0f, math::Attr{}) == 0.0f);
  CHECK(math::StopGradient::gradient<math::ScalarMath>(2.0, 1.0, 1.0, math::Attr{}) == 0.0);
}

TEST_CASE("ops: maximum and max_index take NaN as the largest; maximum's gradient to the first") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    testing::check_maximum_nan("cpu", threads);
  }
}

// log_softmax and pick_neg_log_softmax subtract the column's largest entry before adding the
// log of the sum, so they keep float precision however far from 0 the column lies, and a column
// masked to one large negative value is uniform, as in PyTorch. Against a double reference on
// the stored floats; tests/test_cuda.cpp runs it on the GPU.
void testing::check_log_softmax_far(const std::string& device, int threads) {
  const std::vector<float> base{0.5f, -1.25f, 2.0f, 0.0f, 0.75f};
  const uint32_t n = static_cast<uint32_t>(base.size());
  ParameterCollection pc(1);
  Graph g(pc);
  std::vector<Expr> xs, logs, picks, terms;
  std::vector<std::vector<float>> columns;
  for (double offset : {0.0, 1e4, 1e5, 1e7, 3e7, -1e9}) {
    std::vector<float> v(n);
    for (uint32_t q = 0; q < n; ++q)
      v[q] = offset == -1e9 ? -1e9f : static_cast<float>(offset + base[q]);
    columns.push_back(v);
    xs.push_back(input(g, Dim{n, 1}, v));
    logs.push_back(log_softmax(xs.back()));
    picks.push_back(pick_neg_log_softmax(xs.back(), static_cast<uint32_t>(xs.size()) % n));
    terms.push_back(picks.back());
    terms.push_back(column_sum(logs.back()));
  }
  const Expr loss = sum(terms);
  Engine e(pc, EngineOptions{"lb-greedy", device, threads});
  e.forward(g, loss);
  e.backward(g, loss);
  for (size_t k = 0; k < xs.size(); ++k) {
    CAPTURE(columns[k][0]);
    const std::vector<float>& v = columns[k];
    const double m = *std::max_element(v.begin(), v.end());
    double sum_exp = 0;
    for (float x : v) sum_exp += std::exp(x - m);
    const uint32_t label = static_cast<uint32_t>(k + 1) % n;
    const std::vector<float> y = as_vector(e.value(logs[k]));
    const std::vector<float> dx = as_vector(e.gradient(xs[k]));
    for (uint32_t q = 0; q < n; ++q) {
      const double log_p = (v[q] - m) - std::log(sum_exp), p = std::exp(log_p);
      CHECK(y[q] == doctest::Approx(log_p).epsilon(1e-5));
      // d/dx of -log_softmax[label] plus the column's sum of log_softmax.
      const double grad = (p - (q == label ? 1 : 0)) + (1 - n * p);
      CHECK(dx[q] == doctest::Approx(grad).epsilon(1e-5));
    }
    CHECK(as_scalar(e.value(picks[k])) ==
          doctest::Approx(std::log(sum_exp) - (v[label] - m)).epsilon(1e-5));
  }
}

// A sum or mean of 10^5 arguments (a node of that fan-in) against a double reference: added one
// after another in float32 the error would grow with the count (about 1e-3 relative here); the
// kernels keep it at float32's rounding. An infinity among the arguments stays infinite, and
// +inf with -inf gives NaN.
void testing::check_wide_sums(const std::string& device, int threads) {
  const uint32_t k = 100003, n = 3;
  ParameterCollection pc(1);
  Graph g(pc);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  std::vector<Expr> xs;
  std::vector<double> want(n, 0.0);
  for (uint32_t j = 0; j < k; ++j) {
    std::vector<float> v(n);
    for (uint32_t r = 0; r < n; ++r) {
      v[r] = u(rng);
      want[r] += v[r];
    }
    xs.push_back(input(g, Dim{n, 1}, v));
  }
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<Expr> with_inf(xs.begin(), xs.begin() + 300);
  with_inf.push_back(input(g, Dim{n, 1}, {inf, -inf, inf}));
  with_inf.push_back(input(g, Dim{n, 1}, {1.0f, 1.0f, -inf}));
  const Expr s = sum(xs), a = average(xs), si = sum(with_inf), ai = average(with_inf);
  Engine e(pc, EngineOptions{"lb-greedy", device, threads});
  e.forward(g, sum({column_sum(s), column_sum(a), column_sum(si), column_sum(ai)}));
  const std::vector<float> ys = as_vector(e.value(s)), ya = as_vector(e.value(a));
  for (uint32_t r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(ys[r] == doctest::Approx(want[r]).epsilon(1e-5));
    CHECK(ya[r] == doctest::Approx(want[r] / k).epsilon(1e-5));
  }
  for (const Expr& x : {si, ai}) {
    const std::vector<float> y = as_vector(e.value(x));
    CHECK(y[0] == inf);
    CHECK(y[1] == -inf);
    CHECK(std::isnan(y[2]));
  }
}

TEST_CASE("ops: sums and means of 10^5 arguments keep float32's precision") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    testing::check_wide_sums("cpu", threads);
  }
}

TEST_CASE("ops: log_softmax and pick_neg_log_softmax far from 0 and under a mask") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    testing::check_log_softmax_far("cpu", threads);
  }
}

// Nodes no seed depends on are not differentiated, as PyTorch never differentiates them: exp of
// a loss that overflows, sqrt and log at 0 and a division by 0, computed only to be read, leave
// the gradients bitwise as they are without them. tests/test_cuda.cpp runs it on the GPU.
void testing::check_unused_nodes(const std::string& device, int threads) {
  ParameterCollection pc(3);
  const Parameter W = pc.add_parameters("W", Dim{6, 4});
  const std::vector<float> xv{0.5f, -1.0f, 0.25f, 2.0f};
  Engine e(pc, EngineOptions{"lb-greedy", device, threads});
  const auto gradient = [&](bool unused, bool seeds) {
    Graph g(pc);
    const Expr h = relu(matmul(parameter(g, W), input(g, Dim{4, 1}, xv)));
    const Expr loss = sum({pick(h, 0), pick(h, 1), tanh(pick(h, 2))});
    std::vector<Expr> read;
    if (unused) {
      const Expr zero = h - h;
      read = {exp(scalar_affine(loss, 1000.0f, 100.0f)), sqrt(zero), log(zero), h / zero,
              1.0f / zero};
    }
    e.forward(g, loss);
    if (unused) {
      CHECK(std::isinf(as_scalar(e.value(read[0]))));
      CHECK(as_vector(e.value(read[1]))[0] == 0.0f);
      CHECK(std::isinf(as_vector(e.value(read[2]))[0]));
    }
    pc.zero_grads();
    const float one = 1.0f;
    if (seeds)
      e.backward(g, {loss}, &one);
    else
      e.backward(g, loss);
    const float* dw = pc.grads(W.id);
    return std::vector<float>(dw, dw + 24);
  };
  const std::vector<float> plain = gradient(false, false);
  bool any = false;
  for (float v : plain) any = any || v != 0.0f;
  CHECK(any);
  CHECK(gradient(true, false) == plain);
  CHECK(gradient(true, true) == plain);
}

TEST_CASE("ops: nodes the loss does not depend on leave the gradients alone") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    testing::check_unused_nodes("cpu", threads);
  }
}

// The CPU kernels' forms of step and keep (Eigen's vectorised compare and select) on values the
// harness does not draw: zeros, inf and NaN. keep's gradient passes only where it keeps.
TEST_CASE("ops: keep drops inf and NaN where it does not keep; step of NaN is 0") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    ParameterCollection pc(1);
    Graph g(pc);
    const Expr x = input(g, Dim{6, 1}, {inf, nan, 1.5f, -2.0f, 0.0f, -0.0f});
    const Expr m = input(g, Dim{6, 1}, {0.0f, -1.0f, 1.0f, 0.5f, 0.0f, nan});
    const Expr kept = keep(x, m), strict = step(x), inclusive = step(x, true);
    const Expr loss = column_sum(kept) + column_sum(strict) + column_sum(inclusive);
    Engine e(pc, EngineOptions{"lb-greedy", "cpu", threads});
    CHECK(as_scalar(e.forward(g, loss)) == -0.5f + 2.0f + 4.0f);
    CHECK(as_vector(e.value(kept)) == std::vector<float>{0, 0, 1.5f, -2.0f, 0, 0});
    CHECK(as_vector(e.value(strict)) == std::vector<float>{1, 0, 1, 0, 0, 0});
    CHECK(as_vector(e.value(inclusive)) == std::vector<float>{1, 0, 1, 0, 1, 1});
    e.backward(g, loss);
    CHECK(as_vector(e.gradient(x)) == std::vector<float>{0, 0, 1, 1, 0, 0});
    CHECK(as_vector(e.gradient(m)) == std::vector<float>(6, 0.0f));
  }
}

// The reference takes its elementwise math from kernels/op_math.h, like the kernels; the values
// are checked here against closed forms written independently (derivatives: the harness's finite
// differences), including arguments where a naive form overflows or cancels.
TEST_CASE("op math: values against closed forms") {
  using math::Attr;
  using math::ScalarMath;
  for (double x : {-60.0, -20.0, -3.5, -1e-3, 0.0, 1e-7, 0.25, 2.0, 17.0, 60.0, 700.0}) {
    CAPTURE(x);
    const double softplus = x > 30 ? x + std::exp(-x) : std::log(1.0 + std::exp(x));
    CHECK(math::Softplus::value<ScalarMath>(x, Attr{}) == doctest::Approx(softplus).epsilon(1e-12));
    CHECK(math::Tanh::value<ScalarMath>(x, Attr{}) == doctest::Approx(std::tanh(x)));
    CHECK(math::Sigmoid::value<ScalarMath>(x, Attr{}) == doctest::Approx(1 / (1 + std::exp(-x))));
    CHECK(math::Relu::value<ScalarMath>(x, Attr{}) == (x > 0 ? x : 0.0));
    CHECK(math::ScalarAffine::value<ScalarMath>(x, Attr{-0.5f, 2.0f}) == doctest::Approx(-0.5 * x + 2));
    // The float instantiation the CUDA kernels use agrees with the double one.
    const float xf = static_cast<float>(x);
    CHECK(math::Softplus::value<ScalarMath>(xf, Attr{}) ==
          doctest::Approx(math::Softplus::value<ScalarMath>(double(xf), Attr{})).epsilon(1e-6));
  }
  CHECK(math::Softplus::value<ScalarMath>(1e-30, Attr{}) == doctest::Approx(std::log(2.0)));
}

TEST_CASE("op math: exp, log, sqrt, gelu, leaky_relu, elu, abs, divisions against closed forms") {
  using math::Attr;
  using math::ScalarMath;
  const double kPi = 3.14159265358979323846;
  for (double x : {-60.0, -20.0, -3.5, -1e-3, 1e-7, 0.25, 2.0, 17.0, 60.0}) {
    CAPTURE(x);
    const double ax = std::fabs(x);
    CHECK(math::Exp::value<ScalarMath>(x, Attr{}) == doctest::Approx(std::exp(x)).epsilon(1e-14));
    CHECK(math::Log::value<ScalarMath>(ax, Attr{}) == doctest::Approx(std::log(ax)).epsilon(1e-14));
    CHECK(math::Sqrt::value<ScalarMath>(ax, Attr{}) ==
          doctest::Approx(std::sqrt(ax)).epsilon(1e-14));
    // The normal distribution's CDF from erfc (no cancellation for negative x), times x.
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2 * kPi);
    CHECK(math::Gelu::value<ScalarMath>(x, Attr{}) == doctest::Approx(x * cdf).epsilon(1e-12));
    CHECK(math::Gelu::gradient<ScalarMath>(1.0, x, 0.0, Attr{}) ==
          doctest::Approx(cdf + x * pdf).epsilon(1e-12));
    CHECK(math::ScalarDivide::value<ScalarMath>(x, Attr{-1.5f}) == doctest::Approx(-1.5 / x));
    // leaky_relu, elu, abs: the branches PyTorch writes, values and slopes.
    const Attr a{0.25f};
    CHECK(math::LeakyRelu::value<ScalarMath>(x, a) == doctest::Approx(x > 0 ? x : 0.25 * x));
    CHECK(math::LeakyRelu::gradient<ScalarMath>(2.0, x, 0.0, a) == (x > 0 ? 2.0 : 0.5));
    CHECK(math::Elu::value<ScalarMath>(x, a) ==
          doctest::Approx(x > 0 ? x : 0.25 * std::expm1(x)).epsilon(1e-12));
    CHECK(math::Elu::gradient<ScalarMath>(2.0, x, 0.0, a) ==
          doctest::Approx(x > 0 ? 2.0 : 0.5 * std::exp(x)).epsilon(1e-12));
    CHECK(math::Abs::value<ScalarMath>(x, Attr{}) == ax);
    CHECK(math::Abs::gradient<ScalarMath>(3.0, x, 0.0, Attr{}) == (x > 0 ? 3.0 : -3.0));
    CHECK(math::Divide::value<ScalarMath>(3.0, x) == doctest::Approx(3.0 / x));
    // sin, cos, erf: values from the C library, slopes cos, -sin and the normal density.
    CHECK(math::Sin::value<ScalarMath>(x, Attr{}) == std::sin(x));
    CHECK(math::Sin::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) == doctest::Approx(2 * std::cos(x)));
    CHECK(math::Cos::value<ScalarMath>(x, Attr{}) == std::cos(x));
    CHECK(math::Cos::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
          doctest::Approx(-2 * std::sin(x)));
    CHECK(math::Erf::value<ScalarMath>(x, Attr{}) == std::erf(x));
    CHECK(math::Erf::gradient<ScalarMath>(1.0, x, 0.0, Attr{}) ==
          doctest::Approx(2.0 / std::sqrt(kPi) * std::exp(-x * x)).epsilon(1e-12));
    // atan: the C library's value, the slope 1 / (1 + x^2); 0 where x^2 overflows.
    CHECK(math::Atan::value<ScalarMath>(x, Attr{}) == std::atan(x));
    CHECK(math::Atan::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
          doctest::Approx(2.0 / (1.0 + x * x)).epsilon(1e-12));
    // sinh, cosh, asinh, and atanh, asin, acos inside (-1, 1): the C library's values, closed-form
    // slopes.
    CHECK(math::Sinh::value<ScalarMath>(x, Attr{}) == std::sinh(x));
    CHECK(math::Sinh::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
          doctest::Approx(2.0 * std::cosh(x)).epsilon(1e-12));
    CHECK(math::Cosh::value<ScalarMath>(x, Attr{}) == std::cosh(x));
    CHECK(math::Cosh::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
          doctest::Approx(2.0 * std::sinh(x)).epsilon(1e-12));
    CHECK(math::Asinh::value<ScalarMath>(x, Attr{}) == std::asinh(x));
    CHECK(math::Asinh::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
          doctest::Approx(2.0 / std::sqrt(x * x + 1.0)).epsilon(1e-12));
    if (ax < 1) {
      CHECK(math::Atanh::value<ScalarMath>(x, Attr{}) == std::atanh(x));
      CHECK(math::Atanh::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
            doctest::Approx(2.0 / (1.0 - x * x)).epsilon(1e-12));
      CHECK(math::Asin::value<ScalarMath>(x, Attr{}) == std::asin(x));
      CHECK(math::Asin::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
            doctest::Approx(2.0 / std::sqrt(1.0 - x * x)).epsilon(1e-12));
      CHECK(math::Acos::value<ScalarMath>(x, Attr{}) == std::acos(x));
      CHECK(math::Acos::gradient<ScalarMath>(2.0, x, 0.0, Attr{}) ==
            doctest::Approx(-2.0 / std::sqrt(1.0 - x * x)).epsilon(1e-12));
    }
    // The float instantiation the CUDA kernels use agrees with the double one.
    const float xf = static_cast<float>(x);
    CHECK(math::Gelu::value<ScalarMath>(xf, Attr{}) ==
          doctest::Approx(math::Gelu::value<ScalarMath>(double(xf), Attr{})).epsilon(1e-6));
  }
  // A dy of exactly 0 gives 0 where the slope is infinite (the domain's ends; cosh overflowed),
  // not 0 * inf = NaN; a nonzero dy there gives the infinite slope.
  CHECK(math::Atanh::gradient<ScalarMath>(0.0f, 1.0f, 0.0f, Attr{}) == 0.0f);
  CHECK(math::Asin::gradient<ScalarMath>(0.0f, -1.0f, 0.0f, Attr{}) == 0.0f);
  CHECK(math::Acos::gradient<ScalarMath>(0.0f, 1.0f, 0.0f, Attr{}) == 0.0f);
  CHECK(math::Sinh::gradient<ScalarMath>(0.0f, 100.0f, 0.0f, Attr{}) == 0.0f);
  CHECK(std::isinf(math::Atanh::gradient<ScalarMath>(1.0f, 1.0f, 0.0f, Attr{})));
  // The divisions' gradients in float where b * b would underflow: -a / b^2 = -1e16.
  CHECK(math::Divide::grad_b<ScalarMath>(1.0f, 1e-30f, 1e-23f, 0.0f) ==
        doctest::Approx(-1e16).epsilon(1e-6));
  CHECK(math::ScalarDivide::gradient<ScalarMath>(1.0f, 1e-23f, 0.0f, Attr{1e-30f}) ==
        doctest::Approx(-1e16).epsilon(1e-6));
  // At the kink: leaky_relu's slope is alpha, elu's alpha, abs's 0 (PyTorch's choices).
  CHECK(math::LeakyRelu::gradient<ScalarMath>(1.0, 0.0, 0.0, Attr{0.25f}) == 0.25);
  CHECK(math::Elu::gradient<ScalarMath>(1.0, 0.0, 0.0, Attr{0.25f}) == 0.25);
  CHECK(math::Abs::gradient<ScalarMath>(1.0, 0.0, 0.0, Attr{}) == 0.0);
  // step: x > 0, or x >= 0 with alpha 1; NaN is 0 either way (PyTorch's comparisons are false).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& [x, exclusive, inclusive] :
       std::vector<std::tuple<double, double, double>>{{0.0, 0, 1},
                                                       {-0.0, 0, 1},
                                                       {1e-30, 1, 1},
                                                       {-1e-30, 0, 0},
                                                       {nan, 0, 0},
                                                       {inf, 1, 1},
                                                       {-inf, 0, 0}}) {
    CAPTURE(x);
    CHECK(math::Step::value<ScalarMath>(x, Attr{}) == exclusive);
    CHECK(math::Step::value<ScalarMath>(x, Attr{1.0f}) == inclusive);
    CHECK(math::Step::value<ScalarMath>(static_cast<float>(x), Attr{1.0f}) == inclusive);
    CHECK(math::Step::gradient<ScalarMath>(5.0, x, 0.0, Attr{}) == 0.0);
  }
  // floor and round (halves to even, as torch.round), in float and double; gradient 0, even for
  // an infinite dy.
  for (const auto& [x, down, nearest] :
       std::vector<std::tuple<double, double, double>>{{-1.5, -2, -2},
                                                       {-0.5, -1, -0.0},
                                                       {-0.0, -0.0, -0.0},
                                                       {0.3, 0, 0},
                                                       {0.5, 0, 0},
                                                       {1.5, 1, 2},
                                                       {2.5, 2, 2},
                                                       {2.7, 2, 3},
                                                       {8388609, 8388609, 8388609},
                                                       {-1e10, -1e10, -1e10},
                                                       {inf, inf, inf},
                                                       {-inf, -inf, -inf}}) {
    CAPTURE(x);
    CHECK(math::Floor::value<ScalarMath>(x, Attr{}) == down);
    CHECK(math::Round::value<ScalarMath>(x, Attr{}) == nearest);
    CHECK(std::signbit(math::Round::value<ScalarMath>(x, Attr{})) == std::signbit(nearest));
    const float xf = static_cast<float>(x);
    CHECK(math::Floor::value<ScalarMath>(xf, Attr{}) == static_cast<float>(down));
    CHECK(math::Round::value<ScalarMath>(xf, Attr{}) == static_cast<float>(nearest));
    CHECK(math::Floor::gradient<ScalarMath>(inf, x, 0.0, Attr{}) == 0.0);
    CHECK(math::Round::gradient<ScalarMath>(2.0f, xf, 0.0f, Attr{}) == 0.0f);
  }
  CHECK(math::Round::value<ScalarMath>(0.49999997f, Attr{}) == 0.0f);
  // atan2(a, b), the angle of (b, a): both sides of the cut along b < 0, the axes, the
  // infinities; gradients b / r^2 and -a / r^2, NaN at the origin (PyTorch's) unless dy is 0.
  for (const auto& [a, b, angle] :
       std::vector<std::tuple<double, double, double>>{{0.0, -1.0, kPi},
                                                       {-0.0, -1.0, -kPi},
                                                       {1.0, 0.0, kPi / 2},
                                                       {-2.0, 0.0, -kPi / 2},
                                                       {0.0, 0.0, 0.0},
                                                       {1.0, 1.0, kPi / 4},
                                                       {-1.0, -1.0, -3 * kPi / 4},
                                                       {inf, inf, kPi / 4},
                                                       {3.0, -inf, kPi}}) {
    CAPTURE(a);
    CAPTURE(b);
    CHECK(math::Atan2::value<ScalarMath>(a, b) == doctest::Approx(angle).epsilon(1e-15));
    CHECK(math::Atan2::value<ScalarMath>(static_cast<float>(a), static_cast<float>(b)) ==
          doctest::Approx(angle).epsilon(1e-6));
  }
  CHECK(math::Atan2::grad_a<ScalarMath>(2.0, 1.0, 1.0, 0.0) == doctest::Approx(1.0));
  CHECK(math::Atan2::grad_b<ScalarMath>(2.0, 1.0, 1.0, 0.0) == doctest::Approx(-1.0));
  CHECK(math::Atan2::grad_a<ScalarMath>(1.0f, 3.0f, -4.0f, 0.0f) == doctest::Approx(-4.0 / 25));
  CHECK(math::Atan2::grad_b<ScalarMath>(1.0f, 3.0f, -4.0f, 0.0f) == doctest::Approx(-3.0 / 25));
  CHECK(std::isnan(math::Atan2::grad_a<ScalarMath>(1.0, 0.0, 0.0, 0.0)));
  CHECK(std::isnan(math::Atan2::grad_b<ScalarMath>(1.0f, 0.0f, 0.0f, 0.0f)));
  CHECK(math::Atan2::grad_a<ScalarMath>(0.0, 0.0, 0.0, 0.0) == 0.0);
  // hypot(a, b): no overflow or underflow in the squares, inf beside NaN; gradients a / r and
  // b / r, NaN at the origin (PyTorch's) unless dy is 0.
  for (const auto& [a, b, r] :
       std::vector<std::tuple<double, double, double>>{{3.0, -4.0, 5.0},
                                                       {-0.0, 0.0, 0.0},
                                                       {3e30, 4e30, 5e30},
                                                       {-3e-30, 4e-30, 5e-30},
                                                       {inf, nan, inf},
                                                       {nan, -inf, inf},
                                                       {1.0, nan, nan}}) {
    CAPTURE(a);
    CAPTURE(b);
    const double got = math::Hypot::value<ScalarMath>(a, b);
    const float got_f =
        math::Hypot::value<ScalarMath>(static_cast<float>(a), static_cast<float>(b));
    if (std::isnan(r)) {
      CHECK(std::isnan(got));
      CHECK(std::isnan(got_f));
    } else if (std::isinf(r)) {
      CHECK(got == r);
      CHECK(got_f == static_cast<float>(r));
    } else {
      CHECK(got == doctest::Approx(r).epsilon(1e-15));
      CHECK(got_f == doctest::Approx(r).epsilon(1e-6));
    }
  }
  // (the gradients read y = hypot(a, b), which the kernels pass them)
  CHECK(math::Hypot::grad_a<ScalarMath>(2.0, 3.0, -4.0, 5.0) == doctest::Approx(6.0 / 5));
  CHECK(math::Hypot::grad_b<ScalarMath>(2.0, 3.0, -4.0, 5.0) == doctest::Approx(-8.0 / 5));
  CHECK(math::Hypot::grad_a<ScalarMath>(1.0f, 3e30f, 4e30f, 5e30f) == doctest::Approx(0.6));
  CHECK(math::Hypot::grad_b<ScalarMath>(1.0f, -3e-30f, 4e-30f, 5e-30f) == doctest::Approx(0.8));
  CHECK(std::isnan(math::Hypot::grad_a<ScalarMath>(1.0, 0.0, 0.0, 0.0)));
  CHECK(std::isnan(math::Hypot::grad_b<ScalarMath>(1.0f, 0.0f, 0.0f, 0.0f)));
  CHECK(math::Hypot::grad_b<ScalarMath>(0.0, 0.0, 0.0, 0.0) == 0.0);
  // A scalar affine with beta 0 is the product alone, its zero's sign included (-x of +0 is -0,
  // as PyTorch's negation); other betas add as usual.
  for (const auto& [alpha, beta, x, want] :
       std::vector<std::tuple<float, float, float, float>>{{-1, 0, 0.0f, -0.0f},
                                                           {-1, 0, -0.0f, 0.0f},
                                                           {2, 0, -0.0f, -0.0f},
                                                           {-1, -0.0f, 0.0f, -0.0f},
                                                           {1, 0.5f, 1.0f, 1.5f},
                                                           {-1, 0.5f, 0.5f, 0.0f},
                                                           {0.5f, -2.0f, 3.0f, -0.5f}}) {
    CAPTURE(alpha);
    CAPTURE(beta);
    CAPTURE(x);
    const float got = math::ScalarAffine::value<ScalarMath>(x, Attr{alpha, beta});
    CHECK(got == want);
    CHECK(std::signbit(got) == std::signbit(want));
    CHECK(std::signbit(math::ScalarAffine::value<ScalarMath>(
              static_cast<double>(x), Attr{alpha, beta})) == std::signbit(want));
  }
  CHECK(std::isnan(math::Floor::value<ScalarMath>(nan, Attr{})));
  CHECK(std::isnan(math::Round::value<ScalarMath>(static_cast<float>(nan), Attr{})));
  // relu of NaN is NaN (PyTorch's), in the float form the GPU evaluates and the double reference.
  CHECK(std::isnan(math::Relu::value<ScalarMath>(nan, Attr{})));
  CHECK(std::isnan(math::Relu::value<ScalarMath>(static_cast<float>(nan), Attr{})));
  CHECK(math::Relu::value<ScalarMath>(-inf, Attr{}) == 0.0);
  // keep selects: a value not kept is exactly 0 even when it is inf or NaN.
  CHECK(math::Keep::value<ScalarMath>(inf, 0.0) == 0.0);
  CHECK(math::Keep::value<ScalarMath>(nan, -1.0) == 0.0);
  CHECK(math::Keep::value<ScalarMath>(inf, 2.0) == inf);
  CHECK(math::Keep::value<ScalarMath>(-3.0, nan) == 0.0);
  CHECK(math::Keep::grad_a<ScalarMath>(2.0, 7.0, 0.0, 0.0) == 0.0);
  CHECK(math::Keep::grad_a<ScalarMath>(2.0, 7.0, 0.5, 0.0) == 2.0);
  CHECK(math::Keep::grad_b<ScalarMath>(2.0, 7.0, 0.5, 0.0) == 0.0);
  // Thresholds: p * 2^32 exactly, rounded up.
  CHECK(math::dropout_threshold(0.0f) == 0u);
  CHECK(math::dropout_threshold(0.25f) == 1u << 30);
  CHECK(math::dropout_threshold(0.5f) == 1u << 31);
  CHECK(math::dropout_threshold(1e-12f) == 1u);
  CHECK(math::dropout_threshold(0.99999994f) == 4294967040u);
}
