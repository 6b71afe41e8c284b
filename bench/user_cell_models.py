"""Models for bench/bench_user_cells.py: the user cells (ordinary nn.Modules run by
edbatch.nn.Propagate) and the plain-PyTorch implementations they are timed against.

- Child-Sum Tree-LSTM (Tai et al. 2015) over trees of any arity: ChildSumNode / ChildForget as
  user cells; node by node (the same modules applied node after node); hand-batched by level
  (one GEMM for every node's input projections, one GEMM per level over the level's children,
  sums by index_add), as an expert writes it.
- Lattice LSTM with the built-in lattice_lstm's math, as user cells (an arc cell per arc kind,
  a pass-through node cell, learned initial state), next to the built-in cell and
  bench/torch_models.LatticeLstm (node by node, hand-batched).
"""
import os
import sys

import torch
from torch import nn

# The cells are the examples' own (examples/child_sum_tree_lstm.py, examples/lattice_user_cell.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from child_sum_tree_lstm import ChildForget, ChildSumNode  # noqa: E402
from lattice_user_cell import ArcLSTM  # noqa: E402


class ChildSumModel(nn.Module):
    """Embedding, the Child-Sum cells and the loss head shared by every implementation."""

    def __init__(self, vocab, hidden, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.node, self.edge = ChildSumNode(hidden, hidden), ChildForget(hidden, hidden)
        self.out = nn.Linear(hidden, classes)
        self.H = hidden

    def head(self, h, labels):
        keep = labels >= 0
        return nn.functional.cross_entropy(self.out(h[keep]), labels[keep], reduction="sum")


class Embedded(nn.Module):
    """A Child-Sum cell that embeds its id first (a node or arc without a word, row -1, embeds
    to zeros): the node cell takes (ids, message), the edge cell (state, the parent's ids)."""

    def __init__(self, embed, cell, edge=False):
        super().__init__()
        self.embed, self.cell, self.edge = embed, cell, edge

    def forward(self, a, b):
        return self.cell(a, self.embed(b)) if self.edge else self.cell(self.embed(a), b)


def child_sum_propagate(model, policy="lb-greedy", threads=0, classes=None, ids=False):
    """Propagate over the model's cells; with classes=model.out, its loss head is that layer.
    With ids=True the cells embed their ids (forward / loss_step with ids=packed.input_ids)."""
    import edbatch
    node, edge = model.node, model.edge
    if ids:
        node, edge = Embedded(model.embed, node), Embedded(model.embed, edge, edge=True)
    prop = edbatch.nn.Propagate(node, edge, reduce="sum",
                                state_size=(model.H, model.H), policy=policy, threads=threads,
                                classes=None if classes is None else classes.out_features)
    if classes is not None:
        prop.head = classes
    return prop


def child_sum_node_by_node(model, packed):
    """The loss with the user's modules applied node after node (eager PyTorch)."""
    x = model.embed(packed.input_ids)
    zeros = x.new_zeros((1, model.H))
    states = []
    node_inputs, pred_ptr = packed.node_inputs.tolist(), packed.pred_ptr.tolist()
    pred_ids, arc_inputs = packed.pred_ids.tolist(), packed.arc_inputs.tolist()
    for k in range(packed.num_nodes):
        row = node_inputs[k]
        x_k = x[row:row + 1] if row >= 0 else zeros
        h_sum, fc_sum = zeros, zeros
        for a in range(pred_ptr[k], pred_ptr[k + 1]):
            r = arc_inputs[a]
            h, fc = model.edge(states[pred_ids[a]], x[r:r + 1] if r >= 0 else zeros)
            h_sum, fc_sum = h_sum + h, fc_sum + fc
        states.append(model.node(x_k, (h_sum, fc_sum)))
    return model.head(torch.cat([h for h, _ in states]), packed.labels)


class ChildSumBatched:
    """Child-Sum Tree-LSTM hand-batched by level (a node's level: 1 + its highest child's).

    plan() (host, once per mini-batch, outside the timed step) sorts the nodes by level; loss()
    then runs one GEMM for all input projections [W; W_f] x, and per level one GEMM of the
    level's children by [U | U_f] whose U part is summed into the parents by index_add, the
    gates, and an index_add of the level's (h, c) rows into the state buffer."""

    def __init__(self, model, device):
        self.m, self.device = model, device

    def plan(self, packed):
        n = packed.num_nodes
        pred_ptr, pred_ids = packed.pred_ptr.tolist(), packed.pred_ids.tolist()
        level = [0] * n
        for k in range(n):
            for a in range(pred_ptr[k], pred_ptr[k + 1]):
                level[k] = max(level[k], level[pred_ids[a]] + 1)
        order = sorted(range(n), key=lambda k: level[k])
        pos = [0] * n
        for i, k in enumerate(order):
            pos[k] = i
        counts = [0] * (max(level) + 1 if n else 0)
        for lv in level:
            counts[lv] += 1
        kids, parents = [], []  # per level: sorted positions of children, local parent index
        start = 0
        for m in counts:
            kid, par = [], []
            for local, k in enumerate(order[start:start + m]):
                for a in range(pred_ptr[k], pred_ptr[k + 1]):
                    kid.append(pos[pred_ids[a]])
                    par.append(local)
            kids.append(torch.tensor(kid, dtype=torch.long, device=self.device))
            parents.append(torch.tensor(par, dtype=torch.long, device=self.device))
            start += m
        index = torch.tensor(order, dtype=torch.long)
        rows = packed.node_inputs[index] if n else packed.node_inputs
        labels = packed.labels[index] if n else packed.labels
        return (rows.to(self.device), labels.to(self.device), counts, kids, parents)

    def loss(self, packed, plan):
        m, H = self.m, self.m.H
        rows, labels, counts, kids, parents = plan
        x = m.embed(packed.input_ids)
        x = torch.cat([x, x.new_zeros((1, H))])[rows]  # row -1: the zero row
        W = torch.cat([m.node.W.weight, m.edge.W_f.weight])
        b = torch.cat([m.node.W.bias, m.edge.W_f.bias])
        proj = torch.addmm(b, x, W.t())  # [n, 4H]: i, o, u, then f's x part
        UT = torch.cat([m.node.U.weight, m.edge.U_f.weight]).t()  # [H, 4H]
        n = rows.numel()
        S = x.new_zeros((n, 2 * H))
        start = 0
        for lv, cnt in enumerate(counts):
            iou, xf = proj[start:start + cnt].split([3 * H, H], 1)
            fc_sum = None
            if kids[lv].numel():
                hk, ck = S.index_select(0, kids[lv]).split(H, 1)
                r_iou, r_f = (hk @ UT).split([3 * H, H], 1)
                f = torch.sigmoid(xf.index_select(0, parents[lv]) + r_f)
                iou = iou.index_add(0, parents[lv], r_iou)
                fc_sum = x.new_zeros((cnt, H)).index_add(0, parents[lv], f * ck)
            i, o, u = iou.chunk(3, 1)
            c = torch.sigmoid(i) * torch.tanh(u)
            if fc_sum is not None:
                c = c + fc_sum
            h = torch.sigmoid(o) * torch.tanh(c)
            idx = torch.arange(start, start + cnt, device=x.device)
            S = S.index_add(0, idx, torch.cat([h, c], 1))
            start += cnt
        return m.head(S[:, :H], labels)


def lattice_node(x, message):
    """A lattice node's state is the sum of its arcs' states."""
    return message


def lattice_user_cells(w, H, device, policy="lb-greedy", threads=0):
    """Propagate with the built-in lattice_lstm's math and the weights `w` (the zoo's names)."""
    import edbatch
    arcs = []
    for t in ("char", "word"):
        arc = ArcLSTM(H, H)  # gates f, c~, i, o as the built-in cell's
        with torch.no_grad():
            arc.U.weight.copy_(torch.cat([w[f"{t}.U_{g}"] for g in "fcio"]))
            arc.U.bias.copy_(torch.cat([w[f"{t}.b_{g}"] for g in "fcio"]))
            arc.W.weight.copy_(torch.cat([w[f"{t}.W_{g}"] for g in "fcio"]))
        arcs.append(arc)
    prop = edbatch.nn.Propagate(lattice_node, arcs, reduce="sum", state_size=(H, H),
                                initial="learned", policy=policy, threads=threads)
    with torch.no_grad():
        prop.initial[0].copy_(w["h0"])
        prop.initial[1].copy_(w["c0"])
    return prop.to(device)


def with_loss_head(prop, weight, tables=None):
    """A Propagate over prop's own cells and learned initial state with a loss head inside the
    engine whose weight is `weight` (classes x H) and whose bias stays zero (the baselines'
    heads have none). With `tables` (one nn.Embedding per arc kind) the arc cells embed their
    ids themselves (forward / loss_step with ids=packed.input_ids)."""
    import edbatch
    edges = list(prop.edge_cells)
    if tables is not None:
        edges = [Embedded(table, arc, edge=True) for table, arc in zip(tables, edges)]
    out = edbatch.nn.Propagate(list(prop.node_cells), edges, reduce=prop.reduce,
                               state_size=prop.state_size, initial=prop.initial_kind,
                               policy=prop.policy, threads=prop.threads,
                               classes=weight.shape[0])
    out.initial = prop.initial
    out.head.weight = weight
    out.head.bias = nn.Parameter(torch.zeros(weight.shape[0], device=weight.device),
                                 requires_grad=False)
    return out
