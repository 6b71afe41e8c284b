// The CPU backend's small-GEMM kernel (kernels/cpu/gemm.cpp) against a double-precision product,
// over awkward shapes (rows not a multiple of the vector width, one column, long panels), leading
// dimensions larger than the rows, and accumulation into existing values; padding rows between
// columns must stay untouched.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "tests/check.h"

using edbatch::testing::check_close;

TEST_CASE("cpu gemm_acc: Y += W X equals the double product at awkward sizes") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const uint32_t ms[] = {1, 5, 16, 17, 31, 48, 129};
  const uint32_t ns[] = {1, 3, 64, 257};
  const uint32_t ks[] = {1, 2, 3, 4, 6, 7, 9, 13, 47, 48, 49, 97};
  for (uint32_t m : ms)
    for (uint32_t n : ns)
      for (uint32_t k : ks) {
        const uint32_t pad = (m + n + k) % 3;  // leading dimensions beyond the shape, sometimes
        const size_t ldw = m + pad, ldx = n + pad, ldy = m + pad;
        std::vector<float> w(ldw * n), x(ldx * k), y(ldy * k);
        for (float& v : w) v = normal(rng);
        for (float& v : x) v = normal(rng);
        for (float& v : y) v = normal(rng);
        std::vector<double> want(ldy * k);
        for (uint32_t c = 0; c < k; ++c)
          for (uint32_t r = 0; r < ldy; ++r) {
            double s = y[c * ldy + r];
            if (r < m)
              for (uint32_t p = 0; p < n; ++p) s += double(w[p * ldw + r]) * x[c * ldx + p];
            want[c * ldy + r] = s;
          }
        edbatch::cpu::gemm_acc(m, n, k, w.data(), ldw, x.data(), ldx, y.data(), ldy);
        check_close(y, want, y.size(), 1e-5,
                    "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
      }
}
