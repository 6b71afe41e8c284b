// Optimizer steps on the device: the optimizer's slots live in device buffers beside the
// parameter mirror (same offsets), a step uploads its segments (dense parameters in runs, the
// touched columns of lazily updated lookup tables) and launches the norm reduction (clipping)
// and the update (optim.cu). Nothing goes to the host; what the device changed is fetched when
// host code reads it, as for the parameters.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

OptimizerSync::Slots& OptimizerSync::record(OptimizerState& state) {
  const uint64_t serial = state.serial();
  auto it = states_.find(serial);
  if (it != states_.end()) return *it->second;
  auto s = std::make_unique<Slots>();
  s->state = &state;
  // The state frees our copy when it is destroyed first.
  state.attach(this, [this, serial] { states_.erase(serial); });
  return *states_.emplace(serial, std::move(s)).first->second;
}

void OptimizerSync::upload(Slots& s, const ParamMirror& m, uint32_t slots) {
  const OptimizerState& state = *s.state;
  s.offset = m.offset;
  s.floats = m.floats;
  s.slots = slots;
  const size_t bytes = std::max<size_t>(m.floats, 1) * sizeof(float);
  staging_.reserve(bytes);
  float* h = staging_.as();
  for (uint32_t k = 0; k < slots; ++k) {
    s.buffers[k].reserve(bytes, queue_.stream());
    for (uint32_t id = 0; id < state.ids(); ++id)
      if (state.floats(id) > 0)
        std::memcpy(h + s.offset[id], state.slot(k, id), state.floats(id) * sizeof(float));
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(s.buffers[k].as(), h, m.floats * sizeof(float),
                                       cudaMemcpyHostToDevice, queue_.stream()));
    EDBATCH_CUDA_CHECK(cudaStreamSynchronize(queue_.stream()));  // the staging is reused
  }
  s.version = state.version();
}

// The pending fetch left in a state: host copies of its slots.
void OptimizerSync::fetch(uint64_t serial) {
  auto it = states_.find(serial);
  if (it == states_.end()) return;
  Slots& s = *it->second;
  OptimizerState& state = *s.state;
  queue_.wait();
  staging_.reserve(std::max<size_t>(s.floats, 1) * sizeof(float));
  float* h = staging_.as();
  for (uint32_t k = 0; k < s.slots; ++k) {
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(h, s.buffers[k].as(), s.floats * sizeof(float),
                                       cudaMemcpyDeviceToHost, queue_.stream()));
    EDBATCH_CUDA_CHECK(cudaStreamSynchronize(queue_.stream()));
    for (uint32_t id = 0; id < state.ids() && id < s.offset.size(); ++id)
      if (state.floats(id) > 0)
        std::memcpy(state.slot(k, id), h + s.offset[id], state.floats(id) * sizeof(float));
  }
}

void OptimizerSync::segments(const ParameterCollection& pc, const ParamMirror& m,
                             const UpdateRule& rule) {
  segments_.clear();
  for (uint32_t id = 0; id < pc.size(); ++id) {
    if (pc.is_view(id)) continue;  // updated through its base
    const uint64_t at = m.offset[id];
    if (pc.is_lookup(id) && rule.sparse_lookups) {
      const uint32_t rows = pc.dim(id).rows;
      for (uint32_t c : pc.touched_columns(id))
        segments_.push_back({at + uint64_t{c} * rows, rows, 0});
      continue;
    }
    const size_t n = pc.dim(id).size();
    for (size_t a = 0; a < n; a += kMaxSegmentFloats)
      segments_.push_back(
          {at + a, static_cast<uint32_t>(std::min<size_t>(kMaxSegmentFloats, n - a)), 0});
  }
}

void OptimizerSync::step(ParameterCollection& pc, const UpdateRule& rule, OptimizerState& state) {
  params_.sync(pc);
  params_.upload_grads_if_changed(pc);
  const ParamMirror& m = params_.mirror();
  const uint32_t slots = rule.slots();
  if (!state.covers(pc, slots)) state.ensure(pc, slots);  // fetches first
  Slots& s = record(state);
  if (slots > 0 && (s.version != state.version() || s.slots != slots || s.floats != m.floats ||
                    s.offset != m.offset)) {
    state.fetch_from_device();  // ours (with the old layout) or another backend's
    upload(s, m, slots);
  }
  segments(pc, m, rule);
  const uint32_t count = static_cast<uint32_t>(segments_.size());
  const UpdateSegment* d_segments = nullptr;
  if (count > 0) {
    const size_t bytes = segments_.size() * sizeof(UpdateSegment);
    char* h = uploads_.interop_staging(bytes).as<char>();
    std::memcpy(h, segments_.data(), bytes);
    d_segments = reinterpret_cast<const UpdateSegment*>(uploads_.upload_interop(h, bytes));
  }
  const double* d_norm = nullptr;
  if (rule.clip_norm > 0 && count > 0) {
    norm_.reserve(sizeof(double), queue_.stream());
    EDBATCH_CUDA_CHECK(cudaMemsetAsync(norm_.as<double>(), 0, sizeof(double), queue_.stream()));
    launch_squared_norm(m.grads.as(), d_segments, count, norm_.as<double>(), queue_.stream());
    d_norm = norm_.as<double>();
  }
  DeviceRule r;
  r.kind = static_cast<uint32_t>(rule.kind);
  r.momentum_slot = rule.kind == UpdateRule::Kind::Sgd && slots == 1 ? 1 : 0;
  r.lr = rule.lr;
  r.momentum = rule.momentum;
  r.beta1 = rule.beta1;
  r.beta2 = rule.beta2;
  r.eps = rule.eps;
  r.weight_decay = rule.weight_decay;
  r.grad_scale = rule.grad_scale;
  r.clip_norm = rule.clip_norm;
  r.bc1 = bias_correction(rule.beta1, rule.step);
  r.bc2 = bias_correction(rule.beta2, rule.step);
  launch_update(m.values.as(), m.grads.as(), slots > 0 ? s.buffers[0].as() : nullptr,
                slots > 1 ? s.buffers[1].as() : nullptr, d_segments, count, r, d_norm,
                queue_.stream());
  EDBATCH_CUDA_CHECK(cudaPeekAtLastError());
  queue_.note_queued("optimizer step", "the optimizer's norm and update kernels");
  queue_.mark_queued();
  params_.device_updated(pc);
  if (slots > 0) {
    const uint64_t serial = state.serial();
    state.set_device_fetch(this, [this, serial] { fetch(serial); });
  }
}

void OptimizerSync::release() {
  std::map<uint64_t, std::unique_ptr<Slots>> states = std::move(states_);
  states_.clear();
  for (auto& [serial, s] : states) {
    // Keep the record reachable while our own fetch runs.
    states_[serial] = std::move(s);
    OptimizerState* state = states_[serial]->state;
    try {
      if (state->device_fetch_owner() == this) state->fetch_from_device();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
    state->detach(this);
    states_.erase(serial);
  }
}

}  // namespace edbatch::cuda
