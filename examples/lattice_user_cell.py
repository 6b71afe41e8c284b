#!/usr/bin/env python3
"""A lattice LSTM written as user cells (char and word arc kinds) and run by
edbatch.nn.Propagate over edbatch.pack_lattices, trained to tag lattice nodes (synthetic
lattices unless --data names a file in the zoo's lattice format, docs/models.md).

Each arc j -> k runs its kind's LSTM step on (h_j, c_j) and the arc's embedding (a character or
a word); a node's state is the sum of its incoming arcs' results, and the first node of each
lattice starts from a learned (h0, c0) (initial="learned").

    /usr/bin/python3 examples/lattice_user_cell.py --epochs 5
"""
import torch
from torch import nn

import example_common

edbatch = example_common.import_edbatch()
packing = edbatch.packing


class ArcLSTM(nn.Module):
    """One arc kind's LSTM step: (h, c) and the arc's embedding -> (h', c')."""

    def __init__(self, input_size, hidden):
        super().__init__()
        self.U = nn.Linear(input_size, 4 * hidden)
        self.W = nn.Linear(hidden, 4 * hidden, bias=False)

    def forward(self, state, x):
        h, c = state
        f, g, i, o = (self.U(x) + self.W(h)).chunk(4, -1)
        c = torch.sigmoid(i) * torch.tanh(g) + torch.sigmoid(f) * c
        return torch.sigmoid(o) * torch.tanh(c), c


def node_state(x, message):
    """A lattice node's state is the summed message of its arcs."""
    return message


class Tagger(nn.Module):
    def __init__(self, vocab_size, hidden, tags):
        super().__init__()
        self.chars = nn.Embedding(vocab_size, hidden)
        self.words = nn.Embedding(vocab_size, hidden)
        self.lattice = edbatch.nn.Propagate(
            node_state, {0: ArcLSTM(hidden, hidden), 1: ArcLSTM(hidden, hidden)},
            reduce="sum", state_size=(hidden, hidden), initial="learned")
        with torch.no_grad():
            for p in self.lattice.initial:
                p.normal_(0, 0.1)
        self.out = nn.Linear(hidden, tags)

    def embed(self, packed):
        """Arc embeddings: the char table for input kind 0, the word table for kind 1."""
        word = (packed.input_kinds == 1).unsqueeze(1)
        return torch.where(word, self.words(packed.input_ids), self.chars(packed.input_ids))

    def forward(self, packed):
        h, _ = self.lattice(packed, x=self.embed(packed))
        return self.out(h)

    def loss(self, packed):
        return example_common.node_loss(self(packed), packed.labels)


def node_by_node(model, packed):
    """The same lattice LSTM node by node in plain PyTorch: logits of every node."""
    x = model.embed(packed)
    h0, c0 = (p.view(1, -1) for p in model.lattice.initial)
    states = []
    for k in range(packed.num_nodes):
        arcs = range(packed.pred_ptr[k], packed.pred_ptr[k + 1])
        if not arcs:
            states.append((h0, c0))
            continue
        h_sum = c_sum = 0
        for a in arcs:
            cell = model.lattice.edge_cells[packed.arc_types[a].item()]
            row = packed.arc_inputs[a].item()
            h, c = cell(states[packed.pred_ids[a].item()], x[row:row + 1])
            h_sum, c_sum = h_sum + h, c_sum + c
        states.append((h_sum, c_sum))
    return model.out(torch.cat([h for h, _ in states]))


def main():
    args = example_common.arguments(__doc__.split("\n\n")[0], "lattices in the zoo's format",
                                    examples=60)
    torch.manual_seed(args.seed)
    if args.data:
        with open(args.data) as f:
            records = packing.parse_lattices(f.read())
    else:
        records = packing.synthetic_lattices(args.examples, vocab_size=200, seed=args.seed,
                                             min_len=4, max_len=12, tags=6)
    vocab = 1 + max(i for r in records for arcs in r["arcs"] for _, i in arcs)
    tags = 1 + max(t for r in records for t in r["tags"])
    batches = [edbatch.pack_lattices(records[i:i + args.batch])
               for i in range(0, len(records), args.batch)]
    model = Tagger(vocab, args.hidden, tags)
    example_common.train(model, batches, args.epochs, args.lr)


if __name__ == "__main__":
    main()
