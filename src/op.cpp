#include "edbatch/op.h"

#include <stdexcept>
#include <string>

namespace edbatch {

namespace {
constexpr OpInfo kOpInfo[] = {
    // name, min args, max args, rule, elementwise
    {"input", 0, 0, BatchRule::Source, false},
    {"parameter", 0, 0, BatchRule::Source, false},
    {"lookup", 0, 0, BatchRule::Exact, true},
    {"affine", 3, -1, BatchRule::Exact, false},
    {"matmul", 2, 2, BatchRule::Exact, false},
    {"sum", 1, -1, BatchRule::Ragged, true},
    {"subtract", 2, 2, BatchRule::Exact, true},
    {"cmult", 2, 2, BatchRule::Exact, true},
    {"scalar_affine", 1, 1, BatchRule::Exact, true},
    {"tanh", 1, 1, BatchRule::Exact, true},
    {"sigmoid", 1, 1, BatchRule::Exact, true},
    {"relu", 1, 1, BatchRule::Exact, true},
    {"concat", 1, -1, BatchRule::Exact, true},
    {"pick", 1, 1, BatchRule::Exact, true},
    {"pick_neg_log_softmax", 1, 1, BatchRule::Exact, true},
    {"call", 0, -1, BatchRule::Exact, false},
    {"output", 1, 1, BatchRule::View, false},
    {"reshape", 1, 1, BatchRule::View, false},
};
static_assert(sizeof(kOpInfo) / sizeof(kOpInfo[0]) == static_cast<size_t>(Op::Count),
              "kOpInfo must have one row per Op");
}  // namespace

const OpInfo& op_info(Op op) {
  auto i = static_cast<size_t>(op);
  if (i >= static_cast<size_t>(Op::Count))
    throw std::invalid_argument("[op_info] no such op: " + std::to_string(i));
  return kOpInfo[i];
}

}  // namespace edbatch
