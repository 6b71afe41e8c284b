// The BiLSTM tagger (`bilstm_tagger`): word embeddings (or, with char_embeddings, a character
// BiLSTM over the spelling of rare words), a 2-layer forward and a 2-layer backward LSTM, and an
// MLP per token.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <unordered_map>

#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::zoo {

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

namespace {

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
      const size_t counted = o.train_instances
                                 ? std::min<size_t>(o.train_instances, data_.sentences.size())
                                 : data_.sentences.size();
      for (size_t i = 0; i < counted; ++i)
        for (uint32_t w : data_.sentences[i].words) ++counts_[w];
      number_chars();
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
           "  chars of word w: its spelling's bytes, each byte's id by first appearance over the "
           "data set's spellings (in word id order) mod char_vocab\n"
           "  a word without a spelling: length 2 + (mix(w) mod 8), char j = mix(w, j) mod "
           "char_vocab";
    return m;
  }

  // The character ids of word id `w`: its spelling's, else derived from the id.
  std::vector<uint32_t> chars_of(uint32_t w) const {
    if (w < data_.spellings.size() && !data_.spellings[w].empty()) {
      const std::string& spelling = data_.spellings[w];
      std::vector<uint32_t> cs(spelling.size());
      for (size_t j = 0; j < cs.size(); ++j)
        cs[j] = char_ids_[static_cast<unsigned char>(spelling[j])];
      return cs;
    }
    const uint64_t h = mix64(w + 0x1234567ull);
    std::vector<uint32_t> cs(2 + h % 8);
    for (size_t j = 0; j < cs.size(); ++j)
      cs[j] = static_cast<uint32_t>(mix64(h + j) % options_.char_vocab);
    return cs;
  }

 protected:
  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const TaggedSentence& s = sentence(instance);
    const size_t n = s.words.size();
    xs_.resize(n);
    for (size_t t = 0; t < n; ++t) xs_[t] = embed(g, s.words[t]);
    lstm_layer(g, layers_[0], xs_, false, h1_);
    lstm_layer(g, layers_[1], h1_, false, f2_);
    lstm_layer(g, layers_[2], xs_, true, h1_);
    lstm_layer(g, layers_[3], h1_, true, b2_);
    losses_.clear();
    for (size_t t = 0; t < n; ++t) {
      losses_.push_back(node_loss(g, W_out_, mlp(g, f2_[t], b2_[t]), s.tags[t], logits));
    }
    return sum_losses(losses_);
  }
  // Blocks: per direction, both layers of one position in one cell, a first-step variant and a
  // step (inputs x, h1, c1, h2, c2; outputs h1, c1, h2, c2); the MLP and loss per token (inputs
  // f2_t, b2_t; integer tag); with char_embeddings, per direction a character cell (a first step
  // and a step with inputs h, c; integer char) and the projection [cf; cb] -> e.
  Expr build_blocks(Sink& sink, uint32_t instance, std::vector<Expr>* logits) override {
    const TaggedSentence& s = sentence(instance);
    const size_t n = s.words.size();
    if (!out_block_) make_blocks();
    xs_.resize(n);
    for (size_t t = 0; t < n; ++t)
      xs_[t] = rare(s.words[t]) ? embed_chars(sink, s.words[t]) : sink.lookup(E_, s.words[t]);
    f2_.resize(n);
    b2_.resize(n);
    Expr state[4];  // h1, c1, h2, c2
    for (int dir = 0; dir < 2; ++dir) {
      std::vector<Expr>& top = dir == 0 ? f2_ : b2_;
      for (size_t t = 0; t < n; ++t) {
        const size_t p = dir == 0 ? t : n - 1 - t;
        const Expr in[5] = {xs_[p], state[0], state[1], state[2], state[3]};
        sink.call(*dir_blocks_[dir][t == 0 ? 0 : 1], in, t == 0 ? 1 : 5, nullptr, 0, state);
        top[p] = state[2];
      }
    }
    losses_.clear();
    Expr out[2];
    for (size_t t = 0; t < n; ++t) {
      const Expr in[2] = {f2_[t], b2_[t]};
      sink.call(*out_block_, in, 2, &s.tags[t], 1, out);
      losses_.push_back(call_loss(out, 2, logits));
    }
    return sink.sum_losses(losses_);
  }

 private:
  const TaggedSentence& sentence(uint32_t instance) const {
    const TaggedSentence& s = data_.sentences[instance];
    if (s.words.empty() || s.tags.size() != s.words.size())
      throw std::invalid_argument(
          fmt::format("[bilstm_tagger] sentence {} has {} words and {} tags", instance,
                      s.words.size(), s.tags.size()));
    return s;
  }

  // Character ids by first appearance of each byte over the spellings, in word id order, folded
  // modulo char_vocab like word ids.
  void number_chars() {
    char_ids_.fill(kNoChar);
    uint32_t next = 0;
    for (const std::string& spelling : data_.spellings)
      for (char c : spelling) {
        uint32_t& id = char_ids_[static_cast<unsigned char>(c)];
        if (id == kNoChar) id = next++ % options_.char_vocab;
      }
  }

  // With char_embeddings: whether word w is embedded through its characters.
  bool rare(uint32_t w) const {
    if (!options_.char_embeddings) return false;
    const auto count = counts_.find(w);
    return count == counts_.end() || count->second < options_.rare_below;
  }

  // The MLP over [f2_t; b2_t].
  Expr mlp(Graph& g, const Expr& f2, const Expr& b2) const {
    return tanh(affine({parameter(g, b_mlp_), parameter(g, W_mlp_), concat({f2, b2})}));
  }
  // A rare word's embedding from the last forward and the first backward character state.
  Expr char_projection(Graph& g, const Expr& cf, const Expr& cb) const {
    return affine({parameter(g, b_ch_), parameter(g, W_ch_), concat({cf, cb})});
  }

  // Character BiLSTM of word w through blocks.
  Expr embed_chars(Sink& sink, uint32_t w) {
    const std::vector<uint32_t> cs = chars_of(w);
    const size_t m = cs.size();
    Expr ends[2], state[2];  // ends: the forward state after the last char, the backward one
                             // after the first
    for (int dir = 0; dir < 2; ++dir)
      for (size_t j = 0; j < m; ++j) {
        const size_t p = dir == 0 ? j : m - 1 - j;
        const Expr in[2] = {state[0], state[1]};
        sink.call(*char_blocks_[dir][j == 0 ? 0 : 1], in, j == 0 ? 0 : 2, &cs[p], 1, state);
        ends[dir] = state[0];
      }
    const Expr in[2] = {ends[0], ends[1]};
    Expr e;
    sink.call(*char_embed_block_, in, 2, nullptr, 0, &e);
    return e;
  }

  void make_blocks() {
    const Dim h{options_.hidden, 1};
    const char* const dirs[2] = {"fwd", "bwd"};
    for (int dir = 0; dir < 2; ++dir)
      for (int step = 0; step < 2; ++step) {
        const std::string block_name = name() + "." + dirs[dir] + (step ? ".step" : ".first");
        dir_blocks_[dir][step] = make_block(pc_, block_name, [&](Block& blk) {
          const Expr x = blk.input("x", h);
          CellState prev[2];
          if (step)
            for (int layer = 0; layer < 2; ++layer) {
              const std::string l = std::to_string(layer + 1);
              prev[layer].h = blk.input("h" + l, h);
              prev[layer].c = blk.input("c" + l, h);
            }
          const CellState s1 =
              lstm_step(blk.body(), layers_[2 * dir], x, step ? &prev[0] : nullptr);
          const CellState s2 =
              lstm_step(blk.body(), layers_[2 * dir + 1], s1.h, step ? &prev[1] : nullptr);
          blk.output("h1", s1.h);
          blk.output("c1", s1.c);
          blk.output("h2", s2.h);
          blk.output("c2", s2.c);
        });
      }
    out_block_ = make_block(pc_, name() + ".out", [&](Block& blk) {
      const Expr f2 = blk.input("f2", h), b2 = blk.input("b2", h);
      output_node_loss(blk, W_out_, mlp(blk.body(), f2, b2), blk.index("tag"));
    });
    if (!options_.char_embeddings) return;
    for (int dir = 0; dir < 2; ++dir)
      for (int step = 0; step < 2; ++step) {
        const std::string block_name = name() + ".char_" + dirs[dir] + (step ? ".step" : ".first");
        char_blocks_[dir][step] = make_block(pc_, block_name, [&](Block& blk) {
          CellState prev;
          if (step) {
            prev.h = blk.input("h", h);
            prev.c = blk.input("c", h);
          }
          const Expr x = blk.lookup(CE_, blk.index("char"));
          const CellState s = lstm_step(blk.body(), char_[dir], x, step ? &prev : nullptr);
          blk.output("h", s.h);
          blk.output("c", s.c);
        });
      }
    char_embed_block_ = make_block(pc_, name() + ".char_embed", [&](Block& blk) {
      const Expr cf = blk.input("cf", h), cb = blk.input("cb", h);
      blk.output("e", char_projection(blk.body(), cf, cb));
    });
  }

  Expr embed(Graph& g, uint32_t w) {
    if (!rare(w)) return lookup(g, E_, w);
    const std::vector<uint32_t> cs = chars_of(w);
    chars_.resize(cs.size());
    for (size_t j = 0; j < cs.size(); ++j) chars_[j] = lookup(g, CE_, cs[j]);
    lstm_layer(g, char_[0], chars_, false, cf_);
    lstm_layer(g, char_[1], chars_, true, cb_);
    return char_projection(g, cf_.back(), cb_.front());
  }

  const TaggedData& data_;
  LookupParameter E_, CE_;
  LstmWeights layers_[4], char_[2];
  Parameter W_mlp_, b_mlp_, W_out_, W_ch_, b_ch_;
  std::unordered_map<uint32_t, uint32_t> counts_;
  static constexpr uint32_t kNoChar = ~0u;
  std::array<uint32_t, 256> char_ids_{};  // by byte value
  // Made on the first block build: dir_blocks_[fwd, bwd][first, step], char_blocks_ likewise.
  std::unique_ptr<Block> dir_blocks_[2][2], char_blocks_[2][2], out_block_, char_embed_block_;
  std::vector<Expr> xs_, h1_, f2_, b2_, chars_, cf_, cb_, losses_;
};

}  // namespace

std::unique_ptr<Model> make_bilstm_tagger(ParameterCollection& pc, const Dataset& data,
                                          const ModelOptions& o) {
  return std::make_unique<BilstmTagger>(pc, data, o);
}

}  // namespace edbatch::zoo
