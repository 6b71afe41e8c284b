// `edbatch run --decode`: greedy decoding of sequence-to-sequence models (Model::decode), one
// incremental forward per step, measured per mini-batch like the other runs.
#pragma once
#include <cstdint>
#include <ostream>
#include <vector>

#include "edbatch/engine.h"
#include "edbatch/models.h"
#include "tools/edbatch/metrics.h"

namespace edbatch::cli {

// Decodes the instances `ids` into `g`; the sample's loss is minus the summed scores (the
// negative log-probability of the greedy outputs).
MiniBatchSample decode_sample(Model& model, Engine& engine, Graph& g,
                              const std::vector<uint32_t>& ids, const DecodeOptions& options);
// Decodes the model's first `size` instances (the run's data, not the held-out ones after it) in
// mini-batches of `batch`: a JSON line per instance with its tokens, score and reference (the
// target). Throws std::runtime_error at a score that is not finite.
void write_decoded(std::ostream& out, Model& model, Engine& engine, Graph& g, uint32_t size,
                   uint32_t batch, const DecodeOptions& options);

}  // namespace edbatch::cli
