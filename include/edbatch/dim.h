// Tensor shapes. Every value is a float32 column-major matrix rows x cols; a vector is rows x 1.
#pragma once
#include <cstdint>
#include <string>

namespace edbatch {

struct Dim {
  uint32_t rows = 0;
  uint32_t cols = 1;
  uint32_t size() const { return rows * cols; }
  bool operator==(const Dim& o) const { return rows == o.rows && cols == o.cols; }
  bool operator!=(const Dim& o) const { return !(*this == o); }
};

// "128" for a vector, "128x64" for a matrix.
std::string to_string(Dim d);

}  // namespace edbatch
