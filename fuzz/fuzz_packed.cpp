// The packed structures the PyTorch extension accepts: after the checks of the torch side
// (src/torch/runtime.cpp: array lengths), a Runner either refuses the structure cleanly
// (check_packed, the cell's check) or runs its forward and backward pass. Built from the
// torch-free half of the adapter (src/torch/cells.cpp, cell_models.cpp) without libtorch.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "fuzz/packed_text.h"
#include "src/torch/cells.h"

using namespace edbatch;
using namespace edbatch::fuzz;
namespace ta = edbatch::torch_adapter;

namespace {

constexpr int64_t kMaxNodes = 2000, kMaxX = 256;

// One runner per cell, kept across inputs as the extension keeps them.
ta::Runner& runner(size_t cell) {
  static std::map<size_t, std::unique_ptr<ta::Runner>> runners;
  auto& r = runners[cell];
  if (!r) {
    ta::CellConfig c;
    c.cell = kCells[cell].name;
    c.hidden = kHidden;
    c.input_dim = kCells[cell].input_dim;
    c.node_types = 2;
    c.arc_types = 2;
    r = std::make_unique<ta::Runner>(c, ta::RunOptions{});
  }
  return *r;
}

std::vector<float> numbers(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i % 7) - 3.0f);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  PackedText t;
  if (!parse_packed_text(std::string(reinterpret_cast<const char*>(data), size), t)) return 0;
  const auto& a = t.arrays;
  const int64_t N = static_cast<int64_t>(a[0].size()), A = static_cast<int64_t>(a[3].size());
  // What the torch side refuses before the structure reaches the adapter (check_structure):
  // array lengths. Sizes are bounded to keep each run short.
  if (int64_t(a[1].size()) != N || int64_t(a[2].size()) != N + 1 || int64_t(a[4].size()) != A ||
      int64_t(a[5].size()) != A || a[6].empty() || N > kMaxNodes || t.num_x < 0 || t.num_x > kMaxX)
    return 0;
  const size_t cell = static_cast<size_t>(t.cell < 0 ? -t.cell : t.cell) % std::size(kCells);
  ta::Runner& r = runner(cell);
  const uint32_t D = kCells[cell].input_dim;

  ta::Packed p;
  p.num_nodes = N;
  p.num_arcs = A;
  p.num_instances = static_cast<int64_t>(a[6].size()) - 1;
  p.node_inputs = a[0].data();
  p.node_types = a[1].data();
  p.pred_ptr = a[2].data();
  p.pred_ids = a[3].data();
  p.arc_types = a[4].data();
  p.arc_inputs = a[5].data();
  p.instance_offsets = a[6].data();
  const std::vector<float> x = numbers(size_t(t.num_x) * D, 0.1f);
  p.x = x.data();
  p.num_x = t.num_x;
  p.x_dim = D;

  const ta::Cell& c = r.cell();
  std::vector<std::vector<float>> w, gw;
  std::vector<const float*> weights;
  std::vector<float*> grad_weights;
  for (const ta::WeightSpec& s : c.weights()) {
    w.push_back(numbers(size_t(s.rows) * std::max<uint32_t>(s.cols, 1), 0.05f));
    gw.emplace_back(w.back().size());
  }
  for (size_t i = 0; i < w.size(); ++i) {
    weights.push_back(w[i].data());
    grad_weights.push_back(gw[i].data());
  }
  std::vector<std::vector<float>> out(c.num_outputs());
  std::vector<float*> outputs;
  size_t out_floats = 0;
  for (uint32_t o = 0; o < c.num_outputs(); ++o) {
    out[o].resize(size_t(N) * c.output_size(o));
    outputs.push_back(out[o].data());
    out_floats += out[o].size();
  }
  if (!parses([&] { r.forward(p, weights, outputs, true); })) return 0;
  const std::vector<float> out_grad(out_floats, 1.0f);
  std::vector<float> grad_x(x.size());
  r.backward(out_grad.data(), grad_x.data(), grad_weights);
  return 0;
}
