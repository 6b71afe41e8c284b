// Runs edbatch's optimizers (edbatch/optim.h) on parameters and gradients read from a file, so
// that tests/python/test_optim_torch.py can compare every step with torch.optim.
//
//   edbatch_optim_steps IN.safetensors OUT.safetensors
//
// IN holds, in PyTorch's layout (matrices [rows, cols], vectors [rows], lookup tables [vocab,
// dim]): "param.<name>" the initial values, "grad.<k>.<name>" the raw gradient of step k (1 to
// steps; a missing one is zero) and, for lookup tables, "rows.<k>.<name>" the rows backward
// touched in step k (as floats). Its metadata: "optimizer" (sgd, momentum, adam, adagrad),
// "steps", "lookups" (comma-separated names of the lookup tables), and optionally "lr",
// "momentum", "beta1", "beta2", "eps", "weight_decay", "clip", "grad_scale" (each step's
// argument) and "sparse_lookups" (1 or 0).
// OUT holds "<k>.<name>", the values after step k, and "state.<name>.<slot>", the optimizer's
// state after the last step (slot names as Optimizer::slot_names), with metadata "steps".
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "edbatch/optim.h"
#include "edbatch/params.h"
#include "edbatch/safetensors.h"

namespace {

using edbatch::Dim;
using edbatch::NamedTensor;
using edbatch::ParameterCollection;

float number(const std::map<std::string, std::string>& meta, const std::string& key,
             float fallback) {
  auto it = meta.find(key);
  return it == meta.end() ? fallback : std::stof(it->second);
}

// Torch layout <-> column-major storage: only matrices that are not lookup tables differ.
std::vector<float> to_storage(const ParameterCollection& pc, uint32_t id,
                              const std::vector<float>& t) {
  const Dim d = pc.dim(id);
  if (pc.is_lookup(id) || d.cols == 1) return t;
  std::vector<float> s(t.size());
  for (uint32_t i = 0; i < d.rows; ++i)
    for (uint32_t j = 0; j < d.cols; ++j) s[size_t(j) * d.rows + i] = t[size_t(i) * d.cols + j];
  return s;
}

NamedTensor to_torch(const ParameterCollection& pc, uint32_t id, const float* s, std::string name) {
  const Dim d = pc.dim(id);
  NamedTensor t{std::move(name), {}, std::vector<float>(s, s + d.size())};
  if (pc.is_lookup(id)) {
    t.shape = {d.cols, d.rows};
  } else if (d.cols == 1) {
    t.shape = {d.rows};
  } else {
    t.shape = {d.rows, d.cols};
    for (uint32_t i = 0; i < d.rows; ++i)
      for (uint32_t j = 0; j < d.cols; ++j)
        t.data[size_t(i) * d.cols + j] = s[size_t(j) * d.rows + i];
  }
  return t;
}

int run(const std::string& in_path, const std::string& out_path) {
  std::map<std::string, std::string> meta;
  const std::vector<NamedTensor> in = edbatch::read_safetensors(in_path, &meta);
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : in) by_name[t.name] = &t;
  std::set<std::string> lookups;
  std::stringstream names(meta.count("lookups") ? meta.at("lookups") : "");
  for (std::string n; std::getline(names, n, ',');)
    if (!n.empty()) lookups.insert(n);

  ParameterCollection pc;
  std::vector<std::string> params;
  for (const NamedTensor& t : in) {
    if (t.name.rfind("param.", 0) != 0) continue;
    const std::string name = t.name.substr(6);
    const auto& s = t.shape;
    if (lookups.count(name)) {
      if (s.size() != 2) throw std::invalid_argument(name + ": a lookup table is [vocab, dim]");
      pc.add_lookup_parameters(name, uint32_t(s[0]), uint32_t(s[1]));
    } else if (s.size() <= 2) {
      pc.add_parameters(name,
                        Dim{s.empty() ? 1u : uint32_t(s[0]), s.size() == 2 ? uint32_t(s[1]) : 1u});
    } else {
      throw std::invalid_argument(name + ": parameters have one or two dimensions");
    }
    const uint32_t id = pc.find(name);
    const std::vector<float> v = to_storage(pc, id, t.data);
    std::copy(v.begin(), v.end(), pc.values(id));
    params.push_back(name);
  }
  pc.mark_changed();

  edbatch::OptimizerOptions o;
  o.lr = number(meta, "lr", 0);
  o.momentum = number(meta, "momentum", 0);
  o.beta1 = number(meta, "beta1", o.beta1);
  o.beta2 = number(meta, "beta2", o.beta2);
  o.eps = number(meta, "eps", 0);
  o.weight_decay = number(meta, "weight_decay", 0);
  o.clip_norm = number(meta, "clip", 0);
  o.sparse_lookups = number(meta, "sparse_lookups", 1) != 0;
  const float grad_scale = number(meta, "grad_scale", 1);
  const int steps = int(number(meta, "steps", 1));
  std::unique_ptr<edbatch::Optimizer> opt =
      edbatch::make_optimizer(meta.count("optimizer") ? meta.at("optimizer") : "", pc, o);

  std::vector<NamedTensor> out;
  for (int k = 1; k <= steps; ++k) {
    for (const std::string& name : params) {
      const uint32_t id = pc.find(name);
      auto g = by_name.find("grad." + std::to_string(k) + "." + name);
      if (g == by_name.end()) continue;
      const std::vector<float> v = to_storage(pc, id, g->second->data);
      std::copy(v.begin(), v.end(), pc.grads(id));
      auto rows = by_name.find("rows." + std::to_string(k) + "." + name);
      if (rows != by_name.end())
        for (float r : rows->second->data) pc.mark_lookup_row(id, uint32_t(r));
    }
    pc.mark_changed();
    opt->step(grad_scale);
    for (const std::string& name : params) {
      const uint32_t id = pc.find(name);
      out.push_back(to_torch(pc, id, pc.values(id), std::to_string(k) + "." + name));
    }
  }
  const std::vector<std::string> slots = opt->slot_names();
  for (uint32_t s = 0; s < slots.size(); ++s)
    for (const std::string& name : params) {
      const uint32_t id = pc.find(name);
      out.push_back(to_torch(pc, id, opt->state().slot(s, id), "state." + name + "." + slots[s]));
    }
  edbatch::write_safetensors(out_path, out, {{"steps", std::to_string(opt->steps())}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: edbatch_optim_steps IN.safetensors OUT.safetensors\n");
    return 2;
  }
  try {
    return run(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edbatch_optim_steps: %s\n", e.what());
    return 1;
  }
}
