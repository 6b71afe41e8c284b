// Lattice RNNs over character lattices with word arcs: `lattice_lstm` and `lattice_gru`. Node k
// combines an arc cell over its incoming arcs (variable arity: lattice_lstm sums them,
// lattice_gru averages them); char arcs (from k-1) and word arcs have their own embedding table
// and weights.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::zoo {

namespace {

const char* const kArcTypes[2] = {"char", "word"};

uint32_t lattice_classes(const std::vector<Lattice>& lattices) {
  uint32_t classes = 18;
  for (const Lattice& l : lattices)
    for (uint8_t t : l.tags) classes = std::max<uint32_t>(classes, t + 1u);
  return classes;
}

// The shared part: data, per-type tables, the output layer and the walk over nodes and arcs.
class LatticeModel : public Model {
 public:
  // `has_c`: the arc cell carries a memory cell c besides h. `average_arcs`: a node's state is
  // the mean of its arcs' states rather than their sum.
  LatticeModel(const char* name, ParameterCollection& pc, const Dataset& data,
               const ModelOptions& o, bool has_c, bool average_arcs)
      : Model(name, pc, o),
        lattices_(data.lattices),
        classes_(lattice_classes(data.lattices)),
        has_c_(has_c),
        average_arcs_(average_arcs) {
    for (int t = 0; t < 2; ++t)
      E_[t] = pc.add_lookup_parameters(std::string(kArcTypes[t]) + ".E", o.vocab, o.hidden);
  }
  uint32_t size() const override { return static_cast<uint32_t>(lattices_.size()); }
  uint32_t num_classes() const override { return classes_; }
  std::vector<uint32_t> labels(uint32_t i) const override {
    const Lattice& l = lattices_.at(i);
    return std::vector<uint32_t>(l.tags.begin(), l.tags.end());
  }

 protected:
  // The arc cell of type `type` from the state of node j with input x.
  virtual CellState arc(Graph& g, int type, const CellState& from, const Expr& x) = 0;
  virtual CellState no_arcs(Graph& g) = 0;  // the learned state of a node without arcs

  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const Lattice& l = lattices_[instance];
    states_.resize(l.length());
    losses_.clear();
    Sink sink(g, nullptr);  // combine, node by node
    for (uint32_t k = 0; k < l.length(); ++k) {
      const uint32_t a0 = l.arc_begin[k], a1 = l.arc_begin[k + 1];
      if (a0 == a1) {
        states_[k] = no_arcs(g);
      } else {
        hs_.clear();
        cs_.clear();
        for (uint32_t a = a0; a < a1; ++a) {
          const LatticeArc& arc_in = l.arcs[a];
          const int type = arc_type(instance, k, arc_in);
          const CellState s = arc(g, type, states_[arc_in.from], lookup(g, E_[type], arc_in.id));
          hs_.push_back(s.h);
          if (s.c.graph) cs_.push_back(s.c);
        }
        states_[k].h = combine(sink, hs_);
        states_[k].c = cs_.empty() ? Expr{} : combine(sink, cs_);
      }
      losses_.push_back(node_loss(g, W_out_, states_[k].h, l.tags[k], logits));
    }
    return sum_losses(losses_);
  }
  // Blocks: an arc cell per arc type (inputs h_j and c_j; integer id; outputs h', c'), its
  // variant from a node without arcs (h_j, c_j = the learned state, inside the body), and the node
  // loss (input h_k, or the learned state; integer tag). The sums (means) over arcs stay outside.
  Expr build_blocks(Sink& s, uint32_t instance, std::vector<Expr>* logits) override {
    const Lattice& l = lattices_[instance];
    if (!loss_block_) make_blocks();
    states_.resize(l.length());
    start_.assign(l.length(), 0);
    losses_.clear();
    const uint32_t outs = has_c_ ? 2 : 1;
    Expr out[2];
    for (uint32_t k = 0; k < l.length(); ++k) {
      const uint32_t a0 = l.arc_begin[k], a1 = l.arc_begin[k + 1], tag = l.tags[k];
      if (a0 == a1) {
        start_[k] = 1;
        s.call(*start_loss_block_, nullptr, 0, &tag, 1, out);
        losses_.push_back(call_loss(out, 2, logits));
        continue;
      }
      hs_.clear();
      cs_.clear();
      for (uint32_t a = a0; a < a1; ++a) {
        const LatticeArc& arc_in = l.arcs[a];
        const int type = arc_type(instance, k, arc_in);
        const CellState& from = states_[arc_in.from];
        const Expr in[2] = {from.h, from.c};
        if (start_[arc_in.from])
          s.call(*arc_blocks_[type][1], nullptr, 0, &arc_in.id, 1, out);
        else
          s.call(*arc_blocks_[type][0], in, outs, &arc_in.id, 1, out);
        hs_.push_back(out[0]);
        if (has_c_) cs_.push_back(out[1]);
      }
      // A sum or mean of one is the value itself.
      states_[k].h = hs_.size() == 1 ? hs_[0] : combine(s, hs_);
      states_[k].c = !has_c_ ? Expr{} : cs_.size() == 1 ? cs_[0] : combine(s, cs_);
      s.call(*loss_block_, &states_[k].h, 1, &tag, 1, out);
      losses_.push_back(call_loss(out, 2, logits));
    }
    return s.sum_losses(losses_);
  }

  const std::vector<Lattice>& lattices_;
  uint32_t classes_;
  LookupParameter E_[2];
  Parameter W_out_;

 private:
  // 0 for a char arc (from k-1), 1 for a word arc; throws unless the arc comes from before k.
  int arc_type(uint32_t instance, uint32_t k, const LatticeArc& arc_in) const {
    if (arc_in.from >= k)
      throw std::invalid_argument(
          fmt::format("[{}] lattice {}: arc into node {} comes from node {}", name(), instance, k,
                      arc_in.from));
    return Lattice::is_word_arc(k, arc_in) ? 1 : 0;
  }

  void make_blocks() {
    const Dim h{options_.hidden, 1};
    for (int t = 0; t < 2; ++t)
      for (int from_start = 0; from_start < 2; ++from_start) {
        const std::string block_name =
            name() + "." + kArcTypes[t] + (from_start ? "_from_start" : "");
        arc_blocks_[t][from_start] = make_block(pc_, block_name, [&](Block& blk) {
          CellState from;
          if (from_start) {
            from = no_arcs(blk.body());
          } else {
            from.h = blk.input("h", h);
            if (has_c_) from.c = blk.input("c", h);
          }
          const uint32_t id = blk.index("id");
          const CellState s = arc(blk.body(), t, from, blk.lookup(E_[t], id));
          blk.output("h", s.h);
          if (has_c_) blk.output("c", s.c);
        });
      }
    loss_block_ = make_block(pc_, name() + ".loss", [&](Block& blk) {
      const Expr hk = blk.input("h", h);
      output_node_loss(blk, W_out_, hk, blk.index("tag"));
    });
    start_loss_block_ = make_block(pc_, name() + ".start_loss", [&](Block& blk) {
      output_node_loss(blk, W_out_, no_arcs(blk.body()).h, blk.index("tag"));
    });
  }

  // Sum or mean over a node's arcs.
  Expr combine(Sink& s, const std::vector<Expr>& xs) const {
    return average_arcs_ ? s.average(xs) : s.sum(xs);
  }

  const bool has_c_, average_arcs_;
  // Made on the first block build: arc_blocks_[type][from a node without arcs].
  std::unique_ptr<Block> arc_blocks_[2][2], loss_block_, start_loss_block_;
  std::vector<CellState> states_;
  std::vector<uint8_t> start_;  // per node: it has no arcs (its state is the learned one)
  std::vector<Expr> hs_, cs_, losses_;
};

// Per arc type t and gate g in {f, c, i, o}: U_{t,g} x + W_{t,g} h_j + b_{t,g}.
class LatticeLstm : public LatticeModel {
 public:
  LatticeLstm(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : LatticeModel("lattice_lstm", pc, data, o, true, false) {
    const uint32_t H = o.hidden;
    for (int t = 0; t < 2; ++t)
      for (int gate = 0; gate < 4; ++gate) {
        const std::string p = std::string(kArcTypes[t]) + ".", s = std::string("_") + "fcio"[gate];
        w_.U[t][gate] = pc.add_parameters(p + "U" + s, Dim{H, H});
        w_.W[t][gate] = pc.add_parameters(p + "W" + s, Dim{H, H});
        w_.b[t][gate] = pc.add_parameters(p + "b" + s, Dim{H, 1});
      }
    w_.h0 = pc.add_parameters("h0", Dim{H, 1});
    w_.c0 = pc.add_parameters("c0", Dim{H, 1});
    W_out_ = pc.add_parameters("W_out", Dim{classes_, H});
  }
  std::string math() const override {
    return "arc (j, id) into node k, type t = char if j = k-1 else word; x = t.E[id]:\n"
           "  f = sigmoid(t.U_f x + t.W_f h_j + t.b_f); c~ = tanh(t.U_c x + t.W_c h_j + t.b_c)\n"
           "  i = sigmoid(t.U_i x + t.W_i h_j + t.b_i); o = sigmoid(t.U_o x + t.W_o h_j + t.b_o)\n"
           "  c' = i.c~ + f.c_j; h' = o.tanh(c')\n"
           "node: h_k = sum over arcs of h'; c_k = sum over arcs of c'; (h0, c0) without arcs\n"
           "loss: sum over all nodes of -log softmax(W_out h_k)[tag]";
  }

 protected:
  CellState arc(Graph& g, int t, const CellState& from, const Expr& x) override {
    return lattice_lstm_arc(g, w_, t, from, x);
  }
  CellState no_arcs(Graph& g) override { return {parameter(g, w_.h0), parameter(g, w_.c0)}; }

 private:
  LatticeLstmWeights w_;
};

// Per arc type t: r, z, c from U_* h_j + W_* x + b_*; h' = z.h_j + (1-z).c. A node averages its
// arcs' states: h' mixes h_j and a tanh convexly, so with the mean no state leaves
// [-max(1, |h0|), max(1, |h0|)]; a sum grows about geometrically along lattices with fan-in.
class LatticeGru : public LatticeModel {
 public:
  LatticeGru(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : LatticeModel("lattice_gru", pc, data, o, false, true) {
    const uint32_t H = o.hidden;
    for (int t = 0; t < 2; ++t)
      for (int gate = 0; gate < 3; ++gate) {
        const std::string p = std::string(kArcTypes[t]) + ".", s = std::string("_") + "rzc"[gate];
        w_.U[t][gate] = pc.add_parameters(p + "U" + s, Dim{H, H});
        w_.W[t][gate] = pc.add_parameters(p + "W" + s, Dim{H, H});
        w_.b[t][gate] = pc.add_parameters(p + "b" + s, Dim{H, 1});
      }
    w_.h0 = pc.add_parameters("h0", Dim{H, 1});
    W_out_ = pc.add_parameters("W_out", Dim{classes_, H});
  }
  std::string math() const override {
    return "arc (j, id) into node k, type t = char if j = k-1 else word; x = t.E[id]:\n"
           "  r = sigmoid(t.U_r h_j + t.W_r x + t.b_r); z = sigmoid(t.U_z h_j + t.W_z x + t.b_z)\n"
           "  c = tanh(t.U_c (r.h_j) + t.W_c x + t.b_c); h' = z.h_j + (1-z).c\n"
           "node: h_k = mean over arcs of h'; h0 without arcs\n"
           "loss: sum over all nodes of -log softmax(W_out h_k)[tag]";
  }

 protected:
  CellState arc(Graph& g, int t, const CellState& from, const Expr& x) override {
    return lattice_gru_arc(g, w_, t, from, x);
  }
  CellState no_arcs(Graph& g) override { return {parameter(g, w_.h0), Expr{}}; }

 private:
  LatticeGruWeights w_;
};

}  // namespace

CellState lattice_lstm_arc(Graph& g, const LatticeLstmWeights& w, int t, const CellState& from,
                           const Expr& x) {
  Expr gates[4];
  for (int k = 0; k < 4; ++k)
    gates[k] = affine({parameter(g, w.b[t][k]), parameter(g, w.U[t][k]), x,
                       parameter(g, w.W[t][k]), from.h});
  const Expr f = sigmoid(gates[0]), c_new = tanh(gates[1]), i = sigmoid(gates[2]),
             o = sigmoid(gates[3]);
  const Expr c = sum({cmult(i, c_new), cmult(f, from.c)});
  return {cmult(o, tanh(c)), c};
}

CellState lattice_gru_arc(Graph& g, const LatticeGruWeights& w, int t, const CellState& from,
                          const Expr& x) {
  const Expr& h = from.h;
  auto gate = [&](int k, const Expr& on_h) {
    return affine(
        {parameter(g, w.b[t][k]), parameter(g, w.U[t][k]), on_h, parameter(g, w.W[t][k]), x});
  };
  const Expr r = sigmoid(gate(0, h)), z = sigmoid(gate(1, h));
  const Expr c = tanh(gate(2, cmult(r, h)));
  return {sum({cmult(z, h), cmult(1.0f - z, c)}), Expr{}};
}

std::unique_ptr<Model> make_lattice_lstm(ParameterCollection& pc, const Dataset& data,
                                         const ModelOptions& o) {
  return std::make_unique<LatticeLstm>(pc, data, o);
}

std::unique_ptr<Model> make_lattice_gru(ParameterCollection& pc, const Dataset& data,
                                        const ModelOptions& o) {
  return std::make_unique<LatticeGru>(pc, data, o);
}

}  // namespace edbatch::zoo
