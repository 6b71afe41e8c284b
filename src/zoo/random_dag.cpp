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
      A_.push_back(pc.add_parameters("A" + std::to_string(a), Dim{H, H}));
    for (uint32_t t = 0; t < state_types_; ++t) {
      W_.push_back(pc.add_parameters("W" + std::to_string(t), Dim{H, 2 * H}));
      b_.push_back(pc.add_parameters("b" + std::to_string(t), Dim{H, 1}));
    }
    s0_ = pc.add_parameters("s0", Dim{H, 1});
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
    const Dag& d = dags_[instance];
    if (d.size() == 0)
      throw std::invalid_argument(fmt::format("[random_dag] DAG {} has no states", instance));
    h_.resize(d.size());
    losses_.clear();
    for (uint32_t k = 0; k < d.size(); ++k) {
      inputs_.clear();
      for (uint32_t a = d.arc_begin[k]; a < d.arc_begin[k + 1]; ++a) {
        const DagArc& arc = d.arcs[a];
        if (arc.from >= k)
          throw std::invalid_argument(fmt::format(
              "[random_dag] DAG {}: arc into state {} comes from state {}", instance, k,
              arc.from));
        inputs_.push_back(matmul(parameter(g, A_[arc.type]), h_[arc.from]));
      }
      const Expr s = inputs_.empty() ? parameter(g, s0_) : sum(inputs_);
      const uint32_t t = d.state_types[k];
      h_[k] = tanh(affine({parameter(g, b_[t]), parameter(g, W_[t]),
                           concat({s, lookup(g, E_, d.inputs[k])})}));
      losses_.push_back(node_loss(g, W_out_, h_[k], d.labels[k], logits));
    }
    return sum_losses(losses_);
  }
  Expr build_blocks(Graph&, uint32_t, std::vector<Expr>*) override {
    block_path_missing(name());
  }

 private:
  const std::vector<Dag>& dags_;
  uint32_t classes_ = 0, state_types_ = 1, arc_types_ = 1;
  LookupParameter E_;
  std::vector<Parameter> A_, W_, b_;
  Parameter s0_, W_out_;
  std::vector<Expr> h_, inputs_, losses_;
};

}  // namespace

std::unique_ptr<Model> make_random_dag(ParameterCollection& pc, const Dataset& data,
                                       const ModelOptions& o) {
  return std::make_unique<RandomDag>(pc, data, o);
}

}  // namespace edbatch::zoo
