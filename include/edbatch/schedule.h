// Scheduling: the ordered list of batches for a graph, chosen by a policy over the ready frontier.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace edbatch {

class Graph;

struct Batch {
  uint32_t type;
  uint32_t begin;  // into Schedule::nodes
  uint32_t count;
};

// Which schedules list what each batch reads (Scheduler::set_reads).
enum class BatchReads { None, WholeGraphs, Always };

struct Schedule {
  std::vector<uint32_t> nodes;  // every non-source node exactly once, batch by batch
  std::vector<Batch> batches;
  uint32_t lower_bound = 0;     // sum over types of the longest chain of nodes of that type
  // With Scheduler::set_reads (for the runs and extends it names), what each batch reads from
  // earlier batches (of its own extend and of those before it): batch b's pairs (producer
  // batch, output) are reads[2 * read_begin[b], 2 * read_begin[b + 1]), each once, where
  // `output` is the index of a block call's output read through its Output view, or
  // kWholeBatch for the batch's own values (and for outputs past 62). A kWholeBatch pair may
  // follow pairs of single outputs of the same batch, never the reverse. Empty when not asked
  // for.
  static constexpr uint32_t kWholeBatch = 63;
  std::vector<uint32_t> read_begin, reads;
  uint64_t reads_id = 0;  // which scheduler call wrote the reads last (0: none)
  void clear() {
    nodes.clear();
    batches.clear();
    lower_bound = 0;
    read_begin.clear();
    reads.clear();
    reads_id = 0;
  }
};

// What a frontier policy sees when it chooses. All queries are O(1).
class Frontier {
 public:
  const std::vector<uint32_t>& ready_types() const { return ready_types_; }
  uint32_t ready_count(uint32_t type) const { return static_cast<uint32_t>(ready_[type].size()); }
  // Mean depth (longest path from the sources) over all nodes of the type in the graph.
  double average_depth(uint32_t type) const { return avg_depth_[type]; }
  // Remaining chain bound of the type: the most type-`type` nodes on one path among the
  // nodes not yet scheduled, and how many of those critical nodes exist and are ready now.
  uint32_t remaining_bound(uint32_t type) const { return top_[type]; }
  uint32_t critical_total(uint32_t type) const {
    return remaining_at_[level_base_[type] + top_[type]];
  }
  uint32_t critical_ready(uint32_t type) const { return ready_at_[level_base_[type] + top_[type]]; }
  uint32_t num_types() const { return static_cast<uint32_t>(ready_.size()); }

 protected:
  std::vector<std::vector<uint32_t>> ready_;
  std::vector<uint32_t> ready_types_;
  std::vector<uint32_t> ready_pos_;  // position in ready_types_, UINT32_MAX when absent
  std::vector<double> avg_depth_;
  std::vector<uint32_t> top_;          // per type: current remaining bound
  std::vector<uint32_t> level_base_;   // per type: offset into the histograms below
  std::vector<uint32_t> remaining_at_; // per (type, height): unscheduled nodes
  std::vector<uint32_t> ready_at_;     // per (type, height): ready nodes
};

class Policy {
 public:
  enum class Kind { NodeByNode, Depth, Frontier };
  virtual ~Policy() = default;
  virtual const char* name() const = 0;
  virtual Kind kind() const { return Kind::Frontier; }
  // Called once per graph before the first choice.
  virtual void begin(const Graph&) {}
  // Returns a type from frontier.ready_types().
  virtual uint32_t choose(const Frontier& frontier) = 0;
  // Called after each batch of `type` ran, with the nodes it took.
  virtual void on_batch(uint32_t /*type*/, uint32_t /*count*/) {}
  // Learned policies: choices served by their table and by their fallback since begin().
  // `scored`: of the misses, those a learned scorer decided (the rest went to lb-greedy).
  struct Lookups {
    uint64_t hits = 0, misses = 0, scored = 0;
  };
  virtual Lookups lookups() const { return {}; }
};

// What make_policy needs beyond the name: the device (part of auto's cache key) and auto's
// settings.
struct PolicyContext {
  std::string device = "cpu";
  double auto_budget_s = 2;  // auto: the most training may add to the first graph
  std::string cache_dir = "";  // auto: empty = default_policy_cache_dir() (options.h)
  std::function<void(const std::string&)> warn;  // auto's warnings; empty: stderr
};

// "none", "depth", "agenda", "lb-greedy", "fsm:FILE" (a learned policy file, see fsm.h) or
// "auto" (learned on first use and cached, see AutoPolicy in fsm.h). Unknown names throw
// std::invalid_argument.
std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyContext& context = {});
std::vector<std::string> policy_names();

// Builds schedules; keeps its scratch between calls so steady-state scheduling allocates nothing.
class Scheduler : private Frontier {
 public:
  void run(const Graph& g, Policy& policy, Schedule& out);
  // Incremental forward: schedules nodes [first_node, end_node) (end_node past the graph: to its
  // end), whose inputs before first_node have run, and appends their batches (and their lower
  // bound) to `out`. The policy sees the frontier of the new nodes alone. Costs the new nodes'
  // size, not the graph's. Nodes from end_node on are left for a later extend.
  void extend(const Graph& g, Policy& policy, Schedule& out, uint32_t first_node,
              uint32_t end_node = UINT32_MAX);
  // Also fill Schedule::reads (a backend that orders its device work by what each batch reads
  // asks for them: a few ns per argument, spent where the producers are resolved anyway), for
  // every run and extend, or for whole graphs only (an extend from node 0), where increments
  // leave their batches' lists out (a decoding step is one chain of dependent batches).
  void set_reads(BatchReads reads) { reads_ = reads; }

 private:
  void prepare(const Graph& g);
  // Schedule::reads of out's batches from first_batch on.
  void collect_reads(const Graph& g, Schedule& out, uint32_t first_batch);
  void run_node_by_node(const Graph& g, Schedule& out);
  void run_depth(const Graph& g, Schedule& out);
  void run_frontier(const Graph& g, Policy& policy, Schedule& out);
  void push_ready(uint32_t s, uint32_t type);  // s: a compact id (see prepare)

  // Per node of the segment (index v - first_): the compact id of the scheduled node that
  // computes its value (itself; for a view, the node it views), or UINT32_MAX (a source, or a
  // view of one or of a node that ran before). With reads, also that node's id (UINT32_MAX for
  // a source; views of nodes that ran before included) and the call output its views pass
  // through (UINT32_MAX: none).
  std::vector<uint32_t> local_, resolved_, view_output_;
  std::vector<uint32_t> sched_;       // per compact id: the node's index from first_
  std::vector<uint32_t> sched_type_;  // per compact id: the node's type
  // Per compact id: consumers (CSR, compact ids), inputs not yet scheduled, depth, height.
  std::vector<uint32_t> consumer_begin_, consumers_, pending_, depth_, height_;
  std::vector<uint32_t> producer_;  // per argument of the segment's nodes (see prepare)
  struct Arc {
    uint32_t producer, consumer;  // compact ids
  };
  std::vector<Arc> arcs_;  // prepare: the segment's arcs between scheduled nodes, in node order
  std::vector<uint32_t> taken_;     // run_frontier: the nodes of the batch being scheduled
  std::vector<uint32_t> chain_;     // compact ids x present types: chain heights
  std::vector<uint32_t> type_count_, bucket_;  // per global type (see prepare)
  std::vector<uint32_t> present_;              // the types of the last segment's scheduled nodes
  uint32_t first_ = 0;  // nodes before it have run; per-node arrays start here
  uint32_t end_ = 0;    // nodes from it on are not scheduled this time
  uint32_t arg_base_ = 0;  // the first argument of the segment's nodes (producer_[0])
  BatchReads reads_ = BatchReads::None;
  bool reading_ = false;  // this run or extend lists its reads
  // With reads_, per argument of the segment's nodes: its scheduled producer (those that ran
  // before included) and the call output it reads.
  std::vector<uint32_t> read_producer_, output_;
  std::vector<uint32_t> batch_of_;  // collect_reads: per graph node scheduled so far, its batch
  uint64_t reads_id_ = 0;           // the Schedule::reads_id batch_of_ describes
  uint32_t reads_batches_ = 0;      // ... up to this batch
  std::vector<uint32_t> triples_, sorted_, cursor_;  // collect_reads: the arguments' reads
  static constexpr uint32_t kRecentBits = 12;
  std::vector<uint64_t> recent_;  // collect_reads: triples met lately
  std::vector<uint32_t> seen_;    // collect_reads: per batch, the reader that last met it
  std::vector<uint64_t> mask_;    // collect_reads: per batch, what that reader reads of it
};

// The scheduled node that computes node `a`'s value (a view resolves to the node it views), or
// UINT32_MAX for inputs and parameters. `output`, when given, is set to the index of the block
// call's output when the views pass through an Output view (left alone otherwise).
uint32_t scheduled_producer(const Graph& g, uint32_t a, uint32_t* output = nullptr);

// Checks that every non-source node runs exactly once, after all its inputs, and that each batch
// holds nodes of its type only. Throws std::runtime_error naming the offending node.
void validate_schedule(const Graph& g, const Schedule& s);

}  // namespace edbatch
