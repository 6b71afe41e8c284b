// Internal to the CUDA kernels: pointwise runs of a step group (device.h, StepGroup::run_src),
// forward. A thread takes element r of one invocation through every member of every step of the
// run: it loads the operands the run reads from memory first (all at once), then computes with
// the run's own values in registers, storing each. Backward runs the steps one by one.
#pragma once
#include "kernels/cuda/device.h"
#include "kernels/cuda/step_operands.cuh"
#include "kernels/op_math.h"

namespace edbatch::cuda {

namespace {

// Which element of its memory operands element r of a run's step reads: a slice of a column
// reads its argument's rows from the slice's first on.
__device__ inline uint32_t run_element(const StepDesc& s, uint32_t r) {
  return static_cast<Op>(s.op) == Op::SliceRows ? s.attr + r : r;
}

// The value of a step of a run from its operands' values.
__device__ inline float run_value(const StepDesc& s, const float* a) {
  switch (static_cast<Op>(s.op)) {
    case Op::SliceRows:
      return a[0];
    case Op::Sum: {
      float acc = 0;
      for (uint32_t j = 0; j < s.operand_count; ++j) acc += a[j];
      return acc;
    }
#define EDBATCH_RUN_UNARY(op, m) \
  case Op::op:                   \
    return math::m::value<math::ScalarMath>(a[0], math::Attr{s.alpha, s.beta});
      EDBATCH_UNARY_OPS(EDBATCH_RUN_UNARY)
#undef EDBATCH_RUN_UNARY
#define EDBATCH_RUN_BINARY(op, m) \
  case Op::op:                    \
    return math::m::value<math::ScalarMath>(a[0], a[1]);
      EDBATCH_BINARY_OPS(EDBATCH_RUN_BINARY)
#undef EDBATCH_RUN_BINARY
    default:
      return 0;
  }
}

// Run [f, f + len) of group g over invocations [i0, i0 + n), forward. `ops_of(s)` gives step s's
// operands.
template <class OpsOf>
__device__ void run_forward(const DeviceView& d, const StepGroup& g, uint32_t f, uint32_t len,
                            uint32_t i0, uint32_t n, const OpsOf& ops_of) {
  const uint32_t base = g.steps[f].run_slot;
  const uint32_t per_node = g.steps[f].out_size, k = g.steps[f].k;
  const uint8_t* reads = g.run_reads[f];
  uint32_t count = 0;  // operands read from memory
  while (count < kMaxRunReads && reads[count] != kFromMemory) ++count;
  const uint32_t items = n * per_node;
  for (uint32_t t = threadIdx.x; t < items; t += blockDim.x) {
    const uint32_t r = t % per_node, inv = i0 + t / per_node;
    // Node v of slot `at`'s step.
    const auto node = [&](uint32_t at) {
      return (at - g.steps[g.run_step[at]].run_slot) * k + inv;
    };
    float mem[kMaxRunReads], val[kMaxRunLocal], a[kMaxRunArgs];
#pragma unroll 8
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t at = base + reads[i] / kMaxRunArgs, j = reads[i] % kMaxRunArgs;
      const StepDesc& s = g.steps[g.run_step[at]];
      mem[i] = value_at(d, ops_of(s), slot(ops_of(s), s, j), node(at), s.k)[run_element(s, r)];
    }
    for (uint32_t q = f; q < f + len; ++q) {
      const StepDesc& s = g.steps[q];
      for (uint32_t at = s.run_slot, end = at + s.count / s.k; at < end; ++at) {
        uint32_t next = g.run_read_begin[at];
        for (uint32_t j = 0; j < s.operand_count; ++j) {
          const uint8_t src = g.run_src[at][j];
          a[j] = src == kFromMemory ? mem[next++] : val[src - base];
        }
        val[at - base] = run_value(s, a);
        d.values[s.out_offset + static_cast<uint64_t>(node(at)) * s.out_size + r] = val[at - base];
      }
    }
  }
}

}  // namespace

}  // namespace edbatch::cuda
