#include "src/torch/program_parts.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace edbatch::torch_adapter {

void bad(const std::string& what) {
  throw std::invalid_argument(fmt::format("[edbatch.propagate] program: {}", what));
}

namespace {

// A float field: a JSON number, or "inf", "-inf" or "nan" (JSON has no such numbers).
float real_or(const json& j, const char* key, float fallback, const std::string& at) {
  if (!j.contains(key)) return fallback;
  const json& v = j.at(key);
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<float>::infinity();
    if (s == "-inf") return -std::numeric_limits<float>::infinity();
    if (s == "nan") return std::numeric_limits<float>::quiet_NaN();
    bad(fmt::format("{}: \"{}\" is neither a number nor \"inf\", \"-inf\" or \"nan\"", at, key));
  }
  return field<float>(j, key, at);
}

}  // namespace

Instr read_instr(const json& j, const std::string& cell, size_t v) {
  const std::string at = fmt::format("{}, value {}", cell, v);
  Instr in;
  in.op = field<std::string>(j, "op", at);
  in.where = field_or<std::string>(j, "where", "", at);
  in.args = field_or<std::vector<uint32_t>>(j, "args", {}, at);
  for (uint32_t a : in.args)
    if (a >= v) bad(fmt::format("{} ({}) reads value {}, not defined before it", at, in.op, a));
  if (in.op != "ids") in.size = field<uint32_t>(j, "size", at);
  in.slot = field_or<int32_t>(j, "slot", -1, at);
  in.weight = field_or<int32_t>(j, "weight", -1, at);
  in.bias = field_or<int32_t>(j, "bias", -1, at);
  in.alpha = real_or(j, "alpha", 0.0f, at);
  in.beta = real_or(j, "beta", 0.0f, at);
  in.eps = real_or(j, "eps", 1e-5f, at);
  in.p = real_or(j, "p", 0.0f, at);
  in.value = real_or(j, "value", 0.0f, at);
  in.begin = field_or<uint32_t>(j, "begin", 0, at);
  in.end = field_or<uint32_t>(j, "end", 0, at);
  return in;
}

Hoisting plan_hoisting(const std::vector<Instr>& body, const std::vector<uint32_t>& outputs,
                       int32_t input_slot, InputKind input) {
  const size_t n = body.size();
  Hoisting h;
  h.in_hoist.assign(n, 0);
  h.in_main.assign(n, 1);
  if (input == InputKind::None) return h;
  // What each value depends on: weights and constants only, the input row (the x row or the id,
  // and maybe weights), or something else (another slot, a dropout mask drawn per call).
  enum Dep : uint8_t { Fixed, X, Other };
  std::vector<Dep> dep(n, Other);
  bool projects = false;
  for (size_t v = 0; v < n; ++v) {
    const Instr& in = body[v];
    if (in.op == "input") {
      dep[v] = in.slot == input_slot && input == InputKind::X ? X : Other;
    } else if (in.op == "ids") {
      dep[v] = input == InputKind::Ids ? X : Other;
    } else if (in.op == "weight" || in.op == "const") {
      dep[v] = Fixed;
    } else if (in.op == "dropout") {
      dep[v] = Other;
    } else {
      Dep d = Fixed;
      for (uint32_t a : in.args) d = std::max(d, dep[a]);
      dep[v] = d;
      projects = projects || (d == X && in.op == "linear");
    }
  }
  if (!projects) return h;
  // The projection's outputs: input-dependent values (other than the x row or the id itself)
  // read by the rest of the cell or returned by it.
  std::vector<uint8_t> out(n, 0);
  for (size_t v = 0; v < n; ++v)
    if (dep[v] == Other)
      for (uint32_t a : body[v].args) out[a] = 1;
  for (uint32_t o : outputs) out[o] = 1;
  for (size_t v = 0; v < n; ++v)
    if (out[v] && dep[v] == X && body[v].op != "input" && body[v].op != "ids")
      h.outputs.push_back(static_cast<uint32_t>(v));
  if (h.outputs.empty()) return h;
  // What each block needs, walking the body backwards from its outputs; the cell's block stops
  // at the projection's outputs, which it reads as inputs.
  std::vector<uint8_t> need_hoist(n, 0), need_main(n, 0);
  for (uint32_t o : h.outputs) need_hoist[o] = 1;
  for (uint32_t o : outputs) need_main[o] = 1;
  // Instructions that depend on anything else are translated as before, needed or not, so that
  // dropout sites keep their numbers.
  for (size_t v = 0; v < n; ++v)
    if (dep[v] == Other) need_main[v] = 1;
  for (size_t v = n; v-- > 0;) {
    const bool hoisted = std::find(h.outputs.begin(), h.outputs.end(), v) != h.outputs.end();
    if (need_hoist[v])
      for (uint32_t a : body[v].args) need_hoist[a] = 1;
    if (need_main[v] && !hoisted)
      for (uint32_t a : body[v].args) need_main[a] = 1;
  }
  h.in_main = need_main;
  h.in_hoist = need_hoist;
  return h;
}

Reduce read_reduce(const std::string& name, const std::vector<uint32_t>& message) {
  if (name == "sum") return Reduce::Sum;
  if (name == "mean") return Reduce::Mean;
  if (name == "max") return Reduce::Max;
  if (name != "softmax") bad("reduce '" + name + "' (expected sum, mean, max or softmax)");
  if (message.size() < 2 || message[0] != 1)
    bad("reduce 'softmax' needs messages of two components or more, the first of size 1 (the "
        "score)");
  return Reduce::Softmax;
}

void reduce_messages(Reduce how, const std::vector<std::vector<Expr>>& messages,
                     const std::vector<uint32_t>& sizes, Expr* reduced) {
  const size_t k = messages[0].size();
  if (how != Reduce::Softmax || k == 1) {
    for (size_t c = 0; c < messages.size(); ++c) {
      const std::vector<Expr>& ms = messages[c];
      reduced[c] = how == Reduce::Mean  ? average(ms)
                   : how == Reduce::Max ? maximum(ms)
                                        : sum(ms);  // Sum, and one message under Softmax
    }
    return;
  }
  // Over each arc's score alone, so that no op depends on an arc's position (one slice per
  // position would make a batching type per position, and scheduling quadratic in the fan-in):
  // e_j = exp(s_j - m), m the largest score but at least the lowest float, so that arcs all
  // masked (-inf) give -inf as torch.logsumexp does, not NaN; log-sum-exp m + log sum e, and the
  // values weighted as sum e_j v_j / sum e, the softmax's weights applied once to the sum.
  const std::vector<Expr>& scores = messages[0];
  std::vector<Expr> e(scores);
  e.push_back(input(*scores[0].graph, -std::numeric_limits<float>::max()));
  const Expr m = maximum(e);
  e.pop_back();
  for (size_t j = 0; j < k; ++j) e[j] = exp(subtract(scores[j], m));
  const Expr total = sum(e);
  reduced[0] = add(m, log(total));
  const Expr inverse = scalar_divide(1, total);
  std::vector<Expr> terms(k);
  for (size_t c = 1; c < messages.size(); ++c) {
    for (size_t j = 0; j < k; ++j)
      terms[j] = cmult(sizes[c] == 1 ? e[j] : broadcast_rows(e[j], sizes[c]), messages[c][j]);
    reduced[c] = cmult(sum(terms), sizes[c] == 1 ? inverse : broadcast_rows(inverse, sizes[c]));
  }
}

bool foldable(const LinearForm& a, const LinearForm& b) {
  const bool a_any = !a.terms.empty() || !a.biases.empty(),
             b_any = !b.terms.empty() || !b.biases.empty();
  return a_any && b_any && (!a.terms.empty() || !b.terms.empty());
}

}  // namespace edbatch::torch_adapter
