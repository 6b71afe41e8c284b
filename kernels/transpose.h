// A tiled matrix transpose, shared by the CPU backend (W^T for backward products) and the
// PyTorch adapter (weights between torch's row-major memory and the engine's column-major one).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace edbatch {

// out (c x r, row-major) = a^T for a (r x c, row-major), in tiles of 16 x 16 so that both the
// reads and the writes stay within a few cache lines per tile (a plain loop writes or reads one
// float per line, at a stride of the matrix's width). Column-major views read alike: a column-
// major r x c matrix is a row-major c x r one.
inline void transpose(const float* a, uint32_t r, uint32_t c, float* out) {
  constexpr uint32_t kTile = 16;
  for (uint32_t i0 = 0; i0 < r; i0 += kTile)
    for (uint32_t j0 = 0; j0 < c; j0 += kTile) {
      const uint32_t i1 = std::min(r, i0 + kTile), j1 = std::min(c, j0 + kTile);
      for (uint32_t j = j0; j < j1; ++j)
        for (uint32_t i = i0; i < i1; ++i)
          out[static_cast<size_t>(j) * r + i] = a[static_cast<size_t>(i) * c + j];
    }
}

}  // namespace edbatch
