// The zoo on a device: every model at each mini-batch size and hidden size, forward only and
// forward + backward + SGD update, through blocks, each plain (every mini-batch's loss read before
// the next is built) and pipelined (Engine::submit: mini-batch i+1 is built, scheduled, planned
// and queued before the loss of i is read, so CPU work overlaps the device's). Per
// configuration: instances/s from the median mini-batch time (construction through update, as a
// caller sees it; pipelined, the steady-state period) with the p10/p90 spread, the device time of
// the passes (CUDA events) against that time, kernels and stages per mini-batch (a chained launch
// runs many dependent stages) and device time per stage. One JSON line per
// configuration on stdout, a table on stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "edbatch/edbatch.h"
#include "edbatch/models.h"
#include "edbatch/options.h"

using namespace edbatch;

namespace {

struct Config {
  std::string model, device, policy;
  uint32_t batch, hidden;
  bool train, blocks, pipelined, host_sgd;
};

struct Result {
  bench::Summary ms, device_ms, build_ms, schedule_ms;
  double kernels = 0, stages = 0, nodes = 0, batches = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

Result measure(const Config& c, int warmup, int iters, uint32_t mini_batches) {
  ParameterCollection pc(1);
  const Dataset data = load_dataset(model_data_kind(c.model),
                                    "synthetic:" + std::to_string(c.batch * mini_batches), 256, 1);
  ModelOptions mo;
  mo.hidden = c.hidden;
  mo.blocks = c.blocks;
  const std::unique_ptr<Model> model = make_model(c.model, pc, data, mo);
  EngineOptions eo;
  eo.device = c.device;
  eo.policy = c.policy;
  eo = apply_debug_env(eo);  // EDBATCH_CUDA_* debugging switches
  Engine engine(pc, eo);
  Graph g(pc);
  std::vector<double> ms, device_ms, build_ms, schedule_ms, kernels, stages, nodes, batches;
  std::vector<Expr> losses;
  const float lr = 0.01f / static_cast<float>(c.batch);
  uint64_t previous = 0;  // pipelined: the ticket of the mini-batch before
  double checksum = 0;    // losses are read, as a training loop would
  for (int it = 0; it < warmup + iters; ++it) {
    const uint32_t first = (static_cast<uint32_t>(it) % mini_batches) * c.batch;
    const uint64_t kernels_before = engine.stats().kernels;
    const uint64_t stages_before = engine.stats().stages;
    const double t0 = bench::now_ms();
    g.clear();
    losses.clear();
    for (uint32_t i = 0; i < c.batch; ++i) losses.push_back(model->build(g, first + i));
    const Expr loss = sum_losses(losses);
    const double t1 = bench::now_ms();
    if (c.pipelined) {
      const uint64_t ticket = engine.submit(g, loss);
      if (c.train) {
        engine.backward(g, loss);
        engine.sgd_update(lr);
      }
      if (it > 0) checksum += as_scalar(engine.result(previous));
      previous = ticket;
    } else {
      checksum += as_scalar(engine.forward(g, loss));
      if (c.train) {
        engine.backward(g, loss);
        if (c.host_sgd)
          pc.sgd_update(lr);
        else
          engine.sgd_update(lr);
      }
    }
    const double t2 = bench::now_ms();
    if (it < warmup) continue;
    const Stats& s = engine.stats();
    ms.push_back(t2 - t0);
    build_ms.push_back(t1 - t0);
    schedule_ms.push_back(s.scheduling_ms);
    device_ms.push_back(s.device_forward_ms + (c.train ? s.device_backward_ms : 0));
    kernels.push_back(static_cast<double>(s.kernels - kernels_before));
    stages.push_back(static_cast<double>(s.stages - stages_before));
    nodes.push_back(static_cast<double>(s.nodes));
    batches.push_back(static_cast<double>(s.batches));
  }
  if (c.pipelined) checksum += as_scalar(engine.result(previous));
  if (!(checksum == checksum)) std::fprintf(stderr, "bench_cuda: %s: loss is NaN\n", c.model.c_str());
  Result r;
  r.ms = bench::summarize(ms);
  r.device_ms = bench::summarize(device_ms);
  r.build_ms = bench::summarize(build_ms);
  r.schedule_ms = bench::summarize(schedule_ms);
  r.kernels = bench::summarize(kernels).median;
  r.stages = bench::summarize(stages).median;
  r.nodes = bench::summarize(nodes).median;
  r.batches = bench::summarize(batches).median;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"edbatch zoo benchmark on a device (CUDA by default)"};
  std::string models = "", batches = "32,128", hiddens = "128,512",
              modes = "forward,train,forward-pipelined,train-pipelined";
  std::string device = "cuda", policy = "lb-greedy";
  int warmup = 5, iters = 30;
  uint32_t mini_batches = 4;
  bool op_level = false, host_sgd = false;
  app.add_option("--models", models, "comma-separated zoo models (default: all)");
  app.add_option("--batch", batches, "comma-separated mini-batch sizes");
  app.add_option("--hidden", hiddens, "comma-separated hidden sizes");
  app.add_option("--modes", modes,
                 "forward, train (forward, backward and SGD update), forward-pipelined, "
                 "train-pipelined (Engine::submit: the next mini-batch is built and queued before "
                 "this one's loss is read)");
  app.add_flag("--host-sgd", host_sgd,
               "plain train: update on the host (ParameterCollection::sgd_update: gradients "
               "downloaded, values uploaded) instead of Engine::sgd_update on the device");
  app.add_option("--device", device, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--policy", policy, "batching policy");
  app.add_option("--warmup", warmup, "mini-batches run before timing")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--iters", iters, "timed mini-batches")->check(CLI::Range(1, 1 << 30));
  app.add_option("--mini-batches", mini_batches, "distinct mini-batches cycled through")
      ->check(CLI::Range(1, 1 << 30));
  app.add_flag("--op-level", op_level, "build the models op by op instead of through blocks");
  if (const int code = bench::parse(app, argc, argv); code >= 0) return code;
  return bench::guarded("bench_cuda", [&] {
    for (const std::string& mode : split(modes))
      if (mode != "forward" && mode != "train" && mode != "forward-pipelined" &&
          mode != "train-pipelined") {
        std::fprintf(stderr, "bench_cuda: unknown mode '%s'\n", mode.c_str());
        return 2;
      }
    const std::vector<std::string> names = models.empty() ? model_names() : split(models);
    std::fprintf(stderr, "%-24s %5s %6s %-17s %12s %18s %10s %8s %9s %7s %9s %8s\n", "model",
                 "batch", "hidden", "mode", "inst/s", "ms p10-p90", "device ms", "busy", "kernels",
                 "stages", "us/stage", "build ms");
    for (const std::string& name : names)
      for (const std::string& b : split(batches))
        for (const std::string& h : split(hiddens))
          for (const std::string& mode : split(modes)) {
            const Config c{name,
                           device,
                           policy,
                           static_cast<uint32_t>(std::stoul(b)),
                           static_cast<uint32_t>(std::stoul(h)),
                           mode.rfind("train", 0) == 0,
                           !op_level,
                           mode.find("pipelined") != std::string::npos,
                           host_sgd};
            const Result r = measure(c, warmup, iters, mini_batches);
            const double per_s = c.batch / r.ms.median * 1e3;
            const double us_per_stage = r.stages > 0 ? r.device_ms.median * 1e3 / r.stages : 0;
            nlohmann::json j{{"bench", "cuda"},
                             {"model", name},
                             {"device", device},
                             {"policy", policy},
                             {"blocks", c.blocks},
                             {"batch", c.batch},
                             {"hidden", c.hidden},
                             {"mode", mode},
                             {"host_sgd", c.train && !c.pipelined && host_sgd},
                             {"instances_per_s", per_s},
                             {"ms_median", r.ms.median},
                             {"ms_p10", r.ms.p10},
                             {"ms_p90", r.ms.p90},
                             {"device_ms_median", r.device_ms.median},
                             {"device_busy", r.device_ms.median / r.ms.median},
                             {"build_ms_median", r.build_ms.median},
                             {"schedule_ms_median", r.schedule_ms.median},
                             {"kernels_per_minibatch", r.kernels},
                             {"stages_per_minibatch", r.stages},
                             {"device_us_per_stage", us_per_stage},
                             {"nodes", r.nodes},
                             {"batches", r.batches},
                             {"iters", iters}};
            std::printf("%s\n", j.dump().c_str());
            std::fflush(stdout);
            std::fprintf(stderr,
                         "%-24s %5u %6u %-17s %12.0f %8.2f-%-9.2f %10.3f %7.0f%% %9.0f %7.0f %9.2f "
                         "%8.2f\n",
                         name.c_str(), c.batch, c.hidden, mode.c_str(), per_s, r.ms.p10, r.ms.p90,
                         r.device_ms.median, 100 * r.device_ms.median / r.ms.median, r.kernels,
                         r.stages, us_per_stage, r.build_ms.median);
          }
    return 0;
  });
}
