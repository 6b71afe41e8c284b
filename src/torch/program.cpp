#include "src/torch/program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "edbatch/block.h"
#include "kernels/op_math.h"
#include "src/torch/program_parts.h"

namespace edbatch::torch_adapter {

namespace {

// The program's one-argument instructions without fields (docs/programs.md).
const std::map<std::string, Expr (*)(const Expr&)> kUnary = {
    {"sigmoid", sigmoid},   {"tanh", tanh},
    {"relu", relu},         {"gelu", gelu},
    {"softplus", softplus}, {"exp", exp},
    {"log", log},           {"sqrt", sqrt},
    {"abs", abs},           {"sin", sin},
    {"cos", cos},           {"erf", erf},
    {"atan", atan},         {"sinh", sinh},
    {"cosh", cosh},         {"asinh", asinh},
    {"atanh", atanh},       {"asin", asin},
    {"acos", acos},         {"floor", floor},
    {"erfc", erfc},         {"lgamma", lgamma},
    {"digamma", digamma},   {"erfinv", erfinv},
    {"round", round},       {"stop_gradient", stop_gradient},
    {"softmax", softmax},   {"log_softmax", log_softmax}};

// The program's two-argument elementwise instructions.
const std::map<std::string, Expr (*)(const Expr&, const Expr&)> kBinary = {
    {"add", add},    {"sub", subtract},        {"mul", cmult},
    {"div", divide}, {"atan2", atan2},         {"hypot", hypot},
    {"fmod", fmod},  {"remainder", remainder}, {"copysign", copysign}};

class ProgramCell : public Cell {
 public:
  ProgramCell(const json& doc, ParameterCollection& pc, uint32_t input_size);
  uint32_t num_outputs() const override { return static_cast<uint32_t>(state_.size()); }
  uint32_t output_size(uint32_t o) const override { return state_.at(o); }
  std::vector<uint32_t> input_segments() const override {
    return kind_ == InputKind::X ? std::vector<uint32_t>{input_dim()} : std::vector<uint32_t>{};
  }
  void check(const Packed& p, const char* fn) const override;
  void build(Graph& g, const Packed& p, const std::vector<Expr>& x,
             std::vector<Expr>& out) override;
  bool step(Graph& g, const Expr* x, const Expr* prev, Expr* out) override;

 private:
  void read_weights(const json& doc, ParameterCollection& pc);
  void compile(CellProgram& c, bool edge, ParameterCollection& pc, uint32_t site);
  Expr translate(Block& blk, CellProgram& c, const Instr& in, size_t v, std::vector<Expr>& val,
                 std::vector<LinearForm>& form, const std::vector<uint32_t>& uses,
                 const std::map<int32_t, Expr>& slots, uint32_t& next_site);
  Expr translate_at(Block& blk, CellProgram& c, size_t v, std::vector<Expr>& val,
                    std::vector<LinearForm>& form, const std::vector<uint32_t>& uses,
                    const std::map<int32_t, Expr>& slots, uint32_t& next_site);
  void compile_projection(CellProgram& c, const Hoisting& h, const std::vector<uint32_t>& uses);
  const Expr* projected(Graph& g, const Packed& p, CellProgram& c, int64_t in_row, const Expr* x);
  Expr affine_of(Graph& b, const LinearForm& f);
  Parameter weight(int32_t w, const std::string& at, bool vector) const;
  Parameter constant(float value, uint32_t size);
  Expr zeros(Graph& g, uint32_t size);
  // The id that row `row` of p embeds (no_id_ for -1).
  uint32_t id_of(const Packed& p, int64_t row) const {
    return row >= 0 ? static_cast<uint32_t>(p.ids[row]) : no_id_;
  }
  // Calls cell c: `floats` are the values of its slots 0, 1, ...; `in_row` the x/ids row.
  void check_id(const Packed& p, const char* fn, const CellProgram& c, int64_t row,
                const char* what, int64_t at) const;
  void call(Graph& g, const Packed& p, CellProgram& c, const Expr* floats, int64_t in_row,
            const Expr* x, uint32_t key_index, Expr* outs);

  ParameterCollection& pc_;
  InputKind kind_ = InputKind::X;
  Reduce reduce_ = Reduce::Sum;
  std::vector<uint32_t> state_, message_;
  std::vector<Parameter> params_;  // one per weight (lookup tables by id too)
  std::vector<std::string> layouts_;
  std::vector<Parameter> initial_;  // learned initial message, per component
  std::vector<CellProgram> cells_;
  std::vector<uint32_t> node_cells_, edge_cells_;
  // By the value's bits and size: a float key would match NaN to every value, and -0 to 0.
  std::map<std::pair<uint32_t, uint32_t>, Parameter> constants_;
  uint32_t sites_ = 0;
  // The id that row -1 embeds (every lookup table's columns from its rows up to it are zeros);
  // each weight's rows when it is a lookup table (else 0).
  uint32_t no_id_ = 0;
  std::vector<uint32_t> lookup_rows_;
  // Per build: zero columns by size, the messages of one node; step()'s message (kept: a step
  // runs per decoded row).
  std::map<uint32_t, Expr> zeros_;
  std::vector<std::vector<Expr>> messages_;
  std::vector<Expr> step_reduced_;
};

ProgramCell::ProgramCell(const json& doc, ParameterCollection& pc, uint32_t input_size)
    : Cell(1, input_size), pc_(pc) {
  const std::string at = "document";
  if (field<int>(doc, "version", at) != 1) bad("only version 1 is known");
  const json& input = doc.at("input");
  const std::string kind = field<std::string>(input, "kind", "input");
  kind_ = kind == "x" ? InputKind::X : kind == "ids" ? InputKind::Ids : InputKind::None;
  if (kind != "x" && kind != "ids" && kind != "none")
    bad("input kind '" + kind + "' (expected x, ids or none)");
  state_ = field<std::vector<uint32_t>>(doc, "state", at);
  message_ = field<std::vector<uint32_t>>(doc, "message", at);
  if (state_.empty() || message_.empty()) bad("empty state or message");
  for (uint32_t s : state_)
    if (s == 0) bad("a state component of size 0");
  reduce_ = read_reduce(field<std::string>(doc, "reduce", at), message_);
  read_weights(doc, pc);
  const std::string initial = field<std::string>(doc, "initial", at);
  if (initial == "learned") {
    const auto ws = field<std::vector<int32_t>>(doc, "initial_weights", at);
    if (ws.size() != message_.size()) bad("one initial weight per message component expected");
    for (size_t c = 0; c < ws.size(); ++c) {
      initial_.push_back(weight(ws[c], "initial message", true));
      if (weights_[ws[c]].rows != message_[c])
        bad(fmt::format("initial weight {} has {} entries, message component {} has {}", ws[c],
                        weights_[ws[c]].rows, c, message_[c]));
    }
  } else if (initial != "zeros") {
    bad("initial '" + initial + "' (expected zeros or learned)");
  }
  node_cells_ = field<std::vector<uint32_t>>(doc, "node_cells", at);
  edge_cells_ = field<std::vector<uint32_t>>(doc, "edge_cells", at);
  if (node_cells_.empty()) bad("no node cells");
  if (edge_cells_.empty() && message_ != state_) bad("without edge cells the message is the state");
  const json& cells = doc.at("cells");
  cells_.resize(cells.size());
  for (size_t c = 0; c < cells.size(); ++c) {
    CellProgram& cp = cells_[c];
    cp.name = field<std::string>(cells[c], "name", fmt::format("cell {}", c));
    const json& body = cells[c].at("body");
    for (size_t v = 0; v < body.size(); ++v) cp.body.push_back(read_instr(body[v], cp.name, v));
    cp.outputs = field<std::vector<uint32_t>>(cells[c], "outputs", cp.name);
    for (uint32_t o : cp.outputs)
      if (o >= cp.body.size()) bad(fmt::format("{}: output value {} is not defined", cp.name, o));
  }
  auto listed = [](const std::vector<uint32_t>& list, uint32_t c) {
    return std::find(list.begin(), list.end(), c) != list.end();
  };
  for (uint32_t c : node_cells_)
    if (c >= cells_.size()) bad(fmt::format("node cell {} is not defined", c));
  for (uint32_t c : edge_cells_)
    if (c >= cells_.size()) bad(fmt::format("edge cell {} is not defined", c));
  // In document order, so that dropout sites count through the program as written.
  for (uint32_t c = 0; c < cells_.size(); ++c) {
    const bool node = listed(node_cells_, c), edge = listed(edge_cells_, c);
    if (node && edge) bad(fmt::format("cell {} is both a node cell and an edge cell", c));
    if (!node && !edge) continue;
    compile(cells_[c], edge, pc, sites_);
    sites_ += cells_[c].sites;
  }
}

void ProgramCell::read_weights(const json& doc, ParameterCollection& pc) {
  const json& ws = doc.at("weights");
  for (const json& w : ws) {
    const bool lookup = field_or<std::string>(w, "layout", "", "weight") == "lookup";
    lookup_rows_.push_back(lookup ? field_or<uint32_t>(w, "rows", 0, "weight") : 0);
    no_id_ = std::max(no_id_, lookup_rows_.back());
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    const std::string at = fmt::format("weight {}", i);
    WeightSpec s;
    s.name = fmt::format("w{}.{}", i, field<std::string>(ws[i], "name", at));
    s.rows = field<uint32_t>(ws[i], "rows", at);
    s.cols = field<uint32_t>(ws[i], "cols", at);
    const std::string layout = field<std::string>(ws[i], "layout", at);
    if (s.rows == 0) bad(at + " has no rows");
    Parameter p;
    if (layout == "transpose" && s.cols > 0) {
      p = pc.add_parameters(s.name, Dim{s.rows, s.cols});
    } else if (layout == "as_is" && s.cols > 0) {
      p = pc.add_parameters(s.name, Dim{s.cols, s.rows});
      s.transpose = false;
    } else if (layout == "lookup" && s.cols > 0) {
      p.id = pc.add_lookup_parameters(s.name, no_id_ + 1, s.cols).id;
      std::fill(pc.values(p.id) + size_t{s.rows} * s.cols,
                pc.values(p.id) + size_t{no_id_ + 1} * s.cols, 0.0f);
      s.transpose = false;
      s.lookup = true;
    } else if (layout == "vector" && s.cols == 0) {
      p = pc.add_parameters(s.name, Dim{s.rows, 1});
    } else {
      bad(fmt::format("{} ({}): layout '{}' does not fit {} columns", at, s.name, layout, s.cols));
    }
    weights_.push_back(s);
    params_.push_back(p);
    layouts_.push_back(layout);
  }
}

Parameter ProgramCell::weight(int32_t w, const std::string& at, bool vector) const {
  if (w < 0 || static_cast<size_t>(w) >= params_.size())
    bad(fmt::format("{}: weight {} is not defined", at, w));
  if (vector != (layouts_[w] == "vector"))
    bad(fmt::format("{}: weight {} ({}) is {}", at, w, weights_[w].name,
                    vector ? "a matrix where a vector is needed" : "not a matrix"));
  return params_[w];
}

Parameter ProgramCell::constant(float value, uint32_t size) {
  std::pair<uint32_t, uint32_t> key{0, size};
  std::memcpy(&key.first, &value, sizeof key.first);
  if (const auto it = constants_.find(key); it != constants_.end()) return it->second;
  const Parameter p = pc_.add_parameters(fmt::format("const{}", constants_.size()), Dim{size, 1});
  std::fill(pc_.values(p.id), pc_.values(p.id) + size, value);
  return constants_[key] = p;
}

// A cell's block: inputs for the slots the body reads (ascending), the id and one integer per
// dropout site, the body translated instruction by instruction, and the outputs checked.
void ProgramCell::compile(CellProgram& c, bool edge, ParameterCollection& pc, uint32_t site) {
  const uint32_t S = static_cast<uint32_t>(state_.size());
  const uint32_t in_slot = edge ? S : 0;
  auto slot_size = [&](int32_t s) -> uint32_t {
    if (s < 0) bad(c.name + ": an input without a slot");
    if (static_cast<uint32_t>(s) == in_slot) return kind_ == InputKind::X ? input_dim() : 0;
    const uint32_t comp = edge ? static_cast<uint32_t>(s) : static_cast<uint32_t>(s) - 1;
    const std::vector<uint32_t>& sizes = edge ? state_ : message_;
    if (comp >= sizes.size()) bad(fmt::format("{}: input slot {} does not exist", c.name, s));
    return sizes[comp];
  };
  c.input_slot = static_cast<int32_t>(in_slot);
  if (!edge && message_ == state_ && c.outputs.size() == state_.size()) {
    c.pass_through = true;  // e.g. a lattice LSTM's node, whose state is the sum of its arcs
    for (size_t o = 0; o < c.outputs.size(); ++o) {
      const Instr& in = c.body[c.outputs[o]];
      c.pass_through = c.pass_through && in.op == "input" && in.slot == static_cast<int32_t>(o + 1);
    }
    if (c.pass_through) return;
  }
  const Hoisting h = plan_hoisting(c.body, c.outputs, c.input_slot, kind_);
  c.block = std::make_unique<Block>(pc, c.name);
  Block& blk = *c.block;
  std::map<int32_t, Expr> slots;
  std::vector<int32_t> read;
  bool ids = false;  // read by the cell, or by its projection only
  for (size_t v = 0; v < c.body.size(); ++v) {
    const Instr& in = c.body[v];
    if (in.op == "input" && h.in_main[v]) read.push_back(in.slot);
    if (in.op == "ids") {
      ids = true;
      c.reads_ids = c.reads_ids || h.in_main[v];
    }
    if (in.op == "dropout") ++c.sites;
    if (in.op == "embedding" && in.weight >= 0 &&
        static_cast<size_t>(in.weight) < lookup_rows_.size() && lookup_rows_[in.weight] > 0)
      c.id_rows = std::min(c.id_rows, lookup_rows_[in.weight]);
  }
  std::sort(read.begin(), read.end());
  read.erase(std::unique(read.begin(), read.end()), read.end());
  for (int32_t s : read) {
    const uint32_t size = slot_size(s);
    if (size == 0) bad(fmt::format("{}: slot {} is not a vector input", c.name, s));
    c.float_slots.push_back(s);
    slots[s] = blk.input(fmt::format("slot{}", s), Dim{size, 1});
  }
  std::map<uint32_t, Expr> hoisted;  // instruction -> the block input of its projected value
  for (size_t i = 0; i < h.outputs.size(); ++i) {
    c.float_slots.push_back(kHoistedSlot + static_cast<int32_t>(i));
    hoisted[h.outputs[i]] =
        blk.input(fmt::format("projection{}", i), Dim{c.body[h.outputs[i]].size, 1});
  }
  if (ids && kind_ != InputKind::Ids) bad(c.name + " embeds ids, but the input is not ids");
  if (c.reads_ids) blk.index("id");
  c.first_site = site;
  std::vector<uint32_t> uses(c.body.size(), 0);
  for (const Instr& in : c.body)
    for (uint32_t a : in.args) ++uses[a];
  for (uint32_t o : c.outputs) ++uses[o];
  if (h.any()) compile_projection(c, h, uses);
  std::vector<Expr> val(c.body.size());
  std::vector<LinearForm> form(c.body.size());
  uint32_t next_site = 0;
  for (size_t v = 0; v < c.body.size(); ++v) {
    if (!h.in_main[v]) continue;
    auto it = hoisted.find(static_cast<uint32_t>(v));
    if (it != hoisted.end()) {
      val[v] = it->second;
      form[v].biases = {it->second};  // adds into an affine as its bias
      continue;
    }
    val[v] = translate_at(blk, c, v, val, form, uses, slots, next_site);
  }
  const std::vector<uint32_t>& want = edge ? message_ : state_;
  if (c.outputs.size() != want.size())
    bad(fmt::format("{} returns {} tensors, the {} has {}", c.name, c.outputs.size(),
                    edge ? "message" : "state", want.size()));
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    Expr e = val[c.outputs[o]];
    if (c.body[c.outputs[o]].size != want[o])
      bad(fmt::format("{}: output {} has {} entries, the {} component has {}", c.name, o,
                      c.body[c.outputs[o]].size, edge ? "message" : "state", want[o]));
    // An output that is an input or a weight (an edge cell passing the state on, a constant)
    // still needs a value of its own in the block.
    const Op op = blk.body().node(e.id).op;
    if (op == Op::Input || op == Op::Parameter) e = scalar_affine(e, 1.0f, 0.0f);
    blk.output(fmt::format("out{}", o), e);
  }
  blk.freeze();
}

// Translates instruction v of cell c into `blk`, naming the cell and instruction in errors.
Expr ProgramCell::translate_at(Block& blk, CellProgram& c, size_t v, std::vector<Expr>& val,
                               std::vector<LinearForm>& form, const std::vector<uint32_t>& uses,
                               const std::map<int32_t, Expr>& slots, uint32_t& next_site) {
  try {
    return translate(blk, c, c.body[v], v, val, form, uses, slots, next_site);
  } catch (const std::invalid_argument& e) {
    const Instr& in = c.body[v];
    bad(fmt::format("{}, value {} ({}{}): {}", c.name, v, in.op,
                    in.where.empty() ? "" : ", " + in.where, e.what()));
  }
}

// The cell's input projection (Hoisting): a block from the x row to the values the cell reads.
void ProgramCell::compile_projection(CellProgram& c, const Hoisting& h,
                                     const std::vector<uint32_t>& uses) {
  c.projection = std::make_unique<Block>(pc_, c.name + ".projection");
  Block& blk = *c.projection;
  std::map<int32_t, Expr> slots;  // the x row, or the id as the block's integer 0
  if (kind_ == InputKind::X)
    slots[c.input_slot] = blk.input("x", Dim{input_dim(), 1});
  else
    blk.index("id");
  std::vector<Expr> val(c.body.size());
  std::vector<LinearForm> form(c.body.size());
  uint32_t no_sites = 0;
  for (size_t v = 0; v < c.body.size(); ++v)
    if (h.in_hoist[v]) val[v] = translate_at(blk, c, v, val, form, uses, slots, no_sites);
  for (size_t i = 0; i < h.outputs.size(); ++i) {
    Expr e = val[h.outputs[i]];
    const Op op = blk.body().node(e.id).op;
    if (op == Op::Parameter || op == Op::Input) e = scalar_affine(e, 1.0f, 0.0f);
    blk.output(fmt::format("out{}", i), e);
  }
  blk.freeze();
  c.projected = static_cast<uint32_t>(h.outputs.size());
}

// Cell c's projected values for x / ids row `in_row` (-1: the zeros, or no_id_), one call per
// row and build.
const Expr* ProgramCell::projected(Graph& g, const Packed& p, CellProgram& c, int64_t in_row,
                                   const Expr* x) {
  Expr* out = &c.projections[static_cast<size_t>(in_row + 1) * c.projected];
  if (out[0].graph != nullptr) return out;
  if (kind_ == InputKind::Ids) {
    const uint32_t id = id_of(p, in_row);
    c.projection->call(g, nullptr, 0, &id, 1, out);
  } else {
    const Expr in = in_row >= 0 ? x[in_row] : zeros(g, input_dim());
    c.projection->call(g, &in, 1, nullptr, 0, out);
  }
  return out;
}

Expr ProgramCell::affine_of(Graph& b, const LinearForm& f) {
  const uint32_t rows = b.node(f.terms[0].id).dim.rows;
  std::vector<Expr> args;
  args.push_back(f.biases.empty() ? parameter(b, constant(0.0f, rows)) : f.biases[0]);
  args.insert(args.end(), f.terms.begin(), f.terms.end());
  Expr y = affine(args);
  for (size_t i = 1; i < f.biases.size(); ++i) y = y + f.biases[i];
  return y;
}

Expr ProgramCell::translate(Block& blk, CellProgram& c, const Instr& in, size_t v,
                            std::vector<Expr>& val, std::vector<LinearForm>& form,
                            const std::vector<uint32_t>& uses,
                            const std::map<int32_t, Expr>& slots, uint32_t& next_site) {
  Graph& b = blk.body();
  auto arg = [&](size_t i) -> const Expr& {
    if (i >= in.args.size()) throw std::invalid_argument("too few arguments");
    const Expr& e = val[in.args[i]];
    if (e.graph == nullptr) throw std::invalid_argument("reads the integer ids as a vector");
    return e;
  };
  const std::string& op = in.op;
  Expr y;
  if (op == "input") {
    y = slots.at(in.slot);
  } else if (op == "ids") {
    return Expr{};  // read by `embedding` through the block's integer 0
  } else if (op == "weight") {
    y = parameter(b, weight(in.weight, "weight value", true));
  } else if (op == "const") {
    y = parameter(b, constant(in.value, in.size));
  } else if (op == "linear") {
    LinearForm& f = form[v];
    f.terms = {parameter(b, weight(in.weight, "linear", false)), arg(0)};
    if (in.bias >= 0) f.biases.push_back(parameter(b, weight(in.bias, "linear bias", true)));
    y = affine_of(b, f);
  } else if (op == "embedding") {
    if (in.args.size() != 1 || c.body[in.args[0]].op != "ids")
      throw std::invalid_argument("embedding reads the cell's ids input");
    y = blk.lookup(LookupParameter{weight(in.weight, "embedding", false).id}, 0);
  } else if (op == "add" && foldable(form[in.args.at(0)], form[in.args.at(1)]) &&
             uses[in.args[0]] == 1 && uses[in.args[1]] == 1) {
    LinearForm& f = form[v];  // both sides are products (or projections) used only here: one affine
    for (uint32_t a : {in.args[0], in.args[1]}) {
      f.terms.insert(f.terms.end(), form[a].terms.begin(), form[a].terms.end());
      f.biases.insert(f.biases.end(), form[a].biases.begin(), form[a].biases.end());
    }
    y = affine_of(b, f);
  } else if (const auto bin = kBinary.find(op); bin != kBinary.end()) {
    y = bin->second(arg(0), arg(1));
  } else if (op == "scale") {
    y = scalar_affine(arg(0), in.alpha, in.beta);
  } else if (op == "rdiv") {
    y = scalar_divide(in.alpha, arg(0));
  } else if (const auto u = kUnary.find(op); u != kUnary.end()) {
    y = u->second(arg(0));
  } else if (op == "leaky_relu") {
    y = leaky_relu(arg(0), in.alpha);
  } else if (op == "elu") {
    y = elu(arg(0), in.alpha);
  } else if (op == "step") {
    y = edbatch::step(arg(0), in.alpha != 0);
  } else if (op == "keep") {
    y = keep(arg(0), arg(1));
  } else if (op == "cat") {
    std::vector<Expr> xs;
    for (size_t i = 0; i < in.args.size(); ++i) xs.push_back(arg(i));
    y = concat(xs);
  } else if (op == "slice") {
    y = slice_rows(arg(0), in.begin, in.end);
  } else if (op == "sum_features") {
    y = column_sum(arg(0));
  } else if (op == "max_features") {  // max_index's row 0: the largest entry
    y = slice_rows(max_index(arg(0)), 0, 1);
  } else if (op == "broadcast") {
    y = broadcast_rows(arg(0), in.size);
  } else if (op == "max") {
    y = maximum({arg(0), arg(1)});
  } else if (op == "min") {  // -max(-a, -b): at a tie the gradient goes to a, as for max
    y = scalar_affine(maximum({scalar_affine(arg(0), -1, 0), scalar_affine(arg(1), -1, 0)}), -1, 0);
  } else if (op == "layer_norm") {
    y = layer_norm(arg(0), in.eps);
    if (in.weight >= 0) y = cmult(y, parameter(b, weight(in.weight, "layer_norm weight", true)));
    if (in.bias >= 0) y = y + parameter(b, weight(in.bias, "layer_norm bias", true));
  } else if (op == "dropout") {
    const uint32_t slot = blk.index(fmt::format("dropout{}", c.first_site + next_site++));
    y = blk.dropout(arg(0), in.p, slot);
  } else {
    throw std::invalid_argument("unknown instruction");
  }
  const uint32_t rows = b.node(y.id).dim.rows;
  if (rows != in.size)
    throw std::invalid_argument(fmt::format("has {} entries, the program says {}", rows, in.size));
  return y;
}

void ProgramCell::check(const Packed& p, const char* fn) const {
  const bool edges = !edge_cells_.empty();
  for (int64_t k = 0; k < p.num_nodes; ++k) {
    const int64_t t = p.node_types[k];
    if (t < 0 || t >= static_cast<int64_t>(node_cells_.size()))
      throw std::invalid_argument(fmt::format(
          "[{}] node {} has kind {}; the module has {} node cells", fn, k, t, node_cells_.size()));
    if (p.ids) check_id(p, fn, cells_[node_cells_[t]], p.node_inputs[k], "node", k);
  }
  if (!edges) return;
  for (int64_t a = 0; a < p.num_arcs; ++a) {
    const int64_t t = p.arc_types[a];
    if (t >= static_cast<int64_t>(edge_cells_.size()))
      throw std::invalid_argument(fmt::format(
          "[{}] arc {} has kind {}; the module has {} edge cells", fn, a, t, edge_cells_.size()));
    if (p.ids && t >= 0) check_id(p, fn, cells_[edge_cells_[t]], p.arc_inputs[a], "arc", a);
  }
}

// Each cell's tables hold the ids it reads: cells of other kinds may have smaller tables (a
// character vocabulary beside a word one). Every table has zero columns up to no_id_, so an id
// below it is in bounds whichever cell's lookup (or input projection) reads its row.
void ProgramCell::check_id(const Packed& p, const char* fn, const CellProgram& c, int64_t row,
                           const char* what, int64_t at) const {
  if (row < 0 || row >= p.num_x || c.id_rows == UINT32_MAX) return;  // rows: checked before
  const int64_t id = p.ids[row];
  if (id < 0 || id >= c.id_rows)  // below it, in bounds: no table has more than no_id_ rows
    throw std::invalid_argument(
        fmt::format("[{}] {} {} reads ids[{}] = {}, outside {}'s embedding table of {} rows", fn,
                    what, at, row, id, c.name, c.id_rows));
}

Expr ProgramCell::zeros(Graph& g, uint32_t size) {
  auto it = zeros_.find(size);
  if (it != zeros_.end()) return it->second;
  return zeros_[size] = input(g, Dim{size, 1}, std::vector<float>(size, 0.0f));
}

void ProgramCell::call(Graph& g, const Packed& p, CellProgram& c, const Expr* floats,
                       int64_t in_row, const Expr* x, uint32_t key_index, Expr* outs) {
  Expr in[16];
  std::vector<Expr> many;
  Expr* ins = c.float_slots.size() <= 16 ? in : (many.resize(c.float_slots.size()), many.data());
  for (size_t i = 0; i < c.float_slots.size(); ++i) {
    const int32_t s = c.float_slots[i];
    if (s >= kHoistedSlot)
      ins[i] = projected(g, p, c, in_row, x)[s - kHoistedSlot];
    else if (s == c.input_slot) ins[i] = in_row >= 0 ? x[in_row] : zeros(g, input_dim());
    else ins[i] = floats[s];
  }
  uint32_t ints[64];
  std::vector<uint32_t> more;
  const uint32_t n_ints = (c.reads_ids ? 1 : 0) + c.sites;
  uint32_t* iv = n_ints <= 64 ? ints : (more.resize(n_ints), more.data());
  uint32_t q = 0;
  if (c.reads_ids) iv[q++] = id_of(p, in_row);
  for (uint32_t s = 0; s < c.sites; ++s) iv[q++] = math::dropout_key(p.seed, key_index, c.first_site + s);
  c.block->call(g, ins, static_cast<uint32_t>(c.float_slots.size()), iv, n_ints, outs);
}

void ProgramCell::build(Graph& g, const Packed& p, const std::vector<Expr>& x,
                        std::vector<Expr>& out) {
  const int64_t N = p.num_nodes;
  const uint32_t S = static_cast<uint32_t>(state_.size()), M = static_cast<uint32_t>(message_.size());
  zeros_.clear();
  for (CellProgram& c : cells_)
    if (c.projected) c.projections.assign(static_cast<size_t>(p.num_x + 1) * c.projected, Expr{});
  messages_.resize(M);
  std::vector<Expr> state(S), msg(M), reduced(M + 1);
  for (int64_t k = 0; k < N; ++k) {
    for (auto& m : messages_) m.clear();
    for (int64_t a = p.pred_ptr[k]; a < p.pred_ptr[k + 1]; ++a) {
      const int64_t j = p.pred_ids[a];
      for (uint32_t s = 0; s < S; ++s) state[s] = out[s * N + j];
      if (edge_cells_.empty()) {
        for (uint32_t m = 0; m < M; ++m) messages_[m].push_back(state[m]);
        continue;
      }
      CellProgram& e = cells_[edge_cells_[p.arc_types[a]]];
      call(g, p, e, state.data(), p.arc_inputs[a], x.data(), static_cast<uint32_t>(N + a),
           msg.data());
      for (uint32_t m = 0; m < M; ++m) messages_[m].push_back(msg[m]);
    }
    if (messages_[0].empty())
      for (uint32_t m = 0; m < M; ++m)
        reduced[m + 1] = initial_.empty() ? zeros(g, message_[m]) : parameter(g, initial_[m]);
    else
      reduce_messages(reduce_, messages_, message_, reduced.data() + 1);
    CellProgram& nc = cells_[node_cells_[p.node_types[k]]];
    if (nc.pass_through) {
      for (uint32_t s = 0; s < S; ++s) out[s * N + k] = reduced[s + 1];
      continue;
    }
    Expr o[64];
    std::vector<Expr> more;
    Expr* os = S <= 64 ? o : (more.resize(S), more.data());
    call(g, p, nc, reduced.data(), p.node_inputs[k], x.data(), static_cast<uint32_t>(k), os);
    for (uint32_t s = 0; s < S; ++s) out[s * N + k] = os[s];
  }
}

// A chain step: the message is the previous state (through edge cell 0, without an arc input, if
// any); one message reduces to itself; node cell 0 reads x. Not for ids or dropout (call data).
bool ProgramCell::step(Graph& g, const Expr* x, const Expr* prev, Expr* out) {
  if (kind_ != InputKind::X || sites_ > 0) return false;
  zeros_.clear();  // the decoder's graph may have been cleared since the last step
  for (CellProgram& c : cells_) c.projections.assign(2 * static_cast<size_t>(c.projected), Expr{});
  std::vector<Expr>& reduced = step_reduced_;
  reduced.assign(message_.size() + 1, Expr{});
  if (edge_cells_.empty()) std::copy(prev, prev + message_.size(), reduced.begin() + 1);
  else
    call(g, Packed{}, cells_[edge_cells_[0]], prev, -1, x, 1, reduced.data() + 1);
  CellProgram& nc = cells_[node_cells_[0]];
  if (nc.pass_through) std::copy(reduced.begin() + 1, reduced.end(), out);
  else
    call(g, Packed{}, nc, reduced.data(), 0, x, 0, out);
  return true;
}

}  // namespace

bool is_program(const std::string& cell) { return cell.rfind(kProgramPrefix, 0) == 0; }

std::unique_ptr<Cell> make_program_cell(const std::string& program, ParameterCollection& pc) {
  json doc;
  try {
    doc = json::parse(program);
  } catch (const json::exception& e) {
    bad(std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("input") || !doc.contains("cells") || !doc.contains("weights"))
    bad("not a program document (docs/programs.md)");
  const uint32_t input_size =
      doc["input"].value("kind", "") == "x" ? field<uint32_t>(doc["input"], "size", "input") : 0;
  return std::make_unique<ProgramCell>(doc, pc, input_size);
}

}  // namespace edbatch::torch_adapter
