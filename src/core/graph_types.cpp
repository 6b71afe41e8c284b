// Node types: the interned key of a node (op, shape, attributes, and per argument either the
// parameter or the operand's shape) and its readable name.
#include "src/core/graph_types.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "edbatch/graph.h"
#include "edbatch/types.h"

namespace edbatch {

namespace {
constexpr uint32_t kParamSlot = 0x80000000u;
constexpr uint32_t kRaggedFlag = TypeTable::kRaggedKey;
}  // namespace

void graph_fail(const char* fn, const std::string& msg) {
  throw std::invalid_argument(std::string("[") + fn + "] " + msg);
}

std::string short_float(float f) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return buf;
}

bool alpha_attribute(Op op) {
  return op == Op::ScalarDivide || op == Op::LayerNorm || op == Op::Dropout ||
         op == Op::LeakyRelu || op == Op::Elu || op == Op::Step;
}

uint32_t Graph::type_of(const Node& n, const uint32_t* args) {
  const OpInfo& info = op_info(n.op);
  if (info.rule == BatchRule::View) return UINT32_MAX;
  key_.clear();
  bool any_param = false;
  for (uint32_t i = 0; i < n.num_args; ++i) any_param |= nodes_[args[i]].op == Op::Parameter;
  if (n.op == Op::Call) {
    // Calls with no parameter among their inputs, the usual case, have one type per block.
    if (!any_param && n.aux < plain_call_type_.size() && plain_call_type_[n.aux] != UINT32_MAX)
      return plain_call_type_[n.aux];
    // Invocations of one block batch together (the block fixed their shapes), except that an
    // input given as a parameter is the batch's shared operand, as for any op: calls reading
    // different parameters, or a parameter and a computed value, in one slot never batch.
    key_.push_back(static_cast<uint32_t>(Op::Call));
    key_.push_back(n.aux);
    std::string shared, shapes;
    for (uint32_t i = 0; i < n.num_args; ++i) {
      const Node& a = nodes_[args[i]];
      if (a.op != Op::Parameter) {
        shapes += (shapes.empty() ? "" : ",") + to_string(a.dim);
        continue;
      }
      key_.push_back(i);
      key_.push_back(kParamSlot | a.aux);
      shared += (shared.empty() ? "" : ",") + std::to_string(i) + "=" + params_->name(a.aux);
    }
    TypeTable& table = params_->types();
    auto interned = table.intern(key_.data(), static_cast<uint32_t>(key_.size()));
    // The block fixed its shapes: they name the type, as they do other ops', so a policy
    // learned for other shapes (another hidden size) does not match it.
    if (interned.is_new)
      table.set_name(interned.id, "block:" + params_->block_name(n.aux) +
                                      (shared.empty() ? "" : "[" + shared + "]") + "(" + shapes +
                                      "->" + to_string(n.dim) + ")");
    if (!any_param) {
      if (plain_call_type_.size() <= n.aux) plain_call_type_.resize(n.aux + 1, UINT32_MAX);
      plain_call_type_[n.aux] = interned.id;
    }
    return interned.id;
  }
  const bool ragged = info.rule == BatchRule::Ragged && !any_param;
  key_.push_back(static_cast<uint32_t>(n.op) | (ragged ? kRaggedFlag : 0u));
  key_.push_back(n.dim.rows);
  key_.push_back(n.dim.cols);
  if (n.op == Op::Parameter || n.op == Op::Lookup || n.op == Op::SliceRows) key_.push_back(n.aux);
  if (n.op == Op::ScalarAffine) {
    key_.push_back(float_bits(n.alpha));
    key_.push_back(float_bits(n.beta));
  }
  if (alpha_attribute(n.op)) key_.push_back(float_bits(n.alpha));
  if (!ragged) {
    key_.push_back(n.num_args);
    for (uint32_t i = 0; i < n.num_args; ++i) {
      const Node& a = nodes_[args[i]];
      if (a.op == Op::Parameter) {
        key_.push_back(kParamSlot | a.aux);
      } else {
        key_.push_back(a.dim.rows);
        key_.push_back(a.dim.cols);
      }
    }
  }
  TypeTable& table = params_->types();
  auto interned = table.intern(key_.data(), static_cast<uint32_t>(key_.size()));
  if (interned.is_new) {
    // Stable, readable names: op[parameters](operand shapes->output shape).
    std::string name = info.name;
    std::string plist, shapes;
    if (n.op == Op::Parameter || n.op == Op::Lookup) plist = params_->name(n.aux);
    if (n.op == Op::ScalarAffine)
      name += "{" + std::to_string(n.alpha) + "," + std::to_string(n.beta) + "}";
    if (alpha_attribute(n.op)) name += "{" + short_float(n.alpha) + "}";
    if (n.op == Op::SliceRows)
      name += "{" + std::to_string(n.aux) + "," + std::to_string(n.aux + n.dim.rows) + "}";
    if (ragged) {
      shapes = to_string(nodes_[args[0]].dim) + "*";
    } else {
      for (uint32_t i = 0; i < n.num_args; ++i) {
        const Node& a = nodes_[args[i]];
        if (a.op == Op::Parameter) {
          plist += (plist.empty() ? "" : ",") + params_->name(a.aux);
        } else {
          shapes += (shapes.empty() ? "" : ",") + to_string(a.dim);
        }
      }
    }
    if (!plist.empty()) name += "[" + plist + "]";
    name += "(" + shapes + "->" + to_string(n.dim) + ")";
    table.set_name(interned.id, std::move(name));
  }
  return interned.id;
}

}  // namespace edbatch
