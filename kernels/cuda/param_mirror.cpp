// The parameter mirror: device copies of a collection's values and gradients, uploaded when the
// collection's version moves, and fetched back when host code reads what the device changed.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/backend_parts.h"
#include "kernels/cuda/cuda_check.h"

namespace edbatch::cuda {

void ParamMirror::layout(ParameterCollection& pc, Stream s) {
  ranges.clear();
  for (uint32_t id = 0; id < pc.size(); ++id)
    if (!pc.is_view(id)) ranges.push_back({pc.values(id), pc.grads(id), pc.dim(id).size(), 0});
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.host_values < b.host_values; });
  // Merge storages that lie back to back in both values and gradients (stacked parameters).
  std::vector<Range> merged;
  for (const Range& r : ranges) {
    if (!merged.empty()) {
      Range& last = merged.back();
      if (last.host_values + last.floats == r.host_values &&
          last.host_grads + last.floats == r.host_grads) {
        last.floats += r.floats;
        continue;
      }
    }
    merged.push_back(r);
  }
  ranges = std::move(merged);
  floats = 0;
  for (Range& r : ranges) {
    r.device = floats;
    floats += (r.floats + 31) / 32 * 32;  // 128-byte aligned starts
  }
  offset.assign(pc.size(), 0);
  for (uint32_t id = 0; id < pc.size(); ++id) {
    const float* v = pc.values(id);
    auto it = std::upper_bound(ranges.begin(), ranges.end(), v,
                               [](const float* p, const Range& r) { return p < r.host_values; });
    if (it == ranges.begin() || v >= (it - 1)->host_values + (it - 1)->floats)
      throw std::runtime_error("[cuda] parameter '" + pc.name(id) + "' lies in no storage");
    --it;
    offset[id] = static_cast<uint32_t>(it->device + static_cast<size_t>(v - it->host_values));
  }
  values.reserve(std::max<size_t>(floats, 1) * sizeof(float), s);
  grads.reserve(std::max<size_t>(floats, 1) * sizeof(float), s);
  staging.reserve(std::max<size_t>(floats, 1) * sizeof(float));
}

// Host ranges <-> the device buffer, through the staging (synchronous: the staging is reused at
// once). `grads` picks the gradients' host ranges and buffer instead of the values'.
void ParamMirror::copy(bool grads_, bool to_device, Stream s) {
  float* host = staging.as();
  float* device = grads_ ? grads.as() : values.as();
  auto host_of = [grads_](const Range& r) { return grads_ ? r.host_grads : r.host_values; };
  if (to_device) {
    for (const Range& r : ranges)
      std::memcpy(host + r.device, host_of(r), r.floats * sizeof(float));
    EDBATCH_CUDA_CHECK(cudaMemcpyAsync(device, host, floats * sizeof(float),
                                       cudaMemcpyHostToDevice, s));
    EDBATCH_CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  EDBATCH_CUDA_CHECK(cudaMemcpyAsync(host, device, floats * sizeof(float),
                                     cudaMemcpyDeviceToHost, s));
  EDBATCH_CUDA_CHECK(cudaStreamSynchronize(s));
  for (const Range& r : ranges) std::memcpy(host_of(r), host + r.device, r.floats * sizeof(float));
}

void ParamSync::sync(ParameterCollection& pc) {
  pc_ = &pc;
  if (mirror_.values_version == pc.version()) return;
  // The host copies are the ones to upload: bring them up to date first (a fetch of ours or
  // of another device's is pending when the device updated them).
  pc.fetch_from_device();
  queue_.wait();  // the staging may still feed a queued copy
  mirror_.layout(pc, queue_.stream());
  mirror_.upload_values(queue_.stream());
  mirror_.values_version = pc.version();
  mirror_.grads_version = UINT64_MAX;  // the layout may have moved: upload before backward
  values_newer_ = grads_newer_ = false;
}

void ParamSync::upload_grads_if_changed(ParameterCollection& pc) {
  if (mirror_.grads_version == pc.version()) return;
  queue_.wait();
  mirror_.upload_grads(queue_.stream());
  mirror_.grads_version = pc.version();
  grads_newer_ = false;
}

void ParamSync::device_wrote(ParameterCollection& pc, bool values, bool grads) {
  if (values) values_newer_ = true;
  if (grads) grads_newer_ = true;
  pc.set_device_fetch(this, [this] { fetch(); });
}

void ParamSync::device_updated(ParameterCollection& pc) {
  values_newer_ = grads_newer_ = true;
  pc.updated_on_device(this, [this] { fetch(); });
  mirror_.values_version = mirror_.grads_version = pc.version();
}

void ParamSync::fetch_if_pending() {
  if (pc_ && pc_->device_fetch_owner() == this) pc_->fetch_from_device();
}

// The pending fetch left in the collection: host copies of what the device changed.
void ParamSync::fetch() {
  queue_.wait();
  if (values_newer_) mirror_.download_values(queue_.stream());
  if (grads_newer_) mirror_.download_grads(queue_.stream());
  values_newer_ = grads_newer_ = false;
}

}  // namespace edbatch::cuda
