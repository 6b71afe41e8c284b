#!/usr/bin/env python3
"""Child-Sum Tree-LSTM (Tai et al. 2015) written as user cells and run by edbatch.nn.Propagate
over trees of any arity, trained for sentiment on SST-format trees (synthetic unless --data).

The per-child forget gates f_k = sigmoid(W_f x_parent + U_f h_k + b_f) are an edge cell whose
input is the parent's row (pack_trees(..., edge_inputs="parent")): each arc's message is
(h_k, f_k * c_k), and the sum over children gives the node cell (sum h_k, sum f_k c_k).
(In SST trees inner nodes have no word, so x_parent is zero there.)

The cells may also embed their ids themselves, called as tree(packed, ids=packed.input_ids):
a node or parent without a word (row -1) embeds to zeros, the same model, and a
loss_step(..., lr=) then updates the embedding inside the engine too (bench/user_cell_models.py,
Embedded).

    /usr/bin/python3 examples/child_sum_tree_lstm.py --epochs 5
"""
import torch
from torch import nn

import example_common

edbatch = example_common.import_edbatch()


class ChildSumNode(nn.Module):
    """State (h, c) from the node's x and the summed message (sum h_k, sum f_k c_k)."""

    def __init__(self, input_size, hidden):
        super().__init__()
        self.W = nn.Linear(input_size, 3 * hidden)
        self.U = nn.Linear(hidden, 3 * hidden, bias=False)

    def forward(self, x, message):
        h_sum, fc_sum = message
        i, o, u = (self.W(x) + self.U(h_sum)).chunk(3, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + fc_sum
        return torch.sigmoid(o) * torch.tanh(c), c


class ChildForget(nn.Module):
    """Message of child k to its parent: (h_k, f_k * c_k), f_k from the parent's x and h_k."""

    def __init__(self, input_size, hidden):
        super().__init__()
        self.W_f = nn.Linear(input_size, hidden)
        self.U_f = nn.Linear(hidden, hidden, bias=False)

    def forward(self, state, x_parent):
        h, c = state
        f = torch.sigmoid(self.W_f(x_parent) + self.U_f(h))
        return h, f * c


class Sentiment(nn.Module):
    def __init__(self, vocab_size, hidden, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.tree = edbatch.nn.Propagate(ChildSumNode(hidden, hidden),
                                         ChildForget(hidden, hidden), reduce="sum",
                                         state_size=(hidden, hidden))
        self.out = nn.Linear(hidden, classes)

    def forward(self, packed):
        h, _ = self.tree(packed, x=self.embed(packed.input_ids))
        return self.out(h)

    def loss(self, packed):
        return example_common.node_loss(self(packed), packed.labels)


def node_by_node(model, packed):
    """The same model node by node in plain PyTorch: logits of every node."""
    x = model.embed(packed.input_ids)
    node, edge = model.tree.node_cells[0], model.tree.edge_cells[0]
    zeros = x.new_zeros((1, x.shape[1]))
    states = []
    for k in range(packed.num_nodes):
        row = packed.node_inputs[k].item()
        x_k = x[row:row + 1] if row >= 0 else zeros
        h_sum = fc_sum = x.new_zeros((1, model.out.in_features))
        for a in range(packed.pred_ptr[k], packed.pred_ptr[k + 1]):
            h, c = states[packed.pred_ids[a].item()]
            parent_row = packed.arc_inputs[a].item()
            h, fc = edge((h, c), x[parent_row:parent_row + 1] if parent_row >= 0 else zeros)
            h_sum, fc_sum = h_sum + h, fc_sum + fc
        states.append(node(x_k, (h_sum, fc_sum)))
    return model.out(torch.cat([h for h, _ in states]))


def pack(lines, vocab):
    parsed = [edbatch.parse_sst(line, vocab) for line in lines]
    return edbatch.pack_trees([t for t, _ in parsed], [l for _, l in parsed],
                              edge_inputs="parent")


def main():
    args = example_common.arguments(__doc__.split("\n\n")[0], "an SST-format file")
    torch.manual_seed(args.seed)
    lines, vocab = example_common.sst_lines(args, edbatch), {}
    batches = [pack(lines[i:i + args.batch], vocab) for i in range(0, len(lines), args.batch)]
    model = Sentiment(len(vocab), args.hidden)
    example_common.train(model, batches, args.epochs, args.lr)


if __name__ == "__main__":
    main()
