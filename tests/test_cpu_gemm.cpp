// The CPU backend's small-GEMM kernels (kernels/cpu/gemm.cpp: Y += W X, Y += W X^T and its sum
// over parts) against a double-precision product, over awkward shapes (rows not a multiple of the
// vector width, one column, long panels), leading dimensions larger than the rows, and
// accumulation into existing values; padding rows between columns must stay untouched. Scattered
// matrix operands multiplied in place, through the engine; the packed-weight cache's lookups.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "edbatch/engine.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm.h"
#include "kernels/transpose.h"
#include "memplan/outer_order.h"
#include "tests/check.h"
#include "tests/reference.h"

using namespace edbatch;
using edbatch::testing::check_close;

namespace {

// Y += W X (transposed: Y += W X^T, X stored k x n) through the kernel against the double product,
// over every shape of the lists, with leading dimensions sometimes beyond the shape and existing
// values in Y; rows between the columns must stay untouched.
void check_gemm(bool transposed, uint32_t seed, const std::vector<uint32_t>& ms,
                const std::vector<uint32_t>& ns, const std::vector<uint32_t>& ks) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (uint32_t m : ms)
    for (uint32_t n : ns)
      for (uint32_t k : ks) {
        const uint32_t pad = (m + n + k) % 3;
        const size_t ldw = m + pad, ldx = (transposed ? k : n) + pad, ldy = m + pad;
        std::vector<float> w(ldw * n), x(ldx * (transposed ? n : k)), y(ldy * k);
        for (float& v : w) v = normal(rng);
        for (float& v : x) v = normal(rng);
        for (float& v : y) v = normal(rng);
        // The right operand's entry (p, c): X(p, c), or X^T(p, c) = X(c, p).
        auto rhs = [&](uint32_t p, uint32_t c) {
          return double(transposed ? x[p * ldx + c] : x[c * ldx + p]);
        };
        std::vector<double> want(ldy * k);
        for (uint32_t c = 0; c < k; ++c)
          for (uint32_t r = 0; r < ldy; ++r) {
            double s = y[c * ldy + r];
            if (r < m)
              for (uint32_t p = 0; p < n; ++p) s += double(w[p * ldw + r]) * rhs(p, c);
            want[c * ldy + r] = s;
          }
        if (transposed)
          edbatch::cpu::gemm_acc_xt(m, n, k, w.data(), ldw, x.data(), ldx, y.data(), ldy);
        else
          edbatch::cpu::gemm_acc(m, n, k, w.data(), ldw, x.data(), ldx, y.data(), ldy);
        check_close(y, want, y.size(), 1e-5,
                    "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
      }
}

}  // namespace

TEST_CASE("cpu gemm_acc: Y += W X equals the double product at awkward sizes") {
  // 61 and 125: strips of the widest tiles (4 registers of rows) with a masked last register.
  check_gemm(false, 7, {1, 5, 16, 17, 31, 48, 61, 125, 129}, {1, 3, 64, 257},
             {1, 2, 3, 4, 6, 7, 9, 13, 47, 48, 49, 97});
}

TEST_CASE("cpu gemm_acc_xt: Y += W X^T (a weight gradient's product) equals the double product") {
  // n, the inner dimension, is the batch's columns.
  check_gemm(true, 8, {1, 5, 16, 17, 33, 61, 129}, {1, 2, 37, 300}, {1, 3, 7, 12, 13, 48, 49, 130});
}

TEST_CASE("cpu: a shared weight times scattered matrices (multiplied in place) = reference") {
  // Shared W times per-node matrices read through an index (a repeated operand can never be a
  // view): below kDirectGemmCols columns the kernel gathers them, from it on it multiplies each in
  // place. Values and gradients against the double reference; the plan's gather accounting (what
  // the null backend reports) against what the CPU copied.
  for (uint32_t cols : {7u, 8u, 13u}) {
    CAPTURE(cols);
    ParameterCollection pc(5);
    const Parameter W = pc.add_parameters("W", Dim{6, 5});
    const LookupParameter E = pc.add_lookup_parameters("E", 7, 5 * cols);
    std::mt19937_64 rng(cols);
    Graph g(pc);
    std::vector<Expr> mats, losses;
    for (uint32_t i = 0; i < 9; ++i)
      mats.push_back(reshape(tanh(lookup(g, E, static_cast<uint32_t>(rng() % 7))), Dim{5, cols}));
    for (uint32_t i = 0; i < 13; ++i) {
      const Expr y = tanh(matmul(parameter(g, W), mats[rng() % mats.size()]));
      losses.push_back(pick_neg_log_softmax(reshape(y, Dim{6 * cols, 1}),
                                            static_cast<uint32_t>(rng() % (6 * cols))));
    }
    const Expr loss = sum_losses(losses);
    testing::Reference ref(g);
    ref.forward();
    ref.backward(loss.id);
    for (int threads : {1, 2}) {
      pc.zero_grads();
      Engine e(pc, EngineOptions{"lb-greedy", "cpu", threads, 1.0});
      const double l = as_scalar(e.forward(g, loss));
      const uint64_t forward_bytes = e.stats().bytes_copied;
      e.backward(g, loss);
      check_close(&l, &ref.values[loss.id][0], 1, 1e-5, "loss");
      check_close(pc.grads(W.id), ref.param_grads[W.id].data(), pc.dim(W.id).size(), 1e-5, "dW");
      check_close(pc.grads(E.id), ref.param_grads[E.id].data(), pc.dim(E.id).size(), 1e-5, "dE");
      EngineOptions on{"lb-greedy", "null", 1};
      Engine null_engine(pc, on);
      null_engine.forward(g, loss);
      CHECK(null_engine.stats().bytes_copied == forward_bytes);
      CHECK((forward_bytes > 0) == (cols < edbatch::kDirectGemmCols));
    }
  }
}

TEST_CASE("cpu gemm_acc_xt_parts: a weight gradient summed over batches equals the double sum") {
  // dW += sum over parts of dY_q X_q^T, the parts' inner dimensions (a batch's columns) awkward,
  // one of them empty, together past one run of 128 and one longer than a run, over rows
  // [row0, row0 + m) of taller dY_q (a thread's share of rows).
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const std::vector<uint32_t> inner = {5, 0, 1, 13, 37, 2, 90, 150, 70};
  for (uint32_t rows : {1u, 17u, 40u, 129u})
    for (uint32_t k : {1u, 7u, 12u, 49u})
      for (uint32_t row0 : {0u, rows / 3}) {
        const uint32_t m = rows - row0, ldw = rows + 1, ldx = k + 2, ldy = m + 3;
        std::vector<std::vector<float>> ws, xs;
        std::vector<edbatch::cpu::GemmPart> parts;
        for (uint32_t n : inner) {
          ws.emplace_back(static_cast<size_t>(ldw) * n + 1);
          xs.emplace_back(static_cast<size_t>(ldx) * n + 1);
          for (float& v : ws.back()) v = normal(rng);
          for (float& v : xs.back()) v = normal(rng);
          parts.push_back({ws.back().data(), xs.back().data(), n});
        }
        std::vector<float> y(static_cast<size_t>(ldy) * k);
        for (float& v : y) v = normal(rng);
        std::vector<double> want(y.begin(), y.end());
        for (size_t q = 0; q < parts.size(); ++q)
          for (uint32_t c = 0; c < k; ++c)
            for (uint32_t r = 0; r < m; ++r)
              for (uint32_t p = 0; p < inner[q]; ++p)
                want[c * ldy + r] += double(ws[q][p * ldw + row0 + r]) * xs[q][p * ldx + c];
        edbatch::cpu::gemm_acc_xt_parts(m, k, parts.data(), static_cast<uint32_t>(parts.size()),
                                        row0, ldw, ldx, y.data(), ldy);
        check_close(y, want, y.size(), 1e-5,
                    "rows=" + std::to_string(rows) + " k=" + std::to_string(k) +
                        " row0=" + std::to_string(row0));
      }
}

TEST_CASE(
    "cpu gemm_acc_packed: a packed W gives gemm_acc's bits, a packed W^T the double product") {
  // W (m x n, leading dimension beyond m) packed by gemm_pack and multiplied into existing values:
  // the same sums in the same order as gemm_acc on W itself, so the same bits (the engine mixes
  // both forms within a pass); W^T packed by gemm_pack_transposed against the double W^T X. Rows
  // of Y between the columns stay untouched.
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  namespace cpu = edbatch::cpu;
  for (uint32_t m : {1u, 5u, 16u, 17u, 33u, 61u, 129u})
    for (uint32_t n : {1u, 3u, 64u, 257u})
      for (uint32_t k : {2u, 3u, 7u, 13u, 48u, 49u, 97u}) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        const size_t ldw = m + 2;
        std::vector<float> w(ldw * n);
        for (float& v : w) v = normal(rng);
        // Y += W X against gemm_acc, bit for bit.
        std::vector<float> packed(cpu::gemm_packed_size(m, n)), x(size_t{n} * k);
        std::vector<float> y(size_t{m + 1} * k);
        for (float& v : x) v = normal(rng);
        for (float& v : y) v = normal(rng);
        std::vector<float> want = y;
        cpu::gemm_pack(m, n, w.data(), ldw, packed.data());
        cpu::gemm_acc(m, n, k, w.data(), ldw, x.data(), n, want.data(), m + 1);
        cpu::gemm_acc_packed(m, n, k, packed.data(), x.data(), n, y.data(), m + 1);
        CHECK(y == want);
        // Y (n x k) += W^T X, X m x k, against the double product.
        std::vector<float> packed_t(cpu::gemm_packed_size(n, m)), xt(size_t{m} * k);
        std::vector<float> yt(size_t{n + 1} * k);
        for (float& v : xt) v = normal(rng);
        for (float& v : yt) v = normal(rng);
        std::vector<double> want_t(yt.begin(), yt.end());
        for (uint32_t c = 0; c < k; ++c)
          for (uint32_t r = 0; r < n; ++r)
            for (uint32_t p = 0; p < m; ++p)
              want_t[c * (n + 1) + r] += double(w[r * ldw + p]) * xt[c * m + p];
        cpu::gemm_pack_transposed(m, n, w.data(), ldw, packed_t.data());
        cpu::gemm_acc_packed(n, m, k, packed_t.data(), xt.data(), m, yt.data(), n + 1);
        check_close(yt, want_t, yt.size(), 1e-5, "W^T X");
      }
}

TEST_CASE("cpu gemm_bias: Y = bias + W X without reading Y, the bits of Y set to the bias first") {
  // W plain (leading dimension beyond m) and packed, at awkward sizes: Y's rows start as NaN (a
  // product that read them would give NaN) and the rows between its columns as a sentinel that
  // must stay; the result equals, bit for bit, Y set to the bias and then gemm_acc /
  // gemm_acc_packed (what an affine's forward did before), and the double bias + W X.
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  namespace cpu = edbatch::cpu;
  for (uint32_t m : {1u, 5u, 16u, 17u, 33u, 129u})
    for (uint32_t n : {1u, 3u, 64u, 257u})
      for (uint32_t k : {1u, 2u, 3u, 7u, 13u, 48u, 49u, 97u}) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        const size_t ldw = m + 2, ldy = m + 1;
        std::vector<float> w(ldw * n), x(size_t{n} * k), bias(m);
        for (float& v : w) v = normal(rng);
        for (float& v : x) v = normal(rng);
        for (float& v : bias) v = normal(rng);
        std::vector<float> packed(cpu::gemm_packed_size(m, n));
        cpu::gemm_pack(m, n, w.data(), ldw, packed.data());
        std::vector<float> before(ldy * k, std::numeric_limits<float>::quiet_NaN());
        for (uint32_t c = 0; c < k; ++c) before[c * ldy + m] = 7.0f;
        std::vector<float> set = before;
        for (uint32_t c = 0; c < k; ++c) std::copy(bias.begin(), bias.end(), set.begin() + c * ldy);
        std::vector<double> want(set.begin(), set.end());
        for (uint32_t c = 0; c < k; ++c)
          for (uint32_t r = 0; r < m; ++r)
            for (uint32_t p = 0; p < n; ++p)
              want[c * ldy + r] += double(w[p * ldw + r]) * x[c * n + p];
        for (bool pack : {false, true}) {
          CAPTURE(pack);
          std::vector<float> y = before, acc = set;
          if (pack) {
            cpu::gemm_bias_packed(m, n, k, packed.data(), x.data(), n, bias.data(), y.data(), ldy);
            cpu::gemm_acc_packed(m, n, k, packed.data(), x.data(), n, acc.data(), ldy);
          } else {
            cpu::gemm_bias(m, n, k, w.data(), ldw, x.data(), n, bias.data(), y.data(), ldy);
            cpu::gemm_acc(m, n, k, w.data(), ldw, x.data(), n, acc.data(), ldy);
          }
          CHECK(std::memcmp(y.data(), acc.data(), y.size() * sizeof(float)) == 0);
          check_close(y, want, y.size(), 1e-5, pack ? "packed" : "plain");
        }
      }
}

TEST_CASE("cpu: packed weights follow the parameters across graphs and increments") {
  // y_i = W x_i + b over more nodes than a forward multiplies before it packs W (64 columns), in
  // awkward sizes, against the double product with the weights of the moment: a first graph; an
  // increment of it after a change of W marked with mark_changed (its new nodes read the new W,
  // the old ones keep theirs); a new graph after a write that is not marked (a graph's first
  // forward packs again). Backward's dX (through W^T, packed per pass) against the double W^T dY.
  constexpr uint32_t M = 37, N = 29, kCount = 70;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    ParameterCollection pc(3);
    const Parameter W = pc.add_parameters("W", Dim{M, N});
    const Parameter b = pc.add_parameters("b", Dim{M, 1});
    Engine e(pc, EngineOptions{"lb-greedy", "cpu", threads, 1.0});
    std::mt19937 rng(static_cast<uint32_t>(threads));
    std::normal_distribution<float> normal;
    Graph g(pc);
    std::vector<Expr> xs, ys;
    std::vector<std::vector<double>> want;  // y_i with the weights when it was added
    auto add_nodes = [&] {
      for (uint32_t i = 0; i < kCount; ++i) {
        std::vector<float> x(N);
        for (float& v : x) v = normal(rng);
        xs.push_back(input(g, Dim{N, 1}, x));
        ys.push_back(affine({parameter(g, b), parameter(g, W), xs.back()}));
        std::vector<double> y(pc.values(b.id), pc.values(b.id) + M);
        for (uint32_t r = 0; r < M; ++r)
          for (uint32_t p = 0; p < N; ++p) y[r] += double(pc.values(W.id)[p * M + r]) * x[p];
        want.push_back(y);
      }
    };
    auto check_values = [&](const char* what) {
      for (size_t i = 0; i < ys.size(); ++i) {
        const std::vector<float> y = as_vector(e.value(ys[i]));
        check_close(y, want[i], M, 1e-5, std::string(what) + ", node " + std::to_string(i));
      }
    };
    auto scale_w = [&](float s) {
      float* w = pc.values(W.id);
      for (uint32_t i = 0; i < M * N; ++i) w[i] *= s;
    };
    add_nodes();
    e.forward_through(g, ys);
    check_values("first graph");
    const uint64_t packed = e.stats().packed_weights;
    CHECK(packed >= 1);

    scale_w(-0.5f);
    pc.mark_changed();
    add_nodes();
    e.forward_through(g, ys);
    check_values("increment after a marked change");
    CHECK(e.stats().packed_weights > packed);

    // Backward from sum_i <s_i, y_i>: dx_i = W^T s_i with the W of now, for every node.
    std::vector<float> seeds;
    for (size_t i = 0; i < ys.size(); ++i)
      for (uint32_t r = 0; r < M; ++r) seeds.push_back(normal(rng));
    e.backward(g, ys, seeds.data());
    const float* w = pc.values(W.id);
    for (size_t i = 0; i < xs.size(); ++i) {
      std::vector<double> dx(N);
      for (uint32_t p = 0; p < N; ++p)
        for (uint32_t r = 0; r < M; ++r) dx[p] += double(w[p * M + r]) * seeds[i * M + r];
      check_close(as_vector(e.gradient(xs[i])), dx, N, 1e-5, "dx " + std::to_string(i));
    }

    g.clear();
    xs.clear();
    ys.clear();
    want.clear();
    scale_w(3.0f);  // not marked: the new graph's first forward reads W again
    add_nodes();
    e.forward_through(g, ys);
    check_values("new graph after an unmarked write");
  }
}

TEST_CASE("cpu: packed weights are found again by each thread, never another object's or stamp's") {
  // PackedWeights::get serves a thread's repeated lookups without its lock. A lookup must still
  // see a new stamp (W packed again), another object (its own entries and column count), and an
  // object made where a destroyed one was; threads that look up together get W packed once.
  namespace cpu = edbatch::cpu;
  constexpr uint32_t M = 37, N = 29;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> ws(3, std::vector<float>(M * N));
  for (auto& w : ws)
    for (float& v : w) v = normal(rng);
  auto packed_of = [&](const std::vector<float>& w) {
    std::vector<float> out(cpu::gemm_packed_size(M, N));
    cpu::gemm_pack(M, N, w.data(), M, out.data());
    return out;
  };
  auto same = [&](const float* got, const std::vector<float>& w) {
    const std::vector<float> want = packed_of(w);
    return got != nullptr && std::memcmp(got, want.data(), want.size() * sizeof(float)) == 0;
  };
  auto a = std::make_unique<cpu::PackedWeights>(false, 0u);
  a->new_pass(1);
  const float* first = a->get(ws[0].data(), M, N, 1);
  CHECK(same(first, ws[0]));
  CHECK(a->get(ws[0].data(), M, N, 1) == first);
  CHECK(a->packs() == 1);

  cpu::PackedWeights b(false, 100);  // packs after 100 columns: not for this thread's hit of a's
  b.new_pass(1);
  CHECK(b.get(ws[0].data(), M, N, 60) == nullptr);
  CHECK(same(b.get(ws[0].data(), M, N, 60), ws[0]));

  for (float& v : ws[0]) v *= -0.5f;  // a new stamp: W packed again, not the hit of before
  a->new_pass(2);
  CHECK(same(a->get(ws[0].data(), M, N, 1), ws[0]));
  a->new_pass(2);  // the same stamp: the entry stays
  CHECK(same(a->get(ws[0].data(), M, N, 1), ws[0]));
  CHECK(a->packs() == 2);

  a->new_pass(3);
  std::vector<std::thread> threads;
  std::vector<int> right(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 50; ++r) {
        const auto& w = ws[static_cast<size_t>(r + t) % ws.size()];
        right[static_cast<size_t>(t)] += same(a->get(w.data(), M, N, 1), w);
      }
    });
  for (auto& t : threads) t.join();
  for (int r : right) CHECK(r == 50);
  CHECK(a->packs() == 2 + ws.size());

  // This thread's hit, then a new cache, often in the same place (the allocator's last free
  // block): the hit is not its.
  a->get(ws[1].data(), M, N, 1);
  a.reset();
  a = std::make_unique<cpu::PackedWeights>(false, 100u);
  a->new_pass(3);
  CHECK(a->get(ws[1].data(), M, N, 1) == nullptr);
}

TEST_CASE("cpu transposes: plain, accumulating and strided equal an element-by-element loop") {
  // The vector blocks are 8 x 8: sizes around 8 and 16, and leading dimensions past the shape
  // whose padding must stay untouched.
  std::mt19937 rng(41);
  std::normal_distribution<float> normal;
  for (const uint32_t r : {1u, 7u, 8u, 9u, 16u, 17u, 24u, 130u})
    for (const uint32_t c : {1u, 5u, 8u, 13u, 16u, 33u, 129u}) {
      CAPTURE(r);
      CAPTURE(c);
      const size_t lda = c + (r % 3), ldo = r + (c % 4);
      std::vector<float> a(r * lda), out(c * ldo), before;
      for (float& v : a) v = normal(rng);
      for (float& v : out) v = normal(rng);
      before = out;
      transpose_strided(a.data(), lda, r, c, out.data(), ldo);
      for (uint32_t j = 0; j < c; ++j)
        for (size_t i = 0; i < ldo; ++i)
          REQUIRE(out[j * ldo + i] == (i < r ? a[i * lda + j] : before[j * ldo + i]));
      std::vector<float> dense(size_t(r) * c), t(size_t(c) * r), acc(size_t(c) * r);
      for (float& v : dense) v = normal(rng);
      for (float& v : acc) v = normal(rng);
      const std::vector<float> acc0 = acc;
      transpose(dense.data(), r, c, t.data());
      transpose_add(dense.data(), r, c, -0.37f, acc.data());
      for (uint32_t i = 0; i < r; ++i)
        for (uint32_t j = 0; j < c; ++j) {
          REQUIRE(t[size_t(j) * r + i] == dense[size_t(i) * c + j]);
          const double want = double(acc0[size_t(j) * r + i]) - 0.37 * dense[size_t(i) * c + j];
          REQUIRE(std::abs(acc[size_t(j) * r + i] - want) <= 1e-6 * (1 + std::abs(want)));
        }
    }
}
