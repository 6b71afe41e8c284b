// An independent double-precision interpreter of a Graph, node by node, with reverse-mode
// gradients. It shares no code with the engine: it reads only the graph's plain node arrays.
#pragma once
#include <cstdint>
#include <vector>

#include "edbatch/graph.h"

namespace edbatch::testing {

struct Reference {
  std::vector<std::vector<double>> params;       // per parameter id (copied from the collection)
  std::vector<double> inputs;                    // the graph's input values
  std::vector<std::vector<double>> values;       // per node
  std::vector<std::vector<double>> adjoints;     // per node
  std::vector<std::vector<double>> param_grads;  // per parameter id

  explicit Reference(const Graph& g);
  void forward();
  void backward(uint32_t loss);
  // Central finite difference of node `loss` with respect to a parameter or input element.
  double fd_param(uint32_t loss, uint32_t param, uint32_t k, double eps = 1e-6);
  double fd_input(uint32_t loss, uint32_t k, double eps = 1e-6);

 private:
  const Graph& g_;
};

}  // namespace edbatch::testing
