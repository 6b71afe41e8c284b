#!/usr/bin/env python3
"""Binary N-ary Tree-LSTM (Tai et al. 2015) written as user cells and run by
edbatch.nn.Propagate, trained for sentiment on SST-format trees (synthetic unless --data).

The N-ary gates mix both children: gates = W x + U_L h_L + U_R h_R + b for i, o, u, f_L, f_R,
and c = i u + f_L c_L + f_R c_R. With edge kinds left (arc kind 0, the first child) and right
(1), each edge cell emits (U_side h_child, c placed in its own slot, zeros in the other), so the
sum over the two arcs gives the node cell (U_L h_L + U_R h_R, c_L, c_R).

    /usr/bin/python3 examples/nary_tree_lstm.py --epochs 5
"""
import torch
from torch import nn

import example_common

edbatch = example_common.import_edbatch()


class SideEdge(nn.Module):
    """The message of a left (slot 0) or right (slot 1) child: (U_side h, c or 0, 0 or c)."""

    def __init__(self, hidden, slot):
        super().__init__()
        self.U = nn.Linear(hidden, 5 * hidden, bias=False)
        self.slot = slot

    def forward(self, state, x):
        h, c = state
        zero = torch.zeros_like(c)
        return (self.U(h), c, zero) if self.slot == 0 else (self.U(h), zero, c)


class NaryNode(nn.Module):
    """State (h, c) from x and the summed message (U_L h_L + U_R h_R, c_L, c_R)."""

    def __init__(self, input_size, hidden):
        super().__init__()
        self.W = nn.Linear(input_size, 5 * hidden)

    def forward(self, x, message):
        children, c_left, c_right = message
        i, o, u, f_left, f_right = (self.W(x) + children).chunk(5, -1)
        c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_left) * c_left +
             torch.sigmoid(f_right) * c_right)
        return torch.sigmoid(o) * torch.tanh(c), c


class Sentiment(nn.Module):
    def __init__(self, vocab_size, hidden, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.tree = edbatch.nn.Propagate(
            NaryNode(hidden, hidden), [SideEdge(hidden, 0), SideEdge(hidden, 1)],
            reduce="sum", state_size=(hidden, hidden))
        self.out = nn.Linear(hidden, classes)

    def forward(self, packed):
        h, _ = self.tree(packed, x=self.embed(packed.input_ids))
        return self.out(h)

    def loss(self, packed):
        return example_common.node_loss(self(packed), packed.labels)


def node_by_node(model, packed):
    """The textbook N-ary Tree-LSTM node by node in plain PyTorch, with the model's weights:
    logits of every node."""
    x = model.embed(packed.input_ids)
    W = model.tree.node_cells[0].W
    U_left, U_right = (e.U for e in model.tree.edge_cells)
    H = model.out.in_features
    states = []
    for k in range(packed.num_nodes):
        row = packed.node_inputs[k].item()
        gates = W(x[row:row + 1]) if row >= 0 else W.bias.view(1, -1)
        c_left = c_right = x.new_zeros((1, H))
        children = packed.pred_ids[packed.pred_ptr[k]:packed.pred_ptr[k + 1]].tolist()
        if children:
            (h_l, c_left), (h_r, c_right) = states[children[0]], states[children[1]]
            gates = gates + U_left(h_l) + U_right(h_r)
        i, o, u, f_l, f_r = gates.chunk(5, -1)
        c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c_left +
             torch.sigmoid(f_r) * c_right)
        states.append((torch.sigmoid(o) * torch.tanh(c), c))
    return model.out(torch.cat([h for h, _ in states]))


def main():
    args = example_common.arguments(__doc__.split("\n\n")[0], "an SST-format file")
    torch.manual_seed(args.seed)
    lines, vocab = example_common.sst_lines(args, edbatch), {}
    batches = [edbatch.pack_sst(lines[i:i + args.batch], vocab)
               for i in range(0, len(lines), args.batch)]
    model = Sentiment(len(vocab), args.hidden)
    example_common.train(model, batches, args.epochs, args.lr)


if __name__ == "__main__":
    main()
