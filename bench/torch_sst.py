"""Time to accuracy on SST of hand-batched PyTorch: the Tree-LSTM of `edbatch run --model
tree_lstm` (bench/torch_models.py's TreeLstm: batched by dependency level, fused gate GEMMs),
trained as `edbatch run --train --optimizer adam` trains it, evaluated on the dev set after every
epoch.

Same model and training: hidden 128, embeddings of the full vocabulary (word ids by first
appearance in the training file, the dev file's new words after them, as `--vocab-size 0`),
a loss on every node, mini-batches of 32 trees reshuffled each epoch, the gradient of the mean
loss per tree clipped to global norm 5, Adam at lr 0.001 with lazy (sparse) updates of the
embedding rows a mini-batch used (SparseAdam, as edbatch's default `sparse_lookups`), the other
tensors with Adam. Initial weights: Glorot uniform with edbatch's fans, or edbatch's own
(`--weights`, from `edbatch run --save-weights`).

One JSON line per epoch (training time, mean training loss per tree, dev loss, root and all-node
accuracy, `train_wall_s`: training time so far without evaluation), then a summary line with the
median and spread of the epoch times and the training time to reach `--target` root accuracy.

  python3 bench/torch_sst.py --train trees/train.txt --dev trees/dev.txt [--device cuda]
      [--epochs 8] [--threads 1] [--target 0.45] [--limit N] [--weights init.safetensors]
Works with torch 1.13 and 2.x.
"""

import argparse
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import spread  # noqa: E402
from torch_models import TreeLstm, read_safetensors, read_trees  # noqa: E402


def glorot_weights(vocab, H, seed):
    """edbatch's initialisation scheme: uniform in +-sqrt(6 / fan), fan = rows + cols of the
    (rows x cols) matrix, a bias counting as H x 1, a lookup table's fan its embedding size.
    Torch layout: matrices [rows, cols], vectors [rows], the table [vocab, H]."""
    gen = torch.Generator().manual_seed(seed)

    def uniform(shape, fan):
        bound = math.sqrt(6.0 / fan)
        return (torch.rand(shape, generator=gen) * 2 - 1) * bound

    w = {"E": uniform([vocab, H], H)}
    for n in ("W_i", "W_o", "W_u", "U_f1", "U_f2"):
        w[n] = uniform([H, H], 2 * H)
    for n in ("U_i", "U_o", "U_u"):
        w[n] = uniform([H, 2 * H], 3 * H)
    for n in ("b_i", "b_o", "b_u", "b_f"):
        w[n] = uniform([H], H + 1)
    w["W_out"] = uniform([5, H], 5 + H)
    return w


class Trainer:
    def __init__(self, args, train, vocab):
        self.args, self.train, self.device = args, train, torch.device(args.device)
        w = read_safetensors(args.weights) if args.weights else glorot_weights(
            vocab, args.hidden, args.seed)
        if w["E"].shape[0] < vocab:
            raise ValueError(f"{args.weights}: E has {w['E'].shape[0]} rows, "
                             f"the data {vocab} words")
        self.model = TreeLstm(w, args.device, requires_grad=True)
        self.model.sparse_embedding = not args.dense_embedding
        params = list(self.model.params.values())
        E = self.model.params["E"]
        dense = [p for p in params if p is not E]
        self.optimizers = [torch.optim.Adam(params if args.dense_embedding else dense,
                                            lr=args.lr)]
        if not args.dense_embedding:
            self.optimizers.append(torch.optim.SparseAdam([E], lr=args.lr))
        self.params = params

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def epoch(self, rng):
        order = list(range(len(self.train)))
        rng.shuffle(order)
        total, B = 0.0, self.args.batch
        for b in range(0, len(order), B):
            trees = [self.train[i] for i in order[b:b + B]]
            loss = self.model.batched_losses(trees).sum()
            (loss / len(trees)).backward()
            E = self.model.params["E"]
            if E.grad is not None and E.grad.is_sparse:
                E.grad = E.grad.coalesce()  # repeated words: one row each, for the norm
            if self.args.clip > 0:
                clip_global_norm_(self.params, self.args.clip)
            for opt in self.optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            total += loss.item()  # waits for the device, as edbatch reads each mini-batch's loss
        return total / len(order)

    @torch.no_grad()
    def evaluate(self, plans):
        """(loss per tree, root correct, roots, node correct, nodes) over precomputed plans."""
        loss, root_ok, roots, node_ok, nodes = 0.0, 0, 0, 0, 0
        for trees, plan, root_rows in plans:
            h, labels, inst = self.model.batched_losses(trees, plan, states=True)
            logp = torch.log_softmax(torch.mm(h, self.model.W_outT), 1)
            loss += -logp.gather(1, labels.unsqueeze(1)).sum().item()
            right = logp.argmax(1) == labels
            node_ok += int(right.sum())
            nodes += labels.numel()
            root_ok += int(right.index_select(0, root_rows).sum())
            roots += len(trees)
        return loss / max(roots, 1), root_ok, roots, node_ok, nodes


def clip_global_norm_(params, max_norm):
    """clip_grad_norm_'s arithmetic (the norm plus 1e-6, a scale of at most 1) for dense and
    coalesced sparse gradients alike: torch 2's clip_grad_norm_ takes the _foreach path, which
    has no sparse kernels."""
    grads = [p.grad._values() if p.grad.is_sparse else p.grad
             for p in params if p.grad is not None]
    norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)
    return norm


def dev_plans(trees, batch, device):
    plans = []
    for b in range(0, len(trees), batch):
        chunk = trees[b:b + batch]
        plan = TreeLstm.plan(chunk)
        packed, counts = plan
        n, n0 = sum(counts), counts[0]
        inst = packed[3 * n - n0:]  # rows in level order; an instance's root is its last row
        last = torch.zeros(len(chunk), dtype=torch.int64)
        last[inst] = torch.arange(n)  # CPU index_put: the last write wins (rows ascend)
        plans.append((chunk, plan, last.to(device)))
    return plans


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="SST training trees (train.txt)")
    ap.add_argument("--dev", required=True, help="SST dev trees (dev.txt)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of torch (cpu: 1)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--clip", type=float, default=5.0, help="global gradient norm (0: none)")
    ap.add_argument("--target", type=float, default=0.45, help="dev root accuracy to time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N trees only")
    ap.add_argument("--dev-limit", type=int, default=0, help="evaluate the first N dev trees")
    ap.add_argument("--dense-embedding", action="store_true",
                    help="dense Adam on the whole table (every row moves every step)")
    ap.add_argument("--weights", help="initial weights from `edbatch run --save-weights` "
                    "(tree_lstm, --vocab-size 0, the same files)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    words = {}
    train = read_trees(args.train, vocab=0, words=words)
    dev = read_trees(args.dev, vocab=0, words=words)
    if args.limit:
        train = train[:args.limit]
    if args.dev_limit:
        dev = dev[:args.dev_limit]
    trainer = Trainer(args, train, len(words))
    plans = dev_plans(dev, args.batch, trainer.device)
    config = {"bench": "torch_sst", "device": args.device, "threads": args.threads,
              "torch": torch.__version__, "train_trees": len(train), "dev_trees": len(dev),
              "vocab": len(words), "hidden": args.hidden, "batch": args.batch, "lr": args.lr,
              "clip": args.clip, "embedding": "dense" if args.dense_embedding else "sparse",
              "weights": args.weights or "glorot"}
    if trainer.device.type == "cuda":
        config["gpu"] = torch.cuda.get_device_name(trainer.device)
    rng = random.Random(args.seed)
    dev_loss, root_ok, roots, node_ok, nodes = trainer.evaluate(plans)
    print(json.dumps({**config, "epoch": 0, "dev_loss_per_tree": dev_loss,
                      "root_accuracy": root_ok / roots, "node_accuracy": node_ok / nodes}),
          flush=True)
    train_wall, epoch_s, reached, best = 0.0, [], None, (-1.0, 0)
    for epoch in range(1, args.epochs + 1):
        trainer.sync()
        t0 = time.perf_counter()
        train_loss = trainer.epoch(rng)
        trainer.sync()
        seconds = time.perf_counter() - t0
        train_wall += seconds
        epoch_s.append(seconds)
        t1 = time.perf_counter()
        dev_loss, root_ok, roots, node_ok, nodes = trainer.evaluate(plans)
        eval_s = time.perf_counter() - t1
        acc = root_ok / roots
        if acc > best[0]:
            best = (acc, epoch)
        if reached is None and acc >= args.target:
            reached = (epoch, train_wall)
        print(json.dumps({**config, "epoch": epoch, "train_s": seconds,
                          "trees_per_s": len(train) / seconds, "train_wall_s": train_wall,
                          "eval_s": eval_s, "mean_loss_per_tree": train_loss,
                          "dev_loss_per_tree": dev_loss, "root_accuracy": acc,
                          "root_correct": root_ok, "node_accuracy": node_ok / nodes}), flush=True)
    print(json.dumps({**config, "summary": True, "epochs": args.epochs,
                      "epoch_s": spread(sorted(epoch_s)), "target": args.target,
                      "best_root_accuracy": best[0], "best_epoch": best[1],
                      "target_epoch": reached[0] if reached else None,
                      "time_to_target_s": reached[1] if reached else None}), flush=True)


if __name__ == "__main__":
    main()
