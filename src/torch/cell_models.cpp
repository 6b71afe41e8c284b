// The cells the PyTorch ops run, as blocks: the zoo's cells (src/zoo/zoo_internal.h), with the
// embedding lookups replaced by rows of the op's input x.
#include <fmt/format.h>

#include <stdexcept>

#include "edbatch/zoo.h"
#include "src/torch/cells.h"
#include "src/torch/program.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::torch_adapter {

namespace {

// `what`: what node k lacks.
void need_input(const Packed& p, int64_t k, const char* fn, const char* cell,
                const char* what = "has no predecessors and no input row") {
  if (p.node_inputs[k] < 0)
    throw std::invalid_argument(fmt::format("[{}] {}: node {} {}", fn, cell, k, what));
}

void binary_tree_check(const Packed& p, const char* fn, const char* cell) {
  for (int64_t k = 0; k < p.num_nodes; ++k) {
    const int64_t n = p.pred_ptr[k + 1] - p.pred_ptr[k];
    if (n == 0) need_input(p, k, fn, cell);
    else if (n != 2)
      throw std::invalid_argument(fmt::format(
          "[{}] {}: node {} has {} children; a binary tree node has 0 or 2", fn, cell, k, n));
    if (p.node_types[k] != 0)
      throw std::invalid_argument(
          fmt::format("[{}] {}: node {} has type {}; this cell has one type", fn, cell, k,
                      p.node_types[k]));
  }
}

template <class Declare>
std::unique_ptr<Block> frozen(ParameterCollection& pc, const std::string& name, Declare declare) {
  return zoo::make_block(pc, name, declare);
}

// ---- Tree-LSTM (the zoo's cells) ----

class TreeLstmCell : public Cell {
 public:
  TreeLstmCell(ParameterCollection& pc, uint32_t H, uint32_t D) : Cell(H, D) {
    TreeLstmLeafWeights l;
    l.W_i = add(pc, "W_i", H, D);
    l.W_o = add(pc, "W_o", H, D);
    l.W_u = add(pc, "W_u", H, D);
    l.b_i = add(pc, "b_i", H, 0);
    l.b_o = add(pc, "b_o", H, 0);
    l.b_u = add(pc, "b_u", H, 0);
    const TreeLstmInnerWeights n{add(pc, "U_i", H, 2 * H), add(pc, "U_o", H, 2 * H),
                                 add(pc, "U_u", H, 2 * H), add(pc, "U_f1", H, H),
                                 add(pc, "U_f2", H, H),    l.b_i,
                                 l.b_o,                    l.b_u,
                                 add(pc, "b_f", H, 0)};
    const Dim h{H, 1};
    leaf_ = frozen(pc, "tree_lstm.leaf", [&](Block& b) {
      const CellState s = zoo::tree_lstm_leaf_cell(b.body(), l, b.input("x", Dim{D, 1}));
      b.output("h", s.h);
      b.output("c", s.c);
    });
    inner_ = frozen(pc, "tree_lstm.inner", [&](Block& b) {
      const CellState left{b.input("h1", h), b.input("c1", h)};
      const CellState right{b.input("h2", h), b.input("c2", h)};
      const CellState s = tree_lstm_inner(b.body(), n, left, right);
      b.output("h", s.h);
      b.output("c", s.c);
    });
  }
  uint32_t num_outputs() const override { return 2; }
  void check(const Packed& p, const char* fn) const override {
    binary_tree_check(p, fn, "tree_lstm");
  }
  void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
             std::vector<Expr>& out) override {
    const int64_t N = p.num_nodes;
    Expr o[2];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t a = p.pred_ptr[k];
      if (a == p.pred_ptr[k + 1]) {
        leaf_->call(g, &x[p.node_inputs[k]], 1, nullptr, 0, o);
      } else {
        const int64_t l = p.pred_ids[a], r = p.pred_ids[a + 1];
        const Expr in[4] = {out[l], out[N + l], out[r], out[N + r]};
        inner_->call(g, in, 4, nullptr, 0, o);
      }
      out[k] = o[0];
      out[N + k] = o[1];
    }
  }

 private:
  std::unique_ptr<Block> leaf_, inner_;
};

// ---- Tree-GRU (the zoo's cells) ----

class TreeGruCell : public Cell {
 public:
  TreeGruCell(ParameterCollection& pc, uint32_t H) : Cell(H, H) {
    zoo::TreeGruWeights w;
    w.U_r = add(pc, "U_r", H, H);
    w.U_z = add(pc, "U_z", H, H);
    w.U_c = add(pc, "U_c", H, H);
    for (int k = 0; k < 2; ++k) {
      const std::string n = std::to_string(k + 1);
      w.U_rk[k] = add(pc, "U_r" + n, H, H);
      w.U_zk[k] = add(pc, "U_z" + n, H, H);
      w.U_ck[k] = add(pc, "U_c" + n, H, H);
    }
    w.b_r = add(pc, "b_r", H, 0);
    w.b_z = add(pc, "b_z", H, 0);
    w.b_c = add(pc, "b_c", H, 0);
    const Dim h{H, 1};
    leaf_ = frozen(pc, "tree_gru.leaf", [&](Block& b) {
      b.output("h", zoo::tree_gru_leaf(b.body(), w, b.input("x", h)));
    });
    inner_ = frozen(pc, "tree_gru.inner", [&](Block& b) {
      const Expr h1 = b.input("h1", h), h2 = b.input("h2", h);
      b.output("h", zoo::tree_gru_inner(b.body(), w, h1, h2));
    });
  }
  uint32_t num_outputs() const override { return 1; }
  void check(const Packed& p, const char* fn) const override {
    binary_tree_check(p, fn, "tree_gru");
  }
  void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
             std::vector<Expr>& out) override {
    for (int64_t k = 0; k < p.num_nodes; ++k) {
      const int64_t a = p.pred_ptr[k];
      if (a == p.pred_ptr[k + 1]) {
        leaf_->call(g, &x[p.node_inputs[k]], 1, nullptr, 0, &out[k]);
      } else {
        const Expr in[2] = {out[p.pred_ids[a]], out[p.pred_ids[a + 1]]};
        inner_->call(g, in, 2, nullptr, 0, &out[k]);
      }
    }
  }

 private:
  std::unique_ptr<Block> leaf_, inner_;
};

// ---- Lattice LSTM / GRU (the zoo's arc cells): an arc cell per arc type, summed per node ----

const char* const kArcTypes[2] = {"char", "word"};

class LatticeCell : public Cell {
 public:
  uint32_t num_outputs() const override { return lstm_ ? 2 : 1; }
  void check(const Packed& p, const char* fn) const override {
    for (int64_t a = 0; a < p.num_arcs; ++a) {
      if (p.arc_types[a] > 1)
        throw std::invalid_argument(fmt::format(
            "[{}] {}: arc {} has type {}; lattice arcs are 0 (char) or 1 (word)", fn, name_, a,
            p.arc_types[a]));
      if (p.arc_inputs[a] < 0)
        throw std::invalid_argument(
            fmt::format("[{}] {}: arc {} has no input row", fn, name_, a));
    }
  }
  void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
             std::vector<Expr>& out) override {
    const int64_t N = p.num_nodes;
    Expr o[2];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t a0 = p.pred_ptr[k], a1 = p.pred_ptr[k + 1];
      if (a0 == a1) {
        const CellState s = no_arcs(g);
        out[k] = s.h;
        if (lstm_) out[N + k] = s.c;
        continue;
      }
      hs_.clear();
      cs_.clear();
      for (int64_t a = a0; a < a1; ++a) {
        const int64_t j = p.pred_ids[a], t = p.arc_types[a];
        Expr in[3];
        uint32_t n = 0;
        const bool from_start = p.pred_ptr[j] == p.pred_ptr[j + 1];
        if (!from_start) {
          in[n++] = out[j];
          if (lstm_) in[n++] = out[N + j];
        }
        in[n++] = x[p.arc_inputs[a]];
        arcs_[t][from_start]->call(g, in, n, nullptr, 0, o);
        hs_.push_back(o[0]);
        if (lstm_) cs_.push_back(o[1]);
      }
      out[k] = hs_.size() == 1 ? hs_[0] : sum(hs_);
      if (lstm_) out[N + k] = cs_.size() == 1 ? cs_[0] : sum(cs_);
    }
  }
  // A chain step: the char arc (type 0) from the previous state, reading the x row.
  bool step(Graph& g, const Expr* x, const Expr* prev, Expr* out) override {
    const Expr in[3] = {prev[0], lstm_ ? prev[1] : x[0], x[0]};
    arcs_[0][0]->call(g, in, lstm_ ? 3 : 2, nullptr, 0, out);
    return true;
  }

 protected:
  LatticeCell(const char* name, bool lstm, uint32_t H, uint32_t D)
      : Cell(H, D), name_(name), lstm_(lstm) {}
  // The arc cell of type t from state `from` with input x.
  virtual CellState arc(Graph& g, int t, const CellState& from, const Expr& x) = 0;
  // The learned state of a node without arcs.
  virtual CellState no_arcs(Graph& g) = 0;
  void make_blocks(ParameterCollection& pc) {
    const Dim h{hidden(), 1}, xd{input_dim(), 1};
    for (int t = 0; t < 2; ++t)
      for (int start = 0; start < 2; ++start)
        arcs_[t][start] = frozen(
            pc, std::string(name_) + "." + kArcTypes[t] + (start ? "_from_start" : ""),
            [&](Block& b) {
              CellState from;
              if (start) {
                from = no_arcs(b.body());
              } else {
                from.h = b.input("h", h);
                if (lstm_) from.c = b.input("c", h);
              }
              const CellState s = arc(b.body(), t, from, b.input("x", xd));
              b.output("h", s.h);
              if (lstm_) b.output("c", s.c);
            });
  }

  const char* name_;
  bool lstm_;

 private:
  std::unique_ptr<Block> arcs_[2][2];  // [arc type][from a node without arcs]
  std::vector<Expr> hs_, cs_;
};

class LatticeLstmCell : public LatticeCell {
 public:
  LatticeLstmCell(ParameterCollection& pc, uint32_t H, uint32_t D)
      : LatticeCell("lattice_lstm", true, H, D) {
    for (int t = 0; t < 2; ++t)
      for (int k = 0; k < 4; ++k) {
        const std::string p = std::string(kArcTypes[t]) + "_", gate = std::string("_") + "fcio"[k];
        w_.U[t][k] = add(pc, p + "U" + gate, H, D);
        w_.W[t][k] = add(pc, p + "W" + gate, H, H);
        w_.b[t][k] = add(pc, p + "b" + gate, H, 0);
      }
    w_.h0 = add(pc, "h0", H, 0);
    w_.c0 = add(pc, "c0", H, 0);
    make_blocks(pc);
  }

 protected:
  CellState arc(Graph& g, int t, const CellState& from, const Expr& x) override {
    return zoo::lattice_lstm_arc(g, w_, t, from, x);
  }
  CellState no_arcs(Graph& g) override { return {parameter(g, w_.h0), parameter(g, w_.c0)}; }

 private:
  zoo::LatticeLstmWeights w_;
};

class LatticeGruCell : public LatticeCell {
 public:
  LatticeGruCell(ParameterCollection& pc, uint32_t H, uint32_t D)
      : LatticeCell("lattice_gru", false, H, D) {
    for (int t = 0; t < 2; ++t)
      for (int k = 0; k < 3; ++k) {
        const std::string p = std::string(kArcTypes[t]) + "_", gate = std::string("_") + "rzc"[k];
        w_.U[t][k] = add(pc, p + "U" + gate, H, H);
        w_.W[t][k] = add(pc, p + "W" + gate, H, D);
        w_.b[t][k] = add(pc, p + "b" + gate, H, 0);
      }
    w_.h0 = add(pc, "h0", H, 0);
    make_blocks(pc);
  }

 protected:
  CellState arc(Graph& g, int t, const CellState& from, const Expr& x) override {
    return zoo::lattice_gru_arc(g, w_, t, from, x);
  }
  CellState no_arcs(Graph& g) override { return {parameter(g, w_.h0), Expr{}}; }

 private:
  zoo::LatticeGruWeights w_;
};

// ---- Random-DAG state cell (the zoo's) ----

class RandomDagCell : public Cell {
 public:
  RandomDagCell(ParameterCollection& pc, uint32_t H, uint32_t D, uint32_t state_types,
                uint32_t arc_types)
      : Cell(H, D), state_types_(state_types), arc_types_(arc_types) {
    zoo::RandomDagWeights w;
    for (uint32_t a = 0; a < arc_types; ++a) w.A.push_back(add(pc, "A" + std::to_string(a), H, H));
    for (uint32_t t = 0; t < state_types; ++t) {
      w.W.push_back(add(pc, "W" + std::to_string(t), H, H + D));
      w.b.push_back(add(pc, "b" + std::to_string(t), H, 0));
    }
    w.s0 = add(pc, "s0", H, 0);
    const Dim h{H, 1}, xd{D, 1};
    for (int start = 0; start < 2; ++start)
      for (uint32_t t = 0; t < state_types; ++t)
        blocks_[start].push_back(frozen(
            pc, "random_dag.state" + std::to_string(t) + (start ? ".start" : ""), [&](Block& blk) {
              Graph& g = blk.body();
              const Expr s = start ? parameter(g, w.s0) : blk.input("s", h);
              const Expr hk = zoo::random_dag_state(g, w, t, s, blk.input("x", xd));
              blk.output("h", hk);
              for (uint32_t a = 0; a < arc_types; ++a)
                blk.output("A" + std::to_string(a) + "h", matmul(parameter(g, w.A[a]), hk));
            }));
  }
  uint32_t num_outputs() const override { return 1; }
  void check(const Packed& p, const char* fn) const override {
    for (int64_t k = 0; k < p.num_nodes; ++k) {
      need_input(p, k, fn, "random_dag", "has no input row (every state reads one)");
      if (p.node_types[k] >= state_types_)
        throw std::invalid_argument(fmt::format("[{}] random_dag: state {} has type {}, not below "
                                                "the {} state types",
                                                fn, k, p.node_types[k], state_types_));
    }
    for (int64_t a = 0; a < p.num_arcs; ++a)
      if (p.arc_types[a] >= arc_types_)
        throw std::invalid_argument(fmt::format(
            "[{}] random_dag: arc {} has type {}, not below the {} arc types", fn, a,
            p.arc_types[a], arc_types_));
  }
  void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
             std::vector<Expr>& out) override {
    const uint32_t A = arc_types_;
    products_.resize(static_cast<size_t>(p.num_nodes) * A);
    std::vector<Expr> o(1 + A);
    for (int64_t k = 0; k < p.num_nodes; ++k) {
      inputs_.clear();
      for (int64_t a = p.pred_ptr[k]; a < p.pred_ptr[k + 1]; ++a)
        inputs_.push_back(products_[p.pred_ids[a] * A + p.arc_types[a]]);
      const Expr& xk = x[p.node_inputs[k]];
      if (inputs_.empty()) {
        blocks_[1][p.node_types[k]]->call(g, &xk, 1, nullptr, 0, o.data());
      } else {
        // A sum of one is the value itself.
        const Expr in[2] = {inputs_.size() == 1 ? inputs_[0] : sum(inputs_), xk};
        blocks_[0][p.node_types[k]]->call(g, in, 2, nullptr, 0, o.data());
      }
      out[k] = o[0];
      for (uint32_t a = 0; a < A; ++a) products_[k * A + a] = o[1 + a];
    }
  }

 private:
  uint32_t state_types_, arc_types_;
  std::vector<std::unique_ptr<Block>> blocks_[2];  // [start][state type]
  std::vector<Expr> inputs_, products_;
};

// ---- MV-RNN (the zoo's inner cell) ----

// A leaf's row of x is [v; vec(M)] (M column-major); outputs v and vec(M) of every node.
class MvrnnCell : public Cell {
 public:
  MvrnnCell(ParameterCollection& pc, uint32_t H) : Cell(H, H + H * H) {
    zoo::MvrnnWeights w;
    w.W_v = add(pc, "W_v", H, 2 * H);
    w.b_v = add(pc, "b_v", H, 0);
    w.W_M = add(pc, "W_M", H, 2 * H);
    w.b_M = add(pc, "b_M", H, H);
    const Dim h{H, 1}, hh{H, H};
    inner_ = frozen(pc, "mvrnn.inner", [&](Block& b) {
      const Expr v1 = b.input("v1", h), M1 = b.input("M1", hh);
      const Expr v2 = b.input("v2", h), M2 = b.input("M2", hh);
      b.output("v", zoo::mvrnn_v(b.body(), w, v1, M1, v2, M2));
      b.output("M", zoo::mvrnn_M(b.body(), w, M1, M2));
    });
  }
  uint32_t num_outputs() const override { return 2; }
  uint32_t output_size(uint32_t o) const override { return o == 0 ? hidden() : hidden() * hidden(); }
  std::vector<uint32_t> input_segments() const override { return {hidden(), hidden() * hidden()}; }
  void check(const Packed& p, const char* fn) const override {
    binary_tree_check(p, fn, "mvrnn");
  }
  void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
             std::vector<Expr>& out) override {
    const int64_t N = p.num_nodes;
    const uint32_t H = hidden();
    M_.resize(N);
    Expr o[2];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t a = p.pred_ptr[k];
      if (a == p.pred_ptr[k + 1]) {
        const int64_t r = p.node_inputs[k];
        out[k] = x[2 * r];
        out[N + k] = x[2 * r + 1];
        M_[k] = reshape(x[2 * r + 1], Dim{H, H});
        continue;
      }
      const int64_t l = p.pred_ids[a], r = p.pred_ids[a + 1];
      const Expr in[4] = {out[l], M_[l], out[r], M_[r]};
      inner_->call(g, in, 4, nullptr, 0, o);
      out[k] = o[0];
      M_[k] = o[1];
      out[N + k] = reshape(o[1], Dim{H * H, 1});
    }
  }

 private:
  std::unique_ptr<Block> inner_;
  std::vector<Expr> M_;
};

}  // namespace

const std::vector<std::string>& cell_names() {
  static const std::vector<std::string> names = {"tree_lstm", "tree_gru", "lattice_lstm",
                                                  "lattice_gru", "random_dag", "mvrnn"};
  return names;
}

std::unique_ptr<Cell> make_cell(const CellConfig& c, ParameterCollection& pc) {
  if (is_program(c.cell))
    return make_program_cell(c.cell.substr(std::string(kProgramPrefix).size()), pc);
  if (c.hidden == 0 || c.input_dim == 0)
    throw std::invalid_argument(fmt::format("[make_cell] {}: hidden size {} and input size {} "
                                            "must be positive",
                                            c.cell, c.hidden, c.input_dim));
  if (c.cell == "tree_lstm") return std::make_unique<TreeLstmCell>(pc, c.hidden, c.input_dim);
  if (c.cell == "tree_gru") {
    if (c.input_dim != c.hidden)
      throw std::invalid_argument(fmt::format(
          "[make_cell] tree_gru: input size {} must equal the hidden size {}", c.input_dim,
          c.hidden));
    return std::make_unique<TreeGruCell>(pc, c.hidden);
  }
  if (c.cell == "lattice_lstm")
    return std::make_unique<LatticeLstmCell>(pc, c.hidden, c.input_dim);
  if (c.cell == "lattice_gru") return std::make_unique<LatticeGruCell>(pc, c.hidden, c.input_dim);
  if (c.cell == "mvrnn") {
    if (c.input_dim != c.hidden + c.hidden * c.hidden)
      throw std::invalid_argument(fmt::format(
          "[make_cell] mvrnn: input size {} must be hidden + hidden^2 = {} (a leaf's v and M)",
          c.input_dim, c.hidden + c.hidden * c.hidden));
    return std::make_unique<MvrnnCell>(pc, c.hidden);
  }
  if (c.cell == "random_dag")
    return std::make_unique<RandomDagCell>(pc, c.hidden, c.input_dim, c.node_types, c.arc_types);
  std::string names;
  for (const std::string& n : cell_names()) names += (names.empty() ? "" : ", ") + n;
  throw std::invalid_argument(
      fmt::format("[make_cell] unknown cell '{}' (known: {})", c.cell, names));
}

}  // namespace edbatch::torch_adapter
