// Seeded random DAGs for the `random_dag` model: typed states reading 1..max_in_degree recent
// earlier states over typed arcs.
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "edbatch/models.h"

namespace edbatch {

std::vector<Dag> synthetic_dags(uint32_t n, uint64_t seed, uint32_t vocab_size,
                                const DagOptions& o) {
  if (vocab_size == 0 || o.min_states == 0 || o.min_states > o.max_states ||
      o.max_in_degree == 0 || o.window == 0 || o.arc_types == 0 || o.arc_types > 256 ||
      o.state_types == 0 || o.state_types > 256 || o.labels == 0 || o.labels > 256)
    throw std::invalid_argument(fmt::format(
        "[synthetic_dags] inconsistent options: vocab {}, states {}..{}, in-degree {}, window {}, "
        "{} arc types, {} state types, {} labels",
        vocab_size, o.min_states, o.max_states, o.max_in_degree, o.window, o.arc_types,
        o.state_types, o.labels));
  std::mt19937_64 rng(seed ^ 0xda9da9da9ull);
  auto below = [&](uint32_t k) { return static_cast<uint32_t>(rng() % k); };
  std::vector<Dag> dags(n);
  std::vector<uint32_t> picked;
  for (Dag& d : dags) {
    const uint32_t states = o.min_states + below(o.max_states - o.min_states + 1);
    d.arc_begin.push_back(0);
    for (uint32_t k = 0; k < states; ++k) {
      d.state_types.push_back(static_cast<uint8_t>(below(o.state_types)));
      d.inputs.push_back(below(vocab_size));
      d.labels.push_back(static_cast<uint8_t>(below(o.labels)));
      // Distinct predecessors among the `window` states before k.
      const uint32_t span = std::min(k, o.window);
      const uint32_t degree = span == 0 ? 0 : 1 + below(std::min(o.max_in_degree, span));
      picked.clear();
      while (picked.size() < degree) {
        const uint32_t from = k - 1 - below(span);
        if (std::find(picked.begin(), picked.end(), from) == picked.end()) picked.push_back(from);
      }
      std::sort(picked.begin(), picked.end());
      for (uint32_t from : picked) d.arcs.push_back({from, static_cast<uint8_t>(below(o.arc_types))});
      d.arc_begin.push_back(static_cast<uint32_t>(d.arcs.size()));
    }
  }
  return dags;
}

}  // namespace edbatch
