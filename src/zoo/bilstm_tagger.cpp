// The BiLSTM tagger (`bilstm_tagger`): word embeddings (or, with char_embeddings, a character
// BiLSTM for rare words), a 2-layer forward and a 2-layer backward LSTM, and an MLP per token.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::zoo {

namespace {

// A standard LSTM layer: gates i, f, o and candidate g from W_* x + U_* h_prev + b_*.
struct LstmWeights {
  Parameter W[4], U[4], b[4];  // i, f, o, g
};

LstmWeights add_lstm(ParameterCollection& pc, const std::string& prefix, uint32_t in,
                     uint32_t hidden) {
  LstmWeights w;
  for (int k = 0; k < 4; ++k) {
    const std::string s = std::string("_") + "ifog"[k];
    w.W[k] = pc.add_parameters(prefix + "W" + s, Dim{hidden, in});
    w.U[k] = pc.add_parameters(prefix + "U" + s, Dim{hidden, hidden});
    w.b[k] = pc.add_parameters(prefix + "b" + s, Dim{hidden, 1});
  }
  return w;
}

// One step; the first step of a sequence (prev == nullptr) starts from h = c = 0, so its
// recurrent terms and forget gate are left out.
CellState lstm_step(Graph& g, const LstmWeights& w, const Expr& x, const CellState* prev) {
  Expr gate[4];
  for (int k = 0; k < 4; ++k) {
    if (prev == nullptr && k == 1) continue;
    gate[k] = prev ? affine({parameter(g, w.b[k]), parameter(g, w.W[k]), x, parameter(g, w.U[k]),
                             prev->h})
                   : affine({parameter(g, w.b[k]), parameter(g, w.W[k]), x});
  }
  const Expr i = sigmoid(gate[0]), o = sigmoid(gate[2]), cand = tanh(gate[3]);
  const Expr c = prev ? sum({cmult(sigmoid(gate[1]), prev->c), cmult(i, cand)}) : cmult(i, cand);
  return {cmult(o, tanh(c)), c};
}

// Runs a layer over xs, forward or backward; returns the h of every position.
void lstm_layer(Graph& g, const LstmWeights& w, const std::vector<Expr>& xs, bool backward,
                std::vector<Expr>& hs) {
  const size_t n = xs.size();
  hs.assign(n, Expr{});
  CellState s;
  for (size_t t = 0; t < n; ++t) {
    const size_t p = backward ? n - 1 - t : t;
    s = lstm_step(g, w, xs[p], t == 0 ? nullptr : &s);
    hs[p] = s.h;
  }
}

class BilstmTagger : public Model {
 public:
  BilstmTagger(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : Model("bilstm_tagger", pc, o), data_(data.tagged) {
    const uint32_t H = o.hidden;
    E_ = pc.add_lookup_parameters("E", o.vocab, H);
    layers_[0] = add_lstm(pc, "fwd1.", H, H);
    layers_[1] = add_lstm(pc, "fwd2.", H, H);
    layers_[2] = add_lstm(pc, "bwd1.", H, H);
    layers_[3] = add_lstm(pc, "bwd2.", H, H);
    W_mlp_ = pc.add_parameters("W_mlp", Dim{H, 2 * H});
    b_mlp_ = pc.add_parameters("b_mlp", Dim{H, 1});
    W_out_ = pc.add_parameters("W_out", Dim{num_classes(), H});
    if (o.char_embeddings) {
      if (o.char_vocab == 0)
        throw std::invalid_argument("[bilstm_tagger] char_vocab must be at least 1");
      CE_ = pc.add_lookup_parameters("CE", o.char_vocab, H);
      char_[0] = add_lstm(pc, "char_fwd.", H, H);
      char_[1] = add_lstm(pc, "char_bwd.", H, H);
      W_ch_ = pc.add_parameters("W_ch", Dim{H, 2 * H});
      b_ch_ = pc.add_parameters("b_ch", Dim{H, 1});
      for (const TaggedSentence& s : data_.sentences)
        for (uint32_t w : s.words) ++counts_[w];
    }
  }
  uint32_t size() const override { return static_cast<uint32_t>(data_.sentences.size()); }
  uint32_t num_classes() const override { return std::max(1u, data_.num_tags); }
  std::vector<uint32_t> labels(uint32_t i) const override { return data_.sentences.at(i).tags; }
  std::string math() const override {
    std::string m =
        "e_t = E[w_t]\n"
        "LSTM(x, h, c): i = sigmoid(W_i x + U_i h + b_i); f = sigmoid(W_f x + U_f h + b_f)\n"
        "  o = sigmoid(W_o x + U_o h + b_o); g = tanh(W_g x + U_g h + b_g)\n"
        "  c' = f.c + i.g; h' = o.tanh(c')   (h = c = 0 before the first step)\n"
        "f1_t = LSTM_fwd1(e_t, f1_{t-1}); f2_t = LSTM_fwd2(f1_t, f2_{t-1})\n"
        "b1_t = LSTM_bwd1(e_t, b1_{t+1}); b2_t = LSTM_bwd2(b1_t, b2_{t+1})\n"
        "loss: sum over tokens of -log softmax(W_out tanh(W_mlp [f2_t; b2_t] + b_mlp))[tag]";
    if (options_.char_embeddings)
      m += "\nrare words (fewer than " + std::to_string(options_.rare_below) +
           " occurrences in the data set) instead:\n"
           "  e_t = W_ch [cf_last; cb_first] + b_ch, cf/cb = LSTM_char_fwd/bwd over CE[chars]\n"
           "  chars of word w: length 2 + (mix(w) mod 8), char j = mix(w, j) mod char_vocab";
    return m;
  }

  // The character ids derived from word id `w` (the loaders keep no spellings).
  std::vector<uint32_t> chars_of(uint32_t w) const {
    const uint64_t h = mix64(w + 0x1234567ull);
    std::vector<uint32_t> cs(2 + h % 8);
    for (size_t j = 0; j < cs.size(); ++j)
      cs[j] = static_cast<uint32_t>(mix64(h + j) % options_.char_vocab);
    return cs;
  }

 protected:
  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const TaggedSentence& s = data_.sentences[instance];
    const size_t n = s.words.size();
    if (n == 0 || s.tags.size() != n)
      throw std::invalid_argument(fmt::format(
          "[bilstm_tagger] sentence {} has {} words and {} tags", instance, n, s.tags.size()));
    xs_.resize(n);
    for (size_t t = 0; t < n; ++t) xs_[t] = embed(g, s.words[t]);
    lstm_layer(g, layers_[0], xs_, false, h1_);
    lstm_layer(g, layers_[1], h1_, false, f2_);
    lstm_layer(g, layers_[2], xs_, true, h1_);
    lstm_layer(g, layers_[3], h1_, true, b2_);
    losses_.clear();
    for (size_t t = 0; t < n; ++t) {
      const Expr m = tanh(affine({parameter(g, b_mlp_), parameter(g, W_mlp_),
                                  concat({f2_[t], b2_[t]})}));
      losses_.push_back(node_loss(g, W_out_, m, s.tags[t], logits));
    }
    return sum_losses(losses_);
  }
  Expr build_blocks(Graph&, uint32_t, std::vector<Expr>*) override {
    block_path_missing(name());
  }

 private:
  Expr embed(Graph& g, uint32_t w) {
    if (!options_.char_embeddings) return lookup(g, E_, w);
    const auto count = counts_.find(w);
    if (count != counts_.end() && count->second >= options_.rare_below) return lookup(g, E_, w);
    const std::vector<uint32_t> cs = chars_of(w);
    chars_.resize(cs.size());
    for (size_t j = 0; j < cs.size(); ++j) chars_[j] = lookup(g, CE_, cs[j]);
    lstm_layer(g, char_[0], chars_, false, cf_);
    lstm_layer(g, char_[1], chars_, true, cb_);
    return affine({parameter(g, b_ch_), parameter(g, W_ch_), concat({cf_.back(), cb_.front()})});
  }

  const TaggedData& data_;
  LookupParameter E_, CE_;
  LstmWeights layers_[4], char_[2];
  Parameter W_mlp_, b_mlp_, W_out_, W_ch_, b_ch_;
  std::unordered_map<uint32_t, uint32_t> counts_;
  std::vector<Expr> xs_, h1_, f2_, b2_, chars_, cf_, cb_, losses_;
};

}  // namespace

std::unique_ptr<Model> make_bilstm_tagger(ParameterCollection& pc, const Dataset& data,
                                          const ModelOptions& o) {
  return std::make_unique<BilstmTagger>(pc, data, o);
}

}  // namespace edbatch::zoo
