// Launch planning: which of a pass's commands run together as one chained launch (chain.cu) and
// which are launched on their own.
#include "kernels/cuda/backend_parts.h"

namespace edbatch::cuda {

namespace {

// The stage a command runs as in a chained launch and its thread blocks, or false when it cannot
// be chained (cuBLAS, gathers and scatters are launched on their own).
bool stage_of_command(const Pass& pass, const Command& c, Stage* st, uint32_t* blocks) {
  *st = Stage{0, c.group, c.group2, 0};
  switch (c.kind) {
    case Command::Kind::Steps:
      st->kind = pass.forward ? Stage::StepsForward : Stage::StepsBackward;
      break;
    case Command::Kind::LinearForward: st->kind = Stage::LinearForward; break;
    case Command::Kind::LinearBackward: st->kind = Stage::LinearBackward; break;
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

}  // namespace

void LaunchPlan::plan(const Pass& pass, const CudaOptions& options) {
  launches.clear();
  stages.clear();
  stage_of.clear();
  counters_floats = 0;
  const uint32_t n = static_cast<uint32_t>(pass.commands.size());
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
    uint32_t blocks = 0;
    while (chain && l.end < n && l.stages < kMaxChainStages &&
           stage_of_command(pass, pass.commands[l.end], &st, &blocks)) {
      if (blocks > 0) {
        st.first = l.blocks;
        stages.push_back(st);
        stage_of.insert(stage_of.end(), blocks, static_cast<uint16_t>(l.stages));
        l.blocks += blocks;
        ++l.stages;
      }
      ++l.end;
    }
    if (l.end - l.begin < 2 || l.stages == 0) {  // command i on its own
      stages.resize(l.stage_begin);
      stage_of.resize(l.map_begin);
      launches.push_back(Launch{i, i + 1});
      ++i;
      continue;
    }
    counters_floats += chain_counters(l.stages);
    launches.push_back(l);
    i = l.end;
  }
}

}  // namespace edbatch::cuda
