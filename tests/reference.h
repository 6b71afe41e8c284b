// An independent double-precision interpreter of a Graph, node by node, with reverse-mode
// gradients. It shares no code with the engine: it reads only the graph's plain node arrays.
#pragma once
#include <cstdint>
#include <vector>

#include "edbatch/graph.h"

namespace edbatch {
struct BlockPlan;
}

namespace edbatch::testing {

struct Reference {
  using Values = std::vector<std::vector<double>>;
  // Inside a block body: the invocation's inputs, integers and input adjoints.
  struct Env {
    const BlockPlan* block = nullptr;
    const Values* inputs = nullptr;
    const uint32_t* ints = nullptr;
    Values* input_adjoints = nullptr;
  };

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
  // Block calls are evaluated by interpreting the block's body as declared, per invocation.
  void run_forward(const Graph& g, const Env& env, Values& vals, std::vector<Values>& sub);
  void run_backward(const Graph& g, const Env& env, const Values& vals, Values& adj,
                    const std::vector<Values>& sub);

  std::vector<Values> calls;  // per top-level call node: its body's values
  const Graph& g_;
};

}  // namespace edbatch::testing
