// Launch planning: which of a pass's commands run together as one chained launch (chain.cu),
// which are launched on their own, and which stages of a chained launch each stage waits for.
#include <algorithm>

#include "edbatch/block.h"
#include "edbatch/block_plan.h"
#include "edbatch/op.h"
#include "edbatch/schedule.h"
#include "kernels/cuda/backend_parts.h"

namespace edbatch::cuda {

namespace {

// The stage a command runs as in a chained launch and its thread blocks, or false when it cannot
// be chained (cuBLAS, gathers and scatters are launched on their own).
bool stage_of_command(const Pass& pass, const Command& c, Stage* st, uint32_t* blocks) {
  *st = Stage{0, c.group, c.group2, 0, 0, 0, kNoOperand, 0};
  switch (c.kind) {
    case Command::Kind::Steps:
      st->kind = pass.forward ? Stage::StepsForward : Stage::StepsBackward;
      break;
    case Command::Kind::LinearForward: st->kind = Stage::LinearForward; break;
    case Command::Kind::LinearBackward:
      st->kind = c.params_only ? Stage::LinearBackwardX : Stage::LinearBackward;
      break;
    case Command::Kind::Lookups:
      st->kind = pass.forward ? Stage::LookupsForward : Stage::LookupsBackward;
      st->index = c.count;
      break;
    default: return false;
  }
  *blocks = stage_blocks(*st, pass.groups.data(), pass.linears.data(),
                         pass.lookup_starts.empty() ? 0 : pass.lookup_starts.back());
  return true;
}

// True when the block call's elementwise steps `steps` can run as the epilogue of the GEMM
// step(s) `linear` just before them in the same stage (Stage::epilogue): a forward pass, both of
// one block call, one column per node (so a column tile of the products is a run of
// invocations), and every GEMM step and elementwise step over the same invocations. Steps of an
// invocation read only that invocation's values within the call (block compilation), and what
// they read from outside it is waited for by the fused stage.
bool fusable(const Pass& pass, const Command& linear, const Command& steps) {
  if (!pass.forward || linear.kind != Command::Kind::LinearForward ||
      steps.kind != Command::Kind::Steps || linear.batch != steps.batch ||
      linear.block_group == kNoOperand || steps.block_group == kNoOperand)
    return false;
  const StepGroup& g = pass.groups[steps.group];
  for (const uint32_t i : {linear.group, linear.group2}) {
    if (i == kNoOperand) continue;
    const LinearDesc& l = pass.linears[i];
    if (l.cols != 1 || l.k != g.k) return false;
  }
  for (uint32_t q = 0; q < g.step_count; ++q)
    if (g.steps[q].k != g.k) return false;
  return g.k > 0;
}

}  // namespace

void LaunchPlan::plan(const Pass& pass, const CudaOptions& options) {
  launches.clear();
  stages.clear();
  stage_of.clear();
  stage_command.clear();
  counters_floats = 0;
  const uint32_t n = static_cast<uint32_t>(pass.commands.size());
  command_stage_.assign(n, UINT32_MAX);
  // Checking after every launch needs every kernel launched on its own.
  const bool chain = (options.chain == CudaOptions::Chain::All ||
                      (options.chain == CudaOptions::Chain::Forward && pass.forward)) &&
                     !options.sync_each_launch;
  for (uint32_t i = 0; i < n;) {
    Launch l{i, i};
    l.stage_begin = static_cast<uint32_t>(stages.size());
    l.map_begin = static_cast<uint32_t>(stage_of.size());
    l.counter_begin = counters_floats;
    Stage st{};
    uint32_t blocks = 0, tile_counters = 0;
    const auto add_stage = [&](const Stage& s, uint32_t b) {
      Stage& added = stages.emplace_back(s);
      added.first = l.blocks;
      stage_command.push_back(l.end);
      stage_of.insert(stage_of.end(), b, static_cast<uint16_t>(l.stages));
      l.blocks += b;
      ++l.stages;
    };
    while (chain && l.end < n && l.stages + 1 < kMaxChainStages &&
           stage_of_command(pass, pass.commands[l.end], &st, &blocks)) {
      const bool after_own_stage =
          l.stages > 0 && l.end > l.begin && command_stage_[l.end - 1] == stages.size() - 1;
      if (blocks > 0 && options.gemm_epilogue && after_own_stage &&
          stages.back().epilogue == kNoOperand &&
          fusable(pass, pass.commands[l.end - 1], pass.commands[l.end])) {
        // The group's thread blocks join the GEMM stage, after its own (the last stage so far).
        Stage& fused = stages.back();
        fused.epilogue = st.index;
        fused.epilogue_counters = tile_counters;
        fused.epilogue_first = l.blocks - fused.first;
        tile_counters += epilogue_tiles(pass.groups[st.index].k);
        stage_of.insert(stage_of.end(), blocks, static_cast<uint16_t>(l.stages - 1));
        l.blocks += blocks;
        command_stage_[l.end++] = static_cast<uint32_t>(stages.size() - 1);
        continue;
      }
      if (blocks > 0) {
        command_stage_[l.end] = static_cast<uint32_t>(stages.size());
        add_stage(st, blocks);
      }
      if (blocks > 0 && st.kind == Stage::LinearBackwardX) {  // dW: a stage no stage waits for
        st.kind = Stage::LinearBackwardW;
        add_stage(st, stage_blocks(st, pass.groups.data(), pass.linears.data(), 0));
      }
      ++l.end;
    }
    if (l.end - l.begin < 2 || l.stages == 0) {  // command i on its own
      stages.resize(l.stage_begin);
      stage_command.resize(l.stage_begin);
      stage_of.resize(l.map_begin);
      std::fill(command_stage_.begin() + l.begin, command_stage_.begin() + l.end, UINT32_MAX);
      launches.push_back(Launch{i, i + 1});
      ++i;
      continue;
    }
    // The tile counters follow the stage counters.
    for (uint32_t t = l.stage_begin; t < l.stage_begin + l.stages; ++t)
      stages[t].epilogue_counters += chain_counters(l.stages);
    counters_floats += chain_counters(l.stages) + tile_counters;
    launches.push_back(l);
    i = l.end;
  }
  if (stages.empty()) {
    waits.clear();
    return;
  }
  // What each batch reads comes with the schedule (Schedule::reads, found where the scheduler
  // resolves the producers anyway); a schedule whose lists do not cover every batch runs in
  // order: under Auto the scheduler leaves increments out (BatchReads::WholeGraphs), and an
  // incremental forward stays in order even where they are there (a decoding step is one chain
  // of dependent stages, where the search would only add host time).
  using Waits = CudaOptions::StageWaits;
  const Schedule& sch = pass.p->schedule;
  const bool reads = sch.read_begin.size() == sch.batches.size() + 1;
  const bool increment = pass.forward && pass.p->first_segment > 0;
  if (reads &&
      (options.stage_waits == Waits::Always || (options.stage_waits == Waits::Auto && !increment)))
    wait_for_producers(pass);
  else
    wait_in_order();
}

namespace {

// Thread blocks of stage s (global index) of launch l.
uint32_t blocks_of(const std::vector<Stage>& stages, const Launch& l, uint32_t s) {
  const uint32_t end = s + 1 < l.stage_begin + l.stages ? stages[s + 1].first : l.blocks;
  return end - stages[s].first;
}

}  // namespace

void LaunchPlan::wait_in_order() {
  waits.clear();
  for (Launch& l : launches) {
    l.critical = 0;
    uint32_t last = UINT32_MAX;  // the latest stage other than a dW stage
    for (uint32_t s = l.stage_begin; s < l.stage_begin + l.stages; ++s) {
      Stage& st = stages[s];
      if (st.kind == Stage::LinearBackwardW) {  // what its dX stage (the one before) waits for
        st.wait_begin = stages[s - 1].wait_begin;
        st.wait_count = stages[s - 1].wait_count;
        continue;
      }
      st.wait_begin = static_cast<uint32_t>(waits.size() / 2);
      st.wait_count = last != UINT32_MAX ? 1 : 0;
      if (st.wait_count)
        waits.insert(waits.end(), {last - l.stage_begin, blocks_of(stages, l, last)});
      last = s;
      ++l.critical;
    }
  }
}

// The group of every body node a block's steps compute, what each group reads, and the group
// each output comes from; computed once per block per pass (blocks are few).
const LaunchPlan::BlockDeps& LaunchPlan::block_deps(const BlockPlan& bp) {
  for (size_t i = 0; i < blocks_used_; ++i)
    if (blocks_[i].plan == &bp) return blocks_[i];
  if (blocks_used_ == blocks_.size()) blocks_.emplace_back();
  BlockDeps& d = blocks_[blocks_used_++];
  d.plan = &bp;
  const Graph& body = *bp.body;
  d.group_of.assign(body.size(), kNoOperand);
  for (const BlockStep& st : bp.steps)
    for (uint32_t m = 0; m < st.member_count; ++m)
      d.group_of[bp.members[st.member_begin + m]] = st.group;
  // A body argument through its views: the step's node it reads, or an input.
  const auto source = [&](uint32_t a) {
    while (op_info(body.node(a).op).rule == BatchRule::View && d.group_of[a] == kNoOperand &&
           bp.input_of[a] < 0 && body.node(a).num_args > 0)
      a = body.args(body.node(a))[0];
    return a;
  };
  const uint32_t groups = static_cast<uint32_t>(bp.groups.size());
  d.dep_begin.assign(groups + 1, 0);
  d.deps.clear();
  d.reads_inputs.assign(groups, 0);
  for (uint32_t q = 0; q < groups; ++q) {
    d.dep_begin[q] = static_cast<uint32_t>(d.deps.size());
    const BlockGroup& bg = bp.groups[q];
    for (uint32_t s = bg.step_begin; s < bg.step_begin + bg.step_count; ++s) {
      const BlockStep& st = bp.steps[s];
      for (uint32_t m = 0; m < st.member_count; ++m) {
        const Node& n = body.node(bp.members[st.member_begin + m]);
        for (uint32_t k = 0; k < n.num_args; ++k) {
          const uint32_t a = source(body.args(n)[k]);
          if (bp.input_of[a] >= 0) d.reads_inputs[q] = 1;
          const uint32_t from = d.group_of[a];
          if (from == kNoOperand || from == q) continue;
          if (std::find(d.deps.begin() + d.dep_begin[q], d.deps.end(), from) == d.deps.end())
            d.deps.push_back(from);
        }
      }
    }
  }
  d.dep_begin[groups] = static_cast<uint32_t>(d.deps.size());
  // The reverse: the groups that read each group (backward waits for them).
  d.rdep_begin.assign(groups + 1, 0);
  for (const uint32_t from : d.deps) ++d.rdep_begin[from + 1];
  for (uint32_t q = 0; q < groups; ++q) d.rdep_begin[q + 1] += d.rdep_begin[q];
  d.rdeps.resize(d.deps.size());
  {
    std::vector<uint32_t> at(d.rdep_begin.begin(), d.rdep_begin.end() - 1);
    for (uint32_t q = 0; q < groups; ++q)
      for (uint32_t e = d.dep_begin[q]; e < d.dep_begin[q + 1]; ++e) d.rdeps[at[d.deps[e]]++] = q;
  }
  d.output_group.resize(bp.output_node.size());
  for (size_t o = 0; o < bp.output_node.size(); ++o)
    d.output_group[o] = d.group_of[source(bp.output_node[o])];
  return d;
}

void LaunchPlan::candidate(const Launch& l, uint32_t s, uint32_t t) {
  if (t == UINT32_MAX || t < l.stage_begin || t >= s) return;
  candidates_[t >> 6] |= uint64_t{1} << (t & 63);
  candidate_low_ = std::min(candidate_low_, t);
  candidate_high_ = std::max(candidate_high_, t);
}

void LaunchPlan::add_producer(const Launch& l, uint32_t s, uint32_t batch, uint32_t group) {
  const auto add = [&](uint32_t t) { candidate(l, s, t); };
  add(last_stage_[batch]);
  if (group_base_[batch] == UINT32_MAX) return;
  if (group != kNoOperand) {
    add(group_stage_[group_base_[batch] + group]);
    return;
  }
  for (uint32_t q = 0; q < call_of_[batch]->plan->groups.size(); ++q)
    add(group_stage_[group_base_[batch] + q]);
}

void LaunchPlan::readers_of(uint32_t batch) {
  // Every reader's commands come before the batch's in backward order, so their stages are
  // final here.
  readers_batch_ = batch;
  readers_.clear();
  for (uint32_t e = consumer_begin_[batch]; e < consumer_begin_[batch + 1]; ++e) {
    const uint32_t reader = consumers_[2 * e], group = consumers_[2 * e + 1];
    const auto add = [&](uint32_t t) {
      if (t != UINT32_MAX) readers_.insert(readers_.end(), {group, t});
    };
    add(last_stage_[reader]);
    if (group_base_[reader] == UINT32_MAX) continue;
    const BlockDeps& call = *call_of_[reader];
    for (uint32_t q = 0; q < call.plan->groups.size(); ++q)
      if (call.reads_inputs[q]) add(group_stage_[group_base_[reader] + q]);
  }
}

void LaunchPlan::wait_for_producers(const Pass& pass) {
  const Graph& g = pass.p->graph;
  const Schedule& sch = pass.p->schedule;
  const uint32_t nb = static_cast<uint32_t>(sch.batches.size());
  // Call batches: their block's groups, and a stage per group.
  blocks_used_ = 0;
  call_of_.assign(nb, nullptr);
  group_base_.assign(nb, UINT32_MAX);
  group_stage_.clear();
  for (uint32_t b = pass.first_batch; b < nb; ++b) {
    const Node& first = g.node(sch.nodes[sch.batches[b].begin]);
    const Block* block = first.op == Op::Call ? pass.p->params.block(first.aux) : nullptr;
    if (block == nullptr) continue;
    call_of_[b] = &block_deps(block->plan());
    group_base_[b] = static_cast<uint32_t>(group_stage_.size());
    group_stage_.resize(group_stage_.size() + block->plan().groups.size(), UINT32_MAX);
  }
  collect_producers(pass);
  choose_waits(pass);
}

void LaunchPlan::collect_producers(const Pass& pass) {
  const Schedule& sch = pass.p->schedule;
  const uint32_t nb = static_cast<uint32_t>(sch.batches.size());
  const uint32_t fb = pass.first_batch;
  // What each batch reads (the scheduler's lists, Schedule::reads) as (batch, group) pairs: the
  // group of a call batch computing the output read, else kNoOperand (the whole batch), each
  // pair once (outputs of one group read twice, a whole batch after its groups: a mask per
  // producer batch, bit 63 for the whole batch, bit q for its group q).
  producers_.clear();
  producer_begin_.resize(nb - fb + 1);
  seen_.assign(nb, UINT32_MAX);
  seen_mask_.resize(nb);
  for (uint32_t b = fb; b < nb; ++b) {
    producer_begin_[b - fb] = static_cast<uint32_t>(producers_.size());
    for (uint32_t r = sch.read_begin[b]; r < sch.read_begin[b + 1]; ++r) {
      const uint32_t pb = sch.reads[2 * r], output = sch.reads[2 * r + 1];
      if (pb < fb) continue;  // ran in an earlier pass
      const BlockDeps* call = call_of_[pb];
      const uint32_t group =
          call && output != Schedule::kWholeBatch && output < call->output_group.size()
              ? call->output_group[output]
              : kNoOperand;
      const uint32_t entry = group < 63 ? group : kNoOperand;  // groups past 62: the whole
      const uint64_t bit = uint64_t{1} << (entry == kNoOperand ? 63 : entry);
      if (seen_[pb] != b) {
        seen_[pb] = b;
        seen_mask_[pb] = 0;
      }
      if (seen_mask_[pb] & (bit | uint64_t{1} << 63)) continue;
      seen_mask_[pb] |= bit;
      producers_.insert(producers_.end(), {pb, entry});
    }
  }
  producer_begin_[nb - fb] = static_cast<uint32_t>(producers_.size());
  if (!pass.forward) {
    // Backward reads the adjoints that the batches reading a batch add into: per batch, its
    // readers (batch, group of it read or kNoOperand).
    consumer_begin_.assign(nb + 1, 0);
    for (size_t q = 0; q < producers_.size(); q += 2) ++consumer_begin_[producers_[q] + 1];
    for (uint32_t b = 0; b < nb; ++b) consumer_begin_[b + 1] += consumer_begin_[b];
    consumers_.resize(producers_.size());
    cursor_.assign(consumer_begin_.begin(), consumer_begin_.end() - 1);
    for (uint32_t b = fb; b < nb; ++b)
      for (uint32_t q = producer_begin_[b - fb]; q < producer_begin_[b - fb + 1]; q += 2) {
        const uint32_t at = cursor_[producers_[q]]++;
        consumers_[2 * at] = b;
        consumers_[2 * at + 1] = producers_[q + 1];
      }
  }
}

void LaunchPlan::choose_waits(const Pass& pass) {
  const uint32_t nb = static_cast<uint32_t>(pass.p->schedule.batches.size());
  const uint32_t fb = pass.first_batch;
  // Per stage: the prefix of the launch's stages finished when it starts, and a window of the
  // 64 stages before it (bit j: stage s - 1 - j finished). A candidate those already cover is
  // not waited for: waiting for a stage waits for everything that stage waited for.
  waits.clear();
  last_stage_.assign(nb, UINT32_MAX);
  candidates_.assign((stages.size() + 63) / 64, 0);
  readers_batch_ = UINT32_MAX;
  prefix_.assign(stages.size(), 0);
  known_.assign(stages.size(), 0);
  depth_.assign(stages.size(), 0);
  uint32_t lookups = UINT32_MAX;
  for (Launch& l : launches) {
    l.critical = 0;
    for (uint32_t j = l.begin; j < l.end; ++j) {
      const uint32_t s = command_stage_[j];
      if (s == UINT32_MAX) continue;
      const Command& c = pass.commands[j];
      // A fused stage (Stage::epilogue) runs two commands: it waits for what either reads.
      const bool fused_before = j > l.begin && command_stage_[j - 1] == s;
      const bool fused_after = j + 1 < l.end && command_stage_[j + 1] == s;
      if (!fused_before) {
        candidate_low_ = UINT32_MAX;
        candidate_high_ = 0;
      }
      const auto add = [&](uint32_t t) { candidate(l, s, t); };
      const bool is_lookups = c.kind == Command::Kind::Lookups;
      const bool ours = !is_lookups && c.batch >= fb && c.batch < nb;
      const BlockDeps* call = ours ? call_of_[c.batch] : nullptr;
      const bool grouped = call && c.block_group != kNoOperand;
      // Stage s as the latest of what the command computes.
      const auto record = [&](uint32_t at) {
        if (is_lookups) {
          lookups = at;
        } else if (grouped) {
          for (const uint32_t q : {c.block_group, c.block_group2})
            if (q != kNoOperand) group_stage_[group_base_[c.batch] + q] = at;
        } else if (ours) {
          last_stage_[c.batch] = at;
        }
      };
      // A grouped command: its own groups' earlier stages, and the groups of its call that
      // its groups read (forward) or that read them (backward, adding into their adjoints).
      // Otherwise the batch's commands run in order.
      const auto add_groups = [&](const std::vector<uint32_t>& begin,
                                  const std::vector<uint32_t>& list) {
        for (const uint32_t q : {c.block_group, c.block_group2}) {
          if (q == kNoOperand) continue;
          add(group_stage_[group_base_[c.batch] + q]);
          for (uint32_t e = begin[q]; e < begin[q + 1]; ++e)
            add(group_stage_[group_base_[c.batch] + list[e]]);
        }
      };
      if (ours && !grouped) add_producer(l, s, c.batch, kNoOperand);
      if (ours && pass.forward) {
        add(lookups);
        bool inputs = !grouped;
        if (grouped) {
          add_groups(call->dep_begin, call->deps);
          for (const uint32_t q : {c.block_group, c.block_group2})
            inputs = inputs || (q != kNoOperand && call->reads_inputs[q]);
        }
        if (inputs)
          for (uint32_t q = producer_begin_[c.batch - fb]; q < producer_begin_[c.batch - fb + 1];
               q += 2)
            add_producer(l, s, producers_[q], producers_[q + 1]);
      } else if (ours) {
        // Backward: the stages that add into the adjoints it reads, those of its own outputs:
        // the groups of its call that read its group, and every reader of the batch (or of the
        // output its group computes), whose input-reading groups add into them.
        if (grouped) add_groups(call->rdep_begin, call->rdeps);
        if (readers_batch_ != c.batch) readers_of(c.batch);
        for (size_t e = 0; e < readers_.size(); e += 2) {
          const uint32_t group = readers_[e];
          if (grouped && group != kNoOperand && group != c.block_group && group != c.block_group2)
            continue;  // it reads another output of this call
          add(readers_[e + 1]);
        }
      } else if (is_lookups && !pass.forward) {
        for (uint32_t t = l.stage_begin; t < s; ++t) add(t);  // every adjoint is complete
      } else if (!is_lookups && s > l.stage_begin) {
        add(s - 1);  // not a batch of this pass: keep the order
      }
      if (fused_after) {
        record(s);
        continue;
      }
      Stage& st = stages[s];
      st.wait_begin = static_cast<uint32_t>(waits.size() / 2);
      st.wait_count = 0;
      int64_t prefix = static_cast<int64_t>(l.stage_begin) - 1;
      uint64_t known = 0;
      uint32_t depth = 0;
      // The candidates from the latest down (each implies what it waited for), until the
      // finished prefix; the bits are cleared on the way for the next stage.
      for (uint32_t w = candidate_high_ / 64 + 1; candidate_low_ != UINT32_MAX && w-- > 0;) {
        uint64_t word = candidates_[w];
        candidates_[w] = 0;
        for (; word != 0; word &= ~(uint64_t{1} << (63 - __builtin_clzll(word)))) {
          const uint32_t d = w * 64 + 63 - static_cast<uint32_t>(__builtin_clzll(word));
          if (static_cast<int64_t>(d) <= prefix) break;
          const uint32_t bit = s - 1 - d;
          if (bit < 64 && ((known >> bit) & 1)) continue;
          waits.insert(waits.end(), {d - l.stage_begin, blocks_of(stages, l, d)});
          ++st.wait_count;
          if (bit < 64) known |= uint64_t{1} << bit;
          if (s - d < 64) known |= known_[d] << (s - d);
          const int64_t after = prefix_[d] >= static_cast<int64_t>(d) - 1 ? d : prefix_[d];
          prefix = std::max(prefix, after);
          depth = std::max(depth, depth_[d]);
        }
        if (w == candidate_low_ / 64) break;
        if (static_cast<int64_t>(w) * 64 <= prefix) {  // the rest lies in the finished prefix
          std::fill(candidates_.begin() + candidate_low_ / 64, candidates_.begin() + w, 0);
          break;
        }
      }
      while (prefix + 1 < static_cast<int64_t>(s)) {
        const uint64_t bit = s - 1 - static_cast<uint64_t>(prefix + 1);
        if (bit >= 64 || !((known >> bit) & 1)) break;
        ++prefix;
      }
      prefix_[s] = prefix;
      known_[s] = known;
      depth_[s] = depth + 1;
      l.critical = std::max(l.critical, depth + 1);
      if (s + 1 < l.stage_begin + l.stages && stages[s + 1].kind == Stage::LinearBackwardW) {
        // The command's dW stage waits for what its dX stage waits for; none waits for it.
        stages[s + 1].wait_begin = st.wait_begin;
        stages[s + 1].wait_count = st.wait_count;
        prefix_[s + 1] = prefix;
        known_[s + 1] = known << 1;
        depth_[s + 1] = depth + 1;
      }
      record(s);
    }
  }
}

}  // namespace edbatch::cuda
