// EngineOptions::check_numerics: after a pass, the first value (or gradient) that is not finite,
// in the order the pass computed them. The check reads the backend's host copy of the arena
// after the pass; every value of an iteration has its own place there, so this finds what a
// check after each batch would.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/engine.h"
#include "edbatch/types.h"

namespace edbatch {

namespace {

// Index of the first non-finite float of v[0, n), or n.
uint64_t first_non_finite(const float* v, uint64_t n) {
  // A block at a time with no early exit, so that the test vectorizes (an infinity or NaN has
  // every exponent bit set), then the block that has one element by element.
  constexpr uint64_t kBlock = 256;
  for (uint64_t b = 0; b < n; b += kBlock) {
    const uint64_t e = std::min(n, b + kBlock);
    uint32_t any = 0;
    for (uint64_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, v + i, sizeof bits);
      any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (any == 0) continue;
    for (uint64_t i = b; i < e; ++i)
      if (!std::isfinite(v[i])) return i;
  }
  return n;
}

struct Finding {
  std::string what;  // "node 17 (op tanh, type '...')"
  uint32_t node = UINT32_MAX;  // NumericsError::node
  float value;
  uint64_t element, size;
  std::string at;  // where in a parameter, as its saved tensor indexes it; else empty
};

// Element i of parameter `id` (stored column-major) as its saved tensor (safetensors, and
// PyTorch) indexes it: [row, column] of a matrix, [word, feature] of a lookup table.
std::string parameter_index(const ParameterCollection& pc, uint32_t id, uint64_t i) {
  const Dim d = pc.dim(id);
  if (d.cols == 1) return fmt::format("element {} of {}", i, d.rows);
  if (pc.is_lookup(id))
    return fmt::format("element [{}, {}] of shape [{}, {}]", i / d.rows, i % d.rows, d.cols,
                       d.rows);
  return fmt::format("element [{}, {}] of shape [{}, {}]", i % d.rows, i / d.rows, d.rows, d.cols);
}

class Checker {
 public:
  Checker(const PlanRef& p, const Backend& backend, bool adjoints)
      : p_(p), backend_(backend), adjoints_(adjoints) {}

  // The parameters (values, or gradients after backward), views skipped (their base holds them).
  bool parameters(Finding& f) const {
    const ParameterCollection& pc = p_.params;
    for (uint32_t id = 0; id < pc.size(); ++id) {
      if (pc.is_view(id)) continue;
      const uint64_t n = pc.dim(id).size();
      const float* v = adjoints_ ? pc.grads(id) : pc.values(id);
      if (!found(v, n, f)) continue;
      f.at = parameter_index(pc, id, f.element);
      return named(
          f, fmt::format("{}parameter '{}'", adjoints_ ? "the gradient of " : "", pc.name(id)));
    }
    return false;
  }

  // The graph's input nodes from `begin` on.
  bool inputs(uint32_t begin, Finding& f) const {
    // The planned nodes (a forward_through plans a prefix of the graph).
    const std::vector<Node>& nodes = p_.graph.nodes();
    for (uint32_t id = begin; id < p_.plan.node_offset.size(); ++id) {
      if (nodes[id].op != Op::Input) continue;
      const uint64_t n = nodes[id].dim.size();
      if (found(read(p_.plan.node_offset[id], n), n, f))
        return named(f, fmt::format("input node {}", id), id);
    }
    return false;
  }

  // Batch b's outputs: its nodes, or for block calls every value inside the calls.
  bool batch(size_t b, Finding& f) const {
    const Batch& batch = p_.schedule.batches[b];
    const Node& first = p_.graph.node(p_.schedule.nodes[batch.begin]);
    if (first.op == Op::Call) return block_batch(b, f);
    const std::string& type = p_.graph.types().name(batch.type);
    for (uint32_t i = 0; i < batch.count; ++i) {
      const uint32_t id = p_.schedule.nodes[batch.begin + i];
      const uint64_t n = p_.graph.node(id).dim.size();
      if (found(read(p_.plan.node_offset[id], n), n, f))
        return named(
            f,
            fmt::format("{}node {} (op {}, type '{}')", prefix(), id, op_info(first.op).name, type),
            id);
    }
    return false;
  }

 private:
  bool block_batch(size_t b, Finding& f) const {
    const Batch& batch = p_.schedule.batches[b];
    const BatchPlan& bp = p_.plan.batches[b];
    const Node& first = p_.graph.node(p_.schedule.nodes[batch.begin]);
    const Block* block = p_.params.block(first.aux);
    if (block == nullptr) return false;  // the backend has thrown already
    const BlockPlan& plan = block->plan();
    const uint32_t k = batch.count;
    for (uint32_t s = 0; s < plan.steps.size() && s < bp.step_count; ++s) {
      const BlockStep& step = plan.steps[s];
      const BatchPlan& sp = p_.plan.steps[bp.step_begin + s];
      const uint64_t n = uint64_t(sp.count) * sp.out_size;
      if (!found(read(sp.out_offset, n), n, f)) continue;
      // Member j of invocation i is virtual node j * k + i (BlockStep).
      const uint64_t virtual_node = f.element / sp.out_size;
      const uint32_t member = static_cast<uint32_t>(virtual_node / k);
      const uint32_t call = p_.schedule.nodes[batch.begin + virtual_node % k];
      const uint32_t body_node = plan.members[step.member_begin + member];
      f.element %= sp.out_size;
      f.size = sp.out_size;
      return named(f,
                   fmt::format("{}body node {} (op {}) of block '{}' in call node {}", prefix(),
                               body_node, op_info(step.op).name, plan.name, call),
                   call);
    }
    return false;
  }

  const char* prefix() const { return adjoints_ ? "the gradient of " : ""; }
  const float* read(uint32_t offset, uint64_t n) const {
    return backend_.arena(p_.plan, offset, static_cast<uint32_t>(n), adjoints_);
  }
  static bool found(const float* v, uint64_t n, Finding& f) {
    if (v == nullptr) return false;
    const uint64_t i = first_non_finite(v, n);
    if (i == n) return false;
    f.value = v[i];
    f.element = i;
    f.size = n;
    return true;
  }
  static bool named(Finding& f, std::string what, uint32_t node = UINT32_MAX) {
    f.what = std::move(what);
    f.node = node;
    return true;
  }

  const PlanRef& p_;
  const Backend& backend_;
  bool adjoints_;
};

[[noreturn]] void report(const char* fn, const char* kind, const Finding& f,
                         const std::string& where) {
  const std::string at = f.at.empty() ? fmt::format("element {} of {}", f.element, f.size) : f.at;
  throw NumericsError(fmt::format("[{}] non-finite {}: {} holds {} at {}, {} "
                                  "(EngineOptions::check_numerics)",
                                  fn, kind, f.what, f.value, at, where),
                      f.node);
}

}  // namespace

void Engine::check_forward_numerics(const Graph& g, const char* fn, uint32_t first_segment) const {
  const PlanRef p{g, schedule_, plan_, params_};
  const Checker check(p, *backend_, false);
  // An increment checks what it ran: the values before it were checked by their own forward
  // (and one found then is not reported again by every later step of a loop).
  const bool all = first_segment >= plan_.segments.size();
  const PlanSegment* seg = all ? nullptr : &plan_.segments[first_segment];
  Finding f;
  if (check.parameters(f) || check.inputs(seg ? seg->node_begin : 0, f))
    report(fn, "value", f, "before the forward pass");
  const size_t batches = schedule_.batches.size();
  for (size_t b = seg ? seg->batch_begin : 0; b < batches; ++b)
    if (check.batch(b, f))
      report(fn, "value", f,
             fmt::format("computed by batch {} of {} of the forward pass", b, batches));
}

void Engine::check_backward_numerics(const Graph& g) const {
  const char* fn = "Engine::backward";
  const PlanRef p{g, schedule_, plan_, params_};
  const Checker check(p, *backend_, true);
  Finding f;
  const size_t batches = schedule_.batches.size();
  // In the order backward finishes gradients: a batch's nodes once all their consumers ran.
  for (size_t b = batches; b-- > 0;)
    if (!(b < skip_batches_.size() && skip_batches_[b]) && check.batch(b, f))  // not run
      report(
          fn, "gradient", f,
          fmt::format("the output of forward batch {} of {}, after the backward pass", b, batches));
  if (check.parameters(f)) report(fn, "gradient", f, "after the backward pass");
}

}  // namespace edbatch
