// The "auto" policy: a scorer learned on the first graph within a time budget, cached on disk
// keyed by the graph's type names and the device, and reused by later runs (fsm.h, AutoPolicy).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "edbatch/fsm.h"
#include "edbatch/graph.h"
#include "edbatch/options.h"
#include "edbatch/types.h"

namespace edbatch {

namespace {
constexpr const char* kAutoModel = "auto";
constexpr uint32_t kAutoAttempts = 8;

nlohmann::json training_of(const FsmPolicyData& d) {
  nlohmann::json t = nlohmann::json::parse(d.info.training, nullptr, false);
  return t.is_object() ? t : nlohmann::json::object();
}

std::string device_of(const FsmPolicyData& d) {
  const nlohmann::json t = training_of(d);
  auto it = t.find("device");
  return it != t.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// lb-greedy cached because the budget ran out before anything was learned (not because the
// graphs were at the bound): a larger budget than that one (or none) learns again.
bool learn_again(const FsmPolicyData& d, double budget) {
  const nlohmann::json t = training_of(d);
  if (!t.value("out_of_time", false) || t.value("best", std::string()) != "lb-greedy") return false;
  const auto it = t.find("auto_budget_s");
  const double cached = it != t.end() && it->is_number() ? it->get<double>() : 0;
  return budget <= 0 || budget > cached;
}

// The cache path holds a regular file, or nothing: a pipe or device there would block a read or
// a write (or never end), so it is neither.
void refuse_unless_regular(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw std::runtime_error("'" + path + "' is not a regular file");
}
}  // namespace

AutoPolicy::AutoPolicy(PolicyContext context)
    : context_(std::move(context)), fallback_(make_policy("lb-greedy")) {}

std::string AutoPolicy::cache_key(const Graph& g, const std::string& device) {
  std::set<std::string> names;  // sorted and unique: the key does not depend on build order
  for (const Node& n : g.nodes())
    if (is_scheduled(n.op)) names.insert(g.types().name(n.type));
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the format version, device and names
  auto add = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;
  };
  add("edbatch-fsm-policy " + std::to_string(kFsmFormatVersion));
  add(device);
  for (const std::string& n : names) add(n);
  std::string safe;
  for (char c : device) safe += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "auto-" + safe + "-" + hex;
}

void AutoPolicy::warn(const std::string& what) const {
  if (context_.warn)
    context_.warn(what);
  else
    std::fprintf(stderr, "[edbatch] warning: %s\n", what.c_str());
}

void AutoPolicy::begin(const Graph& g) {
  if (!started_) {
    started_ = true;
    dir_ = context_.cache_dir.empty() ? default_policy_cache_dir() : context_.cache_dir;
    if (dir_.empty())
      warn(
          "[auto policy] no cache directory (XDG_CACHE_HOME and HOME are unset or not "
          "absolute paths): what is learned now is not kept, and the next run learns again");
  }
  if (!learned_ && attempts_ < kAutoAttempts) {
    // Each graph is looked up under its own key, so the entry is named by the graph it was
    // learned on (a first graph at the lower bound may be followed by graphs of other types).
    path_ = dir_.empty() ? std::string() : dir_ + "/" + cache_key(g, context_.device) + ".json";
    if (!path_.empty() &&
        std::find(looked_up_.begin(), looked_up_.end(), path_) == looked_up_.end()) {
      looked_up_.push_back(path_);
      load_cached(g);
    }
    if (!learned_) learn(g);
  }
  current_ = fallback_.get();
  if (learned_) {
    try {
      learned_->begin(g);
      current_ = learned_.get();
    } catch (const std::invalid_argument&) {
      // A graph with types the one learned on lacked: lb-greedy schedules it.
    }
  }
  if (current_ == fallback_.get()) fallback_->begin(g);
}

void AutoPolicy::load_cached(const Graph& g) {
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return;
  try {
    refuse_unless_regular(path_);
    FsmPolicyData d = load_fsm_policy(path_);
    if (d.info.model != kAutoModel || device_of(d) != context_.device)
      throw std::runtime_error("'" + path_ + "' was learned by model '" + d.info.model +
                               "' on device '" + device_of(d) + "'");
    if (learn_again(d, context_.auto_budget_s)) return;  // quietly: the budget was raised
    auto p = std::make_unique<FsmPolicy>(std::move(d), path_);
    p->begin(g);  // refuses a policy for other types
    learned_ = std::move(p);
  } catch (const std::exception& e) {
    warn("[auto policy] ignoring the cached policy, learning again: " + std::string(e.what()));
  }
}

// Trains on `g`. A graph that lb-greedy already schedules at the lower bound teaches nothing: the
// next graphs are tried (at most kAutoAttempts, within the budget) before lb-greedy is cached.
void AutoPolicy::learn(const Graph& g) {
  const auto t0 = std::chrono::steady_clock::now();
  const double budget = context_.auto_budget_s;
  if (budget > 0 && training_s_ >= budget) attempts_ = kAutoAttempts;
  ++attempts_;
  FsmTrainOptions o;
  o.table = false;  // the scorer alone: it generalises to the mini-batches after this one
  o.time_budget_s = budget > 0 ? budget - training_s_ : 0;
  o.scorer_search = 60;
  FsmTrainResult r = train_fsm_policy({&g}, {&g}, o);
  training_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.best_source == "lb-greedy" && attempts_ < kAutoAttempts &&
      (budget <= 0 || training_s_ < budget))
    return;
  r.policy.info.model = kAutoModel;
  nlohmann::json training = nlohmann::json::parse(r.policy.info.training);
  training["device"] = context_.device;
  training["auto_budget_s"] = budget;
  const bool nothing = r.out_of_time && r.best_source == "lb-greedy";
  training["out_of_time"] = r.out_of_time;
  r.policy.info.training = training.dump();
  trained_ = true;
  if (nothing)
    warn(fmt::format(
        "[auto policy] the time budget of {:g} s ran out before anything was learned on a "
        "mini-batch of {} nodes, so lb-greedy schedules{}: a larger budget learns again (0: no "
        "limit), or train a policy with edbatch train",
        budget, g.size(),
        path_.empty() ? std::string() : " (kept in '" + path_ + "' for runs with this budget)"));
  if (!path_.empty()) {
    try {
      std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
      refuse_unless_regular(path_);
      save_fsm_policy(path_, r.policy);
    } catch (const std::exception& e) {
      warn("[auto policy] cannot cache the learned policy: " + std::string(e.what()));
    }
  }
  learned_ = std::make_unique<FsmPolicy>(std::move(r.policy), path_.empty() ? "auto" : path_);
}

uint32_t AutoPolicy::choose(const Frontier& f) {
  return current_->choose(f);
}

Policy::Lookups AutoPolicy::lookups() const {
  return current_ ? current_->lookups() : Lookups{};
}

}  // namespace edbatch
