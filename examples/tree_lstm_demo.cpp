// Trains an op-level Tree-LSTM on built-in synthetic SST-like trees (or an SST file) and prints
// loss, throughput and the batching statistics of each epoch.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "edbatch/edbatch.h"
#include "edbatch/zoo.h"

using namespace edbatch;

int main(int argc, char** argv) {
  CLI::App app{"Tree-LSTM sentiment training demo (op-level model, dynamic batching)"};
  std::string data = "synthetic:640", policy = "lb-greedy";
  uint32_t batch = 32, hidden = 64, epochs = 3, threads = 1;
  float lr = 0.05f;
  app.add_option("--data", data, "synthetic:N or an SST-format tree file")->capture_default_str();
  app.add_option("--policy", policy, "none, depth, agenda or lb-greedy")->capture_default_str();
  app.add_option("--batch", batch, "trees per mini-batch")->capture_default_str();
  app.add_option("--hidden", hidden, "hidden size")->capture_default_str();
  app.add_option("--epochs", epochs, "passes over the data")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--lr", lr, "SGD learning rate")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<Tree> trees;
    if (data.rfind("synthetic:", 0) == 0)
      trees = synthetic_trees(static_cast<uint32_t>(std::stoul(data.substr(10))), 1);
    else
      trees = load_trees(data);
    ParameterCollection pc(1);
    TreeLstmOps model(pc, 256, hidden);
    Engine engine(pc, EngineOptions{policy, "cpu", static_cast<int>(threads)});
    Graph g(pc);
    std::printf("%zu trees, hidden %u, mini-batch %u, policy %s, %u thread(s)\n", trees.size(),
                hidden, batch, policy.c_str(), threads);
    for (uint32_t epoch = 1; epoch <= epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0, batches = 0, bound = 0;
      size_t nodes = 0, steps = 0;
      for (size_t begin = 0; begin < trees.size(); begin += batch) {
        g.clear();
        std::vector<Expr> losses;
        for (size_t i = begin; i < std::min(trees.size(), begin + batch); ++i) {
          losses.push_back(model.build(g, trees[i]));
          nodes += trees[i].nodes.size();
        }
        const Expr loss = sum_losses(losses);
        loss_sum += as_scalar(engine.forward(g, loss));
        engine.backward(g, loss);
        pc.sgd_update(lr / batch);
        batches += engine.stats().batches;
        bound += engine.stats().lower_bound;
        ++steps;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("epoch %u  loss/node %.4f  %.0f trees/s (train)  batches/step %.0f (lower bound %.0f)\n",
                  epoch, loss_sum / nodes, trees.size() / s, batches / steps, bound / steps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
