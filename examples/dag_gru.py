#!/usr/bin/env python3
"""A DAG GRU written as user cells and run by edbatch.nn.Propagate over DAGs given as edge
lists, trained to tag every node (synthetic random DAGs unless --data).

Each arc kind mixes its source differently (an edge cell per kind: a linear map of the source's
state scaled by a learned per-kind gate); the messages into a node are averaged (reduce="mean");
the node cell is a GRU whose candidate is normalised by a hand-written RMSNorm
(h * rsqrt(mean(h^2) + eps) * w: a reduction over the features, kept with keepdim=True, that
broadcasts back over them) and clamped.

    /usr/bin/python3 examples/dag_gru.py --epochs 5
    /usr/bin/python3 examples/dag_gru.py --data dags.jsonl   # one {"num_nodes", "edges",
                                                             # "inputs", "labels"} per line
"""
import json
import random

import torch
from torch import nn

import example_common

edbatch = example_common.import_edbatch()

KINDS = 3  # arc kinds of the synthetic DAGs


class KindEdge(nn.Module):
    """The message of an arc of one kind: sigmoid(g) * (A h_source), g a learned scalar."""

    def __init__(self, hidden):
        super().__init__()
        self.A = nn.Linear(hidden, hidden, bias=False)
        self.g = nn.Parameter(torch.zeros(1))

    def forward(self, state, x):
        return torch.sigmoid(self.g) * self.A(state)


class RmsGruNode(nn.Module):
    """h' = (1 - z) h + z c, with h the averaged message and c an RMS-normalised candidate."""

    def __init__(self, input_size, hidden, eps=1e-6):
        super().__init__()
        self.Wx = nn.Linear(input_size, 3 * hidden)
        self.Uh = nn.Linear(hidden, 2 * hidden, bias=False)
        self.Uc = nn.Linear(hidden, hidden, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x, h):
        xz, xr, xc = self.Wx(x).chunk(3, -1)
        hz, hr = self.Uh(h).chunk(2, -1)
        z, r = torch.sigmoid(xz + hz), torch.sigmoid(xr + hr)
        c = xc + self.Uc(r * h)
        c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale
        return (1 - z) * h + z * torch.clamp(c, -3.0, 3.0)


class Tagger(nn.Module):
    def __init__(self, vocab_size, hidden, classes, kinds=KINDS):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.dag = edbatch.nn.Propagate(RmsGruNode(hidden, hidden),
                                        [KindEdge(hidden) for _ in range(kinds)],
                                        reduce="mean", state_size=hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, packed):
        return self.out(self.dag(packed, x=self.embed(packed.input_ids)))

    def loss(self, packed):
        return example_common.node_loss(self(packed), packed.labels)


def node_by_node(model, packed):
    """The same model in plain PyTorch, one node at a time: logits of every node."""
    x = model.embed(packed.input_ids)
    cell, edges = model.dag.node_cells[0], model.dag.edge_cells
    states = []
    for k in range(packed.num_nodes):
        row = packed.node_inputs[k].item()
        xk = x[row:row + 1] if row >= 0 else x.new_zeros((1, x.shape[1]))
        arcs = range(packed.pred_ptr[k].item(), packed.pred_ptr[k + 1].item())
        messages = [edges[packed.arc_types[a].item()](states[packed.pred_ids[a].item()], None)
                    for a in arcs]
        h = torch.stack(messages).mean(0) if messages else xk.new_zeros(xk.shape)
        states.append(cell(xk, h))
    return model.out(torch.cat(states))


def synthetic_dags(n, vocab_size, classes, seed):
    """Random DAGs in shuffled node order; a node's label is (its id + the number of nodes
    above it) mod classes, so tags need both the word and the structure."""
    rng = random.Random(seed)
    dags = []
    for _ in range(n):
        size = rng.randint(2, 16)
        edges = [(rng.randrange(k), k, rng.randrange(KINDS))
                 for k in range(1, size) for _ in range(rng.randint(1, 3))]
        above = [set() for _ in range(size)]
        for s, d, _ in sorted(edges, key=lambda e: e[1]):
            above[d] |= above[s] | {s}
        ids = [rng.randrange(vocab_size) for _ in range(size)]
        order = list(range(size))
        rng.shuffle(order)  # node i is called order[i]: pack_edges sorts any order topologically
        inputs, labels = [0] * size, [0] * size
        for i in range(size):
            inputs[order[i]] = ids[i]
            labels[order[i]] = (ids[i] + len(above[i])) % classes
        dags.append({"num_nodes": size, "edges": [(order[s], order[d], t) for s, d, t in edges],
                     "inputs": inputs, "labels": labels})
    return dags


def main():
    args = example_common.arguments(__doc__.split("\n\n")[0], "a JSON-lines file of edge lists")
    torch.manual_seed(args.seed)
    classes, vocab = 4, 50
    if args.data:
        with open(args.data) as f:
            dags = [json.loads(line) for line in f if line.strip()]
        vocab = 1 + max(i for d in dags for i in d.get("inputs", [0]) if i is not None)
        classes = 1 + max([0] + [label for d in dags for label in d.get("labels") or []
                                 if label is not None])  # None: no label
    else:
        dags = synthetic_dags(args.examples, vocab, classes, args.seed)
    batches = [edbatch.pack_edges(dags[i:i + args.batch])
               for i in range(0, len(dags), args.batch)]
    kinds = max(int(b.arc_types.max()) + 1 if b.arc_types.numel() else 1 for b in batches)
    model = Tagger(vocab, args.hidden, classes, max(kinds, 1))
    example_common.train(model, batches, args.epochs, args.lr)


if __name__ == "__main__":
    main()
