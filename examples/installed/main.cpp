// A program built against an installed edbatch (find_package(edbatch CONFIG)): a tiny recursive
// tree model over left-branching trees of 1 to 7 words, batched by edbatch, with its score
// checked against the same model computed here by plain loops. Exit code 0 when they agree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "edbatch/edbatch.h"

using namespace edbatch;

namespace {

constexpr uint32_t kVocab = 11, kDim = 5, kHidden = 5;  // kDim == kHidden: leaves are states

// b + U [l; r] with U column-major (kHidden x 2 kHidden), then tanh.
std::vector<float> cell(const float* U, const float* b, const std::vector<float>& l,
                        const std::vector<float>& r) {
  std::vector<float> h(kHidden);
  for (uint32_t i = 0; i < kHidden; ++i) {
    double s = b[i];
    for (uint32_t j = 0; j < kHidden; ++j)
      s += U[i + j * kHidden] * l[j] + U[i + (j + kHidden) * kHidden] * r[j];
    h[i] = static_cast<float>(std::tanh(s));
  }
  return h;
}

}  // namespace

int main() {
  ParameterCollection model(/*seed=*/7);
  LookupParameter E = model.add_lookup_parameters("E", kVocab, kDim);
  Parameter U = model.add_parameters("U", Dim{kHidden, 2 * kHidden});
  Parameter b = model.add_parameters("b", Dim{kHidden, 1});
  Parameter w = model.add_parameters("w", Dim{1, kHidden});

  // Instance k has k + 1 words, word i = (3 k + 5 i) mod kVocab; its score is w . root.
  Graph g(model);
  std::vector<Expr> scores;
  double want = 0;
  const float* Ev = model.values(E.id);
  const float* Uv = model.values(U.id);
  const float* bv = model.values(b.id);
  const float* wv = model.values(w.id);
  for (uint32_t k = 0; k < 7; ++k) {
    auto word = [&](uint32_t i) { return (3 * k + 5 * i) % kVocab; };
    Expr h = lookup(g, E, word(0));
    std::vector<float> ref(Ev + word(0) * kDim, Ev + (word(0) + 1) * kDim);
    for (uint32_t i = 1; i <= k; ++i) {
      h = tanh(affine({parameter(g, b), parameter(g, U), concat({h, lookup(g, E, word(i))})}));
      ref = cell(Uv, bv, ref, std::vector<float>(Ev + word(i) * kDim, Ev + (word(i) + 1) * kDim));
    }
    scores.push_back(parameter(g, w) * h);
    for (uint32_t j = 0; j < kHidden; ++j) want += wv[j] * ref[j];
  }
  Expr total = sum(scores);

  Engine engine(model, EngineOptions{"lb-greedy", "cpu", /*threads=*/2});
  const float got = as_scalar(engine.forward(g, total));
  const double err = std::fabs(got - want) / std::max(1.0, std::fabs(want));
  std::printf("score %.6f, by plain loops %.6f; %lu nodes in %lu batches\n", got, want,
              (unsigned long)engine.stats().nodes, (unsigned long)engine.stats().batches);

  const std::vector<std::string> backends = built_backends();
  const bool has_cuda = std::find(backends.begin(), backends.end(), "cuda") != backends.end();
  std::printf("backends built in:");
  for (const std::string& name : backends) std::printf(" %s", name.c_str());
  std::printf("\n");

  bool ok = true;
  if (!(err < 1e-5)) {
    std::fprintf(stderr, "tree_sum: the scores differ (relative error %g)\n", err);
    ok = false;
  }
  if (engine.stats().batches >= engine.stats().nodes) {
    std::fprintf(stderr, "tree_sum: nothing was batched\n");
    ok = false;
  }
  if (has_cuda != static_cast<bool>(EXAMPLE_EXPECT_CUDA)) {
    std::fprintf(stderr, "tree_sum: the package says CUDA %s, the library has it %s\n",
                 EXAMPLE_EXPECT_CUDA ? "on" : "off", has_cuda ? "on" : "off");
    ok = false;
  }
  return ok ? 0 : 1;
}
