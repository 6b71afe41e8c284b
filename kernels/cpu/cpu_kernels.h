// Internal to the CPU backend: the kernel context, operand access and the kernel tables.
#pragma once
#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "edbatch/backend.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/op.h"
#include "kernels/cpu/gemm.h"

namespace edbatch::cpu {

// Grow-only float buffer: growth is counted, memory is never returned until destruction. Aligned
// for Eigen's widest packet (64 bytes with AVX-512), so values the plan aligns are aligned in
// memory and vector loops need no scalar peeling (2.4x on sigmoid/tanh over 128 floats).
class Buffer {
 public:
  float* data() { return data_.data(); }
  size_t size() const { return data_.size(); }
  // Returns true when it had to grow.
  bool reserve(size_t floats);

 private:
  std::vector<float, Eigen::aligned_allocator<float>> data_;
};

// Weights in the tiles' packed form (gemm_pack, gemm.h), made once and read by every product
// that multiplies by them. Forward: parameter weights W, kept across the passes of one stamp (the
// increments of one graph while the collection's version stays), and packed only once they have
// multiplied `min_columns` columns under it, so a weight a pass multiplies by a few columns is not
// copied for them. Backward: W^T of every shared weight (transposed, min_columns 0), made once
// per pass. The memory is kept for later passes. Thread-safe: threads that miss together pack one
// after another; a packed entry a thread has read before is found again without the lock.
class PackedWeights {
 public:
  PackedWeights(bool transposed, uint32_t min_columns);
  ~PackedWeights();  // where the memory was made: Eigen's alignment follows the build's flags
  // Entries made under another stamp are dropped.
  void new_pass(uint64_t stamp);
  // W (m x n, column-major, leading dimension m) packed, or W^T (n x m) when transposed, for a
  // product of `cols` columns; null while W has multiplied fewer than min_columns columns.
  const float* get(const float* w, uint32_t m, uint32_t n, uint32_t cols);
  size_t floats() const;
  uint64_t packs() const { return packs_; }  // weights packed so far

 private:
  const float* get_locked(const float* w, uint32_t m, uint32_t n, uint32_t cols);
  struct Entry {
    const float* w;
    uint32_t m, n;
    uint64_t columns;  // multiplied under the stamp, up to this product
    bool ready;        // packed holds W's packed form
    Buffer packed;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;  // [0, used_) valid under stamp_; the rest keep their memory
  size_t used_ = 0;
  uint64_t stamp_ = ~uint64_t{0};
  // Unique over every PackedWeights and stamp: the key of the threads' lock-free hits. Written
  // only by new_pass, between parallel regions.
  uint64_t generation_;
  uint64_t packs_ = 0;
  bool transposed_;
  uint32_t min_columns_;
};

struct Context;

// The gradients of parameter weights over a backward pass, formed at its end: dW = sum over the
// pass's batches of dY_b X_b^T as one product (gemm_acc_xt_parts), so dW is read and written
// once per pass rather than once per batch (a level of a tree, often a few columns). dY_b stays
// in the adjoint arena, which nothing writes once its batch ran; X_b is a view of the value
// arena or a gathered copy kept here. Not thread-safe: called between parallel regions.
class WeightGrads {
 public:
  void new_pass();
  // Room for `floats` gathered values, at *kept until finish() (the memory may move before).
  float* keep(size_t floats, size_t* kept, ExecCounters* counters);
  // dW (m x n) += dY (m x t, leading dimension m) X^T, X (n x t) at x, or kept at `kept`.
  void add(float* dw, uint32_t m, uint32_t n, uint32_t t, const float* dy, const float* x,
           size_t kept);
  // Every dW of the pass, each split by rows over the context's threads.
  void finish(const Context& c);
  size_t floats() const { return kept_.size(); }

 private:
  struct Part {
    float* dw;
    uint32_t m, n, t;
    const float* dy;
    const float* x;  // null: kept_ at `kept`
    size_t kept;
  };
  std::vector<Part> parts_;
  Buffer kept_;
  size_t kept_used_ = 0;
  std::vector<uint32_t> order_;
  std::vector<GemmPart> group_;
};

struct Context {
  float* values = nullptr;
  float* adjoints = nullptr;
  ParameterCollection* params = nullptr;
  const MemoryPlan* plan = nullptr;
  ExecCounters* counters = nullptr;
  Buffer* scratch_x = nullptr;   // GEMM operand gathers
  Buffer* scratch_dx = nullptr;  // GEMM input gradients before scattering
  PackedWeights* packed = nullptr;       // forward: parameter weights, packed
  PackedWeights* transposed = nullptr;   // backward: W^T per weight and pass, packed
  WeightGrads* weight_grads = nullptr;   // backward: parameter weight gradients (null: at once)
  // Backward of block calls by invocation range (call.cpp): affine and matmul kernels leave the
  // parameters' gradients (biases, weights) to linear_param_grads, run once for the whole batch.
  bool param_grads_later = false;
  int threads = 1;
  double min_parallel_work = 65536;
};

struct BatchArgs {
  Op op;
  Dim out_dim;         // of one node
  uint32_t count;      // nodes in the batch
  const BatchPlan* bp;
  const Operand* operands;
  const uint32_t* aux;  // per-node integer argument (lookup index, pick index, label, dropout key)
  uint32_t table;       // Lookup: the table's parameter id
  uint32_t first_row;   // SliceRows: the first row taken (Node::aux)
  float alpha, beta;    // Node::alpha, beta (ScalarAffine, ScalarDivide, LayerNorm, Dropout)
  const Graph* graph;
  const Node* first;    // the batch's first node: operand shapes are the same for all nodes
};

inline Dim arg_dim(const BatchArgs& b, uint32_t j) {
  return b.graph->node(b.graph->args(*b.first)[j]).dim;
}

inline const float* operand_value(const Context& c, const Operand& o, uint32_t i) {
  switch (o.mode) {
    case OperandMode::Param: return c.params->values(o.param);
    case OperandMode::Shared: return c.values + o.offset;
    case OperandMode::Contiguous: return c.values + o.offset + static_cast<size_t>(i) * o.stride;
    default: return c.values + c.plan->index[o.index_begin + i];
  }
}

inline float* operand_adjoint(const Context& c, const Operand& o, uint32_t i) {
  switch (o.mode) {
    case OperandMode::Param: return c.params->grads(o.param);
    case OperandMode::Shared: return c.adjoints + o.offset;
    case OperandMode::Contiguous: return c.adjoints + o.offset + static_cast<size_t>(i) * o.stride;
    default: return c.adjoints + c.plan->index[o.index_begin + i];
  }
}

// Node i's arguments of a ragged batch (sum, average, maximum): their count, and their arena
// offsets in *offs.
inline uint32_t ragged_args(const Context& c, const BatchArgs& b, uint32_t i,
                            const uint32_t** offs) {
  const uint32_t* rows = c.plan->index.data() + b.operands[0].index_begin;
  *offs = rows + b.count + 1 + rows[i];
  return rows[i + 1] - rows[i];
}

inline float* out_value(const Context& c, const BatchArgs& b, uint32_t i) {
  return c.values + b.bp->out_offset + static_cast<size_t>(i) * b.bp->out_size;
}
inline float* out_adjoint(const Context& c, const BatchArgs& b, uint32_t i) {
  return c.adjoints + b.bp->out_offset + static_cast<size_t>(i) * b.bp->out_size;
}

// Splits [0, n) into chunks over the context's threads when `work` (flops or floats) is large
// enough to pay for it; calls fn(begin, end) for each chunk.
void parallel_chunks(const Context& c, uint32_t n, double work, void (*fn)(void*, uint32_t, uint32_t),
                     void* state);
template <class F>
void for_chunks(const Context& c, uint32_t n, double work, const F& f) {
  parallel_chunks(c, n, work,
                  [](void* s, uint32_t b, uint32_t e) { (*static_cast<const F*>(s))(b, e); },
                  const_cast<F*>(&f));
}

// Sums of many vectors (a reduce over a node of large fan-in): y (n floats) = value(begin) + ...
// + value(end - 1), left to right up to kPairwiseBlock terms, and beyond as the sum of two halves
// (each a whole number of blocks) summed alike, so that rounding grows with log(count) as
// torch.sum's does, not with the count. `scratch` holds n floats per level of halving below this
// one (pairwise_scratch).
constexpr uint32_t kPairwiseBlock = 64;
template <class F>
void pairwise_sum(float* y, uint32_t n, uint32_t begin, uint32_t end, const F& value,
                  float* scratch) {
  if (end - begin <= kPairwiseBlock) {
    const float* v = value(begin);
    std::copy(v, v + n, y);
    for (uint32_t j = begin + 1; j < end; ++j) {
      v = value(j);
      for (uint32_t r = 0; r < n; ++r) y[r] += v[r];
    }
    return;
  }
  const uint32_t blocks = (end - begin + kPairwiseBlock - 1) / kPairwiseBlock;
  const uint32_t mid = begin + blocks / 2 * kPairwiseBlock;
  pairwise_sum(y, n, begin, mid, value, scratch + n);
  pairwise_sum(scratch, n, mid, end, value, scratch + n);
  for (uint32_t r = 0; r < n; ++r) y[r] += scratch[r];
}
// This thread's scratch for pairwise_sum over vectors of n floats (any count below 2^32).
float* pairwise_scratch(uint32_t n);

using Kernel = void (*)(Context&, const BatchArgs&);
struct KernelRow {
  Kernel forward;
  Kernel backward;
};
// One row per Op, defined in elementwise.cpp / linear.cpp.
const KernelRow& cpu_kernels(Op op);

void affine_forward(Context& c, const BatchArgs& b);
void affine_backward(Context& c, const BatchArgs& b);
void matmul_forward(Context& c, const BatchArgs& b);
void matmul_backward(Context& c, const BatchArgs& b);
// What affine_backward / matmul_backward leave out under Context::param_grads_later: the bias
// sum and the weight gradient of every product with a parameter weight, in the order they add
// them (so the gradients equal theirs bitwise).
void linear_param_grads(Context& c, const BatchArgs& b);
// Makes W^T of every shared weight the backward of b multiplies by (PackedWeights::get), so
// that threads do not wait for each other to pack it.
void linear_transposes(Context& c, const BatchArgs& b);

// rows.cpp: elementwise ops that are not a function of one element.
void slice_rows_forward(Context& c, const BatchArgs& b);
void slice_rows_backward(Context& c, const BatchArgs& b);
void softmax_forward(Context& c, const BatchArgs& b);
void softmax_backward(Context& c, const BatchArgs& b);
void log_softmax_forward(Context& c, const BatchArgs& b);
void log_softmax_backward(Context& c, const BatchArgs& b);
void layer_norm_forward(Context& c, const BatchArgs& b);
void layer_norm_backward(Context& c, const BatchArgs& b);
void max_index_forward(Context& c, const BatchArgs& b);
void max_index_backward(Context& c, const BatchArgs& b);
void column_sum_forward(Context& c, const BatchArgs& b);
void column_sum_backward(Context& c, const BatchArgs& b);
void broadcast_forward(Context& c, const BatchArgs& b);
void broadcast_backward(Context& c, const BatchArgs& b);
void average_forward(Context& c, const BatchArgs& b);
void average_backward(Context& c, const BatchArgs& b);
void maximum_forward(Context& c, const BatchArgs& b);
void maximum_backward(Context& c, const BatchArgs& b);
void dropout_forward(Context& c, const BatchArgs& b);
void dropout_backward(Context& c, const BatchArgs& b);

// Block call batches (call.cpp); return the kernels they ran.
uint32_t call_forward(Context& c, const PlanRef& p, size_t batch);
uint32_t call_backward(Context& c, const PlanRef& p, size_t batch);

}  // namespace edbatch::cpu
