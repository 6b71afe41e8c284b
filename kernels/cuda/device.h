// Internal to the CUDA backend: plain data shared by the host code (.cpp) and the kernels (.cu),
// and the launchers the kernels export. No CUDA types appear here, so the host side needs only
// cuda_runtime.h for the stream.
#pragma once
#include <cstdint>

#include "edbatch/memplan.h"
#include "edbatch/op.h"
#include "kernels/op_math.h"  // EDBATCH_HD

struct CUstream_st;

namespace edbatch::cuda {

using Stream = CUstream_st*;

// Device addresses every kernel resolves operands against. The metadata arrays are copies of
// the memory plan's, uploaded once per pass.
struct DeviceView {
  float* values = nullptr;
  float* adjoints = nullptr;
  float* params = nullptr;  // every parameter's values, at param_offset[id]
  float* grads = nullptr;   // and gradients, at the same offsets
  const uint32_t* param_offset = nullptr;
  const Operand* operands = nullptr;
  const Operand* member_operands = nullptr;
  const uint32_t* index = nullptr;
  const uint32_t* aux = nullptr;
};

// One elementwise-family step (a plain batch, or one step of a block's plan) over `count`
// virtual nodes. Node v of a block step belongs to member v / k and invocation v % k; a plain
// batch has k = count.
struct StepDesc {
  uint32_t op;  // edbatch::Op
  uint32_t count, k;
  uint32_t out_offset, out_size, rows;
  uint32_t operand_begin, operand_count;  // into DeviceView::operands
  uint32_t aux_begin;                     // into DeviceView::aux
  uint32_t table;                         // Lookup: float offset of the table in params/grads
  uint32_t arg_rows;  // Pick, PickNegLogSoftmax, SliceRows, MaxIndex: argument rows
  uint32_t attr;      // SliceRows: first row; Dropout: keep threshold; Sum: 1 when wide (wide_sum)
  float alpha, beta;                      // Node::alpha, beta
  uint32_t concat_rows[kMaxConcatArgs];   // Concat: rows of each argument
  uint32_t cache_begin;                   // its operands' place in the group's shared cache
  // Pointwise runs (StepGroup::run_src): the run's length (at its first step; 1: a step of its
  // own; the runs of a group follow each other, so a step's run is found by walking the lengths)
  // and the slot of this step's member 0 (member m: slot + m; the slots of a group's runs are
  // numbered through).
  uint8_t run_len, run_slot, unused_[2];
};

// Reductions over the rows of each column (softmax, log softmax, layer norm, max_index: its two
// output rows per column; pick_neg_log_softmax and column_sum: one) run one warp per
// column: the step kernels give them kColumnThreads items per column.
constexpr uint32_t kColumnThreads = 32;
EDBATCH_HD constexpr bool column_op(Op op) {
  return op == Op::Softmax || op == Op::LogSoftmax || op == Op::LayerNorm || op == Op::MaxIndex ||
         op == Op::PickNegLogSoftmax || op == Op::ColumnSum;
}
// A sum over ragged arguments whose nodes have few elements and some node many arguments (a
// loss summed over thousands of nodes) gives each element a warp, whose lanes take every 32nd
// argument (StepDesc::attr = 1): one thread per element would add them one after another.
constexpr uint32_t kWideSumMaxSize = 4, kWideSumMinArgs = 64;
EDBATCH_HD inline bool wide_sum(const StepDesc& s) {
  return static_cast<Op>(s.op) == Op::Sum && s.attr != 0;
}
// Items (threads) a step gives each node: one per element, one for a pick, a warp per
// column for the column reductions and per element for a wide sum.
EDBATCH_HD inline uint32_t items_per_node(const StepDesc& s) {
  const Op op = static_cast<Op>(s.op);
  if (op == Op::Pick) return 1;
  if (column_op(op)) return kColumnThreads * (s.out_size / s.rows);
  if (wide_sum(s)) return kColumnThreads * s.out_size;
  return s.out_size;
}

// Steps fused into one launch: each thread block runs every step, in order (backward: reverse),
// over its share of the invocations, with a block barrier between steps.
//
// A pointwise run is a sequence of consecutive steps of elementwise math (kernels/op_math.h),
// fixed-arity sums and slices of a column, of one element size, each operand of which is either
// a value the run computes (read from a register) or one no member of the run writes (read from
// memory). Forward, a thread evaluates element r of one invocation through every member of every
// step of the run, with the values in registers and no barrier or round trip through memory
// between the steps (each value is still stored, for backward and later readers). Backward runs
// the steps one by one: carrying the adjoints in registers measured slower (docs/cuda.md).
constexpr uint32_t kMaxFusedSteps = 24;
constexpr uint32_t kMaxRunSlots = 32;  // members over the steps of a group's runs
constexpr uint32_t kMaxRunLocal = 16;  // ... of one run (a thread's registers)
constexpr uint32_t kMaxRunReads = 16;  // operands a run reads from memory
constexpr uint32_t kMaxRunArgs = 4;    // operands of one step of a run
constexpr uint8_t kFromMemory = 0xFF;  // run_src: the operand is read from memory
struct StepGroup {
  StepDesc steps[kMaxFusedSteps];
  // Per register slot (a member of a step of a pointwise run) and operand: the slot that holds
  // the operand's value, or kFromMemory. Per slot: its step, and its first operand read from
  // memory in the run's list of them (run_reads: slot * kMaxRunArgs + operand, in the order the
  // run reads them), which a thread loads before it computes.
  uint8_t run_src[kMaxRunSlots][kMaxRunArgs];
  uint8_t run_step[kMaxRunSlots], run_read_begin[kMaxRunSlots];
  uint8_t run_reads[kMaxFusedSteps][kMaxRunReads];  // per run, by its first step
  uint32_t step_count;
  uint32_t k;      // invocations
  uint32_t chunk;  // invocations per thread block
  // Operands of all steps, and the per-member operands they point to, copied to shared memory
  // once per thread block (0 when they do not fit: read from global memory).
  uint32_t cached_operands, cached_members;
};
constexpr uint32_t kOperandCache = 128, kMemberCache = 256;

void launch_steps(const DeviceView& d, const StepGroup& g, bool forward, Stream s);

// The lookups of a whole pass in one launch (`count` Lookup steps, each a block's lookup step or
// a plain lookup batch, none of which reads anything the pass computes): forward copies table
// rows into the outputs, at the start of the pass; backward adds the outputs' adjoints into the
// table's gradient rows, at its end. Step i gets thread blocks [starts[i], starts[i + 1]) (in
// proportion to its count * out_size: see lookup_blocks).
void launch_lookups(const DeviceView& d, const StepDesc* descs, const uint32_t* starts,
                    uint32_t count, uint32_t blocks, bool forward, Stream s);
constexpr uint32_t kLookupThreads = 256;
// Thread blocks for a lookup step of `floats` elements: a few elements per thread.
inline uint32_t lookup_blocks(uint64_t floats) {
  return static_cast<uint32_t>((floats + 4 * kLookupThreads - 1) / (4 * kLookupThreads));
}

// Y += b + sum_p W_p X_p (into outputs the forward pass zeroed) over a batch or block step whose
// weights are shared by the batch or
// by each member: columns of X are read through their operand modes (views, index lists, per
// member), the bias is added in the same pass, so a GEMM step is one launch. Column t of the
// batch is column t % cols of node t / cols.
constexpr uint32_t kMaxProducts = 8;
constexpr uint32_t kNoOperand = UINT32_MAX;
struct LinearDesc {
  uint32_t count, k, cols, m;  // nodes, invocations, columns per node, output rows
  uint32_t out_offset, out_size;
  uint32_t bias;               // index into DeviceView::operands, or kNoOperand (matmul)
  uint32_t products;
  uint32_t w[kMaxProducts], x[kMaxProducts], n[kMaxProducts];  // operand indices, inner sizes
  uint32_t max_n;
  uint32_t splits;         // dW: column ranges reduced by separate thread blocks
  uint32_t bias_in_w;      // 1: the dW thread blocks also reduce db (one column per node,
                           // each member's bias shared by its nodes)
  uint32_t bias_per_node;  // 1: every node's bias is its own value (a per-row projection
                           // read as the bias): db = dY, one thread per element
  uint32_t kc, kcx;        // inner chunk of a forward / dX thread block (a multiple of
                           // kLinearChunk): linear_chunk_sizes
};

// Fused GEMM thread blocks (linear.cuh) own a tile of kLinearTileRows output rows by
// kLinearTileCols columns of one member and a chunk of the inner dimension; partial sums of the
// chunks meet in the zeroed output with atomics.
constexpr uint32_t kLinearTileRows = 64, kLinearTileCols = 32, kLinearChunk = 32;
EDBATCH_HD inline uint32_t linear_chunks(uint32_t n, uint32_t kc) {
  return (n + kc - 1) / kc;
}
EDBATCH_HD inline uint32_t linear_row_tiles(uint32_t rows) {
  return (rows + kLinearTileRows - 1) / kLinearTileRows;
}
EDBATCH_HD inline uint32_t linear_column_tiles(const LinearDesc& l) {
  return (l.count / l.k) * ((l.k * l.cols + kLinearTileCols - 1) / kLinearTileCols);
}
// The inner-dimension chunks of a forward step (over every product) and of its dX (over W's
// rows, per product).
EDBATCH_HD inline uint32_t linear_forward_chunks(const LinearDesc& l) {
  uint32_t z = 0;
  for (uint32_t p = 0; p < l.products; ++p) z += linear_chunks(l.n[p], l.kc);
  return z;
}
EDBATCH_HD inline uint32_t linear_backward_x_chunks(const LinearDesc& l) {
  return l.products * linear_chunks(l.m, l.kcx);
}
// Thread blocks of a step's forward and of its dX (the grids of linear.cuh, counted).
EDBATCH_HD inline uint32_t linear_forward_blocks(const LinearDesc& l) {
  return linear_row_tiles(l.m) * linear_column_tiles(l) * linear_forward_chunks(l);
}
EDBATCH_HD inline uint32_t linear_backward_x_blocks(const LinearDesc& l) {
  return linear_row_tiles(l.max_n) * linear_column_tiles(l) * linear_backward_x_chunks(l);
}
// Sets kc and kcx: kLinearChunk while a step has few thread blocks (so that a mini-batch of a
// few columns still spreads over the device), doubled while its grid keeps at least
// `min_blocks`, so that a big step runs fewer, longer blocks and fewer atomic partial sums.
void linear_chunk_sizes(LinearDesc& l, uint32_t min_blocks);
// True when a GEMM step of `macs` multiply-adds runs through the fused kernel in that direction
// (forward or backward); above it, through cuBLAS.
bool fused_linear_size(double macs, bool forward);
// With l2, a second GEMM step that neither reads nor writes what l does runs in the same grid.
void launch_linear_forward(const DeviceView& d, const LinearDesc& l, const LinearDesc* l2,
                           Stream s);
// One launch: dX_p += W_p^T dY, added atomically into each node's operand adjoint, and, in other
// thread blocks of the same grid, dW_p += dY X_p^T per member and the bias gradient (a second
// launch only when the bias gradient cannot ride along: see bias_in_w).
void launch_linear_backward(const DeviceView& d, const LinearDesc& l, const LinearDesc* l2,
                            Stream s);
// Launches launch_linear_backward makes for `l`.
uint32_t linear_backward_launches(const LinearDesc& l);

// Chained launches: a run of a pass's kernels (step groups, fused GEMM steps, the hoisted
// lookups) in one launch. Each kernel the run would launch becomes a stage with the thread blocks
// its own launch would have; every thread block of the chained launch takes a ticket on start
// (an atomic counter), and ticket t runs thread block t - first of the stage that holds it, after
// every thread block of the stage before has finished (a per-stage counter). Tickets go in start
// order, so a thread block only ever waits for thread blocks that are already running: the launch
// cannot deadlock however few blocks fit on the device at once, and needs no cooperative launch.
struct Stage {
  // LinearBackwardX / LinearBackwardW: a LinearBackward split in two stages (Command::
  // params_only): dX and a bias gradient of its own; dW (and db riding along with it).
  enum Kind : uint32_t {
    StepsForward,
    StepsBackward,
    LinearForward,
    LinearBackward,
    LookupsForward,
    LookupsBackward,
    LinearBackwardX,
    LinearBackwardW
  };
  uint32_t kind;
  uint32_t index;   // StepGroup or LinearDesc index; Lookups*: how many lookups
  uint32_t index2;  // Linear*: a second, independent LinearDesc in the same stage, or kNoOperand
  uint32_t first;   // its first ticket within the launch (its thread blocks: up to the next
                    // stage's first, or the launch's end)
  // The stages it waits for before it starts: pairs (stage within the launch, its thread
  // blocks) at Chain::waits[2 * wait_begin], wait_count of them (LaunchPlan::plan).
  uint32_t wait_begin;
  uint32_t wait_count;
  // LinearForward of a block call: the StepGroup of the call's elementwise steps that follow
  // it, run in the same stage (GEMM -> elementwise fusion), or kNoOperand. The group's thread
  // blocks (its own launch's) follow the GEMM blocks from the stage's block epilogue_first on;
  // each waits only for the column tiles of the products holding its invocations: a GEMM
  // block counts itself on its tile's counter (zeroed, at Chain::counters[epilogue_counters +
  // tile]) once its share of the tile is added.
  uint32_t epilogue = kNoOperand;
  uint32_t epilogue_counters = 0;
  uint32_t epilogue_first = 0;
};
// Thread blocks a stage needs: those of the launches it replaces (its own launch would have).
// lookup_blocks: the pass's lookup_starts total. A fused stage's group (Stage::epilogue) is not
// counted: LaunchPlan::plan adds its blocks when the group joins the stage.
uint32_t stage_blocks(const Stage& s, const StepGroup* groups, const LinearDesc* linears,
                      uint32_t lookup_blocks);
// Counters a chained launch uses (zeroed before it runs): a ticket, then one per stage, each on
// its own 32-byte sector, then the fused stages' tile counters (Stage::epilogue_counters).
constexpr uint32_t kCounterStride = 8;
inline uint32_t chain_counters(uint32_t stages) { return (stages + 1) * kCounterStride; }
// Column tiles of a fused GEMM step (columns per tile: linear.cuh's kTN), one counter each.
constexpr uint32_t kEpilogueTile = 32;
EDBATCH_HD inline uint32_t epilogue_tiles(uint32_t invocations) {
  return (invocations + kEpilogueTile - 1) / kEpilogueTile;
}
struct Chain {
  const Stage* stages;         // this launch's stages
  const uint16_t* stage_of;    // per ticket: its stage
  uint32_t* counters;          // chain_counters(stages), zeroed
  const StepGroup* groups;     // the pass's descriptors (uploaded)
  const LinearDesc* linears;
  const StepDesc* lookups;
  const uint32_t* lookup_starts;
  const uint32_t* waits;       // the pass's stage waits (Stage::wait_begin)
  uint32_t blocks;             // thread blocks of the launch (sum over its stages)
  // Profiling (CudaOptions::profile), else nullptr: per stage, zeroed before the launch, the
  // bitwise complement of the time its first thread block got past its waits and the time its
  // last one finished (atomic maxima of %globaltimer, in ns).
  unsigned long long* times = nullptr;
};
constexpr uint32_t kMaxChainStages = 65535;  // stage_of entries are 16 bits
void launch_chain(const DeviceView& d, const Chain& c, Stream s);

// dst[v * per_node + r] = operand(v)[r] for v < count (columns of a GEMM operand, or biases).
void launch_gather(const DeviceView& d, const Operand& o, uint32_t count, uint32_t k,
                   uint32_t per_node, float* dst, Stream s);
// operand_adjoint(v)[r] += src[v * per_node + r], atomically (operands may repeat).
void launch_scatter_add(const DeviceView& d, const Operand& o, uint32_t count, uint32_t k,
                        uint32_t per_node, const float* src, Stream s);
// c[i] += the sum over columns j < n of a[j * lda + i], for i < m (a bias gradient: the columns
// are the nodes' output adjoints), atomically over chunks of columns.
void launch_sum_columns(const float* a, uint32_t lda, uint32_t m, uint32_t n, float* c, Stream s);
void launch_fill(float* dst, uint64_t n, float value, Stream s);
// src is rows x cols row-major; dst becomes cols x rows row-major (rows x cols column-major).
void launch_transpose(const float* src, uint32_t rows, uint32_t cols, float* dst, Stream s);
// Span i (spans[3i..3i+2] = source offset, destination offset, floats) copies
// src[source offset ..) to dst[destination offset ..).
void launch_gather_spans(const float* src, const uint32_t* spans, uint32_t count, float* dst,
                         Stream s);
// Span i (spans[3i..3i+2] = destination offset, source offset, floats) adds
// src[source offset ..) into dst[destination offset ..), atomically (spans may overlap).
void launch_add_spans(const float* src, const uint32_t* spans, uint32_t count, float* dst,
                      Stream s);
// Copies between caller memory and the parameter mirror, one descriptor per parameter: mode 0 a
// plain copy, 1 row-major rows x cols src to column-major dst, 2 column-major src to row-major.
struct TransferDesc {
  const float* src;
  float* dst;
  uint32_t rows, cols, mode, pad;
};
void launch_transfers(const TransferDesc* descs, uint32_t count, uint64_t max_floats, Stream s);
// values[i] -= lr * grads[i]; grads[i] = 0 (the SGD update on the device's parameter mirror).
void launch_sgd(float* values, float* grads, uint64_t n, float lr, Stream s);

// ---- Optimizer steps (optim.cu; edbatch/optim.h has the formulas) ----

// A run of floats an optimizer step reads and updates: a part of a dense parameter, or one
// touched column of a lazily updated lookup table. At offset in the parameter mirror's values
// and gradients and in each slot buffer.
struct UpdateSegment {
  uint64_t offset;
  uint32_t floats, pad;
};
constexpr uint32_t kMaxSegmentFloats = 8192;  // dense parameters are cut into runs of at most this
// The rule's constants, precomputed on the host (bias corrections for this step).
struct DeviceRule {
  uint32_t kind;           // UpdateRule::Kind
  uint32_t momentum_slot;  // sgd: 1 when it keeps a momentum buffer
  float lr, momentum, beta1, beta2, eps, weight_decay, grad_scale, clip_norm, bc1, bc2;
};
// *sum += the sum of squares of grads over the segments (in double; *sum zeroed by the caller).
void launch_squared_norm(const float* grads, const UpdateSegment* segments, uint32_t count,
                         double* sum, Stream s);
// The rule over the segments: values, slots m and v (null when the rule keeps none) updated,
// gradients zeroed. With clip_norm > 0 the clipping factor comes from *squared_norm.
void launch_update(float* values, float* grads, float* m, float* v, const UpdateSegment* segments,
                   uint32_t count, const DeviceRule& rule, const double* squared_norm, Stream s);

}  // namespace edbatch::cuda
