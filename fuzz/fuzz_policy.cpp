// Policy files: parse_fsm_policy either refuses cleanly or gives a policy whose table names only
// its own types and whose scorer has its shape; fsm_policy_json writes it back to text that
// parses to the same policy (table, scorer and costs).
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "edbatch/fsm.h"
#include "fuzz/fuzz_check.h"

using namespace edbatch;
using edbatch::fuzz::parses;

namespace {

std::vector<std::array<uint64_t, 3>> rows(const FsmTable& t) {
  std::vector<std::array<uint64_t, 3>> r;
  t.for_each([&](const FsmKey& k, uint32_t a) { r.push_back({k.lo, k.hi, a}); });
  std::sort(r.begin(), r.end());
  return r;
}

// The training and validation objects are compared as JSON values: the writer puts the numbers
// it read back into "validation", so an integer 5 there comes back as 5.0.
bool same_json(const std::string& a, const std::string& b) {
  return nlohmann::json::parse(a) == nlohmann::json::parse(b);
}

bool same_costs(const FsmCostModel& a, const FsmCostModel& b) {
  if (a.device != b.device || a.types != b.types || a.costs.size() != b.costs.size()) return false;
  for (size_t i = 0; i < a.costs.size(); ++i)
    if (a.costs[i].launch_us != b.costs[i].launch_us || a.costs[i].node_us != b.costs[i].node_us)
      return false;
  return true;
}

bool same(const FsmPolicyData& a, const FsmPolicyData& b) {
  const FsmPolicyInfo &x = a.info, &y = b.info;
  if (a.scorer.weights != b.scorer.weights || a.scorer.type_bias != b.scorer.type_bias ||
      !same_costs(a.costs, b.costs))
    return false;
  return x.model == y.model && x.hidden == y.hidden && x.encoding == y.encoding &&
         x.types == y.types && same_json(x.training, y.training) &&
         same_json(x.validation, y.validation) && x.validation_batches == y.validation_batches &&
         x.validation_lower_bound == y.validation_lower_bound && rows(a.table) == rows(b.table);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  FsmPolicyData policy;
  if (!parses([&] { policy = parse_fsm_policy(text, "fuzz"); })) return 0;
  FUZZ_CHECK(policy.info.types.size() <= fsm_encoding_max_types(policy.info.encoding),
             "more types than the encoding holds");
  FUZZ_CHECK(policy.scorer.empty() || (policy.scorer.weights.size() == kFsmFeatures &&
                                       policy.scorer.type_bias.size() == policy.info.types.size()),
             "a scorer of the wrong shape");
  for (const auto& r : rows(policy.table))
    FUZZ_CHECK(r[2] < policy.info.types.size(), "a table entry names a type the file lacks");
  const std::string written = fsm_policy_json(policy);
  const FsmPolicyData back = parse_fsm_policy(written, "written");
  FUZZ_CHECK(same(policy, back), "the written policy reads back differently");
  FUZZ_CHECK(fsm_policy_json(back) == written, "writing is not stable");
  return 0;
}
