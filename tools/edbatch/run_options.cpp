// `edbatch run`: the checks made on its options before any work.
#include "tools/edbatch/run_options.h"

#include <string>
#include <utility>
#include <vector>

#include "edbatch/models.h"

namespace edbatch::cli {

void check_usage(const RunOptions& o) {
  check_data_flag(o.model, o.data);
  const DataKind kind = model_data_kind(o.model);
  if (!o.write_data.empty() && (kind == DataKind::Dags || kind == DataKind::Pairs))
    throw UsageError("--write-data: " + o.model + " reads " +
                     (kind == DataKind::Dags ? "random DAGs, which have no text format"
                                             : "sentence pairs, which it does not write"));
  if (o.chars && o.model != "bilstm_tagger")
    throw UsageError("--char applies to bilstm_tagger only");
  if (o.decode && kind != DataKind::Pairs) throw UsageError("--decode applies to lstm_nmt only");
  if (o.decode && (o.train || o.pipeline || o.device == "null"))
    throw UsageError(
        "--decode reads every step's values: not with --train, --pipeline or "
        "--device null");
  if (o.vocab == 0 && (o.data.rfind("synthetic:", 0) == 0 || o.t.eval.rfind("synthetic:", 0) == 0))
    throw UsageError("--vocab-size 0 (no folding) needs data files: synthetic ids need a size");
  check_vocab_size(o.model, o.vocab);
  check_training_usage(o.t, o.train, o.device, o.model);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"--json", o.json},
      {"--save-weights", o.save_weights},
      {"--outputs", o.outputs},
      {"--save-best", o.t.save_best},
      {"--save-optimizer", o.t.save_optimizer}};
  if (!o.write_data.empty()) refuse_outputs_after("--write-data", files);
  if (o.describe) refuse_outputs_after("--describe", files);
}

OutputFiles output_files(const RunOptions& o) {
  OutputFiles f("run");
  f.add("--write-data", o.write_data);
  f.add("--save-weights", o.save_weights);
  f.add("--save-best", o.t.save_best);
  f.add("--save-optimizer", o.t.save_optimizer);
  f.add("--json", o.json);
  f.add("--outputs", o.outputs);
  f.read_data("--data", o.data);
  f.read_data("--eval", o.t.eval);
  if (o.policy.rfind("fsm:", 0) == 0) f.read("--policy", o.policy.substr(4));
  f.read("--load-weights", o.load_weights, "--save-weights");
  f.read("--load-optimizer", o.t.load_optimizer, "--save-optimizer");
  return f;
}

// --vocab-size 0: a row per id the data holds, within the limit of --vocab-size.

}  // namespace edbatch::cli
