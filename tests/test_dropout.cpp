// Dropout: the masks follow docs/programs.md (checked against a second implementation written
// from its text, and against known answers computed in Python from it), the keep rate is 1 - p
// within a binomial bound, kept entries are scaled by 1 / (1 - p), backward is mask * scale * dy,
// and in blocks the key comes from the invocation's integers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "edbatch/block.h"
#include "edbatch/edbatch.h"
#include "kernels/op_math.h"

using namespace edbatch;

namespace {

// docs/programs.md, "Dropout masks", again.
uint32_t fmix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}
uint32_t doc_key(uint64_t s, uint32_t i, uint32_t t) {
  const uint32_t lo = static_cast<uint32_t>(s), hi = static_cast<uint32_t>(s >> 32);
  return fmix(fmix(lo ^ fmix(hi)) ^ fmix(i) ^ (t * 0x9e3779b9u));
}
uint32_t doc_hash(uint32_t k, uint32_t i) { return fmix(k ^ (i * 0x27d4eb2fu) ^ 0x165667b1u); }
bool doc_kept(uint32_t key, uint32_t i, float p) {
  return static_cast<double>(doc_hash(key, i)) >= static_cast<double>(p) * 4294967296.0;
}

std::vector<float> uniform(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("dropout: key and hash follow docs/programs.md") {
  // Known answers (Python, from the formulas of docs/programs.md).
  const uint32_t k = math::dropout_key(0x123456789abcdef0ull, 5, 2);
  CHECK(k == 0x64025b7du);
  const uint32_t expected[4] = {0x50e53943u, 0xac66dbb7u, 0x5adcbec4u, 0x7d31fd0eu};
  for (uint32_t i = 0; i < 4; ++i) CHECK(math::dropout_hash(k, i) == expected[i]);
  CHECK(math::dropout_key(0, 0, 0) == 0u);
  CHECK(math::dropout_hash(0, 0) == 0xbcf51837u);
  CHECK(math::dropout_hash(0xffffffffu, 1000000) == 0x71a5a8b8u);
  std::mt19937_64 rng(3);
  for (int t = 0; t < 1000; ++t) {
    const uint64_t seed = rng();
    const uint32_t index = static_cast<uint32_t>(rng()), site = static_cast<uint32_t>(rng() % 64);
    const uint32_t key = math::dropout_key(seed, index, site);
    CHECK(key == doc_key(seed, index, site));
    const uint32_t i = static_cast<uint32_t>(rng());
    CHECK(math::dropout_hash(key, i) == doc_hash(key, i));
  }
}

TEST_CASE("dropout: mask, keep rate, scale and backward follow the formula") {
  const Dim d{251, 20};
  const uint32_t nodes = 20;
  for (float p : {0.1f, 0.3f, 0.5f, 0.0f}) {
    CAPTURE(p);
    std::mt19937_64 rng(7);
    ParameterCollection pc(1);
    Graph g(pc);
    std::vector<Expr> xs, losses;
    std::vector<std::vector<float>> xv, uv, vv;
    std::vector<uint32_t> keys;
    for (uint32_t i = 0; i < nodes; ++i) {
      xv.push_back(uniform(rng, d.size(), 0.5f, 1.5f));
      uv.push_back(uniform(rng, d.rows, -1.0f, 1.0f));
      vv.push_back(uniform(rng, d.cols, -1.0f, 1.0f));
      keys.push_back(math::dropout_key(99, i, 4));
      xs.push_back(input(g, d, xv.back()));
      const Expr y = dropout(xs.back(), p, keys.back());
      losses.push_back(matmul(matmul(input(g, Dim{1, d.rows}, uv.back()), y),
                              input(g, Dim{d.cols, 1}, vv.back())));
    }
    const Expr loss = sum_losses(losses);
    EngineOptions o;
    o.threads = 2;
    o.min_parallel_work = 1;
    Engine e(pc, o);
    e.forward(g, loss);
    e.backward(g, loss);
    const double scale = 1.0 / (1.0 - p);
    uint64_t kept = 0, total = 0;
    double worst_value = 0, worst_grad = 0;
    for (uint32_t i = 0; i < nodes; ++i) {
      const Expr y{&g, xs[i].id + 1, xs[i].generation};  // the dropout node follows its input
      REQUIRE(g.node(y.id).op == Op::Dropout);
      const std::vector<float> yv = as_vector(e.value(y));
      const std::vector<float> dx = as_vector(e.gradient(xs[i]));
      for (uint32_t r = 0; r < d.rows; ++r)
        for (uint32_t c = 0; c < d.cols; ++c) {
          const uint32_t at = c * d.rows + r;
          const double f = doc_kept(keys[i], at, p) ? scale : 0.0;
          kept += f != 0;
          ++total;
          worst_value = std::max(worst_value, std::fabs(yv[at] - xv[i][at] * f));
          worst_grad = std::max(worst_grad, std::fabs(dx[at] - f * uv[i][r] * vv[i][c]));
        }
    }
    CHECK(worst_value <= 1e-6 * 1.5 * scale);
    CHECK(worst_grad <= 1e-6 * scale);
    // Binomial: within 5 standard deviations of n (1 - p).
    const double mean = total * (1.0 - p), sd = std::sqrt(total * p * (1.0 - p));
    CHECK(std::fabs(static_cast<double>(kept) - mean) <= 5 * sd + 0.5);
    CHECK(e.stats().batches == 4);  // the dropouts, u y, (u y) v, the sum: one batch each
  }
}

TEST_CASE("dropout: in a block the key is the invocation's integer") {
  ParameterCollection pc(2);
  const Dim h{13, 1};
  Block blk(pc, "drop");
  const Expr x = blk.input("x", h);
  const uint32_t key = blk.index("key");
  blk.output("y", tanh(blk.dropout(scalar_affine(x, 2.0f, 0.5f), 0.4f, key)));
  blk.freeze();
  CHECK_THROWS_WITH_AS(blk.dropout(x, 0.4f, key), doctest::Contains("the body is frozen"),
                       std::invalid_argument);

  std::mt19937_64 rng(5);
  Graph gb(pc), go(pc);
  std::vector<Expr> yb, yo;
  // Any uint32 is a key, UINT32_MAX included.
  const std::vector<uint32_t> keys = {0xffffffffu, 0, 12345, 0xffffffffu, 77, 1u << 31, 9};
  for (uint32_t k : keys) {
    const std::vector<float> v = uniform(rng, h.size(), -1.0f, 1.0f);
    yb.push_back(blk(gb, {input(gb, h, v)}, {k})[0]);
    yo.push_back(tanh(dropout(scalar_affine(input(go, h, v), 2.0f, 0.5f), 0.4f, k)));
  }
  const Expr lb = sum_losses({pick(sum(yb), 3)}), lo = sum_losses({pick(sum(yo), 3)});
  Engine eb(pc, EngineOptions{}), eo(pc, EngineOptions{});
  eb.forward(gb, lb);
  eo.forward(go, lo);
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float> a = as_vector(eb.value(yb[i])), b = as_vector(eo.value(yo[i]));
    for (uint32_t r = 0; r < h.rows; ++r) CHECK(a[r] == doctest::Approx(b[r]).epsilon(1e-6));
  }
}
