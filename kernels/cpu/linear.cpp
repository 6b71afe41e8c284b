// GEMM kernels. A weight shared by the batch (a parameter, or one value read by every node)
// becomes one GEMM with a column per node; operands that are not contiguous are gathered first,
// and those bytes are counted, except operands of kDirectGemmCols columns or more, multiplied in
// place one node at a time. Per-node matrices (MV-RNN) run one small GEMM per node. Forward
// products run gemm_acc (gemm.cpp), and so do the backward products of batched operands.
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <atomic>
#include <tuple>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm.h"
#include "memplan/outer_order.h"

namespace edbatch::cpu {

namespace {

// Parameter weight gradients of batches narrower than this are formed at the end of the pass
// (WeightGrads).
constexpr uint32_t kDeferColumns = 64;

using Mat = Eigen::Map<Eigen::MatrixXf>;
using CMat = Eigen::Map<const Eigen::MatrixXf>;

bool is_shared(const Operand& o) {
  return o.mode == OperandMode::Param || o.mode == OperandMode::Shared;
}

// The batch's X operand as one n x (count*c) matrix: a view when contiguous, else gathered into
// scratch for columns of nodes [i0, i1).
const float* stacked_operand(Context& c, const Operand& xo, uint32_t per_node,
                             uint32_t i0, uint32_t i1, float* scratch) {
  if (xo.mode == OperandMode::Contiguous && xo.stride == per_node)
    return c.values + xo.offset + static_cast<size_t>(i0) * per_node;
  for (uint32_t i = i0; i < i1; ++i) {
    const float* x = operand_value(c, xo, i);
    std::copy(x, x + per_node, scratch + static_cast<size_t>(i - i0) * per_node);
  }
  return scratch;
}

// Y (m x k) += W X, or with `bias` Y = bias + W X (gemm_bias), through W's packed form when there
// is one: the same sums in the same order as gemm_acc, so the same bits. One column stays
// gemm_acc's matrix-vector product.
void weight_product(uint32_t m, uint32_t n, uint32_t k, const float* w, const float* packed,
                    const float* x, float* y, const float* bias) {
  if (packed && k > 1) {
    if (bias)
      gemm_bias_packed(m, n, k, packed, x, n, bias, y, m);
    else
      gemm_acc_packed(m, n, k, packed, x, n, y, m);
  } else if (bias) {
    gemm_bias(m, n, k, w, m, x, n, bias, y, m);
  } else {
    gemm_acc(m, n, k, w, m, x, n, y, m);
  }
}

// dX (n x k) += W^T dY through W^T's packed form (one column: Eigen's matrix-vector product).
void transposed_product(uint32_t m, uint32_t n, uint32_t k, const float* w, const float* wt,
                        const float* dy, float* dx) {
  if (k > 1)
    gemm_acc_packed(n, m, k, wt, dy, m, dx, n);
  else
    Mat(dx, n, 1).noalias() += CMat(w, m, n).transpose() * CMat(dy, m, 1);
}

bool needs_gather(const Operand& xo, uint32_t per_node) {
  return !(xo.mode == OperandMode::Contiguous && xo.stride == per_node);
}

// Scattered x operands of kDirectGemmCols columns or more are multiplied where they are.
bool direct(const Operand& xo, uint32_t per_node, uint32_t cols) {
  return needs_gather(xo, per_node) && cols >= kDirectGemmCols;
}

// Y(m x count*cols) += W(m x n) * X, W shared by the batch (param: a parameter, multiplied
// through its packed form once it has one, PackedWeights). With `bias` (m floats; one column per
// node) Y = bias + W X: the products' sums start from it instead of from Y.
void shared_weight_forward(Context& c, const BatchArgs& b, const float* w, uint32_t m, uint32_t n,
                           const Operand& xo, bool param, const float* bias = nullptr) {
  const uint32_t cols = b.out_dim.cols;
  const uint32_t per_node = n * cols;
  CMat W(w, m, n);
  Mat Y(out_value(c, b, 0), m, static_cast<Eigen::Index>(b.count) * cols);
  if (is_shared(xo)) {
    if (bias) Y.colwise() = Eigen::Map<const Eigen::VectorXf>(bias, m);
    Eigen::MatrixXf wx = W * CMat(operand_value(c, xo, 0), n, cols);
    for (uint32_t i = 0; i < b.count; ++i) Y.middleCols(i * cols, cols) += wx;
    return;
  }
  const float* packed = param && c.packed ? c.packed->get(w, m, n, b.count * cols) : nullptr;
  if (direct(xo, per_node, cols)) {
    for_chunks(c, b.count, 2.0 * m * n * b.count * cols, [&](uint32_t i0, uint32_t i1) {
      for (uint32_t i = i0; i < i1; ++i)
        weight_product(m, n, cols, w, packed, operand_value(c, xo, i), out_value(c, b, i), bias);
    });
    return;
  }
  float* scratch = nullptr;
  if (needs_gather(xo, per_node)) {
    c.scratch_x->reserve(static_cast<size_t>(b.count) * per_node);
    scratch = c.scratch_x->data();
    c.counters->bytes_copied += static_cast<uint64_t>(b.count) * per_node * sizeof(float);
  }
  for_chunks(c, b.count, 2.0 * m * n * b.count * cols, [&](uint32_t i0, uint32_t i1) {
    const float* x = stacked_operand(c, xo, per_node, i0, i1,
                                     scratch ? scratch + static_cast<size_t>(i0) * per_node : nullptr);
    weight_product(m, n, (i1 - i0) * cols, w, packed, x,
                   Y.data() + static_cast<size_t>(i0) * cols * m, bias);
  });
}

void weight_gradient(Context& c, const BatchArgs& b, float* dw, uint32_t m, uint32_t n,
                     const Operand& xo, bool param);

// Sum over the batch's nodes of dY_i (m x cols), for a shared X.
Eigen::MatrixXf summed_adjoint(const Context& c, const BatchArgs& b, uint32_t m) {
  const uint32_t cols = b.out_dim.cols;
  Eigen::MatrixXf s = Eigen::MatrixXf::Zero(m, cols);
  for (uint32_t i = 0; i < b.count; ++i) s += CMat(out_adjoint(c, b, i), m, cols);
  return s;
}

// dW += dY X^T for a shared W (param: a parameter, whose gradient may wait for the end of the
// pass, weight_gradient).
void shared_weight_gradient(Context& c, const BatchArgs& b, float* dw, uint32_t m, uint32_t n,
                            const Operand& xo, bool param) {
  const uint32_t cols = b.out_dim.cols;
  Mat dW(dw, m, n);
  if (is_shared(xo)) {
    dW.noalias() += summed_adjoint(c, b, m) * CMat(operand_value(c, xo, 0), n, cols).transpose();
    return;
  }
  if (!direct(xo, n * cols, cols)) {
    weight_gradient(c, b, dw, m, n, xo, param);
    return;
  }
  for_chunks(c, m, 2.0 * m * n * b.count * cols, [&](uint32_t r0, uint32_t r1) {
    for (uint32_t i = 0; i < b.count; ++i)
      dW.middleRows(r0, r1 - r0).noalias() +=
          CMat(out_adjoint(c, b, i), m, cols).middleRows(r0, r1 - r0) *
          CMat(operand_value(c, xo, i), n, cols).transpose();
  });
}

// dW += dY X^T (shared_weight_gradient) and dX += W^T dY for a shared W. With
// c.param_grads_later a parameter's dW is left out (linear_param_grads adds it afterwards).
void shared_weight_backward(Context& c, const BatchArgs& b, const float* w, float* dw, uint32_t m,
                            uint32_t n, const Operand& xo, bool param) {
  if (!(param && c.param_grads_later)) shared_weight_gradient(c, b, dw, m, n, xo, param);
  const uint32_t cols = b.out_dim.cols;
  const uint32_t per_node = n * cols;
  const Eigen::Index total = static_cast<Eigen::Index>(b.count) * cols;
  CMat W(w, m, n);
  if (is_shared(xo)) {
    Mat(operand_adjoint(c, xo, 0), n, cols).noalias() += W.transpose() * summed_adjoint(c, b, m);
    return;
  }
  if (direct(xo, per_node, cols)) {
    // Serially: an operand may repeat within the batch.
    for (uint32_t i = 0; i < b.count; ++i)
      Mat(operand_adjoint(c, xo, i), n, cols).noalias() +=
          W.transpose() * CMat(out_adjoint(c, b, i), m, cols);
    return;
  }
  const bool gather = needs_gather(xo, per_node);
  const double flops = 2.0 * m * n * total;
  // dX += W^T dY reads its operands in place, with W^T packed once per pass (PackedWeights),
  // where Eigen would pack both operands of every product.
  const float* dy = out_adjoint(c, b, 0);
  const float* wt = c.transposed->get(w, m, n, static_cast<uint32_t>(total));
  if (!gather) {
    float* dx = c.adjoints + xo.offset;
    for_chunks(c, b.count, flops, [&](uint32_t i0, uint32_t i1) {
      const size_t c0 = static_cast<size_t>(i0) * cols;
      transposed_product(m, n, (i1 - i0) * cols, w, wt, dy + c0 * m, dx + c0 * n);
    });
    return;
  }
  c.scratch_dx->reserve(static_cast<size_t>(b.count) * per_node);
  float* dxs = c.scratch_dx->data();
  for_chunks(c, b.count, flops, [&](uint32_t i0, uint32_t i1) {
    const size_t c0 = static_cast<size_t>(i0) * cols;
    std::fill(dxs + c0 * n, dxs + (c0 + static_cast<size_t>(i1 - i0) * cols) * n, 0.0f);
    transposed_product(m, n, (i1 - i0) * cols, w, wt, dy + c0 * m, dxs + c0 * n);
  });
  // Scatter serially: an operand may repeat within the batch.
  c.counters->bytes_copied += static_cast<uint64_t>(b.count) * per_node * sizeof(float);
  for (uint32_t i = 0; i < b.count; ++i) {
    float* dx = operand_adjoint(c, xo, i);
    const float* src = dxs + static_cast<size_t>(i) * per_node;
    for (uint32_t r = 0; r < per_node; ++r) dx[r] += src[r];
  }
}

// dW += dY X^T for a shared W and an operand X that is neither shared nor multiplied in place:
// a parameter's at the end of the pass when the batch is narrow and the context collects them,
// else now, split by rows of W.
void weight_gradient(Context& c, const BatchArgs& b, float* dw, uint32_t m, uint32_t n,
                     const Operand& xo, bool param) {
  const uint32_t cols = b.out_dim.cols;
  const uint32_t per_node = n * cols;
  const Eigen::Index total = static_cast<Eigen::Index>(b.count) * cols;
  const bool gather = needs_gather(xo, per_node);
  // Narrow batches only: a wide one's product already pays for reading dW, and runs while its
  // operands are in cache.
  WeightGrads* later = param && total < kDeferColumns ? c.weight_grads : nullptr;
  const float* x = nullptr;
  size_t kept = 0;
  if (gather) {
    const size_t floats = static_cast<size_t>(b.count) * per_node;
    float* dst = later ? later->keep(floats, &kept, c.counters)
                       : (c.scratch_x->reserve(floats), c.scratch_x->data());
    x = stacked_operand(c, xo, per_node, 0, b.count, dst);
    c.counters->bytes_copied += static_cast<uint64_t>(b.count) * per_node * sizeof(float);
  } else {
    x = stacked_operand(c, xo, per_node, 0, b.count, nullptr);
  }
  const float* dy = out_adjoint(c, b, 0);
  const uint32_t t = static_cast<uint32_t>(total);
  if (later) {
    later->add(dw, m, n, t, dy, gather ? nullptr : x, kept);
    return;
  }
  // Split by rows of W, so threads never write the same element.
  for_chunks(c, m, 2.0 * m * n * total, [&](uint32_t r0, uint32_t r1) {
    gemm_acc_xt(r1 - r0, t, n, dy + r0, m, x, n, dw + r0, m);
  });
}

bool both_contiguous(const Operand& a, const Operand& x) {
  return a.mode == OperandMode::Contiguous && x.mode == OperandMode::Contiguous;
}

// Y_i += A_i X_i with a different A per node.
void per_node_forward(Context& c, const BatchArgs& b, const Operand& ao, uint32_t m, uint32_t n,
                      const Operand& xo) {
  const uint32_t cols = b.out_dim.cols;
  for_chunks(c, b.count, 2.0 * m * n * cols * b.count, [&](uint32_t i0, uint32_t i1) {
    for (uint32_t i = i0; i < i1; ++i)
      gemm_acc(m, n, cols, operand_value(c, ao, i), m, operand_value(c, xo, i), n,
               out_value(c, b, i), m);
  });
}

void per_node_backward(Context& c, const BatchArgs& b, const Operand& ao, uint32_t m, uint32_t n,
                       const Operand& xo) {
  const uint32_t cols = b.out_dim.cols;
  auto body = [&](uint32_t i0, uint32_t i1) {
    for (uint32_t i = i0; i < i1; ++i) {
      CMat dY(out_adjoint(c, b, i), m, cols);
      CMat A(operand_value(c, ao, i), m, n);
      CMat X(operand_value(c, xo, i), n, cols);
      Mat(operand_adjoint(c, ao, i), m, n).noalias() += dY * X.transpose();
      Mat(operand_adjoint(c, xo, i), n, cols).noalias() += A.transpose() * dY;
    }
  };
  // Distinct nodes write distinct adjoints only when both operands are contiguous views.
  if (both_contiguous(ao, xo))
    for_chunks(c, b.count, 4.0 * m * n * cols * b.count, body);
  else
    body(0, b.count);
}

void product_forward(Context& c, const BatchArgs& b, uint32_t slot) {
  const Operand& ao = b.operands[slot];
  const Operand& xo = b.operands[slot + 1];
  const Dim a = arg_dim(b, slot);
  if (is_shared(ao))
    shared_weight_forward(c, b, operand_value(c, ao, 0), a.rows, a.cols, xo,
                          ao.mode == OperandMode::Param);
  else
    per_node_forward(c, b, ao, a.rows, a.cols, xo);
}

// The first product slot of an affine (after its bias) or a matmul.
uint32_t first_product(const BatchArgs& b) {
  return b.op == Op::Affine ? 1 : 0;
}

void product_backward(Context& c, const BatchArgs& b, uint32_t slot) {
  const Operand& ao = b.operands[slot];
  const Operand& xo = b.operands[slot + 1];
  const Dim a = arg_dim(b, slot);
  if (is_shared(ao))
    shared_weight_backward(c, b, operand_value(c, ao, 0), operand_adjoint(c, ao, 0), a.rows, a.cols,
                           xo, ao.mode == OperandMode::Param);
  else
    per_node_backward(c, b, ao, a.rows, a.cols, xo);
}

}  // namespace

namespace {

// A thread's latest lookups of packed entries, (generation, W, m, n) -> packed form, read without
// the lock: two threads running one block's products would otherwise take it in turns on every
// product (a futex call each time they collide). A generation names one PackedWeights under one
// stamp, never reused, so an entry of another object or an earlier stamp never matches; within a
// generation a packed entry's memory stays where it is.
struct PackedHit {
  uint64_t generation;  // 0: empty
  const float* w;
  uint32_t m, n;
  const float* packed;
};
constexpr size_t kPackedHits = 16;
thread_local std::array<PackedHit, kPackedHits> t_packed_hits{};
thread_local size_t t_next_packed_hit = 0;
std::atomic<uint64_t> g_packed_generations{0};

}  // namespace

PackedWeights::PackedWeights(bool transposed, uint32_t min_columns)
    : generation_(++g_packed_generations), transposed_(transposed), min_columns_(min_columns) {}

PackedWeights::~PackedWeights() = default;

void PackedWeights::new_pass(uint64_t stamp) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (stamp == stamp_) return;
  stamp_ = stamp;
  generation_ = ++g_packed_generations;
  used_ = 0;
}

const float* PackedWeights::get(const float* w, uint32_t m, uint32_t n, uint32_t cols) {
  for (const PackedHit& h : t_packed_hits)
    if (h.generation == generation_ && h.w == w && h.m == m && h.n == n) return h.packed;
  const float* packed = get_locked(w, m, n, cols);
  if (packed)
    t_packed_hits[t_next_packed_hit++ % kPackedHits] = PackedHit{generation_, w, m, n, packed};
  return packed;
}

const float* PackedWeights::get_locked(const float* w, uint32_t m, uint32_t n, uint32_t cols) {
  // The threads' hits hold packed memory: entries_ growing must move it, not copy it.
  static_assert(std::is_nothrow_move_constructible_v<Entry>);
  const std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = nullptr;
  for (size_t i = 0; i < used_ && !e; ++i)
    if (entries_[i].w == w && entries_[i].m == m && entries_[i].n == n) e = &entries_[i];
  if (!e) {
    if (used_ == entries_.size()) entries_.emplace_back();
    e = &entries_[used_++];
    e->w = w;
    e->m = m;
    e->n = n;
    e->columns = 0;
    e->ready = false;
  }
  e->columns += cols;
  if (e->ready) return e->packed.data();
  if (e->columns < min_columns_) return nullptr;
  e->packed.reserve(transposed_ ? gemm_packed_size(n, m) : gemm_packed_size(m, n));
  if (transposed_)
    gemm_pack_transposed(m, n, w, m, e->packed.data());
  else
    gemm_pack(m, n, w, m, e->packed.data());
  e->ready = true;
  ++packs_;
  return e->packed.data();
}

void WeightGrads::new_pass() {
  parts_.clear();
  kept_used_ = 0;
}

float* WeightGrads::keep(size_t floats, size_t* kept, ExecCounters* counters) {
  if (kept_.reserve(kept_used_ + floats)) ++counters->arena_growths;
  *kept = kept_used_;
  kept_used_ += floats;
  return kept_.data() + *kept;
}

void WeightGrads::add(float* dw, uint32_t m, uint32_t n, uint32_t t, const float* dy,
                      const float* x, size_t kept) {
  parts_.push_back(Part{dw, m, n, t, dy, x, kept});
}

void WeightGrads::finish(const Context& c) {
  // One product per gradient matrix (a parameter, or a view of one with its own shape), its
  // parts in the order the pass added them, so results do not depend on the thread count.
  // Products run one after another: views of one parameter may overlap.
  auto key = [&](uint32_t i) {
    return std::make_tuple(reinterpret_cast<uintptr_t>(parts_[i].dw), parts_[i].m, parts_[i].n, i);
  };
  order_.resize(parts_.size());
  for (uint32_t i = 0; i < order_.size(); ++i) order_[i] = i;
  std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) { return key(a) < key(b); });
  for (size_t g0 = 0, g1 = 0; g0 < order_.size(); g0 = g1) {
    const Part& head = parts_[order_[g0]];
    group_.clear();
    double flops = 0;
    for (g1 = g0; g1 < order_.size(); ++g1) {
      const Part& p = parts_[order_[g1]];
      if (p.dw != head.dw || p.m != head.m || p.n != head.n) break;
      group_.push_back(GemmPart{p.dy, p.x ? p.x : kept_.data() + p.kept, p.t});
      flops += 2.0 * p.m * p.n * p.t;
    }
    for_chunks(c, head.m, flops, [&](uint32_t r0, uint32_t r1) {
      gemm_acc_xt_parts(r1 - r0, head.n, group_.data(), static_cast<uint32_t>(group_.size()), r0,
                        head.m, head.n, head.dw + r0, head.m);
    });
  }
  parts_.clear();
}

size_t PackedWeights::floats() const {
  size_t f = 0;
  for (const Entry& e : entries_) f += e.packed.size();
  return f;
}

void affine_forward(Context& c, const BatchArgs& b) {
  const uint32_t size = b.out_dim.size();
  const Operand& bias = b.operands[0];
  // A bias shared by the batch, one column per node, is where the first product's sums start
  // when that product's weight is shared too (one GEMM over the batch's columns): the same bits
  // as setting every output to the bias first, without that pass over the outputs.
  uint32_t j = 1;
  if (is_shared(bias) && b.out_dim.cols == 1 && b.bp->operand_count >= 3 &&
      is_shared(b.operands[1])) {
    const Dim a = arg_dim(b, 1);
    shared_weight_forward(c, b, operand_value(c, b.operands[1], 0), a.rows, a.cols, b.operands[2],
                          b.operands[1].mode == OperandMode::Param, operand_value(c, bias, 0));
    j = 3;
  } else {
    for (uint32_t i = 0; i < b.count; ++i) {
      const float* src = operand_value(c, bias, i);
      std::copy(src, src + size, out_value(c, b, i));
    }
  }
  for (; j + 1 < b.bp->operand_count; j += 2) product_forward(c, b, j);
}

void affine_backward(Context& c, const BatchArgs& b) {
  const uint32_t size = b.out_dim.size();
  const Operand& bias = b.operands[0];
  for (uint32_t i = 0; i < b.count; ++i) {
    if (c.param_grads_later && bias.mode == OperandMode::Param) break;
    float* db = operand_adjoint(c, bias, i);
    const float* dy = out_adjoint(c, b, i);
    for (uint32_t r = 0; r < size; ++r) db[r] += dy[r];
  }
  for (uint32_t j = 1; j + 1 < b.bp->operand_count; j += 2) product_backward(c, b, j);
}

void matmul_forward(Context& c, const BatchArgs& b) {
  std::fill(out_value(c, b, 0), out_value(c, b, 0) + static_cast<size_t>(b.count) * b.out_dim.size(),
            0.0f);
  product_forward(c, b, 0);
}

void matmul_backward(Context& c, const BatchArgs& b) { product_backward(c, b, 0); }

void linear_param_grads(Context& c, const BatchArgs& b) {
  if (b.op == Op::Affine && b.operands[0].mode == OperandMode::Param) {
    float* db = operand_adjoint(c, b.operands[0], 0);
    for (uint32_t i = 0; i < b.count; ++i) {
      const float* dy = out_adjoint(c, b, i);
      for (uint32_t r = 0; r < b.out_dim.size(); ++r) db[r] += dy[r];
    }
  }
  for (uint32_t j = first_product(b); j + 1 < b.bp->operand_count; j += 2) {
    const Operand& ao = b.operands[j];
    if (ao.mode != OperandMode::Param) continue;
    const Dim a = arg_dim(b, j);
    shared_weight_gradient(c, b, operand_adjoint(c, ao, 0), a.rows, a.cols, b.operands[j + 1],
                           true);
  }
}

void linear_transposes(Context& c, const BatchArgs& b) {
  for (uint32_t j = first_product(b); j + 1 < b.bp->operand_count; j += 2)
    if (is_shared(b.operands[j])) {
      const Dim a = arg_dim(b, j);
      c.transposed->get(operand_value(c, b.operands[j], 0), a.rows, a.cols, 0);
    }
}

}  // namespace edbatch::cpu
