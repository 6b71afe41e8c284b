#!/usr/bin/env python3
"""Sequence reversal with an LSTM user cell: trained over chains by edbatch.nn.Propagate, then
decoded by edbatch.nn.StepDecoder, greedily and with beam search (reorder: each kept hypothesis
goes on from its parent's state).

An example is one chain: its source symbols, SEP, the symbols reversed, EOS. Each node predicts
the next token; the loss counts the nodes from SEP on. Decoding starts from the states the chain
reaches at SEP (a Propagate forward over the sources), so the decoder's first step reads the
first output token. Prints the loss per epoch and the share of exactly reversed sequences.

    /usr/bin/python3 examples/seq2seq_beam.py --epochs 20 --beam 4
"""
import argparse
import random

import torch
from torch import nn

import example_common

edbatch = example_common.import_edbatch()

EOS, SEP, SYMBOLS = 0, 1, 10  # tokens 2 .. SYMBOLS + 1 are symbols
VOCAB = SYMBOLS + 2


class Cell(nn.Module):
    """The user's cell: the previous (h, c) and a token's embedding to the next (h, c)."""

    def __init__(self, embed, hidden):
        super().__init__()
        self.lstm = nn.LSTMCell(embed, hidden)

    def forward(self, x, state):
        return self.lstm(x, state)


class Reverser(nn.Module):
    def __init__(self, hidden, embed=16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, embed)
        self.chain = edbatch.nn.Propagate(Cell(embed, hidden), state_size=(hidden, hidden))
        self.out = nn.Linear(hidden, VOCAB)

    def forward(self, packed):
        """Every node's next-token logits."""
        h, _ = self.chain(packed, x=self.embed(packed.input_ids))
        return self.out(h)

    def loss(self, packed):
        return example_common.node_loss(self(packed), packed.labels)

    def encode(self, sources):
        """The states each source's chain reaches at SEP: (h, c), a row per source."""
        packed, order = edbatch.pack_edges([chain(s, with_target=False) for s in sources],
                                           return_order=True)
        h, c = self.chain(packed, x=self.embed(packed.input_ids))
        at = torch.tensor([o[-1] for o in order])  # each chain's last node: its SEP
        return h[at], c[at]


def chain(source, with_target=True):
    """One example as an edge list: source, SEP (and the target, labels on the nodes from SEP)."""
    tokens = source + [SEP] + (source[::-1] if with_target else [])
    n = len(tokens)
    labels = [-1] * len(source) + tokens[len(source) + 1:] + [EOS] if with_target else None
    return {"num_nodes": n, "edges": [(k - 1, k) for k in range(1, n)], "inputs": tokens,
            "labels": labels}


def synthetic(n, seed, lengths=(2, 7)):
    rng = random.Random(seed)
    return [[rng.randrange(2, VOCAB) for _ in range(rng.randint(*lengths))] for _ in range(n)]


class Engine:
    """The decoding loop's cell on edbatch: a StepDecoder over the model's cell."""

    def __init__(self, model):
        self.decoder = edbatch.nn.StepDecoder(model.chain, input_size=model.embed.embedding_dim)

    def start(self, state):
        self.decoder.start(state[0].shape[0], state)

    def reorder(self, rows):
        self.decoder.reorder(rows)

    def step(self, x):
        return self.decoder.step(x)


def beam_search(model, engine, sources, beam=4, max_len=None):
    """Each source's best hypothesis (its tokens, EOS left out) and log-probability. Every
    sentence keeps its `beam` best unfinished hypotheses as rows of one batch; a hypothesis that
    emits EOS is finished, and a sentence stops once its best unfinished one cannot beat its best
    finished one (log-probabilities only fall) or at max_len tokens (default: the source's
    length + 2). beam=1 is greedy decoding."""
    h, c = model.encode(sources)
    engine.start((h, c))
    caps = [max_len or len(s) + 2 for s in sources]
    live = [[([], 0.0)] for _ in sources]  # per sentence: (tokens, score) per row, in row order
    best = [(None, float("-inf")) for _ in sources]
    active = list(range(len(sources)))  # sentences with rows, in row order
    t = 0
    while active:
        logp = torch.log_softmax(model.out(h), -1)
        rows, tokens, still, first = [], [], [], 0
        for i in active:
            hyps = live[i]
            scores = torch.tensor([s for _, s in hyps])[:, None] + logp[first:first + len(hyps)]
            top = scores.reshape(-1).topk(min(2 * beam, scores.numel()))
            kept = []
            for score, j in zip(top.values.tolist(), top.indices.tolist()):
                parent, tok = divmod(j, VOCAB)
                if tok == EOS or t + 1 == caps[i]:  # finished: the cap ends the others too
                    if score > best[i][1]:
                        best[i] = (hyps[parent][0] + ([] if tok == EOS else [tok]), score)
                elif len(kept) < beam:
                    kept.append((first + parent, tok, hyps[parent][0] + [tok], score))
            kept = [k for k in kept if k[3] > best[i][1]]
            if kept:
                rows += [r for r, _, _, _ in kept]
                tokens += [tok for _, tok, _, _ in kept]
                live[i] = [(seq, s) for _, _, seq, s in kept]
                still.append(i)
            first += len(hyps)
        active, t = still, t + 1
        if not active:
            break
        engine.reorder(rows)
        h, c = engine.step(model.embed(torch.tensor(tokens)))
    return best


def accuracy(model, sources, beam):
    model.eval()
    with torch.no_grad():
        found = beam_search(model, Engine(model), sources, beam)
    return sum(tokens == s[::-1] for s, (tokens, _) in zip(sources, found)) / len(sources)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=4000, help="training sequences")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--beam", type=int, default=4, help="hypotheses kept per sentence")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    train, test = synthetic(args.examples, args.seed), synthetic(200, args.seed + 1)
    batches = [edbatch.pack_edges([chain(s) for s in train[i:i + args.batch]])
               for i in range(0, len(train), args.batch)]
    model = Reverser(args.hidden)
    example_common.train(model, batches, args.epochs, args.lr)
    for beam in sorted({1, args.beam}):
        print(f"beam {beam}: {accuracy(model, test, beam):.1%} of 200 new sequences reversed")


if __name__ == "__main__":
    main()
