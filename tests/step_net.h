// A recurrent step for the tests of incremental forwards and plan reuse: h' = tanh(W h + U
// E[word] + b) as a block (`cell`, input h, integer word), its weights for building the same
// step op by op, and an output layer Wo (vocab x hidden).
#pragma once
#include <memory>

#include "edbatch/block.h"
#include "edbatch/graph.h"
#include "edbatch/params.h"

namespace edbatch::testing {

struct StepNet {
  Parameter W, U, b, Wo;
  LookupParameter E;
  std::unique_ptr<Block> cell;

  StepNet(ParameterCollection& pc, uint32_t hidden, uint32_t vocab) {
    W = pc.add_parameters("W", Dim{hidden, hidden});
    U = pc.add_parameters("U", Dim{hidden, hidden});
    b = pc.add_parameters("b", Dim{hidden, 1});
    Wo = pc.add_parameters("Wo", Dim{vocab, hidden});
    E = pc.add_lookup_parameters("E", vocab, hidden);
    cell = std::make_unique<Block>(pc, "step");
    const Expr h = cell->input("h", Dim{hidden, 1});
    const Expr e = cell->lookup(E, cell->index("word"));
    Graph& body = cell->body();
    cell->output("h",
                 tanh(affine({parameter(body, b), parameter(body, W), h, parameter(body, U), e})));
    cell->freeze();
  }
};

}  // namespace edbatch::testing
