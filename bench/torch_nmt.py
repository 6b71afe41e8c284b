#!/usr/bin/env python3
"""lstm_nmt in plain PyTorch, as its users write it: padded mini-batches with a mask, nn.LSTM
over the padded source (packed) and, in training, over the padded target; greedy decoding one
nn.LSTMCell step for the whole mini-batch until every sentence has stopped (at its own </s> or
after min(max_len, 2 |source| + 2) tokens, as edbatch's lstm_nmt). The math is edbatch's
(docs/models.md): z_t = W_out tanh(W_o s_t + b_o) + b_out. Sentence pairs are drawn like
edbatch's synthetic pairs (source 3..30 words, targets from a fixed word map).

Prints a table and one JSON line per result with the fields of bench_nmt (impl "pytorch").
For one CPU core: taskset -c 0 python3 bench/torch_nmt.py --device cpu (the script sets one
torch thread).

  torch_nmt.py [--device cpu|cuda] [--hidden 128,256] [--batch 32,128] [--reps N] [--vocab V]
               [--pairs N] [--max-len N] [--check]

p10 and p90 are interpolated between the closest ranks, as `edbatch run --json` and bench_nmt
(torch_baseline.quantile).
"""
import argparse
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import HelpFormatter, count, json_line, quantile  # noqa: E402

UNK, BOS, EOS = 0, 1, 2


def synthetic_pairs(n, vocab, seed=1):
    rng = random.Random(seed)
    words = list(range(3, vocab))
    weights = [1.0 / (i + 1) for i in range(len(words))]
    perm = words[:]
    rng.shuffle(perm)
    pairs = []
    for _ in range(n):
        src = rng.choices(words, weights, k=rng.randint(3, 30))
        tgt = []
        for i in reversed(range(len(src))):
            w = perm[src[i] - 3]
            tgt += [w, w] if i % 5 == 4 else [w]
        pairs.append((src, tgt))
    return pairs


class Seq2Seq(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.emb_src = nn.Embedding(vocab, hidden)
        self.emb_tgt = nn.Embedding(vocab, hidden)
        self.encoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.decoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def encode(self, src, src_len):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb_src(src), src_len.cpu(),
                                                   batch_first=True, enforce_sorted=False)
        _, (h, c) = self.encoder(packed)
        return h, c  # 1 x B x H each: every sentence's last state

    def logits(self, s):
        return self.out(torch.tanh(self.proj(s)))

    def loss(self, src, src_len, tgt_in, tgt_out):
        h, c = self.encode(src, src_len)
        s, _ = self.decoder(self.emb_tgt(tgt_in), (h, c))
        z = self.logits(s)
        return F.cross_entropy(z.reshape(-1, z.shape[-1]), tgt_out.reshape(-1),
                               ignore_index=-1, reduction="sum")

    @torch.no_grad()
    def greedy(self, src, src_len, caps):
        h, c = self.encode(src, src_len)
        h, c = h[0], c[0]
        cell_w = (self.decoder.weight_ih_l0, self.decoder.weight_hh_l0,
                  self.decoder.bias_ih_l0, self.decoder.bias_hh_l0)
        B = src.shape[0]
        y = torch.full((B,), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        tokens, scores = [], torch.zeros(B, device=src.device)
        t = 0
        max_cap = int(caps.max())
        while t < max_cap:
            gates = F.linear(self.emb_tgt(y), cell_w[0], cell_w[2]) + F.linear(h, cell_w[1],
                                                                               cell_w[3])
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            lsm = F.log_softmax(self.logits(h), dim=-1)
            best, y = lsm.max(dim=-1)
            scores += torch.where(done, torch.zeros_like(best), best)
            tokens.append(torch.where(done, torch.full_like(y, -1), y))
            t += 1
            done |= (y == EOS) | (caps <= t)
            if bool(done.all()):  # the users' loop: stop when every sentence has stopped
                break
        return torch.stack(tokens, 1), scores


def pad(seqs, value, device):
    n = max(len(s) for s in seqs)
    return torch.tensor([s + [value] * (n - len(s)) for s in seqs], device=device)


def batch_tensors(pairs, device, max_len):
    src = pad([p[0] for p in pairs], 0, device)
    src_len = torch.tensor([len(p[0]) for p in pairs], device=device)
    tgt_in = pad([[BOS] + p[1] for p in pairs], 0, device)
    tgt_out = pad([p[1] + [EOS] for p in pairs], -1, device)
    caps = torch.tensor([min(max_len, 2 * len(p[0]) + 2) for p in pairs], device=device)
    return src, src_len, tgt_in, tgt_out, caps


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def report(mode, args, hidden, batch, per_s):
    v = sorted(per_s)
    med, p10, p90 = (quantile(v, q) for q in (0.5, 0.1, 0.9))
    print(f"{mode:7s} hidden {hidden:4d}  B {batch:4d}  {med:10.1f} /s  "
          f"(p10 {p10:.1f}, p90 {p90:.1f})")
    print(json_line({"bench": "nmt", "impl": "pytorch", "mode": mode, "device": args.device,
                     "torch": torch.__version__, "threads": torch.get_num_threads(),
                     "hidden": hidden, "batch": batch, "per_s_median": med,
                     "per_s_p10": p10, "per_s_p90": p90}), flush=True)


def check(model, pairs, device, max_len):
    """Batched greedy decoding equals each sentence decoded alone (a functional check)."""
    b = batch_tensors(pairs, device, max_len)
    tokens, scores = model.greedy(b[0], b[1], b[4])
    for k, p in enumerate(pairs):
        one = batch_tensors([p], device, max_len)
        t1, s1 = model.greedy(one[0], one[1], one[4])
        mine = [int(x) for x in tokens[k] if int(x) >= 0]
        assert mine == [int(x) for x in t1[0]], f"sentence {k}: tokens differ"
        assert abs(float(scores[k]) - float(s1[0])) < 1e-3 * max(1, abs(float(s1[0])))
    print(f"check: {len(pairs)} sentences decode alike batched and alone", flush=True)


def sizes(text):
    """An argparse type: comma-separated positive integers, else a usage error."""
    parse = count()
    try:
        return [parse(x) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, not "
                                         f"{text!r}")


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    ap.add_argument("--hidden", type=sizes, default="128,256", help="comma-separated hidden sizes")
    ap.add_argument("--batch", type=sizes, default="32,128",
                    help="comma-separated mini-batch sizes (sentence pairs)")
    ap.add_argument("--reps", type=count(), default=10,
                    help="timed mini-batches per mode and size, after 2 untimed ones")
    ap.add_argument("--vocab", type=count(4), default=256,
                    help="vocabulary, the 3 special tokens (unknown, <s>, </s>) included")
    ap.add_argument("--pairs", type=count(), default=1024, help="synthetic sentence pairs")
    ap.add_argument("--max-len", type=count(), default=100,
                    help="longest greedy decoding, in tokens (each sentence stops at its own "
                         "</s> or after min(max-len, 2 |source| + 2))")
    ap.add_argument("--threads", type=count(), default=1, help="torch.set_num_threads")
    ap.add_argument("--check", action="store_true",
                    help="only the functional check: batched greedy decoding equals each "
                         "sentence decoded alone")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    pairs = synthetic_pairs(args.pairs, args.vocab)
    dev = args.device
    if args.check:
        check(Seq2Seq(args.vocab, 16).to(dev).eval(), pairs[:9], dev, args.max_len)
        return
    for hidden in args.hidden:
        for batch in args.batch:
            model = Seq2Seq(args.vocab, hidden).to(dev)
            opt = torch.optim.SGD(model.parameters(), lr=0.1 / batch)
            batches = [batch_tensors([pairs[(r * batch + k) % len(pairs)] for k in range(batch)],
                                     dev, args.max_len) for r in range(args.reps + 2)]
            per_s = []
            for r, b in enumerate(batches):
                sync(dev)
                t0 = time.perf_counter()
                model.greedy(b[0], b[1], b[4])
                sync(dev)
                if r >= 2:
                    per_s.append(batch / (time.perf_counter() - t0))
            report("decode", args, hidden, batch, per_s)
            per_s = []
            for r, b in enumerate(batches):
                sync(dev)
                t0 = time.perf_counter()
                opt.zero_grad()
                model.loss(b[0], b[1], b[2], b[3]).backward()
                opt.step()
                sync(dev)
                if r >= 2:
                    per_s.append(batch / (time.perf_counter() - t0))
            report("train", args, hidden, batch, per_s)


if __name__ == "__main__":
    main()
