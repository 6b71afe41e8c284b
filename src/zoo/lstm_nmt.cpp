// The LSTM encoder-decoder (`lstm_nmt`), in the style of ED-Batch's NMT benchmark: source
// embeddings through an encoder LSTM whose last state starts a decoder LSTM over target
// embeddings, a tanh projection and an output layer per step. Training is teacher-forced; decoding
// is greedy, one incremental forward per step over the sentences still running.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "edbatch/zoo.h"
#include "src/zoo/zoo_internal.h"

namespace edbatch::zoo {

namespace {

class LstmNmt : public Model {
 public:
  LstmNmt(ParameterCollection& pc, const Dataset& data, const ModelOptions& o)
      : Model("lstm_nmt", pc, o), pairs_(data.pairs) {
    fold_word(0, o.vocab);  // the special ids need a vocabulary of 4 or more
    const uint32_t H = o.hidden;
    E_src_ = pc.add_lookup_parameters("E_src", o.vocab, H);
    E_tgt_ = pc.add_lookup_parameters("E_tgt", o.vocab, H);
    enc_ = add_lstm(pc, "enc.", H, H);
    dec_ = add_lstm(pc, "dec.", H, H);
    W_o_ = pc.add_parameters("W_o", Dim{H, H});
    b_o_ = pc.add_parameters("b_o", Dim{H, 1});
    W_out_ = pc.add_parameters("W_out", Dim{o.vocab, H});
    b_out_ = pc.add_parameters("b_out", Dim{o.vocab, 1});
  }
  uint32_t size() const override { return static_cast<uint32_t>(pairs_.size()); }
  uint32_t num_classes() const override { return options_.vocab; }
  std::vector<uint32_t> labels(uint32_t i) const override {
    std::vector<uint32_t> l = pair(i).target;
    l.push_back(kEos);
    return l;
  }
  std::string math() const override {
    return "LSTM(x, h, c): as bilstm_tagger's (h = c = 0 before the encoder's first step)\n"
           "encoder: (h_j, c_j) = LSTM_enc(E_src[x_j], h_{j-1}, c_{j-1}), j = 1..|x|\n"
           "decoder: (s_0, d_0) = (h_|x|, c_|x|); y_0 = <s>\n"
           "  (s_t, d_t) = LSTM_dec(E_tgt[y_{t-1}], s_{t-1}, d_{t-1})\n"
           "  z_t = W_out tanh(W_o s_t + b_o) + b_out\n"
           "training (teacher forced, y = target then </s>): loss = sum_t -log softmax(z_t)[y_t]\n"
           "greedy decoding: y_t = argmax z_t, score = sum_t log softmax(z_t)[y_t]; a sentence\n"
           "  stops at </s> or after min(max_len, 2 |x| + 2) tokens";
  }

  bool decodes() const override { return true; }
  std::vector<Decoded> decode(Engine& engine, Graph& g, const std::vector<uint32_t>& instances,
                              const DecodeOptions& options) override;

 protected:
  Expr build_ops(Graph& g, uint32_t instance, std::vector<Expr>* logits) override {
    const SentencePair& p = pair(instance);
    CellState s = encode_ops(g, p.source);
    losses_.clear();
    uint32_t prev = kBos;
    for (size_t t = 0; t <= p.target.size(); ++t) {
      const uint32_t y = t < p.target.size() ? p.target[t] : kEos;
      s = lstm_step(g, dec_, lookup(g, E_tgt_, prev), &s);
      const Expr z = output_layer(g, s.h);
      if (logits) logits->push_back(z);
      losses_.push_back(pick_neg_log_softmax(z, y));
      prev = y;
    }
    return sum_losses(losses_);
  }
  // Blocks: an encoder first step and step (integer: the source word), a decoder training step
  // (inputs h, c; integers: previous and gold word; outputs h, c, loss, logits) and a decoding
  // step (outputs h, c, log softmax(z)).
  Expr build_blocks(Sink& sink, uint32_t instance, std::vector<Expr>* logits) override {
    const SentencePair& p = pair(instance);
    if (!train_block_) make_blocks();
    Expr s[4];  // h, c, loss, logits
    encode_blocks(sink, p.source, s);
    losses_.clear();
    uint32_t ints[2] = {kBos, 0};
    for (size_t t = 0; t <= p.target.size(); ++t) {
      ints[1] = t < p.target.size() ? p.target[t] : kEos;
      sink.call(*train_block_, s, 2, ints, 2, s);
      losses_.push_back(call_loss(s, 4, logits));
      ints[0] = ints[1];
    }
    return sink.sum_losses(losses_);
  }

 private:
  const SentencePair& pair(uint32_t i) const {
    const SentencePair& p = pairs_.at(i);
    if (p.source.empty())
      throw std::invalid_argument(fmt::format("[lstm_nmt] sentence pair {} has no source", i));
    for (uint32_t w : p.source)
      if (w >= options_.vocab) bad_word(i, w);
    for (uint32_t w : p.target)
      if (w >= options_.vocab) bad_word(i, w);
    return p;
  }
  [[noreturn]] void bad_word(uint32_t i, uint32_t w) const {
    throw std::invalid_argument(fmt::format(
        "[lstm_nmt] sentence pair {}: word id {} is not below the vocabulary size {}", i, w,
        options_.vocab));
  }

  Expr output_layer(Graph& g, const Expr& h) const {
    const Expr o = tanh(affine({parameter(g, b_o_), parameter(g, W_o_), h}));
    return affine({parameter(g, b_out_), parameter(g, W_out_), o});
  }
  CellState encode_ops(Graph& g, const std::vector<uint32_t>& source) const {
    CellState s;
    for (size_t j = 0; j < source.size(); ++j)
      s = lstm_step(g, enc_, lookup(g, E_src_, source[j]), j == 0 ? nullptr : &s);
    return s;
  }
  void encode_blocks(Sink& sink, const std::vector<uint32_t>& source, Expr* state) const {
    for (size_t j = 0; j < source.size(); ++j)
      sink.call(*enc_blocks_[j == 0 ? 0 : 1], state, j == 0 ? 0 : 2, &source[j], 1, state);
  }
  // One decoding step from `state` (h, c) on word `prev`: the new state and max_index of
  // log softmax(z): the next word's log-probability and the word (2 floats).
  void decode_step(Graph& g, Expr* state, uint32_t prev, Expr* best) const {
    if (options_.blocks) {
      Expr out[3];
      decode_block_->call(g, state, 2, &prev, 1, out);
      state[0] = out[0];
      state[1] = out[1];
      *best = out[2];
      return;
    }
    const CellState prev_state{state[0], state[1]};
    const CellState s = lstm_step(g, dec_, lookup(g, E_tgt_, prev), &prev_state);
    state[0] = s.h;
    state[1] = s.c;
    *best = max_index(log_softmax(output_layer(g, s.h)));
  }

  void make_blocks() {
    const Dim h{options_.hidden, 1};
    for (int step = 0; step < 2; ++step)
      enc_blocks_[step] = make_block(pc_, name() + (step ? ".enc.step" : ".enc.first"),
                                     [&](Block& blk) {
                                       CellState prev;
                                       if (step) {
                                         prev.h = blk.input("h", h);
                                         prev.c = blk.input("c", h);
                                       }
                                       const Expr x = blk.lookup(E_src_, blk.index("word"));
                                       const CellState s = lstm_step(blk.body(), enc_, x,
                                                                     step ? &prev : nullptr);
                                       blk.output("h", s.h);
                                       blk.output("c", s.c);
                                     });
    for (int train = 0; train < 2; ++train) {
      auto blk = make_block(pc_, name() + (train ? ".dec.train" : ".dec.decode"), [&](Block& b) {
        const CellState prev{b.input("h", h), b.input("c", h)};
        const Expr x = b.lookup(E_tgt_, b.index("word"));
        const CellState s = lstm_step(b.body(), dec_, x, &prev);
        b.output("h", s.h);
        b.output("c", s.c);
        const Expr z = output_layer(b.body(), s.h);
        if (train) {
          b.output("loss", b.pick_neg_log_softmax(z, b.index("label")));
          b.output("logits", z);
        } else {
          b.output("best", max_index(log_softmax(z)));
        }
      });
      (train ? train_block_ : decode_block_) = std::move(blk);
    }
  }

  const std::vector<SentencePair>& pairs_;
  LookupParameter E_src_, E_tgt_;
  LstmWeights enc_, dec_;
  Parameter W_o_, b_o_, W_out_, b_out_;
  std::unique_ptr<Block> enc_blocks_[2], train_block_, decode_block_;
  std::vector<Expr> losses_;
};

std::vector<Decoded> LstmNmt::decode(Engine& engine, Graph& g,
                                     const std::vector<uint32_t>& instances,
                                     const DecodeOptions& options) {
  if (&g.params() != &pc_)
    throw std::invalid_argument("[lstm_nmt] decode: the graph is over another collection");
  if (options.max_len == 0) throw std::invalid_argument("[lstm_nmt] decode: max_len is 0");
  if (options_.blocks && !train_block_) make_blocks();
  g.clear();
  const size_t n = instances.size();
  std::vector<Decoded> out(n);
  struct Running {
    uint32_t sentence, cap;
    Expr state[2], best;
  };
  std::vector<Running> running(n);
  // The first increment: every encoder and every first decoding step.
  for (size_t i = 0; i < n; ++i) {
    check_instance(instances[i]);
    const SentencePair& p = pair(instances[i]);
    Running& r = running[i];
    r.sentence = static_cast<uint32_t>(i);
    r.cap = static_cast<uint32_t>(
        std::min<size_t>(options.max_len, 2 * p.source.size() + 2));
    if (options_.blocks) {
      Sink sink(g, nullptr);
      encode_blocks(sink, p.source, r.state);
    } else {
      const CellState s = encode_ops(g, p.source);
      r.state[0] = s.h;
      r.state[1] = s.c;
    }
    decode_step(g, r.state, kBos, &r.best);
  }
  std::vector<Expr> step_outputs, bests;
  while (!running.empty()) {
    // Run the step without reading a value, then read every sentence's next word and its score
    // at once (the argmax runs with the step: two floats a sentence): from a device that is one
    // copy queued behind the step's kernels and one wait.
    step_outputs.clear();
    bests.clear();
    for (const Running& r : running) {
      step_outputs.insert(step_outputs.end(), {r.state[0], r.state[1], r.best});
      bests.push_back(r.best);
    }
    engine.forward_through(g, step_outputs);
    engine.fetch(bests);
    size_t kept = 0;
    for (Running& r : running) {
      const Tensor t = engine.value(r.best);
      if (t.data == nullptr)
        throw std::invalid_argument("[lstm_nmt] decode reads values: not on the null device");
      const uint32_t y = static_cast<uint32_t>(t.data[1]);
      Decoded& d = out[r.sentence];
      d.tokens.push_back(y);
      d.score += t.data[0];
      if (y == kEos || d.tokens.size() >= r.cap) continue;
      decode_step(g, r.state, y, &r.best);
      running[kept++] = r;
    }
    running.resize(kept);
  }
  return out;
}

}  // namespace

std::unique_ptr<Model> make_lstm_nmt(ParameterCollection& pc, const Dataset& data,
                                     const ModelOptions& o) {
  return std::make_unique<LstmNmt>(pc, data, o);
}

}  // namespace edbatch::zoo
