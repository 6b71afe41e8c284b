// The random-DAG model (`random_dag`): each state sums its typed input arcs, then a state-type
// specific tanh layer over [sum; x].
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::zoo {

namespace {

class RandomDag : public Model {
 public:
  RandomDag(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : Model("random_dag", pc, o), dags_(data.dags) {
    const uint32_t H = o.hidden;
    const DagOptions d;
    classes_ = d.labels;
    for (const Dag& dag : dags_) {
      for (uint8_t t : dag.state_types) state_types_ = std::max<uint32_t>(state_types_, t + 1u);
      for (uint8_t l : dag.labels) classes_ = std::max<uint32_t>(classes_, l + 1u);
      for (const DagArc& a : dag.arcs) arc_types_ = std::max<uint32_t>(arc_types_, a.type + 1u);
    }
    E_ = pc.add_lookup_parameters("E", o.vocab, H);
    for (uint32_t a = 0; a < arc_types_; ++a)
      w_.A.push_back(pc.add_parameters("A" + std::to_string(a), Dim{H, H}));
    for (uint32_t t = 0; t < state_types_; ++t) {
      w_.W.push_back(pc.add_parameters("W" + std::to_string(t), Dim{H, 2 * H}));
      w_.b.push_back(pc.add_parameters("b" + std::to_string(t), Dim{H, 1}));
    }
    w_.s0 = pc.add_parameters("s0", Dim{H, 1});
    W_out_ = pc.add_parameters("W_out", Dim{classes_, H});
  }
  uint32_t size() const override { return static_cast<uint32_t>(dags_.size()); }
  uint32_t num_classes() const override { return classes_; }
  std::vector<uint32_t> labels(uint32_t i) const override {
    const Dag& d = dags_.at(i);
    return std::vector<uint32_t>(d.labels.begin(), d.labels.end());
  }
  std::string math() const override {
    return "state k of type t with input arcs (j, a): s_k = sum over arcs of A<a> h_j "
           "(s0 without arcs)\n"
           "  x_k = E[input_k]; h_k = tanh(W<t> [s_k; x_k] + b<t>)\n"
           "loss: sum over all states of -log softmax(W_out h_k)[label]";
  }

 protected:
  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const Dag& d = dag(instance);
    h_.resize(d.size());
    losses_.clear();
    for (uint32_t k = 0; k < d.size(); ++k) {
      inputs_.clear();
      for (uint32_t a = d.arc_begin[k]; a < d.arc_begin[k + 1]; ++a) {
        const DagArc& arc = arc_into(instance, k, a);
        inputs_.push_back(matmul(parameter(g, w_.A[arc.type]), h_[arc.from]));
      }
      const Expr s = inputs_.empty() ? parameter(g, w_.s0) : sum(inputs_);
      h_[k] = random_dag_state(g, w_, d.state_types[k], s, lookup(g, E_, d.inputs[k]));
      losses_.push_back(node_loss(g, W_out_, h_[k], d.labels[k], logits));
    }
    return sum_losses(losses_);
  }

  // Blocks: a state cell per state type (input s_k; integers input_k, label) with, for its
  // successors, A<a> h_k for every arc type a, and the state's loss (outputs A0 h, A1 h, ...,
  // loss, logits); and its variant for a state without arcs (s0 inside the body). The sums over
  // arcs stay outside.
  Expr build_blocks(Sink& s, uint32_t instance, std::vector<Expr>* logits) override {
    const Dag& d = dag(instance);
    if (state_blocks_[0].empty()) make_blocks();
    const uint32_t outs = 2 + arc_types_;
    products_.resize(static_cast<size_t>(d.size()) * arc_types_);
    out_.resize(outs);
    losses_.clear();
    for (uint32_t k = 0; k < d.size(); ++k) {
      inputs_.clear();
      for (uint32_t a = d.arc_begin[k]; a < d.arc_begin[k + 1]; ++a) {
        const DagArc& arc = arc_into(instance, k, a);
        inputs_.push_back(products_[static_cast<size_t>(arc.from) * arc_types_ + arc.type]);
      }
      const uint32_t t = d.state_types[k], ints[2] = {d.inputs[k], d.labels[k]};
      if (inputs_.empty()) {
        s.call(*state_blocks_[1][t], nullptr, 0, ints, 2, out_.data());
      } else {
        // A sum of one is the value itself.
        const Expr in = inputs_.size() == 1 ? inputs_[0] : s.sum(inputs_);
        s.call(*state_blocks_[0][t], &in, 1, ints, 2, out_.data());
      }
      for (uint32_t a = 0; a < arc_types_; ++a)
        products_[static_cast<size_t>(k) * arc_types_ + a] = out_[a];
      losses_.push_back(call_loss(out_.data(), outs, logits));
    }
    return s.sum_losses(losses_);
  }

 private:
  const Dag& dag(uint32_t instance) const {
    const Dag& d = dags_[instance];
    if (d.size() == 0)
      throw std::invalid_argument(fmt::format("[random_dag] DAG {} has no states", instance));
    return d;
  }
  const DagArc& arc_into(uint32_t instance, uint32_t k, uint32_t a) const {
    const DagArc& arc = dags_[instance].arcs[a];
    if (arc.from >= k)
      throw std::invalid_argument(fmt::format(
          "[random_dag] DAG {}: arc into state {} comes from state {}", instance, k, arc.from));
    return arc;
  }

  void make_blocks() {
    const Dim hd{options_.hidden, 1};
    for (int start = 0; start < 2; ++start)
      for (uint32_t t = 0; t < state_types_; ++t) {
        const std::string block_name =
            "random_dag.state" + std::to_string(t) + (start ? ".start" : "");
        state_blocks_[start].push_back(make_block(pc_, block_name, [&](Block& blk) {
          Graph& g = blk.body();
          const Expr s = start ? parameter(g, w_.s0) : blk.input("s", hd);
          const uint32_t input = blk.index("input"), label = blk.index("label");
          const Expr h = random_dag_state(g, w_, t, s, blk.lookup(E_, input));
          for (uint32_t a = 0; a < arc_types_; ++a)
            blk.output("A" + std::to_string(a) + "h", matmul(parameter(g, w_.A[a]), h));
          output_node_loss(blk, W_out_, h, label);
        }));
      }
  }

  const std::vector<Dag>& dags_;
  uint32_t classes_ = 0, state_types_ = 1, arc_types_ = 1;
  LookupParameter E_;
  RandomDagWeights w_;
  Parameter W_out_;
  // Made on the first block build: state_blocks_[start][state type].
  std::vector<std::unique_ptr<Block>> state_blocks_[2];
  std::vector<Expr> h_, inputs_, losses_, products_, out_;
};

}  // namespace

Expr random_dag_state(Graph& g, const RandomDagWeights& w, uint32_t t, const Expr& s,
                      const Expr& x) {
  return tanh(affine({parameter(g, w.b[t]), parameter(g, w.W[t]), concat({s, x})}));
}

std::unique_ptr<Model> make_random_dag(ParameterCollection& pc, const Dataset& data,
                                       const ModelOptions& o) {
  return std::make_unique<RandomDag>(pc, data, o);
}

}  // namespace edbatch::zoo
