// The CPU backend: runs a plan batch by batch over one arena of values and one of adjoints,
// inside a TBB arena of the requested number of threads (at most the cores it may use).
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "edbatch/schedule.h"
#include "kernels/cpu/cpu_kernels.h"
#include "src/core/backends.h"
#include "src/core/huge_pages.h"

namespace edbatch::cpu {

namespace {
// A std::bad_alloc that says what could not be had (callers that catch bad_alloc still do).
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};
}  // namespace

bool Buffer::reserve(size_t floats) {
  if (floats <= data_.size()) return false;
  // Grow with headroom into a new buffer, advised huge pages before its first touch: the old
  // values copied, the rest zero-filled, which also takes the page faults up front.
  const size_t n = std::max(floats, data_.size() + data_.size() / 2);
  std::vector<float, Eigen::aligned_allocator<float>> grown;
  try {
    grown.reserve(n);
  } catch (const std::bad_alloc&) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "[cpu] out of memory: a mini-batch's values, adjoints or scratch could not "
                  "grow from %.1f to %.1f MiB",
                  static_cast<double>(data_.size()) * sizeof(float) / (1 << 20),
                  static_cast<double>(n) * sizeof(float) / (1 << 20));
    throw OutOfMemory(what);
  }
  advise_huge_pages(grown.data(), n * sizeof(float));
  grown.assign(data_.begin(), data_.end());
  grown.resize(n);
  data_.swap(grown);
  return true;
}

float* pairwise_scratch(uint32_t n) {
  // One level per halving of up to 2^32 terms in blocks of kPairwiseBlock.
  thread_local std::vector<float> scratch;
  const size_t need = size_t(n) * 32;
  if (scratch.size() < need) scratch.resize(need);
  return scratch.data();
}

void parallel_chunks(const Context& c, uint32_t n, double work,
                     void (*fn)(void*, uint32_t, uint32_t), void* state) {
  const uint32_t chunks = std::min<uint32_t>(static_cast<uint32_t>(c.threads), n);
  if (chunks <= 1 || work < c.min_parallel_work) {
    if (n > 0) fn(state, 0, n);
    return;
  }
  tbb::parallel_for(
      0u, chunks,
      [&](uint32_t k) {
        const uint32_t b = static_cast<uint32_t>(static_cast<uint64_t>(n) * k / chunks);
        const uint32_t e = static_cast<uint32_t>(static_cast<uint64_t>(n) * (k + 1) / chunks);
        if (b < e) fn(state, b, e);
      },
      tbb::simple_partitioner());
}

namespace {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o)
      : threads_(std::max(1, o.threads)), min_parallel_work_(o.min_parallel_work) {
    // Work is cut into threads_ chunks whatever the arena's size, so results depend only on
    // the requested count; beyond the cores the process may use, more workers would only take
    // turns (and TBB refuses them with a warning of its own).
    if (threads_ > 1)
      arena_ = std::make_unique<tbb::task_arena>(
          std::clamp(tbb::info::default_concurrency(), 1, threads_));
  }
  const char* name() const override { return "cpu"; }

  void forward(const PlanRef& p) override {
    // Packed weights last through the increments of a graph while the parameters stay.
    if (p.first_segment == 0 || p.params.values_version() != packed_version_) {
      ++packed_stamp_;
      packed_version_ = p.params.values_version();
    }
    packed_.new_pass(packed_stamp_);
    Context c = context(p);
    if (values_.reserve(p.plan.total_floats)) ++counters_.arena_growths;
    c.values = values_.data();
    const float* in = p.graph.input_values().data();
    for (size_t s = p.first_segment; s < p.plan.segments.size(); ++s) {
      const PlanSegment& seg = p.plan.segments[s];
      std::copy(in + seg.input_begin, in + seg.input_begin + seg.input_count,
                c.values + seg.input_offset);
    }
    uint64_t kernels = 0;
    const size_t first_batch = first_forward_batch(p);
    run([&] {
      for (size_t b = first_batch; b < p.schedule.batches.size(); ++b) {
        const BatchArgs args = batch_args(p, b);
        if (args.op == Op::Call) {
          kernels += call_forward(c, p, b);
          continue;
        }
        cpu_kernels(args.op).forward(c, args);
        ++kernels;
      }
    });
    counters_.kernels += kernels;
    counters_.stages += kernels;
    update_counters();
  }

  void backward(const PlanRef& p, const BackwardSeed& seed) override {
    if (seed.on_device)
      throw std::invalid_argument("[cpu] backward: seeds in device memory need a device backend");
    Context c = context(p);
    transposed_.new_pass(++backward_passes_);
    weight_grads_.new_pass();
    c.weight_grads = &weight_grads_;
    if (adjoints_.reserve(p.plan.total_floats)) ++counters_.arena_growths;
    c.values = values_.data();
    c.adjoints = adjoints_.data();
    uint64_t kernels = 0;
    run([&] {
      for_chunks(c, p.plan.total_floats, p.plan.total_floats, [&](uint32_t b, uint32_t e) {
        std::memset(c.adjoints + b, 0, (e - b) * sizeof(float));
      });
      if (seed.nodes == nullptr) {
        c.adjoints[p.plan.node_offset[seed.loss_node]] = 1.0f;
      } else {
        const float* v = seed.values;
        for (uint32_t node : *seed.nodes) {
          const Node& n = p.graph.node(node);
          const uint32_t size = n.dim.size();
          float* dst = n.op == Op::Parameter ? p.params.grads(n.aux)
                                             : c.adjoints + p.plan.node_offset[node];
          for (uint32_t r = 0; r < size; ++r) dst[r] += v[r];
          v += size;
        }
      }
      for (size_t b = p.schedule.batches.size(); b-- > 0;) {
        if (seed.skip_batches != nullptr && (*seed.skip_batches)[b]) continue;
        const BatchArgs args = batch_args(p, b);
        if (args.op == Op::Call) {
          kernels += call_backward(c, p, b);
          continue;
        }
        cpu_kernels(args.op).backward(c, args);
        ++kernels;
      }
      weight_grads_.finish(c);
    });
    counters_.kernels += kernels;
    counters_.stages += kernels;
    update_counters();
  }

  const float* value(const MemoryPlan& plan, uint32_t node) const override {
    return const_cast<Buffer&>(values_).data() + plan.node_offset[node];
  }
  const float* adjoint(const MemoryPlan& plan, uint32_t node) const override {
    return const_cast<Buffer&>(adjoints_).data() + plan.node_offset[node];
  }
  const float* arena(const MemoryPlan&, uint32_t offset, uint32_t, bool adjoints) const override {
    return const_cast<Buffer&>(adjoints ? adjoints_ : values_).data() + offset;
  }

 private:
  template <class F>
  void run(const F& f) {
    if (arena_)
      arena_->execute(f);
    else
      f();
  }

  Context context(const PlanRef& p) {
    Context c;
    c.params = &p.params;
    c.plan = &p.plan;
    c.counters = &counters_;
    c.scratch_x = &scratch_x_;
    c.scratch_dx = &scratch_dx_;
    c.packed = &packed_;
    c.transposed = &transposed_;
    c.threads = threads_;
    c.min_parallel_work = min_parallel_work_;
    return c;
  }

  static BatchArgs batch_args(const PlanRef& p, size_t b) {
    const Batch& batch = p.schedule.batches[b];
    const BatchPlan& bp = p.plan.batches[b];
    const Node& first = p.graph.node(p.schedule.nodes[batch.begin]);
    BatchArgs a;
    a.op = first.op;
    a.out_dim = first.dim;
    a.count = batch.count;
    a.bp = &bp;
    a.operands = p.plan.operands.data() + bp.operand_begin;
    a.aux = p.plan.aux.data() + bp.aux_begin;
    a.table = first.aux;
    a.first_row = first.aux;
    a.alpha = first.alpha;
    a.beta = first.beta;
    a.graph = &p.graph;
    a.first = &first;
    return a;
  }

  void update_counters() {
    counters_.packed_weights = packed_.packs() + transposed_.packs();
    counters_.arena_bytes =
        (values_.size() + adjoints_.size() + scratch_x_.size() + scratch_dx_.size() +
         packed_.floats() + transposed_.floats() + weight_grads_.floats()) *
        sizeof(float);
  }

  int threads_;
  double min_parallel_work_;
  std::unique_ptr<tbb::task_arena> arena_;
  Buffer values_, adjoints_, scratch_x_, scratch_dx_;
  // Forward products pack a parameter's weight once it has multiplied this many columns under
  // the stamp: a wider product or a few narrow ones pay for the copy (docs/performance.md).
  static constexpr uint32_t kPackAfterColumns = 64;
  PackedWeights packed_{false, kPackAfterColumns};
  PackedWeights transposed_{true, 0};
  uint64_t packed_stamp_ = 0, packed_version_ = 0, backward_passes_ = 0;
  WeightGrads weight_grads_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace edbatch::cpu
