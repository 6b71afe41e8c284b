// Transposes in blocks of 8 x 8 (kernels/transpose.h): eight rows of a read as vectors, turned
// in registers, written as eight rows of the result; the edges one float at a time. A plain loop
// reads or writes one float per cache line at a stride of the matrix's width, and does not
// vectorize.
#include "kernels/transpose.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>

namespace edbatch {
namespace {

// out[j * ldo + i] (+)= alpha * a[i * lda + j] over rows [i0, i1) and columns [j0, j1).
template <bool Add>
void scalar_block(const float* a, size_t lda, uint32_t i0, uint32_t i1, uint32_t j0, uint32_t j1,
                  float alpha, float* out, size_t ldo) {
  for (uint32_t j = j0; j < j1; ++j)
    for (uint32_t i = i0; i < i1; ++i) {
      const float v = a[i * lda + j];
      if constexpr (Add)
        out[j * ldo + i] += alpha * v;
      else
        out[j * ldo + i] = v;
    }
}

#if defined(__AVX__)
// The 8 x 8 block at a (rows lda apart) transposed into out (rows ldo apart).
template <bool Add>
inline void block8(const float* a, size_t lda, float alpha, float* out, size_t ldo) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(a + k * lda);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  // Rows 0-3 and 4-7, each as four vectors of 2 x 2 pairs turned into 4 x 4 quarters.
  for (int h = 0; h < 8; h += 4) {
    r[h + 0] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);
    t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
  }
  for (int k = 0; k < 8; ++k) {
    float* o = out + k * ldo;
    if constexpr (Add)
      _mm256_storeu_ps(
          o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(_mm256_set1_ps(alpha), t[k])));
    else
      _mm256_storeu_ps(o, t[k]);
  }
}
#endif

template <bool Add>
void transpose_impl(const float* a, size_t lda, uint32_t r, uint32_t c, float alpha, float* out,
                    size_t ldo) {
  uint32_t r8 = 0, c8 = 0;
#if defined(__AVX__)
  r8 = r / 8 * 8;
  c8 = c / 8 * 8;
  // Rows in pairs of blocks where they can be: the two halves of each 64-byte line of the
  // result are written one after the other.
  for (uint32_t i0 = 0; i0 < r8; i0 += 16) {
    const uint32_t i1 = std::min(r8, i0 + 16);
    for (uint32_t j0 = 0; j0 < c8; j0 += 8)
      for (uint32_t i = i0; i < i1; i += 8)
        block8<Add>(a + i * lda + j0, lda, alpha, out + j0 * ldo + i, ldo);
  }
#endif
  scalar_block<Add>(a, lda, 0, r8, c8, c, alpha, out, ldo);  // the columns past the blocks
  scalar_block<Add>(a, lda, r8, r, 0, c, alpha, out, ldo);   // the rows past them
}

}  // namespace

void transpose(const float* a, uint32_t r, uint32_t c, float* out) {
  transpose_impl<false>(a, c, r, c, 1.0f, out, r);
}

void transpose_add(const float* a, uint32_t r, uint32_t c, float alpha, float* out) {
  transpose_impl<true>(a, c, r, c, alpha, out, r);
}

void transpose_strided(const float* a, size_t lda, uint32_t r, uint32_t c, float* out, size_t ldo) {
  transpose_impl<false>(a, lda, r, c, 1.0f, out, ldo);
}

}  // namespace edbatch
