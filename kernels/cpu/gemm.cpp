// Y += W X for thin products. Eigen's GEMM packs W for every call, which costs as much as the
// multiply when X has a few dozen columns (a block step's invocations, a batch of tree nodes), so
// with AVX-512 we run register tiles that read W straight from its column-major storage: a tile
// of R x 16 rows by NC columns accumulates over the whole inner dimension in 2..24 registers.
#include "kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace edbatch::cpu {

namespace {

#if defined(__AVX512F__)

// R registers of 16 rows (the last one masked when M) by NC columns, summed over the parts: part
// q adds W_q X_q over its inner dimension n_q, with W_q read from w_q + wo and X_q from x_q + xo.
// XT: x holds X transposed, so X(p, c) is x[p * ldx + c].
template <int R, int NC, bool M, bool XT>
void tile(const GemmPart* parts, uint32_t count, size_t wo, size_t xo, size_t ldw, size_t ldx,
          float* y, size_t ldy, __mmask16 last) {
  __m512 acc[NC][R];
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      acc[c][r] = _mm512_maskz_loadu_ps(M && r + 1 == R ? last : 0xffff, y + c * ldy + r * 16);
  for (uint32_t q = 0; q < count; ++q) {
    const float* w = parts[q].w + wo;
    const float* x = parts[q].x + xo;
    for (uint32_t p = 0, n = parts[q].n; p < n; ++p) {
      __m512 a[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        a[r] = _mm512_maskz_loadu_ps(M && r + 1 == R ? last : 0xffff, w + p * ldw + r * 16);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        const __m512 b = _mm512_set1_ps(XT ? x[p * ldx + c] : x[c * ldx + p]);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[c][r] = _mm512_fmadd_ps(a[r], b, acc[c][r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(y + c * ldy + r * 16, M && r + 1 == R ? last : 0xffff, acc[c][r]);
}

// Columns of one row strip in tiles of at most 24 / R columns, split evenly.
template <int R, bool M, bool XT>
void strip(const GemmPart* parts, uint32_t count, size_t wo, size_t xo, uint32_t k, size_t ldw,
           size_t ldx, float* y, size_t ldy, __mmask16 last) {
  constexpr uint32_t kMax = R == 1 ? 12 : 24 / R;
  const uint32_t tiles = (k + kMax - 1) / kMax;
  for (uint32_t t = 0, c0 = 0; t < tiles; ++t) {
    const uint32_t c1 = static_cast<uint32_t>(static_cast<uint64_t>(k) * (t + 1) / tiles);
    const size_t xt = XT ? xo + c0 : xo + c0 * ldx;
    float* yt = y + c0 * ldy;
    switch (c1 - c0) {
#define EDBATCH_TILE(N)                                                                        \
  case N:                                                                                      \
    if constexpr (N <= kMax) tile<R, N, M, XT>(parts, count, wo, xt, ldw, ldx, yt, ldy, last); \
    break;
      EDBATCH_TILE(1) EDBATCH_TILE(2) EDBATCH_TILE(3) EDBATCH_TILE(4) EDBATCH_TILE(5)
      EDBATCH_TILE(6) EDBATCH_TILE(7) EDBATCH_TILE(8) EDBATCH_TILE(9) EDBATCH_TILE(10)
      EDBATCH_TILE(11) EDBATCH_TILE(12)
#undef EDBATCH_TILE
      default: break;
    }
    c0 = c1;
  }
}

template <bool M, bool XT>
void strip_of(uint32_t regs, const GemmPart* parts, uint32_t count, size_t wo, size_t xo,
              uint32_t k, size_t ldw, size_t ldx, float* y, size_t ldy, __mmask16 last) {
  switch (regs) {
    case 8: strip<8, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
    case 7: strip<7, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
    case 6: strip<6, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
    case 5: strip<5, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
    case 4: strip<4, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
    case 3: strip<3, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
    case 2: strip<2, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
    default: strip<1, M, XT>(parts, count, wo, xo, k, ldw, ldx, y, ldy, last); break;
  }
}

#endif

}  // namespace

void gemm_acc_eigen(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
                    size_t ldx, float* y, size_t ldy) {
  using Stride = Eigen::OuterStride<>;
  Eigen::Map<const Eigen::MatrixXf, 0, Stride> W(w, m, n, Stride(ldw));
  Eigen::Map<const Eigen::MatrixXf, 0, Stride> X(x, n, k, Stride(ldx));
  Eigen::Map<Eigen::MatrixXf, 0, Stride> Y(y, m, k, Stride(ldy));
  Y.noalias() += W * X;
}

bool gemm_acc_native() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

#if defined(__AVX512F__)
namespace {

// Rows [row0, row0 + m) of the parts' W, all k columns of Y.
template <bool XT>
void gemm_tiles(uint32_t m, uint32_t k, const GemmPart* parts, uint32_t count, size_t row0,
                size_t ldw, size_t ldx, float* y, size_t ldy) {
  // Panels of 48 columns keep X's panel in L1 while each row strip of W is reused across it.
  constexpr uint32_t kPanel = 48;
  for (uint32_t c0 = 0; c0 < k; c0 += kPanel) {
    const uint32_t nc = std::min(kPanel, k - c0);
    // Few columns: taller strips, so enough accumulators hide the FMA latency.
    const uint32_t R = nc <= 3 ? 8 : nc <= 6 ? 4 : nc <= 8 ? 3 : 2;
    const size_t xp = XT ? c0 : c0 * ldx;
    float* yp = y + c0 * ldy;
    for (uint32_t r0 = 0; r0 < m;) {
      const uint32_t left = m - r0;
      const uint32_t regs = std::min<uint32_t>((left + 15) / 16, R);
      const uint32_t rows = std::min(left, regs * 16);
      const uint32_t tail = rows - (regs - 1) * 16;
      const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1);
      if (tail == 16)
        strip_of<false, XT>(regs, parts, count, row0 + r0, xp, nc, ldw, ldx, yp + r0, ldy, last);
      else
        strip_of<true, XT>(regs, parts, count, row0 + r0, xp, nc, ldw, ldx, yp + r0, ldy, last);
      r0 += rows;
    }
  }
}

}  // namespace
#endif

void gemm_acc(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
              size_t ldx, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(__AVX512F__)
  // One column is a matrix-vector product, bound by reading W: Eigen's is as fast.
  if (k == 1) return gemm_acc_eigen(m, n, k, w, ldw, x, ldx, y, ldy);
  const GemmPart one{w, x, n};
  gemm_tiles<false>(m, k, &one, 1, 0, ldw, ldx, y, ldy);
#else
  gemm_acc_eigen(m, n, k, w, ldw, x, ldx, y, ldy);
#endif
}

void gemm_acc_xt(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
                 size_t ldx, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(__AVX512F__)
  const GemmPart one{w, x, n};
  gemm_acc_xt_parts(m, k, &one, 1, 0, ldw, ldx, y, ldy);
#else
  using Stride = Eigen::OuterStride<>;
  Eigen::Map<const Eigen::MatrixXf, 0, Stride> W(w, m, n, Stride(ldw));
  Eigen::Map<const Eigen::MatrixXf, 0, Stride> X(x, k, n, Stride(ldx));
  Eigen::Map<Eigen::MatrixXf, 0, Stride> Y(y, m, k, Stride(ldy));
  Y.noalias() += W * X.transpose();
#endif
}

void gemm_acc_xt_parts(uint32_t m, uint32_t k, const GemmPart* parts, uint32_t count, size_t row0,
                       size_t ldw, size_t ldx, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(__AVX512F__)
  // In runs of at most kRun inner columns (consecutive short parts together, a long part in
  // pieces), so that a tile's strip of W stays in L1 across its panel.
  constexpr uint32_t kRun = 128;
  for (uint32_t q0 = 0, q1 = 0; q0 < count; q0 = q1) {
    if (parts[q0].n > kRun) {
      for (uint32_t p0 = 0; p0 < parts[q0].n; p0 += kRun) {
        const GemmPart piece{parts[q0].w + p0 * ldw, parts[q0].x + p0 * ldx,
                             std::min(kRun, parts[q0].n - p0)};
        gemm_tiles<true>(m, k, &piece, 1, row0, ldw, ldx, y, ldy);
      }
      q1 = q0 + 1;
      continue;
    }
    uint32_t inner = parts[q0].n;
    for (q1 = q0 + 1; q1 < count && inner + parts[q1].n <= kRun; ++q1) inner += parts[q1].n;
    gemm_tiles<true>(m, k, parts + q0, q1 - q0, row0, ldw, ldx, y, ldy);
  }
#else
  for (uint32_t q = 0; q < count; ++q)
    if (parts[q].n > 0)
      gemm_acc_xt(m, parts[q].n, k, parts[q].w + row0, ldw, parts[q].x, ldx, y, ldy);
#endif
}

}  // namespace edbatch::cpu
