// The FSM policy at run time: state encodings, the lookup table, policy files and the policy.
#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "edbatch/files.h"
#include "edbatch/fsm.h"
#include "edbatch/graph.h"
#include "edbatch/types.h"

namespace edbatch {

const char* fsm_encoding_name(FsmEncoding e) {
  switch (e) {
    case FsmEncoding::Set: return "set";
    case FsmEncoding::Sorted: return "sorted";
    case FsmEncoding::SetTop: return "set+top";
    case FsmEncoding::Cover: return "cover";
  }
  return "?";
}

FsmEncoding parse_fsm_encoding(const std::string& name) {
  if (name == "set") return FsmEncoding::Set;
  if (name == "sorted") return FsmEncoding::Sorted;
  if (name == "set+top") return FsmEncoding::SetTop;
  if (name == "cover") return FsmEncoding::Cover;
  throw std::invalid_argument("[parse_fsm_encoding] unknown encoding '" + name +
                              "' (expected set, sorted, set+top or cover)");
}

uint32_t fsm_encoding_max_types(FsmEncoding e) {
  switch (e) {
    case FsmEncoding::Set: return 128;
    case FsmEncoding::Sorted: return 254;
    case FsmEncoding::SetTop: return 120;
    case FsmEncoding::Cover: return 32;
  }
  return 0;
}

FsmKey fsm_encode(FsmEncoding e, const uint32_t* ids, const uint32_t* counts,
                  const uint32_t* levels, uint32_t r, uint32_t* scratch) {
  FsmKey k;
  if (e == FsmEncoding::Cover) {
    for (uint32_t i = 0; i < r; ++i) {
      k.lo |= 1ull << ids[i];
      k.hi |= static_cast<uint64_t>(levels[i]) << (2 * ids[i]);
    }
    return k;
  }
  if (e == FsmEncoding::Sorted) {
    // Insertion sort of positions by (count desc, id asc): r is small.
    for (uint32_t i = 0; i < r; ++i) {
      uint32_t j = i;
      while (j > 0 && (counts[scratch[j - 1]] < counts[i] ||
                       (counts[scratch[j - 1]] == counts[i] && ids[scratch[j - 1]] > ids[i]))) {
        scratch[j] = scratch[j - 1];
        --j;
      }
      scratch[j] = i;
    }
    const uint32_t n = std::min(r, 16u);
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t v = ids[scratch[i]] + 1;  // 0 ends the list
      if (i < 8) k.lo |= v << (8 * i);
      else k.hi |= v << (8 * (i - 8));
    }
    return k;
  }
  uint32_t top = 0, top_count = 0;
  for (uint32_t i = 0; i < r; ++i) {
    const uint32_t t = ids[i];
    if (t < 64) k.lo |= 1ull << t;
    else k.hi |= 1ull << (t - 64);
    if (counts[i] > top_count || (counts[i] == top_count && t < top)) {
      top = t;
      top_count = counts[i];
    }
  }
  if (e == FsmEncoding::SetTop && r > 0) k.hi |= static_cast<uint64_t>(top + 1) << 56;
  return k;
}

void FsmTable::grow() {
  std::vector<FsmKey> keys = std::move(keys_);
  std::vector<uint32_t> actions = std::move(actions_);
  const size_t cap = std::max<size_t>(16, actions.size() * 2);
  keys_.assign(cap, FsmKey{});
  actions_.assign(cap, kNone);
  mask_ = cap - 1;
  size_ = 0;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i] != kNone) insert(keys[i], actions[i]);
}

void FsmTable::insert(const FsmKey& key, uint32_t action) {
  if (action == kNone) throw std::invalid_argument("[FsmTable::insert] reserved action value");
  if ((size_ + 1) * 2 > actions_.size()) grow();  // load factor at most 1/2
  for (size_t i = FsmKeyHash()(key) & mask_;; i = (i + 1) & mask_) {
    if (actions_[i] == kNone) {
      keys_[i] = key;
      actions_[i] = action;
      ++size_;
      return;
    }
    if (keys_[i] == key) {
      actions_[i] = action;
      return;
    }
  }
}

void FsmTable::for_each(const std::function<void(const FsmKey&, uint32_t)>& f) const {
  for (size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i] != kNone) f(keys_[i], actions_[i]);
}

// ---- Policy files ----

namespace {

constexpr const char* kFormatName = "edbatch-fsm-policy";

[[noreturn]] void file_error(const std::string& path, const std::string& what) {
  throw std::runtime_error("[load_fsm_policy] '" + path + "': " + what);
}

// An unsigned integer that fits T: nlohmann's own conversion would wrap negative numbers and
// take floats (1e300 into a uint32_t is undefined behaviour).
template <typename T>
T unsigned_value(const nlohmann::json& v, const std::string& what, const std::string& path) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<T>::max())
    file_error(path, what + " must be an unsigned integer up to " +
                         std::to_string(std::numeric_limits<T>::max()) + ", found " + v.dump());
  return static_cast<T>(v.get<uint64_t>());
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) file_error(path, std::string("missing field '") + key + "'");
  if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
    return unsigned_value<T>(*it, std::string("field '") + key + "'", path);
  } else {
    try {
      return it->get<T>();
    } catch (const nlohmann::json::exception&) {
      file_error(path, std::string("field '") + key + "' has the wrong type");
    }
  }
}

// The table: rows [key lo, key hi, type index] of unsigned integers.
std::vector<std::array<uint64_t, 3>> table_rows(const nlohmann::json& j, const std::string& path) {
  const nlohmann::json table = field<nlohmann::json>(j, "table", path);
  if (!table.is_array()) file_error(path, "field 'table' must be an array of [lo, hi, type] rows");
  std::vector<std::array<uint64_t, 3>> rows;
  for (size_t i = 0; i < table.size(); ++i) {
    const nlohmann::json& r = table[i];
    const std::string what = "table entry " + std::to_string(i);
    if (!r.is_array() || r.size() != 3) file_error(path, what + " must be [lo, hi, type]");
    rows.push_back({unsigned_value<uint64_t>(r[0], what + " lo", path),
                    unsigned_value<uint64_t>(r[1], what + " hi", path),
                    unsigned_value<uint64_t>(r[2], what + " type", path)});
  }
  return rows;
}

// FsmPolicyInfo::training or ::validation, JSON text set by the caller.
nlohmann::json parse_object(const std::string& text, const char* field) {
  if (text.empty()) return nlohmann::json::object();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("[fsm_policy_json] FsmPolicyInfo::") + field +
                                " is not JSON: " + e.what());
  }
  if (!j.is_object())
    throw std::invalid_argument(std::string("[fsm_policy_json] FsmPolicyInfo::") + field +
                                " is not a JSON object: " + text);
  return j;
}

double finite_value(const nlohmann::json& v, const std::string& what, const std::string& path) {
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    file_error(path, what + " must be a finite number, found " + v.dump());
  return v.get<double>();
}

std::vector<double> finite_array(const nlohmann::json& j, const char* key, size_t size,
                                 const std::string& what, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != size)
    file_error(path, what + " '" + key + "' must be an array of " + std::to_string(size) +
                         " numbers");
  std::vector<double> out;
  for (size_t i = 0; i < size; ++i)
    out.push_back(finite_value((*it)[i], what + " " + key + "[" + std::to_string(i) + "]", path));
  return out;
}

// "scorer": {"features": [names], "weights": [per feature], "type_bias": [per type]}. Features
// are matched by name, so a file may name them in any order; an unknown name is refused.
FsmScorer parse_scorer(const nlohmann::json& j, size_t types, const std::string& path) {
  if (!j.is_object()) file_error(path, "field 'scorer' must be an object");
  const auto names = field<std::vector<std::string>>(j, "features", path);
  const std::vector<double> w = finite_array(j, "weights", names.size(), "scorer", path);
  FsmScorer s;
  s.weights.assign(kFsmFeatures, 0.0);
  std::vector<bool> seen(kFsmFeatures, false);
  for (size_t i = 0; i < names.size(); ++i) {
    uint32_t k = 0;
    while (k < kFsmFeatures && names[i] != fsm_feature_name(k)) ++k;
    if (k == kFsmFeatures)
      file_error(path, "scorer feature '" + names[i] + "' is unknown to this build");
    if (seen[k]) file_error(path, "scorer feature '" + names[i] + "' appears twice");
    seen[k] = true;
    s.weights[k] = w[i];
  }
  s.type_bias = finite_array(j, "type_bias", types, "scorer", path);
  return s;
}

// "costs": {"device": name, "types": {type name: [launch_us, node_us]}, "combine": "sum" or
// "chain", "batch_us": number}; without "combine" (files written before it): "sum", and
// without "batch_us": 0.
FsmCostModel parse_costs(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) file_error(path, "field 'costs' must be an object");
  FsmCostModel c;
  c.device = field<std::string>(j, "device", path);
  if (auto it = j.find("combine"); it != j.end()) {
    if (!it->is_string() || (*it != "sum" && *it != "chain"))
      file_error(path, "costs 'combine' must be \"sum\" or \"chain\"");
    c.chain = *it == "chain";
  }
  if (auto it = j.find("batch_us"); it != j.end()) {
    c.batch_us = finite_value(*it, "costs 'batch_us'", path);
    if (c.batch_us < 0) file_error(path, "costs 'batch_us' must not be negative");
  }
  const nlohmann::json types = field<nlohmann::json>(j, "types", path);
  if (!types.is_object()) file_error(path, "costs 'types' must be an object");
  for (const auto& [name, v] : types.items()) {
    if (!v.is_array() || v.size() != 2)
      file_error(path, "costs of '" + name + "' must be [launch_us, node_us]");
    const double launch = finite_value(v[0], "launch cost of '" + name + "'", path);
    const double node = finite_value(v[1], "node cost of '" + name + "'", path);
    if (launch < 0 || node < 0) file_error(path, "costs of '" + name + "' must not be negative");
    c.types.push_back(name);
    c.costs.push_back({launch, node});
  }
  return c;
}

}  // namespace

std::string fsm_policy_json(const FsmPolicyData& policy) {
  const FsmPolicyInfo& info = policy.info;
  nlohmann::json j;
  j["format"] = kFormatName;
  j["version"] = info.block_shapes ? kFsmFormatVersion : 2;  // names as they were read
  j["model"] = info.model;
  j["hidden"] = info.hidden;
  j["encoding"] = fsm_encoding_name(info.encoding);
  j["types"] = info.types;
  j["training"] = parse_object(info.training, "training");
  j["validation"] = parse_object(info.validation, "validation");
  j["validation"]["fsm_batches"] = info.validation_batches;
  j["validation"]["lower_bound"] = info.validation_lower_bound;
  // Entries sorted by key so that equal tables give equal files.
  std::vector<std::array<uint64_t, 3>> rows;
  policy.table.for_each(
      [&](const FsmKey& k, uint32_t a) { rows.push_back({k.lo, k.hi, uint64_t(a)}); });
  std::sort(rows.begin(), rows.end());
  j["entries"] = rows.size();
  j["table"] = rows;
  if (!policy.scorer.empty()) {
    if (policy.scorer.weights.size() != kFsmFeatures ||
        policy.scorer.type_bias.size() != info.types.size())
      throw std::invalid_argument("[fsm_policy_json] the scorer needs " +
                                  std::to_string(kFsmFeatures) + " weights and a bias per type");
    nlohmann::json names = nlohmann::json::array();
    for (uint32_t k = 0; k < kFsmFeatures; ++k) names.push_back(fsm_feature_name(k));
    j["scorer"] = {{"features", names},
                   {"weights", policy.scorer.weights},
                   {"type_bias", policy.scorer.type_bias}};
  }
  if (!policy.costs.empty()) {
    nlohmann::json types = nlohmann::json::object();
    for (size_t i = 0; i < policy.costs.types.size(); ++i)
      types[policy.costs.types[i]] = {policy.costs.costs[i].launch_us,
                                      policy.costs.costs[i].node_us};
    j["costs"] = {{"device", policy.costs.device},
                  {"types", types},
                  {"combine", policy.costs.chain ? "chain" : "sum"},
                  {"batch_us", policy.costs.batch_us}};
  }
  return j.dump(1) + "\n";
}

void save_fsm_policy(const std::string& path, const FsmPolicyData& policy) {
  const std::string text = fsm_policy_json(policy);
  write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

FsmPolicyData load_fsm_policy(const std::string& path) {
  std::ifstream in;
  try {
    in = open_input(path, "load_fsm_policy");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());  // as every error of reading a policy (fsm.h)
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("[load_fsm_policy] error reading '" + path + "'");
  return parse_fsm_policy(text, path);
}

FsmPolicyData parse_fsm_policy(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    file_error(path, std::string("not valid JSON (corrupt or truncated): ") + e.what());
  }
  const auto format = j.is_object() ? j.find("format") : j.end();
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kFormatName)
    file_error(path, std::string("not an edbatch policy file (no \"format\": \"") + kFormatName +
                         "\")");
  const uint32_t version = field<uint32_t>(j, "version", path);
  if (version < 1 || version > kFsmFormatVersion)
    file_error(path, "format version " + std::to_string(version) +
                         ", this build reads versions 1 to " + std::to_string(kFsmFormatVersion));
  FsmPolicyData d;
  FsmPolicyInfo& info = d.info;
  info.model = field<std::string>(j, "model", path);
  info.hidden = field<uint32_t>(j, "hidden", path);
  try {
    info.encoding = parse_fsm_encoding(field<std::string>(j, "encoding", path));
  } catch (const std::invalid_argument& e) {
    file_error(path, e.what());
  }
  info.types = field<std::vector<std::string>>(j, "types", path);
  info.block_shapes = version >= 3;
  {
    std::unordered_map<std::string, size_t> seen;
    for (size_t i = 0; i < info.types.size(); ++i)
      if (!seen.emplace(info.types[i], i).second)
        file_error(path, "type '" + info.types[i] + "' is listed twice (types " +
                             std::to_string(seen[info.types[i]]) + " and " + std::to_string(i) +
                             ")");
  }
  if (info.types.size() > fsm_encoding_max_types(info.encoding))
    file_error(path, std::to_string(info.types.size()) + " types, more than encoding " +
                         fsm_encoding_name(info.encoding) + " supports");
  const nlohmann::json training = field<nlohmann::json>(j, "training", path);
  const nlohmann::json validation = field<nlohmann::json>(j, "validation", path);
  if (!training.is_object() || !validation.is_object())
    file_error(path, "fields 'training' and 'validation' must be objects");
  info.training = training.dump();
  info.validation = validation.dump();
  info.validation_batches = field<double>(validation, "fsm_batches", path);
  info.validation_lower_bound = field<double>(validation, "lower_bound", path);
  const auto rows = table_rows(j, path);
  const uint64_t entries = field<uint64_t>(j, "entries", path);
  if (rows.size() != entries)
    file_error(path, "table has " + std::to_string(rows.size()) + " entries, the header says " +
                         std::to_string(entries));
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i][2] >= info.types.size())
      file_error(path, "table entry " + std::to_string(i) + " names type " +
                           std::to_string(rows[i][2]) + " of " +
                           std::to_string(info.types.size()));
    d.table.insert(FsmKey{rows[i][0], rows[i][1]}, static_cast<uint32_t>(rows[i][2]));
  }
  // Version 1 had neither; a version 1 file that has them is read as written.
  if (auto it = j.find("scorer"); it != j.end() && !it->is_null())
    d.scorer = parse_scorer(*it, info.types.size(), path);
  if (auto it = j.find("costs"); it != j.end() && !it->is_null()) d.costs = parse_costs(*it, path);
  return d;
}

// ---- The policy ----

namespace {

// A block type's name as files before version 3 wrote it: "block:name(8,8->16)" -> "block:name".
std::string without_shapes(const std::string& name) {
  const size_t open = name.rfind('(');
  if (name.rfind("block:", 0) != 0 || open == std::string::npos || name.back() != ')') return name;
  return name.substr(0, open);
}

}  // namespace

FsmPolicy::FsmPolicy(FsmPolicyData data, std::string source)
    : data_(std::move(data)),
      source_(std::move(source)),
      name_("fsm:" + source_),
      fallback_(make_policy("lb-greedy")),
      cover_(data_.info.encoding == FsmEncoding::Cover) {
  if (!data_.scorer.empty() && (data_.scorer.weights.size() != kFsmFeatures ||
                                data_.scorer.type_bias.size() != data_.info.types.size()))
    throw std::invalid_argument("[FsmPolicy] the scorer of '" + source_ + "' needs " +
                                std::to_string(kFsmFeatures) + " weights and a bias per type");
}

void FsmPolicy::begin(const Graph& g) {
  lookups_ = {};
  fallback_->begin(g);
  const TypeTable& types = g.types();
  if (mapped_table_ == types.serial() && mapped_size_ == types.size()) return;
  // Types are only ever added to a table: map the new ones (all of them for another table).
  if (mapped_table_ != types.serial()) {
    mapped_size_ = 0;
    local_of_.clear();
    global_of_.assign(data_.info.types.size(), UINT32_MAX);
    unknown_ = false;
  }
  if (index_.empty())
    for (uint32_t i = 0; i < data_.info.types.size(); ++i) index_.emplace(data_.info.types[i], i);
  local_of_.resize(types.size(), UINT32_MAX);
  for (uint32_t t = mapped_size_; t < types.size(); ++t) {
    auto it = index_.find(data_.info.block_shapes ? types.name(t) : without_shapes(types.name(t)));
    if (it != index_.end()) {
      local_of_[t] = it->second;
      global_of_[it->second] = t;
    } else {
      unknown_ |= is_scheduled(types.op(t));
    }
  }
  if (unknown_) {
    // Only types that this graph schedules matter; others may come from other graphs.
    std::vector<bool> present(types.size(), false);
    for (const Node& n : g.nodes())
      if (is_scheduled(n.op) && n.type < types.size()) present[n.type] = true;
    std::string missing, absent;
    for (uint32_t t = 0; t < types.size(); ++t)
      if (present[t] && local_of_[t] == UINT32_MAX) missing += "\n  " + types.name(t);
    if (!missing.empty()) {
      for (uint32_t i = 0; i < global_of_.size(); ++i)
        if (global_of_[i] == UINT32_MAX || !present[global_of_[i]])
          absent += "\n  " + data_.info.types[i];
      throw std::invalid_argument(
          "[FsmPolicy] policy '" + source_ + "' (model " + data_.info.model + ", hidden " +
          std::to_string(data_.info.hidden) + ") does not match this graph; types of the graph "
          "that the policy does not know:" + missing +
          (absent.empty() ? "" : "\ntypes of the policy that the graph lacks:" + absent));
    }
  }
  mapped_table_ = types.serial();
  mapped_size_ = types.size();
  ids_.resize(data_.info.types.size());
  counts_.resize(ids_.size());
  scratch_.resize(ids_.size());
  views_.resize(ids_.size());
  features_.resize(ids_.size() * kFsmFeatures);
}

uint32_t FsmPolicy::fallback(const Frontier& f) {
  ++lookups_.misses;
  const std::vector<uint32_t>& ready = f.ready_types();
  const uint32_t r = static_cast<uint32_t>(ready.size());
  if (data_.scorer.empty() || r > views_.size()) return fallback_->choose(f);
  ++lookups_.scored;
  for (uint32_t i = 0; i < r; ++i) {
    const uint32_t t = ready[i];
    views_[i] = {t,
                 t,
                 t < local_of_.size() ? local_of_[t] : UINT32_MAX,
                 f.ready_count(t),
                 f.critical_ready(t),
                 f.critical_total(t),
                 f.remaining_bound(t),
                 f.average_depth(t)};
  }
  return views_[fsm_score_choice(data_.scorer, views_.data(), r, features_.data())].type;
}

uint32_t FsmPolicy::choose(const Frontier& f) {
  const std::vector<uint32_t>& ready = f.ready_types();
  const uint32_t r = static_cast<uint32_t>(ready.size());
  bool known = r <= ids_.size();
  FsmKey key;
  if (cover_) {
    // The common case, encoded in the same pass (the key fsm_encode gives for `cover`).
    for (uint32_t i = 0; known && i < r; ++i) {
      const uint32_t t = ready[i];
      const uint32_t id = t < local_of_.size() ? local_of_[t] : UINT32_MAX;
      known = id != UINT32_MAX;
      const uint64_t level = fsm_coverage_level(f.critical_ready(t), f.critical_total(t));
      key.lo |= 1ull << (id & 63);
      key.hi |= level << (2 * (id & 31));
    }
  } else {
    for (uint32_t i = 0; known && i < r; ++i) {
      const uint32_t t = ready[i];
      ids_[i] = t < local_of_.size() ? local_of_[t] : UINT32_MAX;
      known = ids_[i] != UINT32_MAX;
      counts_[i] = f.ready_count(t);
    }
    if (known)
      key = fsm_encode(data_.info.encoding, ids_.data(), counts_.data(), nullptr, r,
                       scratch_.data());
  }
  if (known) {
    const uint32_t a = data_.table.find(key);
    if (a != FsmTable::kNone) {
      const uint32_t t = global_of_[a];
      if (t != UINT32_MAX && t < f.num_types() && f.ready_count(t) > 0) {
        ++lookups_.hits;
        return t;
      }
    }
  }
  return fallback(f);
}

}  // namespace edbatch
