// Encoding a pass: every batch of the plan becomes commands. Elementwise batches and fused groups
// of block steps: a step-group kernel each; GEMM steps: the fused GEMM kernel, or cuBLAS above its
// size (batched over members or nodes for per-member and per-node matrices, read in place).
#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/params.h"
#include "edbatch/schedule.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/op_math.h"

namespace edbatch::cuda {

namespace {

// The batch or block step being encoded, in the terms of MemoryPlan.
struct Item {
  Op op;
  uint32_t batch;
  const BatchPlan* sp;
  uint32_t k;            // invocations (plain batches: count)
  const Graph* graph;    // the graph `first` belongs to (a block body for block steps)
  const Node* first;
  const BlockPlan* block = nullptr;  // block steps: the block and the step
  const BlockStep* step = nullptr;
};

// True when block step `later` (after `earlier` in the block's forward order, same call) reads
// no value that `earlier` computes: their GEMMs may then share a launch, forward and backward.
bool independent(const Item& earlier, const Item& later) {
  if (!earlier.step || !later.step || earlier.block != later.block || earlier.batch != later.batch)
    return false;
  const BlockPlan& bp = *earlier.block;
  const Graph& body = *bp.body;
  const uint32_t* e0 = bp.members.data() + earlier.step->member_begin;
  const uint32_t* e1 = e0 + earlier.step->member_count;
  for (uint32_t j = 0; j < later.step->member_count; ++j) {
    const Node& n = body.node(bp.members[later.step->member_begin + j]);
    for (uint32_t a = 0; a < n.num_args; ++a)
      if (std::find(e0, e1, body.args(n)[a]) != e1) return false;
  }
  return true;
}

const char* gemm_name(bool forward) { return forward ? "gemm forward" : "gemm backward"; }

// The ops of the step kernels (steps.cu): the math ops of kernels/op_math.h and the rest of the
// elementwise ops, each a case of forward_item / backward_item. Affine and matmul go to the GEMM
// paths, calls run their block's steps, sources and views never run. Any other op is refused
// when a pass is encoded, naming it.
bool step_op(Op op) {
  static constexpr Op kOwn[] = {Op::Lookup,   Op::Sum,        Op::Average,   Op::Maximum,
                                Op::Concat,   Op::SliceRows,  Op::Pick,      Op::PickNegLogSoftmax,
                                Op::Softmax,  Op::LogSoftmax, Op::LayerNorm, Op::Dropout,
                                Op::MaxIndex, Op::ColumnSum,  Op::Broadcast};
  return math::is_unary(op) || math::is_binary(op) ||
         std::find(std::begin(kOwn), std::end(kOwn), op) != std::end(kOwn);
}

class Encoder {
 public:
  explicit Encoder(Pass& pass)
      : pass_(pass), plan_(pass.p->plan), params_(pass.p->params), fused_(pass.fused_linear) {}

  void run() {
    const Schedule& s = pass_.p->schedule;
    const size_t n = s.batches.size();
    for (size_t q = pass_.forward ? pass_.first_batch : 0; q < n; ++q) {
      const uint32_t b = static_cast<uint32_t>(pass_.forward ? q : n - 1 - q);
      if (!pass_.forward && pass_.skip_batches != nullptr && (*pass_.skip_batches)[b]) continue;
      const Node& first = pass_.p->graph.node(s.nodes[s.batches[b].begin]);
      if (first.op == Op::Call) {
        call(b, first);
        continue;
      }
      const Item it{first.op, b, &plan_.batches[b], plan_.batches[b].count, &pass_.p->graph, &first};
      if (first.op == Op::Affine || first.op == Op::MatMul)
        linear(it);
      else if (first.op == Op::Lookup)
        hoist_lookups({it});
      else
        steps({it});
    }
    // The pass's lookups, in one launch: first in forward (they read only tables and host
    // indices), last in backward (when every adjoint they pass on is complete).
    if (!pass_.lookups.empty()) {
      Command c{};
      c.kind = Command::Kind::Lookups;
      c.what = pass_.forward ? "lookups forward" : "lookups backward";
      c.batch = lookup_batch_;
      c.count = static_cast<uint32_t>(pass_.lookups.size());
      if (pass_.forward)
        pass_.commands.insert(pass_.commands.begin(), c);
      else
        pass_.commands.push_back(c);
    }
  }

 private:
  void call(uint32_t b, const Node& first) {
    const Block* block = params_.block(first.aux);
    if (block == nullptr)
      throw std::invalid_argument("[cuda] block '" + params_.block_name(first.aux) +
                                  "' was destroyed before its calls ran");
    const BlockPlan& bp = block->plan();
    const BatchPlan& call = plan_.batches[b];
    const size_t ng = bp.groups.size();
    for (size_t q = 0; q < ng; ++q) {
      const BlockGroup& g = bp.groups[pass_.forward ? q : ng - 1 - q];
      std::vector<Item> items;
      for (uint32_t s = g.step_begin; s < g.step_begin + g.step_count; ++s) {
        const BlockStep& st = bp.steps[s];
        items.push_back(Item{st.op, b, &plan_.steps[call.step_begin + s], call.count,
                             bp.body.get(), &bp.body->node(bp.members[st.member_begin]), &bp,
                             &st});
      }
      const bool lookups = std::all_of(items.begin(), items.end(),
                                       [](const Item& i) { return i.op == Op::Lookup; });
      if (items.size() == 1 && (items[0].op == Op::Affine || items[0].op == Op::MatMul))
        linear(items[0]);
      else if (lookups)
        hoist_lookups(items);
      else
        steps(items);
    }
  }

  Dim arg_dim(const Item& it, uint32_t j) const {
    return it.graph->node(it.graph->args(*it.first)[j]).dim;
  }

  // ---- elementwise family ----

  StepDesc describe(const Item& it) {
    if (!step_op(it.op))
      throw std::runtime_error(std::string("[cuda] op '") + op_name(it.op) + "' (batch " +
                               std::to_string(it.batch) + ") has no CUDA kernel");
    const BatchPlan& sp = *it.sp;
    StepDesc d{};
    d.op = static_cast<uint32_t>(it.op);
    d.count = sp.count;
    d.k = it.k;
    d.out_offset = sp.out_offset;
    d.out_size = sp.out_size;
    d.rows = it.first->dim.rows;
    d.operand_begin = sp.operand_begin;
    d.operand_count = sp.operand_count;
    d.aux_begin = sp.aux_begin;
    d.alpha = it.first->alpha;
    d.beta = it.first->beta;
    if (it.op == Op::Lookup) {
      d.table = pass_.param_offset[it.first->aux];
      if (!pass_.forward)
        for (uint32_t v = 0; v < sp.count; ++v)
          params_.mark_lookup_row(it.first->aux, plan_.aux[sp.aux_begin + v]);
    }
    if (it.op == Op::Pick || it.op == Op::PickNegLogSoftmax || it.op == Op::SliceRows ||
        it.op == Op::MaxIndex || it.op == Op::ColumnSum)
      d.arg_rows = arg_dim(it, 0).rows;
    if (it.op == Op::SliceRows) d.attr = it.first->aux;
    if (it.op == Op::Dropout) d.attr = math::dropout_threshold(it.first->alpha);
    if (it.op == Op::Sum)  // wide (device.h): small nodes, one of which has many arguments
      d.attr = sp.out_size <= kWideSumMaxSize && plan_.max_ragged_args(sp) >= kWideSumMinArgs;
    if (it.op == Op::Concat) {
      if (sp.operand_count > kMaxConcatArgs)
        throw std::runtime_error("[cuda] concat of " + std::to_string(sp.operand_count) +
                                 " arguments (batch " + std::to_string(it.batch) +
                                 "): the CUDA backend supports at most 8");
      for (uint32_t j = 0; j < sp.operand_count; ++j)
        d.concat_rows[j] = arg_dim(it, j).rows;
    }
    return d;
  }

  // Items in forward order, one launch per kMaxFusedSteps of them. Each launch runs its steps in
  // reverse in backward, so the launches go in reverse too: the later steps' adjoints first.
  void steps(const std::vector<Item>& items) {
    const size_t parts = (items.size() + kMaxFusedSteps - 1) / kMaxFusedSteps;
    for (size_t q = 0; q < parts; ++q) {
      const size_t begin = (pass_.forward ? q : parts - 1 - q) * kMaxFusedSteps;
      const size_t end = std::min(items.size(), begin + kMaxFusedSteps);
      StepGroup g{};
      g.k = items[begin].k;
      uint32_t per_invocation = 1, operands = 0, members = 0;
      RunStep run_steps[kMaxFusedSteps];
      for (size_t i = begin; i < end; ++i) {
        StepDesc& d = g.steps[g.step_count++] = describe(items[i]);
        run_steps[i - begin] = {items[i].block, items[i].step};
        d.cache_begin = operands;
        operands += d.operand_count;
        for (uint32_t j = 0; j < d.operand_count; ++j)
          if (plan_.operands[d.operand_begin + j].mode == OperandMode::PerMember)
            members += d.count / std::max(1u, d.k);
        per_invocation = std::max(per_invocation, d.count / std::max(1u, d.k) * items_per_node(d));
      }
      mark_pointwise_runs(g, run_steps, plan_, pass_.pointwise_runs && pass_.forward);
      if (operands <= kOperandCache && members <= kMemberCache) {
        g.cached_operands = operands;
        g.cached_members = members;
      }
      // Enough thread blocks to fill the GPU, each with a few thousand elements at most.
      const uint32_t spread = (g.k + 263) / 264;
      g.chunk = std::max(1u, std::min(spread, 4096u / per_invocation));
      if (g.k == 0) continue;
      Command c{};
      c.kind = Command::Kind::Steps;
      c.what = pass_.forward ? "steps forward" : "steps backward";
      c.batch = items[begin].batch;
      c.block_group = items[begin].step ? items[begin].step->group : kNoOperand;
      c.group = static_cast<uint32_t>(pass_.groups.size());
      pass_.groups.push_back(g);
      pass_.commands.push_back(c);
    }
  }

  void hoist_lookups(const std::vector<Item>& items) {
    for (const Item& it : items) {
      if (it.sp->count == 0) continue;
      if (pass_.lookups.empty()) lookup_batch_ = it.batch;
      const StepDesc d = describe(it);
      pass_.lookups.push_back(d);
      pass_.lookup_starts.push_back(pass_.lookup_starts.back() +
                                    lookup_blocks(static_cast<uint64_t>(d.count) * d.out_size));
    }
  }

  // ---- linear algebra ----

  static bool is_shared(OperandMode m) { return m == OperandMode::Param || m == OperandMode::Shared; }

  Operand member(const Operand& o, uint32_t& v, uint32_t k) const {
    if (o.mode != OperandMode::PerMember) return o;
    const Operand m = plan_.member_operands[o.index_begin + v / k];
    v %= k;
    return m;
  }

  size_t offset_of(const Operand& o, uint32_t v) const {
    switch (o.mode) {
      case OperandMode::Param: return pass_.param_offset[o.param];
      case OperandMode::Shared: return o.offset;
      case OperandMode::Contiguous: return o.offset + static_cast<size_t>(v) * o.stride;
      default: return plan_.index[o.index_begin + v];
    }
  }

  // Device address of node v's operand value (or adjoint), resolved on the host.
  float* value_at(const Operand& o0, uint32_t v, uint32_t k) const {
    const Operand o = member(o0, v, k);
    return (o.mode == OperandMode::Param ? pass_.params : pass_.values) + offset_of(o, v);
  }
  float* adjoint_at(const Operand& o0, uint32_t v, uint32_t k) const {
    const Operand o = member(o0, v, k);
    return (o.mode == OperandMode::Param ? pass_.grads : pass_.adjoints) + offset_of(o, v);
  }

  // The weight of each member, when every member's weight is shared by its nodes.
  bool member_weights(const Operand& w, uint32_t members) const {
    if (w.mode != OperandMode::PerMember) return false;
    for (uint32_t j = 0; j < members; ++j)
      if (!is_shared(plan_.member_operands[w.index_begin + j].mode)) return false;
    return true;
  }

  // True when the operand, or some member's, is a parameter or one value for the nodes.
  bool any_shared(const Operand& o, uint32_t members) const {
    if (o.mode != OperandMode::PerMember) return is_shared(o.mode);
    for (uint32_t j = 0; j < members; ++j)
      if (is_shared(plan_.member_operands[o.index_begin + j].mode)) return true;
    return false;
  }

  // True when the operand is a parameter, or every member's is.
  bool member_params(const Operand& o, uint32_t members) const {
    if (o.mode != OperandMode::PerMember) return o.mode == OperandMode::Param;
    for (uint32_t j = 0; j < members; ++j)
      if (plan_.member_operands[o.index_begin + j].mode != OperandMode::Param) return false;
    return true;
  }

  // True when the operand of all `count` nodes is one dense n x count*cols matrix in place.
  bool in_place(const Operand& x, uint32_t count, uint32_t k, uint32_t per_node) const {
    if (x.mode == OperandMode::Contiguous) return x.stride == per_node;
    if (x.mode != OperandMode::PerMember) return false;
    const uint32_t members = count / k;
    const Operand& m0 = plan_.member_operands[x.index_begin];
    for (uint32_t j = 0; j < members; ++j) {
      const Operand& m = plan_.member_operands[x.index_begin + j];
      if (m.mode != OperandMode::Contiguous || m.stride != per_node ||
          m.offset != m0.offset + static_cast<size_t>(j) * k * per_node)
        return false;
    }
    return true;
  }

  void need_scratch(size_t floats) { pass_.scratch_need = std::max(pass_.scratch_need, floats); }
  float* scratch(size_t at, size_t floats) {
    need_scratch(at + floats);
    return at + floats <= pass_.scratch_floats ? pass_.scratch + at : nullptr;
  }

  void gather(const Item& it, const Operand& o, uint32_t per_node, float* dst) {
    Command c{};
    c.kind = Command::Kind::Gather;
    c.what = "gather";
    c.batch = it.batch;
    c.operand = o;
    c.count = it.sp->count;
    c.k = it.k;
    c.per_node = per_node;
    c.buffer = dst;
    pass_.commands.push_back(c);
  }

  void scatter(const Item& it, const Operand& o, uint32_t per_node, float* src) {
    Command c{};
    c.kind = Command::Kind::Scatter;
    c.what = "scatter-add";
    c.batch = it.batch;
    c.operand = o;
    c.count = it.sp->count;
    c.k = it.k;
    c.per_node = per_node;
    c.buffer = src;
    pass_.commands.push_back(c);
    pass_.bytes_copied += static_cast<uint64_t>(it.sp->count) * per_node * sizeof(float);
  }

  void gemm(const Item& it, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int kk,
            const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    Command g{};
    g.kind = Command::Kind::Gemm;
    g.what = gemm_name(pass_.forward);
    g.batch = it.batch;
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.kk = kk;
    g.a = a;
    g.lda = lda;
    g.b = b;
    g.ldb = ldb;
    g.beta = beta;
    g.c = c;
    g.ldc = ldc;
    pass_.commands.push_back(g);
  }

  // A batched GEMM over the pointer triples (a[i], b[i], c[i]).
  void gemm_batched(const Item& it, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int kk, const std::vector<const float*>& a, int lda,
                    const std::vector<const float*>& b, int ldb, float beta,
                    const std::vector<const float*>& c, int ldc) {
    Command g{};
    g.kind = Command::Kind::GemmBatched;
    g.what = pass_.forward ? "batched gemm forward" : "batched gemm backward";
    g.batch = it.batch;
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.kk = kk;
    g.lda = lda;
    g.ldb = ldb;
    g.beta = beta;
    g.ldc = ldc;
    g.batch_count = static_cast<int>(a.size());
    g.ptr_begin = static_cast<uint32_t>(pass_.ptrs.size());
    pass_.ptrs.insert(pass_.ptrs.end(), a.begin(), a.end());
    pass_.ptrs.insert(pass_.ptrs.end(), b.begin(), b.end());
    pass_.ptrs.insert(pass_.ptrs.end(), c.begin(), c.end());
    pass_.commands.push_back(g);
  }

  // One fused launch per pass when every weight is shared by the batch or by each member and
  // the step is small enough that cuBLAS would not beat the simple tiled kernel.
  bool fused_linear(const Item& it) {
    const Operand* ops = plan_.operands.data() + it.sp->operand_begin;
    const bool affine = it.op == Op::Affine;
    const uint32_t count = it.sp->count, k = it.k, members = count / k;
    LinearDesc l{};
    l.count = count;
    l.k = k;
    l.cols = it.first->dim.cols;
    l.m = it.first->dim.rows;
    l.out_offset = it.sp->out_offset;
    l.out_size = it.sp->out_size;
    l.bias = affine ? it.sp->operand_begin : kNoOperand;
    double macs = 0;
    for (uint32_t j = affine ? 1 : 0; j + 1 < it.sp->operand_count; j += 2) {
      const Operand& w = ops[j];
      if (l.products == kMaxProducts) return false;
      const Dim wd = arg_dim(it, j);
      if ((!is_shared(w.mode) && !member_weights(w, members)) || wd.rows != l.m) return false;
      l.w[l.products] = it.sp->operand_begin + j;
      l.x[l.products] = it.sp->operand_begin + j + 1;
      l.n[l.products] = wd.cols;
      l.max_n = std::max(l.max_n, wd.cols);
      ++l.products;
      macs += static_cast<double>(wd.rows) * wd.cols * count * l.cols;
    }
    if (l.products == 0 || !fused_linear_size(macs, pass_.forward)) return false;
    linear_chunk_sizes(l, pass_.linear_min_blocks);
    l.splits = std::max(1u, std::min(16u, k * l.cols / 256));
    // db rides along with dW when each member's bias is one vector shared by its nodes.
    l.bias_in_w =
        affine && l.cols == 1 && (is_shared(ops[0].mode) || member_weights(ops[0], members));
    // Every weight a parameter (Command::params_only): a bias that is not one (a value shared by
    // the member's nodes, read by later batches) takes its gradient from the bias blocks by dX.
    bool params_only = true;
    for (uint32_t p = 0; p < l.products; ++p)
      params_only = params_only && member_params(plan_.operands[l.w[p]], members);
    if (params_only && l.bias_in_w && !member_params(ops[0], members)) l.bias_in_w = 0;
    l.bias_per_node = affine && !l.bias_in_w && !any_shared(ops[0], members);  // db = dY
    const uint32_t index = static_cast<uint32_t>(pass_.linears.size());
    pass_.linears.push_back(l);
    // The previous command is this call's previous GEMM step and the two are independent: one
    // launch runs both (backward walks the steps in reverse, so there `it` comes first).
    if (last_linear_ == pass_.commands.size() && last_linear_ > 0) {
      Command& prev = pass_.commands.back();
      if (prev.group2 == kNoOperand &&
          (pass_.forward ? independent(last_item_, it) : independent(it, last_item_))) {
        prev.group2 = index;
        prev.block_group2 = it.step->group;
        prev.params_only = prev.params_only && params_only;
        return true;
      }
    }
    last_item_ = it;
    last_linear_ = pass_.commands.size() + 1;
    auto add = [&](Command::Kind kind, const char* what) {
      Command c{};
      c.kind = kind;
      c.what = what;
      c.batch = it.batch;
      c.group = index;
      c.block_group = it.step ? it.step->group : kNoOperand;
      c.params_only = params_only;
      pass_.commands.push_back(c);
    };
    if (pass_.forward) {
      add(Command::Kind::LinearForward, "linear forward");
    } else {
      add(Command::Kind::LinearBackward, "linear backward");
    }
    return true;
  }

  void linear(const Item& it) {
    const Operand* ops = plan_.operands.data() + it.sp->operand_begin;
    const uint32_t count = it.sp->count;
    if (count == 0) return;
    if (fused_ && fused_linear(it)) return;
    const bool affine = it.op == Op::Affine;
    float* y = pass_.values + it.sp->out_offset;
    float* dy = pass_.adjoints + it.sp->out_offset;
    const uint32_t out_size = it.sp->out_size;
    if (affine && pass_.forward) gather(it, ops[0], out_size, y);  // biases first, GEMMs add
    if (affine && !pass_.forward) bias_backward(it, ops[0], dy);
    for (uint32_t j = affine ? 1 : 0; j + 1 < it.sp->operand_count; j += 2)
      product(it, ops[j], ops[j + 1], arg_dim(it, j), affine ? 1.0f : 0.0f);
  }

  void bias_backward(const Item& it, const Operand& bias, float* dy) {
    const uint32_t count = it.sp->count, size = it.sp->out_size;
    if (!is_shared(bias.mode)) {
      scatter(it, bias, size, dy);
      return;
    }
    Command c{};
    c.kind = Command::Kind::SumColumns;
    c.what = "bias gradient";
    c.batch = it.batch;
    c.m = static_cast<int>(size);
    c.n = static_cast<int>(count);
    c.a = dy;
    c.lda = static_cast<int>(size);
    c.c = adjoint_at(bias, 0, it.k);
    pass_.commands.push_back(c);
  }

  // Y += W X for the product with weight operand w and input operand x.
  void product(const Item& it, const Operand& w, const Operand& x, Dim wd, float beta) {
    const uint32_t count = it.sp->count, k = it.k, cols = it.first->dim.cols;
    const int m = static_cast<int>(wd.rows), n = static_cast<int>(wd.cols);
    const uint32_t px = wd.cols * cols, out_size = it.sp->out_size;
    const uint32_t members = count / k;
    const bool shared = is_shared(w.mode);
    const bool per_member = !shared && member_weights(w, members);
    float* y = pass_.values + it.sp->out_offset;
    float* dy = pass_.adjoints + it.sp->out_offset;
    if (!shared && !per_member) {
      per_node(it, w, x, m, n, static_cast<int>(cols), beta);
      return;
    }
    // X as one n x count*cols matrix: in place, or gathered into scratch.
    const bool direct = in_place(x, count, k, px);
    const size_t xfloats = static_cast<size_t>(count) * px;
    const float* xs = direct ? value_at(x, 0, k) : scratch(0, xfloats);
    if (!direct) {
      gather(it, x, px, const_cast<float*>(xs));
      pass_.bytes_copied += xfloats * sizeof(float);  // the scatter counts its own
    }
    float* dxs = direct ? adjoint_at(x, 0, k) : scratch(xfloats, xfloats);
    const float dx_beta = direct ? 1.0f : 0.0f;
    const int total = static_cast<int>(count * cols);
    if (shared) {
      const float* wp = value_at(w, 0, k);
      if (pass_.forward) {
        gemm(it, CUBLAS_OP_N, CUBLAS_OP_N, m, total, n, wp, m, xs, n, beta, y, m);
        return;
      }
      gemm(it, CUBLAS_OP_N, CUBLAS_OP_T, m, n, total, dy, m, xs, n, 1.0f, adjoint_at(w, 0, k), m);
      gemm(it, CUBLAS_OP_T, CUBLAS_OP_N, n, total, m, wp, m, dy, m, dx_beta, dxs, n);
    } else {
      // One GEMM per member over its k invocations, batched.
      const int per = static_cast<int>(k * cols);
      std::vector<const float*> wv(members), xv(members), yv(members), dyv(members), dwv(members),
          dxv(members);
      for (uint32_t j = 0; j < members; ++j) {
        wv[j] = value_at(w, j * k, k);
        dwv[j] = adjoint_at(w, j * k, k);
        xv[j] = xs + static_cast<size_t>(j) * k * px;
        dxv[j] = dxs + static_cast<size_t>(j) * k * px;
        yv[j] = y + static_cast<size_t>(j) * k * out_size;
        dyv[j] = dy + static_cast<size_t>(j) * k * out_size;
      }
      if (pass_.forward) {
        gemm_batched(it, CUBLAS_OP_N, CUBLAS_OP_N, m, per, n, wv, m, xv, n, beta, yv, m);
        return;
      }
      std::vector<const float*> sorted = dwv;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) {
        gemm_batched(it, CUBLAS_OP_N, CUBLAS_OP_T, m, n, per, dyv, m, xv, n, 1.0f, dwv, m);
      } else {  // members share a weight: their gradients must not be written concurrently
        for (uint32_t j = 0; j < members; ++j)
          gemm(it, CUBLAS_OP_N, CUBLAS_OP_T, m, n, per, dyv[j], m, xv[j], n, 1.0f,
               const_cast<float*>(dwv[j]), m);
      }
      gemm_batched(it, CUBLAS_OP_T, CUBLAS_OP_N, n, per, m, wv, m, dyv, m, dx_beta, dxv, n);
    }
    if (!pass_.forward && !direct) scatter(it, x, px, dxs);
  }

  // Y_v += A_v X_v with a matrix per node, read in place through pointer arrays.
  void per_node(const Item& it, const Operand& w, const Operand& x, int m, int n, int cols,
                float beta) {
    const uint32_t count = it.sp->count, k = it.k, out_size = it.sp->out_size;
    std::vector<const float*> av(count), xv(count), yv(count);
    for (uint32_t v = 0; v < count; ++v) {
      av[v] = value_at(w, v, k);
      xv[v] = value_at(x, v, k);
      yv[v] = (pass_.forward ? pass_.values : pass_.adjoints) + it.sp->out_offset +
              static_cast<size_t>(v) * out_size;
    }
    if (pass_.forward) {
      gemm_batched(it, CUBLAS_OP_N, CUBLAS_OP_N, m, cols, n, av, m, xv, n, beta, yv, m);
      return;
    }
    // Gradients go to scratch first (operands may repeat), then are added in place.
    const size_t asize = static_cast<size_t>(m) * n, xsize = static_cast<size_t>(n) * cols;
    float* da = scratch(0, count * asize);
    float* dx = scratch(count * asize, count * xsize);
    std::vector<const float*> dav(count), dxv(count);
    for (uint32_t v = 0; v < count; ++v) {
      dav[v] = da ? da + v * asize : nullptr;
      dxv[v] = dx ? dx + v * xsize : nullptr;
    }
    gemm_batched(it, CUBLAS_OP_N, CUBLAS_OP_T, m, n, cols, yv, m, xv, n, 0.0f, dav, m);
    gemm_batched(it, CUBLAS_OP_T, CUBLAS_OP_N, n, cols, m, av, m, yv, m, 0.0f, dxv, n);
    scatter(it, w, static_cast<uint32_t>(asize), da);
    scatter(it, x, static_cast<uint32_t>(xsize), dx);
  }

  // The last fused GEMM command (its index + 1, when it is still the last command) and its step.
  size_t last_linear_ = 0;
  uint32_t lookup_batch_ = 0;  // the first hoisted lookup's batch (for error messages)
  Item last_item_{};
  Pass& pass_;
  const MemoryPlan& plan_;
  ParameterCollection& params_;
  bool fused_;
};

}  // namespace

void encode_pass(Pass& pass) {
  pass.clear_output();
  Encoder(pass).run();
}

}  // namespace edbatch::cuda
