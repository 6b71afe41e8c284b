// The libtorch half of the decoding loop: torch.ops.edbatch's class Decoder (decoder.h) for
// edbatch.nn.StepDecoder. Forward only: tensors come back without autograd history. The engine
// runs on the device of the cell's weights (CPU or CUDA); on CUDA, a step's x and new states stay
// in device memory (through host memory with EDBATCH_TORCH_HOST_COPY=1, or for a CPU x).
#include <fmt/format.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

#include "src/torch/decoder.h"
#include "src/torch/program.h"
#include "src/torch/runtime.h"

namespace edbatch::torch_adapter {

namespace {

class TorchDecoder : public torch::CustomClassHolder {
 public:
  // cell: a built-in cell name or kProgramPrefix + a traced program; device: where the engine
  // runs ("cpu", "cuda", "cuda:N"), that of the weights start() takes.
  TorchDecoder(const std::string& cell, int64_t input_size, int64_t hidden,
               const std::string& policy, int64_t threads, const std::string& device)
      : device_(device) {
    const CallArgs a =
        call_args(cell, device_, input_size, is_program(cell) ? 1 : hidden, 1, 1, policy, threads);
    const c10::DeviceGuard guard(device_);  // the engine's CUDA state is made on its device
    try {
      decoder_ = std::make_unique<Decoder>(a.config, a.options);
    } catch (const std::exception&) {
      fail_handled();
    }
  }

  // weights: the cell's weights (as run_cell takes them); states: one tensor per cell output,
  // num_instances x output size, or none (zeros).
  void start(int64_t num_instances, std::vector<Tensor> weights, std::vector<Tensor> states) {
    const Cell& cell = decoder_->cell();
    decoder_->set_check_numerics(check_numerics());  // edbatch.set_check_numerics, as it is now
    const c10::DeviceGuard guard(device_);
    const Tensor probe = at::empty({0, cell.input_dim()}, at::dtype(at::kFloat).device(device_));
    // On the engine's device; CUDA weights stay there (device_resident), others go to the host.
    const bool on_device = device_.is_cuda() && device_resident(probe);
    check_inputs(probe, weights, cell, cell.weights(), on_device);
    std::vector<const float*> w, s;
    for (const Tensor& t : weights) w.push_back(t.data_ptr<float>());
    kept_.clear();
    if (!states.empty() && states.size() != cell.num_outputs())
      fail(
          fmt::format("[edbatch.Decoder.start] {} initial state tensors given, the cell has {} "
                      "outputs",
                      states.size(), cell.num_outputs()));
    // CUDA states on the engine's device stay there: one buffer, output after output, that the
    // first step's forward reads ahead of its x.
    bool states_on_device = on_device && !states.empty();
    for (size_t o = 0; o < states.size(); ++o) {
      const Tensor& t = states[o];
      const int64_t size = cell.output_size(static_cast<uint32_t>(o));
      if (t.scalar_type() != at::kFloat || t.dim() != 2 || t.size(0) != num_instances ||
          t.size(1) != size)
        fail(fmt::format("[edbatch.Decoder.start] initial state {} must be float32 of shape [{}, "
                         "{}], got {} of shape {}",
                         o, num_instances, size, c10::toString(t.scalar_type()),
                         shape(t.sizes())));
      states_on_device = states_on_device && t.device() == device_;
    }
    std::vector<Tensor> flat;
    for (const Tensor& t : states) {
      if (states_on_device) {
        flat.push_back(t.reshape({-1}));
        continue;
      }
      kept_.push_back(t.to(at::kCPU).contiguous());
      s.push_back(kept_.back().data_ptr<float>());
    }
    start_states_ = states_on_device ? at::cat(flat) : Tensor();
    try {
      decoder_->start(num_instances, w, s, on_device, on_device ? current_stream(probe) : nullptr,
                      states_on_device);
    } catch (const std::exception&) {
      start_states_ = Tensor();
      fail_handled();
    }
    kept_.clear();
  }

  // ids: int64, the running instances; x: float32, one row per id. Returns their new states (one
  // tensor per cell output, a row per id) on x's device. A CUDA x on a CUDA engine stays on the
  // GPU (runtime.h, device_resident): the step is queued on torch's current stream.
  std::vector<Tensor> step(const Tensor& ids, const Tensor& x) {
    const Cell& cell = decoder_->cell();
    check_index_tensor(ids, "ids", -1);
    const int64_t n = ids.numel();
    if (x.scalar_type() != at::kFloat || x.dim() != 2 || x.size(0) != n ||
        x.size(1) != cell.input_dim())
      fail(fmt::format("[edbatch.Decoder.step] x must be float32 of shape [{}, {}], got {} of "
                       "shape {}",
                       n, cell.input_dim(), c10::toString(x.scalar_type()), shape(x.sizes())));
    const c10::DeviceGuard guard(device_);
    const Tensor ids_c = ids.to(at::kCPU).contiguous();
    const bool on_device = device_.is_cuda() && device_resident(x);
    const Tensor x_c = x.to(on_device ? device_ : c10::Device(at::kCPU)).contiguous();
    // The new states are views of one buffer, one after another, so that the decoder reads them
    // at once (one gather on the device) and they move to x's device in one copy.
    int64_t floats = 0;
    for (uint32_t o = 0; o < cell.num_outputs(); ++o) floats += n * cell.output_size(o);
    const auto split = [&](const Tensor& all) {
      std::vector<Tensor> views;
      int64_t begin = 0;
      for (uint32_t o = 0; o < cell.num_outputs(); ++o) {
        const int64_t size = cell.output_size(o);
        views.push_back(all.narrow(0, begin, n * size).view({n, size}));
        begin += n * size;
      }
      return views;
    };
    const Tensor all = at::empty({floats}, at::dtype(at::kFloat).device(x_c.device()));
    std::vector<float*> outputs;
    for (const Tensor& t : split(all)) outputs.push_back(t.data_ptr<float>());
    // Start's states still in device memory: ahead of x for a step on the device, else through
    // the host now.
    Tensor x_in = x_c;
    if (start_states_.defined() && n > 0) {
      if (on_device) {
        x_in = at::cat({start_states_, x_c.reshape({-1})});
      } else {
        const Tensor host = start_states_.to(at::kCPU);
        decoder_->write_start_states(host.data_ptr<float>());
      }
    }
    try {
      decoder_->step(n, ids_c.data_ptr<int64_t>(), x_in.data_ptr<float>(), outputs, on_device,
                     on_device ? current_stream(x_c) : nullptr);
    } catch (const std::exception&) {
      // A step that ran and found a non-finite value (check_numerics) took start's states along.
      if (decoder_->start_states_pending() == 0) start_states_ = Tensor();
      fail_handled();
    }
    if (decoder_->start_states_pending() == 0) start_states_ = Tensor();
    return split(all.to(x.device()));
  }

  // running: int64, the running instances; positions: integers (any dtype and device, checked
  // for dtype and shape by the caller), for each instance of the loop from now on, the position
  // in `running` of the instance whose state it continues from (Decoder::reorder).
  void reorder(const Tensor& running, const Tensor& positions) {
    check_index_tensor(running, "running", -1);
    const Tensor run = running.to(at::kCPU).contiguous();
    const Tensor pos = positions.to(at::TensorOptions().device(at::kCPU).dtype(at::kLong))
                           .contiguous()
                           .reshape({-1});
    const int64_t n = run.numel(), m = pos.numel();
    const int64_t* from = run.data_ptr<int64_t>();
    const int64_t* p = pos.data_ptr<int64_t>();
    ids_.resize(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
      if (p[r] < 0 || p[r] >= n)
        fail(
            fmt::format("[StepDecoder.reorder] position {} is not a running row: positions are "
                        "in [0, {}) (the rows of the last step's output)",
                        p[r], n));
      ids_[static_cast<size_t>(r)] = from[p[r]];
    }
    try {
      decoder_->reorder(m, ids_.data());
    } catch (const std::exception&) {
      fail_handled();
    }
  }

  // [steps, graph nodes, scheduled nodes, kernel launches, batches, steps repeated, steps
  // copied, steps replanned]: scheduled nodes and launches add up over the steps since start
  // (each forward runs only its new nodes).
  std::vector<int64_t> stats() const {
    const Stats& s = decoder_->stats();
    return {decoder_->steps(),
            static_cast<int64_t>(decoder_->graph_nodes()),
            static_cast<int64_t>(s.nodes),
            static_cast<int64_t>(decoder_->kernels()),
            static_cast<int64_t>(s.batches),
            static_cast<int64_t>(decoder_->steps_repeated()),
            static_cast<int64_t>(decoder_->steps_copied()),
            static_cast<int64_t>(decoder_->steps_replanned())};
  }

  // The steps each instance has run since start.
  std::vector<int64_t> instance_steps() const {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < decoder_->num_instances(); ++i) v.push_back(decoder_->instance_steps(i));
    return v;
  }

 private:
  c10::Device device_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<Tensor> kept_;
  Tensor start_states_;       // start()'s states on the device, until the first step takes them
  std::vector<int64_t> ids_;  // reorder()'s
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(edbatch, m) {
  m.class_<TorchDecoder>("Decoder")
      .def(torch::init<std::string, int64_t, int64_t, std::string, int64_t, std::string>())
      .def("start", &TorchDecoder::start)
      .def("step", &TorchDecoder::step)
      .def("reorder", &TorchDecoder::reorder)
      .def("stats", &TorchDecoder::stats)
      .def("instance_steps", &TorchDecoder::instance_steps);
}

}  // namespace edbatch::torch_adapter
