// Y += W X for thin products. Eigen's GEMM packs W for every call, which costs as much as the
// multiply when X has a few dozen columns (a block step's invocations, a batch of tree nodes), so
// with AVX-512, or AVX2 with FMA, we run register tiles that read W straight from its column-major
// storage: a tile of R vector registers of rows by NC columns accumulates over the whole inner
// dimension in registers (R x NC accumulators, R loads of W and one broadcast of X per step).
#include "kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "kernels/transpose.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define EDBATCH_GEMM_TILES 1
#include <immintrin.h>
#endif

namespace edbatch::cpu {

namespace {

#if defined(EDBATCH_GEMM_TILES)

#if defined(__AVX512F__)
// 16 lanes, 32 registers, masks in k registers.
struct Simd {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr uint32_t kLanes = 16;
  // Accumulator tiles of R registers by at most max_cols(R) columns.
  static constexpr int max_cols(int r) { return r == 1 ? 12 : 24 / r; }
  static constexpr int kMaxRegs = 8;
  // Few columns: taller strips, so enough accumulators hide the FMA latency. Many: tiles of 4
  // registers by 6 columns, 10 loads per 24 FMAs where 2 x 12 takes 14 (the broadcasts of X are
  // loads too), which measured 4-8% faster forward and training on the tree and lattice models.
  static uint32_t regs_for(uint32_t nc) { return nc <= 3 ? 8 : nc <= 6 ? 4 : nc <= 8 ? 3 : 4; }
  static Mask tail(uint32_t rows) { return static_cast<Mask>((1u << rows) - 1); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, V v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
  static V splat(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void keep(V&) {}
};
#else
// 8 lanes, 16 registers: R x NC accumulators, R rows of W and one broadcast must fit in 16.
// Masked loads and stores take a lane mask in a vector register.
struct Simd {
  using V = __m256;
  using Mask = __m256i;
  static constexpr uint32_t kLanes = 8;
  static constexpr int max_cols(int r) { return r == 1 ? 12 : r == 2 ? 6 : r == 3 ? 4 : 2; }
  static constexpr int kMaxRegs = 4;
  static uint32_t regs_for(uint32_t nc) { return nc <= 2 ? 4 : 3; }
  static Mask tail(uint32_t rows) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rows)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store(float* p, V v, Mask m) { _mm256_maskstore_ps(p, m, v); }
  static V splat(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // Holds a row of W in a register: left to itself the compiler folds the load into each of the
  // tile's FMAs, NC loads where one does, and the tile becomes bound by loads.
  static void keep(V& v) { asm("" : "+x"(v)); }
};
#endif

constexpr uint32_t kLanes = Simd::kLanes;

// Register r of a tile's rows: the last one masked when M.
template <int R, bool M>
Simd::V load_rows(const float* p, int r, Simd::Mask last) {
  return M && r + 1 == R ? Simd::load(p, last) : Simd::load(p);
}
template <int R, bool M>
void store_rows(float* p, int r, Simd::V v, Simd::Mask last) {
  if (M && r + 1 == R)
    Simd::store(p, v, last);
  else
    Simd::store(p, v);
}

// How the tiles read their operands. Plain: W and X column-major. XT: x holds X transposed, so
// X(p, c) is x[p * ldx + c]. Packed: W in gemm_pack's form, X column-major; ldw is then the
// distance between blocks of kLanes rows (n * kLanes).
enum class Form { Plain, XT, Packed };

// R registers of rows (the last one masked when M) by NC columns, summed over the parts: part
// q adds W_q X_q over its inner dimension n_q, with W_q read from w_q + wo and X_q from x_q + xo.
// The sums start from Y's tile, or with `init` from init's rows in every column (Y not read).
template <int R, int NC, bool M, Form F>
void tile(const GemmPart* parts, uint32_t count, size_t wo, size_t xo, size_t ldw, size_t ldx,
          float* y, size_t ldy, const float* init, Simd::Mask last) {
  Simd::V acc[NC][R];
  if (init) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Simd::V v = load_rows<R, M>(init + r * kLanes, r, last);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) acc[c][r] = v;
    }
  } else {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[c][r] = load_rows<R, M>(y + c * ldy + r * kLanes, r, last);
  }
  for (uint32_t q = 0; q < count; ++q) {
    const float* w = parts[q].w + wo;
    const float* x = parts[q].x + xo;
    for (uint32_t p = 0, n = parts[q].n; p < n; ++p) {
      Simd::V a[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        // A packed W's rows past m are zeros: no mask needed.
        a[r] = F == Form::Packed ? Simd::load(w + p * kLanes + r * ldw)
                                 : load_rows<R, M>(w + p * ldw + r * kLanes, r, last);
        Simd::keep(a[r]);
      }
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        const Simd::V b = Simd::splat(F == Form::XT ? x[p * ldx + c] : x[c * ldx + p]);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[c][r] = Simd::fma(a[r], b, acc[c][r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_rows<R, M>(y + c * ldy + r * kLanes, r, acc[c][r], last);
}

// Columns of one row strip in tiles of at most Simd::max_cols(R) columns, split evenly.
template <int R, bool M, Form F>
void strip(const GemmPart* parts, uint32_t count, size_t wo, size_t xo, uint32_t k, size_t ldw,
           size_t ldx, float* y, size_t ldy, const float* init, Simd::Mask last) {
  constexpr uint32_t kMax = Simd::max_cols(R);
  const uint32_t tiles = (k + kMax - 1) / kMax;
  for (uint32_t t = 0, c0 = 0; t < tiles; ++t) {
    const uint32_t c1 = static_cast<uint32_t>(static_cast<uint64_t>(k) * (t + 1) / tiles);
    const size_t xt = F == Form::XT ? xo + c0 : xo + c0 * ldx;
    float* yt = y + c0 * ldy;
    switch (c1 - c0) {
#define EDBATCH_TILE(N)                                                      \
  case N:                                                                    \
    if constexpr (N <= kMax)                                                 \
      tile<R, N, M, F>(parts, count, wo, xt, ldw, ldx, yt, ldy, init, last); \
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

// A row strip of `regs` registers (at most Simd::kMaxRegs).
template <bool M, Form F, int R = Simd::kMaxRegs>
void strip_of(uint32_t regs, const GemmPart* parts, uint32_t count, size_t wo, size_t xo,
              uint32_t k, size_t ldw, size_t ldx, float* y, size_t ldy, const float* init,
              Simd::Mask last) {
  if constexpr (R > 1)
    if (static_cast<int>(regs) < R)
      return strip_of<M, F, R - 1>(regs, parts, count, wo, xo, k, ldw, ldx, y, ldy, init, last);
  strip<R, M, F>(parts, count, wo, xo, k, ldw, ldx, y, ldy, init, last);
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
#if defined(EDBATCH_GEMM_TILES)
  return true;
#else
  return false;
#endif
}

#if defined(EDBATCH_GEMM_TILES)
namespace {

// Rows [row0, row0 + m) of the parts' W, all k columns of Y; with `init` (m floats), Y's columns
// start from it instead of their values.
template <Form F>
void gemm_tiles(uint32_t m, uint32_t k, const GemmPart* parts, uint32_t count, size_t row0,
                size_t ldw, size_t ldx, float* y, size_t ldy, const float* init = nullptr) {
  // Panels of 48 columns keep X's panel in L1 while each row strip of W is reused across it.
  constexpr uint32_t kPanel = 48;
  // XT: X^T's rows lie ldx apart, which at 1-4 KiB maps a panel's rows onto a few cache sets;
  // each panel's columns are copied out first, nc apart (a copy of 1/m of the product's work).
  thread_local std::vector<float> panel;
  thread_local std::vector<GemmPart> panel_parts;
  size_t inner = 0;
  if constexpr (F == Form::XT)
    for (uint32_t q = 0; q < count; ++q) inner += parts[q].n;
  for (uint32_t c0 = 0; c0 < k; c0 += kPanel) {
    const uint32_t nc = std::min(kPanel, k - c0);
    const uint32_t R = Simd::regs_for(nc);
    size_t xp = F == Form::XT ? c0 : c0 * ldx;
    size_t ld = ldx;
    const GemmPart* ps = parts;
    if (F == Form::XT && ldx > nc) {
      if (panel.size() < inner * nc) panel.resize(inner * nc);
      panel_parts.assign(parts, parts + count);
      float* out = panel.data();
      for (uint32_t q = 0; q < count; ++q) {
        panel_parts[q].x = out;
        for (uint32_t p = 0; p < parts[q].n; ++p, out += nc)
          std::copy(parts[q].x + p * ldx + c0, parts[q].x + p * ldx + c0 + nc, out);
      }
      ps = panel_parts.data();
      xp = 0;
      ld = nc;
    }
    float* yp = y + c0 * ldy;
    for (uint32_t r0 = 0; r0 < m;) {
      const uint32_t left = m - r0;
      const uint32_t regs = std::min<uint32_t>((left + kLanes - 1) / kLanes, R);
      const uint32_t rows = std::min(left, regs * kLanes);
      const uint32_t tail = rows - (regs - 1) * kLanes;
      const Simd::Mask last = Simd::tail(tail);
      const size_t wo = F == Form::Packed ? r0 / kLanes * ldw : row0 + r0;
      const float* in = init ? init + r0 : nullptr;
      if (tail == kLanes)
        strip_of<false, F>(regs, ps, count, wo, xp, nc, ldw, ld, yp + r0, ldy, in, last);
      else
        strip_of<true, F>(regs, ps, count, wo, xp, nc, ldw, ld, yp + r0, ldy, in, last);
      r0 += rows;
    }
  }
}

}  // namespace
#endif

void gemm_acc(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
              size_t ldx, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(EDBATCH_GEMM_TILES)
  // One column is a matrix-vector product, bound by reading W: Eigen's is as fast.
  if (k == 1) return gemm_acc_eigen(m, n, k, w, ldw, x, ldx, y, ldy);
  const GemmPart one{w, x, n};
  gemm_tiles<Form::Plain>(m, k, &one, 1, 0, ldw, ldx, y, ldy);
#else
  gemm_acc_eigen(m, n, k, w, ldw, x, ldx, y, ldy);
#endif
}

namespace {

void fill_columns(uint32_t m, uint32_t k, const float* bias, float* y, size_t ldy) {
  for (uint32_t c = 0; c < k; ++c) std::copy(bias, bias + m, y + c * ldy);
}

}  // namespace

void gemm_bias(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
               size_t ldx, const float* bias, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(EDBATCH_GEMM_TILES)
  if (k > 1) {
    const GemmPart one{w, x, n};
    return gemm_tiles<Form::Plain>(m, k, &one, 1, 0, ldw, ldx, y, ldy, bias);
  }
#endif
  fill_columns(m, k, bias, y, ldy);
  gemm_acc(m, n, k, w, ldw, x, ldx, y, ldy);
}

uint32_t gemm_pack_rows() {
#if defined(EDBATCH_GEMM_TILES)
  return kLanes;
#else
  return 0;
#endif
}

size_t gemm_packed_size(uint32_t m, uint32_t n) {
  const size_t rows = gemm_pack_rows();
  return rows == 0 ? static_cast<size_t>(m) * n : (m + rows - 1) / rows * rows * n;
}

void gemm_pack(uint32_t m, uint32_t n, const float* w, size_t ldw, float* packed) {
  const uint32_t rows = gemm_pack_rows();
  if (rows == 0) {  // no tiles: W column-major with leading dimension m
    for (uint32_t p = 0; p < n; ++p) std::copy(w + p * ldw, w + p * ldw + m, packed + p * m);
    return;
  }
  // Block b, column p: rows [b * rows, b * rows + rows) of W's column p, zeros past m. W is read
  // column by column (in order), the blocks written as one stream each.
  const uint32_t full = m / rows * rows;
  for (uint32_t p = 0; p < n; ++p) {
    const float* col = w + p * ldw;
    float* out = packed + static_cast<size_t>(p) * rows;
    for (uint32_t r0 = 0; r0 < full; r0 += rows)
      std::copy(col + r0, col + r0 + rows, out + static_cast<size_t>(r0) * n);
    if (full < m) {
      float* last = out + static_cast<size_t>(full) * n;
      std::copy(col + full, col + m, last);
      std::fill(last + (m - full), last + rows, 0.0f);
    }
  }
}

void gemm_pack_transposed(uint32_t m, uint32_t n, const float* w, size_t ldw, float* packed) {
  // W^T's rows are W's columns and its column p is W's row p: block b holds W's columns
  // [b * rows, b * rows + rows), each read in order and written across the block's rows.
  const uint32_t rows = gemm_pack_rows();
  const uint32_t height = rows == 0 ? n : rows;
  for (uint32_t i0 = 0; i0 < n; i0 += height) {
    float* block = packed + static_cast<size_t>(i0) * m;
    const uint32_t h = std::min(height, n - i0);
    transpose_strided(w + static_cast<size_t>(i0) * ldw, ldw, h, m, block, height);
    for (uint32_t p = 0; h < height && p < m; ++p)  // the last block's rows past n
      std::fill(block + static_cast<size_t>(p) * height + h,
                block + static_cast<size_t>(p + 1) * height, 0.0f);
  }
}

void gemm_acc_packed(uint32_t m, uint32_t n, uint32_t k, const float* packed, const float* x,
                     size_t ldx, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(EDBATCH_GEMM_TILES)
  const GemmPart one{packed, x, n};
  gemm_tiles<Form::Packed>(m, k, &one, 1, 0, static_cast<size_t>(n) * kLanes, ldx, y, ldy);
#else
  gemm_acc_eigen(m, n, k, packed, m, x, ldx, y, ldy);
#endif
}

void gemm_bias_packed(uint32_t m, uint32_t n, uint32_t k, const float* packed, const float* x,
                      size_t ldx, const float* bias, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(EDBATCH_GEMM_TILES)
  const GemmPart one{packed, x, n};
  gemm_tiles<Form::Packed>(m, k, &one, 1, 0, static_cast<size_t>(n) * kLanes, ldx, y, ldy, bias);
#else
  fill_columns(m, k, bias, y, ldy);
  gemm_acc_eigen(m, n, k, packed, m, x, ldx, y, ldy);
#endif
}

void gemm_acc_xt(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
                 size_t ldx, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
  const GemmPart one{w, x, n};
  gemm_acc_xt_parts(m, k, &one, 1, 0, ldw, ldx, y, ldy);
}

void gemm_acc_xt_parts(uint32_t m, uint32_t k, const GemmPart* parts, uint32_t count, size_t row0,
                       size_t ldw, size_t ldx, float* y, size_t ldy) {
  if (m == 0 || k == 0) return;
#if defined(EDBATCH_GEMM_TILES)
  // In runs of at most kRun inner columns (consecutive short parts together, a long part in
  // pieces), so that a tile's strip of W stays in L1 across its panel.
  constexpr uint32_t kRun = 128;
  for (uint32_t q0 = 0, q1 = 0; q0 < count; q0 = q1) {
    if (parts[q0].n > kRun) {
      for (uint32_t p0 = 0; p0 < parts[q0].n; p0 += kRun) {
        const GemmPart piece{parts[q0].w + p0 * ldw, parts[q0].x + p0 * ldx,
                             std::min(kRun, parts[q0].n - p0)};
        gemm_tiles<Form::XT>(m, k, &piece, 1, row0, ldw, ldx, y, ldy);
      }
      q1 = q0 + 1;
      continue;
    }
    uint32_t inner = parts[q0].n;
    for (q1 = q0 + 1; q1 < count && inner + parts[q1].n <= kRun; ++q1) inner += parts[q1].n;
    gemm_tiles<Form::XT>(m, k, parts + q0, q1 - q0, row0, ldw, ldx, y, ldy);
  }
#else
  using Stride = Eigen::OuterStride<>;
  Eigen::Map<Eigen::MatrixXf, 0, Stride> Y(y, m, k, Stride(ldy));
  for (uint32_t q = 0; q < count; ++q) {
    if (parts[q].n == 0) continue;
    Eigen::Map<const Eigen::MatrixXf, 0, Stride> W(parts[q].w + row0, m, parts[q].n, Stride(ldw));
    Eigen::Map<const Eigen::MatrixXf, 0, Stride> X(parts[q].x, k, parts[q].n, Stride(ldx));
    Y.noalias() += W * X.transpose();
  }
#endif
}

}  // namespace edbatch::cpu
