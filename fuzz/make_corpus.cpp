// Writes the seed corpora of the fuzz targets with the project's own generators and writers:
// fuzz_make_corpus DIR writes DIR/<target>/seed_<n> for every target (fuzz/corpus is its output).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "edbatch/data.h"
#include "edbatch/fsm.h"
#include "edbatch/models.h"
#include "edbatch/safetensors.h"
#include "fuzz/packed_text.h"

using namespace edbatch;
namespace fs = std::filesystem;

namespace {

void save(const fs::path& dir, const std::string& target, int n, const std::string& bytes) {
  fs::create_directories(dir / target);
  std::ofstream(dir / target / ("seed_" + std::to_string(n)), std::ios::binary) << bytes;
}

std::string trees(uint32_t n, uint64_t seed) {
  std::ostringstream out;
  write_trees(out, synthetic_trees(n, seed, 64));
  return out.str();
}

std::string lattices(uint32_t n, uint64_t seed) {
  std::vector<Lattice> l = synthetic_lattices(n, seed, 64);
  for (Lattice& x : l) {  // the short end of the generator keeps seeds small
    const uint32_t len = std::min<uint32_t>(x.length(), 12);
    x.tags.resize(len);
    x.arc_begin.resize(len + 1);
    x.arcs.resize(x.arc_begin[len]);
  }
  std::ostringstream out;
  write_lattices(out, l);
  return out.str();
}

std::string tagged(uint32_t n, uint64_t seed, bool spell) {
  std::vector<TaggedSentence> s = synthetic_tagged(n, seed, 64);
  for (TaggedSentence& x : s) {
    x.words.resize(std::min<size_t>(x.words.size(), 12));
    x.tags.resize(x.words.size());
  }
  std::ostringstream out;
  write_tagged(out, s, {}, spell ? synthetic_spellings(64, seed) : std::vector<std::string>{});
  return out.str();
}

std::string safetensors_of(const std::vector<NamedTensor>& t,
                           const std::map<std::string, std::string>& meta) {
  std::ostringstream out;
  write_safetensors(out, "seed", t, meta);
  return out.str();
}

// A zoo model's weights at hidden size 2, as save_parameters writes them.
std::string model_weights(const fs::path& dir, const std::string& model) {
  const Dataset data = load_dataset(model_data_kind(model), "synthetic:4", 8, 1);
  ParameterCollection pc(1);
  ModelOptions mo;
  mo.hidden = 2;
  mo.vocab = 8;
  const auto m = make_model(model, pc, data, mo);
  const fs::path path = dir / "weights.tmp";
  save_parameters(path.string(), pc);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(path);
  return bytes;
}

// A policy trained for a few episodes on small mini-batches of a zoo model.
std::string policy(const std::string& model, FsmEncoding encoding) {
  const Dataset data = load_dataset(model_data_kind(model), "synthetic:40", 16, 1);
  ParameterCollection pc(1);
  ModelOptions mo;
  mo.hidden = 4;
  mo.vocab = 16;
  const auto m = make_model(model, pc, data, mo);
  const FsmWorkload w = make_fsm_workload(*m, 4, 4, 2, 1);
  FsmTrainOptions o;
  o.encoding = encoding;
  o.episodes = 8;
  o.rollouts_per_round = 4;
  o.beam_width = 2;
  o.refine_states = 8;
  FsmTrainResult r = train_fsm_policy(w.train_graphs(), w.validation_graphs(), o);
  r.policy.info.model = model;
  r.policy.info.hidden = mo.hidden;
  return fsm_policy_json(r.policy);
}

// Packed structures as pack_trees, pack_lattices and pack_dags make them (python/edbatch).
std::string packed_trees(int64_t cell, uint32_t n, uint64_t seed) {
  fuzz::PackedText p;
  p.cell = cell;
  auto& [inputs, types, ptr, preds, arc_types, arc_inputs, offsets] = p.arrays;
  offsets.push_back(0);
  ptr.push_back(0);
  for (const Tree& t : synthetic_trees(n, seed, 64)) {
    const int64_t base = offsets.back();
    for (const TreeNode& node : t.nodes) {
      inputs.push_back(node.leaf() ? p.num_x++ : -1);
      types.push_back(0);
      if (!node.leaf())
        for (int32_t c : {node.left, node.right}) {
          preds.push_back(base + c);
          arc_types.push_back(0);
          arc_inputs.push_back(-1);
        }
      ptr.push_back(static_cast<int64_t>(preds.size()));
    }
    offsets.push_back(base + static_cast<int64_t>(t.nodes.size()));
  }
  return fuzz::packed_text(p);
}

std::string packed_lattices(int64_t cell, uint32_t n, uint64_t seed) {
  fuzz::PackedText p;
  p.cell = cell;
  auto& [inputs, types, ptr, preds, arc_types, arc_inputs, offsets] = p.arrays;
  offsets.push_back(0);
  ptr.push_back(0);
  for (const Lattice& l : synthetic_lattices(n, seed, 64)) {
    const int64_t base = offsets.back();
    const uint32_t len = std::min<uint32_t>(l.length(), 10);
    for (uint32_t k = 0; k < len; ++k) {
      inputs.push_back(-1);
      types.push_back(0);
      for (uint32_t a = l.arc_begin[k]; a < l.arc_begin[k + 1]; ++a) {
        preds.push_back(base + l.arcs[a].from);
        arc_types.push_back(Lattice::is_word_arc(k, l.arcs[a]) ? 1 : 0);
        arc_inputs.push_back(p.num_x++);
      }
      ptr.push_back(static_cast<int64_t>(preds.size()));
    }
    offsets.push_back(base + len);
  }
  return fuzz::packed_text(p);
}

std::string packed_dags(uint32_t n, uint64_t seed) {
  fuzz::PackedText p;
  p.cell = 4;  // random_dag
  auto& [inputs, types, ptr, preds, arc_types, arc_inputs, offsets] = p.arrays;
  offsets.push_back(0);
  ptr.push_back(0);
  DagOptions o;
  o.min_states = 4;
  o.max_states = 12;
  o.state_types = 2;
  o.window = 4;
  o.max_in_degree = 2;
  for (const Dag& d : synthetic_dags(n, seed, 64, o)) {
    const int64_t base = offsets.back();
    for (uint32_t k = 0; k < d.size(); ++k) {
      inputs.push_back(p.num_x++);
      types.push_back(d.state_types[k]);
      for (uint32_t a = d.arc_begin[k]; a < d.arc_begin[k + 1]; ++a) {
        preds.push_back(base + d.arcs[a].from);
        arc_types.push_back(d.arcs[a].type);
        arc_inputs.push_back(-1);
      }
      ptr.push_back(static_cast<int64_t>(preds.size()));
    }
    offsets.push_back(base + d.size());
  }
  return fuzz::packed_text(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_corpus DIR (writes DIR/<target>/seed_<n>)\n";
    return 2;
  }
  const fs::path dir = argv[1];
  try {
    save(dir, "trees", 0, "(3 (2 It) (4 (2 's) (4 good)))\n");
    save(dir, "trees", 1, trees(1, 1));
    save(dir, "trees", 2, trees(3, 2));
    save(dir, "lattices", 0, lattices(1, 1));
    save(dir, "lattices", 1, lattices(3, 2));
    save(dir, "tagged", 0, tagged(2, 1, true));
    save(dir, "tagged", 1, tagged(3, 2, false));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    save(dir, "safetensors", 0,
         safetensors_of({{"layer.weight", {2, 3}, {1.5f, -0.0f, nan, 1e30f, -2, 3}},
                         {"layer.bias", {2}, {0.1f, 0.2f}},
                         {"scalar", {}, {42.0f}},
                         {"empty", {0, 3}, {}}},
                        {{"format", "pt"}}));
    save(dir, "safetensors", 1, model_weights(dir, "tree_lstm"));
    save(dir, "safetensors", 2, model_weights(dir, "lattice_gru"));
    save(dir, "policy", 0, policy("tree_lstm", FsmEncoding::Cover));
    save(dir, "policy", 1, policy("lattice_lstm", FsmEncoding::Sorted));
    save(dir, "policy", 2, policy("random_dag", FsmEncoding::SetTop));
    save(dir, "packed", 0, packed_trees(0, 2, 1));  // tree_lstm
    save(dir, "packed", 1, packed_trees(1, 1, 2));  // tree_gru
    save(dir, "packed", 2, packed_trees(5, 1, 3));  // mvrnn
    save(dir, "packed", 3, packed_lattices(2, 2, 1));
    save(dir, "packed", 4, packed_lattices(3, 1, 2));
    save(dir, "packed", 5, packed_dags(2, 1));
    save(dir, "packed", 6, "0 0\n\n\n0\n\n\n\n0\n");  // an empty mini-batch
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_corpus: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
