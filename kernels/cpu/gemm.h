// A small-GEMM kernel for the CPU backend: Y += W X with column-major operands, W read in place
// (no packing), for the thin products of dynamic batching (a few to a few hundred columns).
#pragma once
#include <cstddef>
#include <cstdint>

namespace edbatch::cpu {

// Y (m x k) += W (m x n) * X (n x k); column-major with leading dimensions ldw, ldx, ldy. Uses
// AVX-512, or AVX2 with FMA, when the build targets it; Eigen otherwise.
void gemm_acc(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
              size_t ldx, float* y, size_t ldy);

// Y (m x k) += W (m x n) * X^T with X (k x n) column-major (leading dimension ldx): a weight
// gradient dW += dY X^T reads both operands where they are.
void gemm_acc_xt(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
                 size_t ldx, float* y, size_t ldy);

// W in the tiles' packed form: blocks of gemm_pack_rows() rows (one vector register), each
// block's n columns one after another, rows past m zero. A product reads such a W as one stream
// per register of rows, where a column-major W with a leading dimension of 1-4 KiB maps its rows'
// columns onto a few cache sets and is read again from L2 or L3 for every tile of columns. Without
// tiles in the build, gemm_pack_rows() is 0 and the form is column-major with leading dimension m.
uint32_t gemm_pack_rows();
size_t gemm_packed_size(uint32_t m, uint32_t n);
void gemm_pack(uint32_t m, uint32_t n, const float* w, size_t ldw, float* packed);
// W^T (n x m) in that form, from W (m x n, column-major): gemm_packed_size(n, m) floats.
void gemm_pack_transposed(uint32_t m, uint32_t n, const float* w, size_t ldw, float* packed);

// Y (m x k) += W (m x n, packed by gemm_pack) * X (n x k, column-major).
void gemm_acc_packed(uint32_t m, uint32_t n, uint32_t k, const float* packed, const float* x,
                     size_t ldx, float* y, size_t ldy);

// Y (m x k) = bias + W X, bias (m floats) in every column: the same bits as filling Y's columns
// with bias and then gemm_acc (or gemm_acc_packed), without reading Y. W (m x n) as gemm_acc
// reads it, or packed by gemm_pack.
void gemm_bias(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
               size_t ldx, const float* bias, float* y, size_t ldy);
void gemm_bias_packed(uint32_t m, uint32_t n, uint32_t k, const float* packed, const float* x,
                      size_t ldx, const float* bias, float* y, size_t ldy);

// One product of a sum: W (m x n, leading dimension ldw) and X (k x n, leading dimension ldx).
struct GemmPart {
  const float* w;
  const float* x;
  uint32_t n;
};

// Y (m x k) += sum over parts of W_q X_q^T, rows [row0, row0 + m) of every W_q: a weight gradient
// over many batches (dW = sum of dY_b X_b^T), its inner dimension running through every batch's
// columns in runs of 128, so Y is read and written once per run rather than once per batch.
void gemm_acc_xt_parts(uint32_t m, uint32_t k, const GemmPart* parts, uint32_t count, size_t row0,
                       size_t ldw, size_t ldx, float* y, size_t ldy);

// The same product through Eigen's GEMM (what gemm_acc replaces), for benchmarks and tests.
void gemm_acc_eigen(uint32_t m, uint32_t n, uint32_t k, const float* w, size_t ldw, const float* x,
                    size_t ldx, float* y, size_t ldy);

// True when gemm_acc has its own kernel in this build (false: it forwards to Eigen).
bool gemm_acc_native();

}  // namespace edbatch::cpu
