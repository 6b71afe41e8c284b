// The README's example: a tiny tree model written one instance at a time, batched by edbatch.
#include <cstdio>

#include "edbatch/edbatch.h"

using namespace edbatch;

int main() {
  ParameterCollection model(/*seed=*/1);
  LookupParameter E = model.add_lookup_parameters("E", /*vocab=*/10, /*dim=*/8);
  Parameter U = model.add_parameters("U", Dim{8, 16});
  Parameter b = model.add_parameters("b", Dim{8, 1});
  Parameter W = model.add_parameters("W", Dim{2, 8});

  Engine engine(model, EngineOptions{"lb-greedy", "cpu", /*threads=*/1});
  for (int step = 0; step < 50; ++step) {
    Graph g(model);
    std::vector<Expr> losses;
    for (uint32_t i = 0; i < 4; ++i) {  // four instances: ((w0 w1) w2), label i % 2
      Expr h0 = lookup(g, E, i), h1 = lookup(g, E, i + 1), h2 = lookup(g, E, i + 2);
      Expr left = tanh(affine({parameter(g, b), parameter(g, U), concat({h0, h1})}));
      Expr root = tanh(affine({parameter(g, b), parameter(g, U), concat({left, h2})}));
      losses.push_back(pick_neg_log_softmax(parameter(g, W) * root, i % 2));
    }
    Expr loss = sum_losses(losses);
    float value = as_scalar(engine.forward(g, loss));
    engine.backward(g, loss);
    model.sgd_update(0.1f);
    if (step % 10 == 0 || step == 49)
      std::printf("step %2d  loss %.4f  batches %lu (lower bound %lu, %lu nodes)\n", step, value,
                  (unsigned long)engine.stats().batches, (unsigned long)engine.stats().lower_bound,
                  (unsigned long)engine.stats().nodes);
  }
  return 0;
}
