#include "edbatch/dim.h"

namespace edbatch {

std::string to_string(Dim d) {
  if (d.cols == 1) return std::to_string(d.rows);
  return std::to_string(d.rows) + "x" + std::to_string(d.cols);
}

}  // namespace edbatch
