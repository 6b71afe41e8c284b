#include "tools/edbatch/decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace edbatch::cli {

MiniBatchSample decode_sample(Model& model, Engine& engine, Graph& g,
                              const std::vector<uint32_t>& ids, const DecodeOptions& options) {
  MiniBatchSample s;
  const Stats before = engine.stats();
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Decoded> out = model.decode(engine, g, ids, options);
  s.total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const Stats& st = engine.stats();
  s.instances = static_cast<uint32_t>(ids.size());
  // Stats of a graph run in increments add up over its increments; construction is the rest
  // (building the steps and reading each step's values).
  take_engine_stats(s, st, before);  // device_forward_ms: summed over the increments too
  s.construction_ms = std::max(0.0, s.total_ms - s.scheduling_ms - s.execution_ms);
  for (const Decoded& d : out) s.loss -= d.score;
  return s;
}

void write_decoded(std::ostream& out, Model& model, Engine& engine, Graph& g, uint32_t size,
                   uint32_t batch, const DecodeOptions& options) {
  std::vector<uint32_t> ids;
  for (uint32_t first = 0; first < size; first += batch) {
    ids.clear();
    for (uint32_t i = first; i < std::min(size, first + batch); ++i) ids.push_back(i);
    const std::vector<Decoded> decoded = model.decode(engine, g, ids, options);
    for (size_t k = 0; k < ids.size(); ++k) {
      if (!std::isfinite(decoded[k].score))
        throw std::runtime_error("instance " + std::to_string(ids[k]) + ": the score is " +
                                 loss_text(decoded[k].score) +
                                 ", not finite; nothing written (find the first non-finite "
                                 "value with --check-numerics)");
      nlohmann::json line;
      line["instance"] = ids[k];
      line["tokens"] = decoded[k].tokens;
      line["score"] = decoded[k].score;
      line["reference"] = model.labels(ids[k]);
      out << line.dump() << "\n";
    }
  }
}

}  // namespace edbatch::cli
