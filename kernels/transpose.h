// Matrix transposes for weights between torch's row-major memory and the engine's column-major
// one (the PyTorch adapter) and for W^T's packed form (the CPU backend's backward products).
// Compiled in the core library, so they use the vector instructions that it targets.
#pragma once
#include <cstddef>
#include <cstdint>

namespace edbatch {

// out (c x r, row-major) = a^T for a (r x c, row-major). Column-major views read alike: a
// column-major r x c matrix is a row-major c x r one.
void transpose(const float* a, uint32_t r, uint32_t c, float* out);
// out (c x r, row-major) += alpha * a^T: a plain SGD step from a transposed gradient in one pass.
void transpose_add(const float* a, uint32_t r, uint32_t c, float alpha, float* out);
// The same with leading dimensions: out[j * ldo + i] = a[i * lda + j] for i < r, j < c.
void transpose_strided(const float* a, size_t lda, uint32_t r, uint32_t c, float* out, size_t ldo);

}  // namespace edbatch
