// Incremental forward: a graph that grew since its last forward is planned as one more segment
// (its new nodes alone, scheduled by the policy over their own frontier and laid out after the
// values already computed), so only the new nodes run and earlier values stay where they are.
#include <chrono>
#include <stdexcept>
#include <string>

#include "edbatch/engine.h"

namespace edbatch {

bool Engine::extends_plan(const Graph& g, uint32_t end) const {
  // Within one generation a graph only grows, so a larger one holds the planned nodes as they were.
  return graph_ == &g && graph_generation_ == g.generation() && graph_cuts_ == g.cuts() &&
         end <= g.size() && end > plan_.node_offset.size() && !plan_.segments.empty();
}

void Engine::extend_plan(Graph& g, uint32_t end) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t first_node = static_cast<uint32_t>(plan_.node_offset.size());
  const uint32_t first_batch = static_cast<uint32_t>(schedule_.batches.size());
  const uint32_t nodes_before = static_cast<uint32_t>(schedule_.nodes.size());
  // The same step as the increment before (decoding the same sentences): its plan again,
  // shifted. Not where the scheduler lists each increment's reads, which the repeat leaves out.
  const SegmentRepeat repeat =
      options_.plan_cache_bytes > 0 && backend_->wants_batch_reads() != BatchReads::Always
          ? repeat_last_segment(g, schedule_, plan_, end)
          : SegmentRepeat::None;
  if (repeat != SegmentRepeat::None) {
    schedule_.lower_bound += segment_bound_;
    ++stats_.increments_repeated;
    stats_.increments_replanned += repeat == SegmentRepeat::Replanned;
  } else {
    const uint32_t bound_before = schedule_.lower_bound;
    scheduler_.extend(g, *policy_, schedule_, first_node, end);
    extend_memory_plan(g, schedule_, first_batch, first_node, plan_, plan_options_, end);
    segment_bound_ = schedule_.lower_bound - bound_before;
    segment_lookups_ = policy_->lookups();
  }
  stats_.construction_ms = g.construction_seconds() * 1e3;
  stats_.scheduling_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stats_.nodes += schedule_.nodes.size() - nodes_before;
  stats_.batches = schedule_.batches.size();
  stats_.lower_bound = schedule_.lower_bound;
  stats_.policy_hits += segment_lookups_.hits;
  stats_.policy_misses += segment_lookups_.misses;
  stats_.policy_scored += segment_lookups_.scored;
  graph_version_ = g.version();
  have_backward_ = false;
}

uint32_t Engine::ran_nodes() const {
  if (ran_segments_ < plan_.segments.size()) return plan_.segments[ran_segments_].node_begin;
  return static_cast<uint32_t>(plan_.node_offset.size());
}

void Engine::check_ran(const Expr& e, const char* fn) const {
  if (graph_ == nullptr || e.graph != graph_ || e.generation != graph_generation_)
    throw std::invalid_argument(std::string("[") + fn +
                                "] expression is not from the last forward graph");
  graph_->node_of(e, fn);
  const uint32_t node = e.id;
  if (ran_inputs_version_ != graph_->inputs_version())
    throw std::invalid_argument(std::string("[") + fn +
                                "] the graph's inputs were rewritten (Graph::write_inputs) since "
                                "the last forward: run forward() first");
  if (graph_->cuts() != graph_cuts_)
    throw std::invalid_argument(std::string("[") + fn +
                                "] the graph was truncated since the last forward: run "
                                "forward() first");
  if (node < ran_nodes()) return;
  throw std::invalid_argument(std::string("[") + fn + "] node " + std::to_string(node) +
                              (node < plan_.node_offset.size()
                                   ? " was prepared but not run"
                                   : " was added after the last forward (or lies past the "
                                     "nodes a forward_through ran) and has not run") +
                              ": run forward() first");
}

void Engine::check_ran_all(const Graph& g) const {
  if (has_run(g)) return;
  if (graph_ == &g && graph_generation_ == g.generation() && ran_segments_ > 0 &&
      ran_inputs_version_ == g.inputs_version() && g.size() > ran_nodes())
    throw std::invalid_argument("[Engine::backward] nodes " + std::to_string(ran_nodes()) + ".." +
                                std::to_string(g.size() - 1) +
                                " were added after the last forward (or lie past the nodes a "
                                "forward_through ran) and have not run: run forward() before "
                                "backward()");
  throw std::invalid_argument(
      "[Engine::backward] run forward() on this graph (in its current state) first");
}

}  // namespace edbatch
