#!/usr/bin/env python3
"""Sentiment training on SST-format trees with edbatch's Tree-LSTM op and a PyTorch optimizer.

Prints the loss per epoch, then times training steps (forward + backward + optimizer) of the same
model written node by node in PyTorch, with the same parameters, and reports the speedup.
Runs on built-in synthetic SST-format trees unless --data names an SST file.

    /usr/bin/python3 examples/train_tree_lstm.py               # after ./scripts/build.sh
    python3 examples/train_tree_lstm.py --data sst/train.txt   # with `pip install`ed edbatch
"""
import argparse
import statistics
import time

import torch

import example_common

edbatch = example_common.import_edbatch()


class Sentiment(torch.nn.Module):
    """Tree-LSTM over the tree, a softmax classifier on every node's h."""

    def __init__(self, vocab, hidden, threads, policy):
        super().__init__()
        self.tree = edbatch.nn.TreeLSTM(vocab, hidden, hidden, threads=threads, policy=policy)
        self.out = torch.nn.Linear(hidden, 5)

    def forward(self, packed):
        h, _ = self.tree(packed)
        return self.out(h)


def node_by_node_logits(model, trees):
    """The same model, node by node in PyTorch (the speed baseline): trees as (children, word)
    lists in post order."""
    c = model.tree.cell
    E = model.tree.embeddings[0].weight
    out = []
    for nodes in trees:
        hs, cs = [], []
        for children, word in nodes:
            if not children:
                e = E[word]
                i = torch.sigmoid(c.W_i @ e + c.b_i)
                o = torch.sigmoid(c.W_o @ e + c.b_o)
                u = torch.tanh(c.W_u @ e + c.b_u)
                cell = i * u
            else:
                l, r = children
                x = torch.cat([hs[l], hs[r]])
                i = torch.sigmoid(c.U_i @ x + c.b_i)
                o = torch.sigmoid(c.U_o @ x + c.b_o)
                u = torch.tanh(c.U_u @ x + c.b_u)
                f1 = torch.sigmoid(c.U_f1 @ hs[l] + c.b_f)
                f2 = torch.sigmoid(c.U_f2 @ hs[r] + c.b_f)
                cell = i * u + f1 * cs[l] + f2 * cs[r]
            hs.append(o * torch.tanh(cell))
            cs.append(cell)
        out.append(model.out(torch.stack(hs)))
    return torch.cat(out)


def tree_lists(packed):
    """Per instance, (children as local ids, word id) per node, from the packed tensors."""
    ptr, ids = packed.pred_ptr.tolist(), packed.pred_ids.tolist()
    rows, words = packed.node_inputs.tolist(), packed.input_ids.tolist()
    offsets = packed.instance_offsets.tolist()
    trees = []
    for i in range(packed.num_instances):
        first = offsets[i]
        trees.append([([j - first for j in ids[ptr[k]:ptr[k + 1]]],
                       words[rows[k]] if rows[k] >= 0 else -1)
                      for k in range(first, offsets[i + 1])])
    return trees


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="SST file (one bracketed tree per line); default: synthetic")
    ap.add_argument("--synthetic", type=int, default=640, help="synthetic trees (default 640)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=0, help="edbatch threads (0: torch's)")
    ap.add_argument("--policy", default="lb-greedy")
    ap.add_argument("--compare-steps", type=int, default=5,
                    help="mini-batches timed for the node-by-node comparison (0: skip)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    if args.data:
        with open(args.data, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
    else:
        lines = edbatch.packing.synthetic_sst(args.synthetic, vocab_size=2000, seed=args.seed)
    vocab = {}
    batches = [edbatch.pack_sst(lines[i:i + args.batch], vocab)
               for i in range(0, len(lines), args.batch)]
    print(f"{len(lines)} trees ({'synthetic' if not args.data else args.data}), "
          f"{sum(b.num_nodes for b in batches)} nodes, vocabulary {len(vocab)}, "
          f"{len(batches)} mini-batches of {args.batch}, hidden {args.hidden}")

    model = Sentiment(len(vocab), args.hidden, args.threads, args.policy)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(packed, forward):
        opt.zero_grad()
        loss = loss_fn(forward(packed), packed.labels)
        loss.backward()
        opt.step()
        return loss.item()

    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        # prefetch: each next mini-batch's graph is built and planned on a worker thread while
        # this one trains.
        losses = [step(b, model) for b in edbatch.prefetch(model.tree, batches)]
        with torch.no_grad():
            correct = sum((model(b)[b.roots].argmax(1) == b.labels[b.roots]).sum().item()
                          for b in batches)
        print(f"epoch {epoch}: loss {statistics.mean(losses):.4f}  root accuracy "
              f"{correct / len(lines):.3f}  ({time.perf_counter() - t0:.2f} s)", flush=True)

    if args.compare_steps <= 0:
        return
    # The same training step, node by node in PyTorch, on the same parameters.
    sample = batches[:args.compare_steps]
    lists = [tree_lists(b) for b in sample]
    with torch.no_grad():
        a = loss_fn(model(sample[0]), sample[0].labels).item()
        b = loss_fn(node_by_node_logits(model, lists[0]), sample[0].labels).item()
    print(f"first mini-batch loss: edbatch {a:.6f}, node by node {b:.6f}")
    times = {"edbatch": [], "node by node": []}
    for packed, trees in zip(sample, lists):
        for name, fwd in (("edbatch", model),
                          ("node by node", lambda p, t=trees: node_by_node_logits(model, t))):
            t0 = time.perf_counter()
            step(packed, fwd)
            times[name].append(time.perf_counter() - t0)
    ours, theirs = statistics.median(times["edbatch"]), statistics.median(times["node by node"])
    print(f"training step (median of {len(sample)}): edbatch {ours * 1e3:.1f} ms, "
          f"node by node {theirs * 1e3:.1f} ms: {theirs / ours:.1f}x faster")


if __name__ == "__main__":
    main()
