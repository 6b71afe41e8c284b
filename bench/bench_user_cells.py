#!/usr/bin/env python3
"""Training step time (forward, backward, SGD update) of user cells run by edbatch.nn.Propagate,
against the same model in plain PyTorch, node by node and hand-batched by level, on the same
mini-batches and weights (bench/user_cell_models.py):

- childsum: a Child-Sum Tree-LSTM over SST-format trees of any arity (synthetic, or --trees FILE);
- lattice: a lattice LSTM with the built-in lattice_lstm's math written as user cells, next to
  the built-in cell (edbatch.nn.LatticeLSTM) and bench/torch_models.LatticeLstm.

The user cells run twice: edbatch (graph build, scheduling and planning inside the step) and
edbatch-prefetch (the next mini-batch prepared on a worker thread during the step, as
edbatch.prefetch does; the hand-batched implementation likewise plans its levels outside the step).
For childsum, edbatch-loss and edbatch-loss-prefetch run the model's loss head inside the engine
(Propagate's classes= and loss()) instead of in PyTorch, and edbatch-step and
edbatch-step-prefetch the loss, its backward and the cells' and head's SGD update in one engine
call (Propagate.loss_step(..., lr=...)); the embedding, outside the cells, gets its gradient
through autograd and the same update as everywhere. For lattice, edbatch-step and
edbatch-step-prefetch do the same with the built-in module's output layer as the loss head.
edbatch-step-ids(-prefetch) run the same cells embedding their ids inside (Child-Sum: a node
without a word embeds zeros; lattice: each arc kind's table in its arc cell), so the tables'
update happens in the engine call as well and the step has no autograd at all;
edbatch-step-ids-prefetch2 prepares two mini-batches ahead (edbatch.prefetch's depth=2: two
workers prepare side by side, for mini-batches whose preparation takes longer than a step).

The implementations run round-robin, one step each per repetition (--steps-per-sync N: N
steps, then a wait for the device), so machine noise hits them alike; each row gives the median,
p10 and p90 over the repetitions and the ratio of its median to edbatch's (user cells) from the
same run. A prefetching implementation's timed steps come after `depth` untimed steps that start
their preparations and before `depth` that take the last ones, so each timed step's mini-batch was
prepared exactly `depth` steps earlier, as in a training loop, and no other implementation finds
a preparation. Plans (packing, level schedules) are made once per mini-batch outside the timed
step.
Every implementation updates with torch_models.sgd_update.
Before timing, the first mini-batch's loss is compared across implementations: a difference
beyond --loss-rtol (relative to the loss's magnitude) stops the benchmark with exit status 1.
Each JSON line has "mode": "train" and "train": true (report.py draws them as training steps);
a loss that is not finite is written as null.

    /usr/bin/python3 bench/bench_user_cells.py [--models childsum,lattice --batch 32 --hidden 128
                                                --device cpu --reps 9]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_torch_ext as ext  # noqa: E402  (finds and loads edbatch)
import torch_models  # noqa: E402
import user_cell_models as ucm  # noqa: E402
from torch_baseline import HelpFormatter, count, json_line  # noqa: E402

edbatch = ext.edbatch
MODELS = ("childsum", "lattice")


def prefetched(prop, loss_of, packs, depth=1):
    """The user cells' step with the host work (Propagate.prepare) of the mini-batch `depth`
    steps later started first, overlapping this step, as edbatch.prefetch(..., depth=depth) does
    in a training loop (timed as a loop runs it: see bench_torch_ext.lead_in)."""
    return ext.Prefetching(prop, loss_of, packs, depth)


class Whole:
    """An implementation whose step does its own backward and update; `loss_of` gives its loss
    for the check before timing."""

    def __init__(self, step, loss_of):
        self.step, self.loss_of = step, loss_of
        self.depth = getattr(step, "depth", 0)

    def __call__(self, i):
        return self.loss_of(i)


def childsum_impls(args, device, drop_grads):
    if args.trees:
        with open(args.trees) as f:
            lines = [line for line in f if line.strip()][:args.batch * args.batches]
    else:
        lines = ext.synthetic_sst(args.batch * args.batches, vocab_size=args.vocab,
                                  seed=args.seed)
    vocab, parsed = {}, []
    for line in lines:
        parsed.append(edbatch.parse_sst(line, vocab))
    packs = [edbatch.pack_trees([t for t, _ in parsed[i:i + args.batch]],
                                [lab for _, lab in parsed[i:i + args.batch]],
                                edge_inputs="parent")
             for i in range(0, len(parsed), args.batch)]
    torch.manual_seed(args.seed)
    model = ucm.ChildSumModel(len(vocab), args.hidden).to(device)
    prop = ucm.child_sum_propagate(model, threads=args.threads)
    # The same cells with the model's loss head inside the engine (classes=, loss()).
    prop_loss = ucm.child_sum_propagate(model, threads=args.threads, classes=model.out)
    batched = ucm.ChildSumBatched(model, device)
    plans = [batched.plan(p) for p in packs]
    packs = [p.to(device) for p in packs]
    params = list(model.parameters())

    def ours(i):
        h, _ = prop(packs[i], x=model.embed(packs[i].input_ids))
        return model.head(h, packs[i].labels)

    def ours_loss(i):
        return prop_loss.loss(packs[i], x=model.embed(packs[i].input_ids))

    def ours_step(i):
        loss = prop_loss.loss_step(packs[i], x=model.embed(packs[i].input_ids), lr=args.lr)
        torch_models.sgd_update([model.embed.weight], args.lr, drop_grads)
        return loss

    # The same cells embedding their ids inside (rows -1 embed zeros): the embedding's update
    # too happens in the engine call, and the step has no autograd at all.
    prop_ids = ucm.child_sum_propagate(model, threads=args.threads, classes=model.out, ids=True)

    def ours_ids_loss(i):
        return prop_ids.loss(packs[i], ids=packs[i].input_ids)

    def ours_ids_step(i):
        return prop_ids.loss_step(packs[i], ids=packs[i].input_ids, lr=args.lr)

    losses = {"edbatch-prefetch": prefetched(prop, ours, packs), "edbatch": ours,
              # Each prefetching step is timed with its lead-in and drain steps around it
              # (time_model), so no other step of the same module finds a preparation.
              "edbatch-loss-prefetch": prefetched(prop_loss, ours_loss, packs),
              "edbatch-step-prefetch": Whole(prefetched(prop_loss, ours_step, packs), ours_loss),
              "edbatch-step-ids-prefetch2": Whole(prefetched(prop_ids, ours_ids_step, packs, 2),
                                                  ours_ids_loss),
              "edbatch-step-ids-prefetch": Whole(prefetched(prop_ids, ours_ids_step, packs),
                                                 ours_ids_loss),
              "edbatch-loss": ours_loss,
              "edbatch-step": Whole(ours_step, ours_loss),
              "edbatch-step-ids": Whole(ours_ids_step, ours_ids_loss),
              "hand-batched": lambda i: batched.loss(packs[i], plans[i]),
              "node-by-node": lambda i: ucm.child_sum_node_by_node(model, packs[i])}
    return losses, params, packs


def lattice_impls(args, device, drop_grads, tmp):
    packs, groups, vocab = ext.lattice_data(args, tmp)
    H = args.hidden
    w = ext.zoo_weights("lattice_lstm", vocab, H, 18, args.seed)
    builtin = ext.Ours("lattice_lstm", w, vocab, H, device, args.threads, drop_grads, args.lr)
    prop = ucm.lattice_user_cells(w, H, device, threads=args.threads)
    ref = torch_models.LatticeLstm(w, device=device, requires_grad=True)
    plans = [torch_models.LatticeLstm.plan(g) for g in groups]
    packs = [p.to(device) for p in packs]
    params = builtin.params + list(prop.parameters()) + list(ref.params.values())

    def user(i):
        h, _ = prop(packs[i], x=builtin.m.embed(packs[i]))
        return torch.nn.functional.cross_entropy(h @ builtin.W_out.t(), packs[i].labels,
                                                 reduction="sum")

    # The same cells with the loss head inside the engine (the built-in module's W_out).
    prop_loss = ucm.with_loss_head(prop, builtin.W_out)
    tables = [e.weight for e in builtin.m.embeddings]

    def user_loss(i):
        return prop_loss.loss(packs[i], x=builtin.m.embed(packs[i]))

    def user_step(i):
        loss = prop_loss.loss_step(packs[i], x=builtin.m.embed(packs[i]), lr=args.lr)
        torch_models.sgd_update(tables, args.lr, drop_grads)
        return loss

    # The arc cells embedding their ids (the char table for char arcs, the word table for
    # word arcs): the tables' update too happens in the engine call.
    prop_ids = ucm.with_loss_head(prop, builtin.W_out, tables=builtin.m.embeddings)

    def user_ids_loss(i):
        return prop_ids.loss(packs[i], ids=packs[i].input_ids)

    def user_ids_step(i):
        return prop_ids.loss_step(packs[i], ids=packs[i].input_ids, lr=args.lr)

    losses = {"edbatch-prefetch": prefetched(prop, user, packs), "edbatch": user,
              "edbatch-step-prefetch": Whole(prefetched(prop_loss, user_step, packs), user_loss),
              "edbatch-step-ids-prefetch2": Whole(prefetched(prop_ids, user_ids_step, packs, 2),
                                                  user_ids_loss),
              "edbatch-step-ids-prefetch": Whole(prefetched(prop_ids, user_ids_step, packs),
                                                 user_ids_loss),
              "edbatch-step": Whole(user_step, user_loss),
              "edbatch-step-ids": Whole(user_ids_step, user_ids_loss),
              "edbatch built-in cell": lambda i: builtin.loss(packs[i]),
              "hand-batched": lambda i: ref.batched_losses(groups[i], plans[i]).sum(),
              "node-by-node": lambda i: ref.eager_losses(groups[i]).sum()}
    return losses, params, packs


def time_model(name, losses, params, packs, args, device, drop_grads):
    def one_step(loss_of, i, prepare=True):
        """One training step of mini-batch i; the loss, detached."""
        if isinstance(loss_of, Whole):
            loss = (loss_of.step(i, prepare) if loss_of.depth else loss_of.step(i))
        else:
            loss = loss_of(i, prepare) if isinstance(loss_of, ext.Prefetching) else loss_of(i)
            loss.backward()
            torch_models.sgd_update([p for p in params if p.grad is not None], args.lr,
                                    drop_grads)
        # Its autograd graph goes within its own step: kept, the next implementation's step
        # would free it (60-80 ms for node by node's at B = 128).
        return loss.detach()

    with torch.no_grad():  # no preparation left behind
        check = {k: (f.step(0) if isinstance(f, ext.Prefetching) else f(0)).item()
                 for k, f in losses.items()}
    ext.check_first_losses(name, check, args.loss_rtol)
    times = {k: [] for k in losses}
    last = {}  # each implementation's loss at its last step: a diverging run shows there
    for rep in range(args.warmup + args.reps):
        for impl, loss_of in losses.items():
            if impl == "node-by-node" and rep >= args.warmup + args.eager_reps:
                continue
            first = rep * args.steps_per_sync
            ext.lead_in(loss_of, first, one_step)
            ext.sync(device)
            t0 = time.perf_counter()
            for i in range(first, first + args.steps_per_sync):
                value = one_step(loss_of, i % len(packs))
            ext.sync(device)
            if rep >= args.warmup:
                times[impl].append((time.perf_counter() - t0) * 1e3 / args.steps_per_sync)
            last[impl] = value
            ext.drain(loss_of, first + args.steps_per_sync, one_step)
    base = statistics.median(times["edbatch"])
    base_prefetch = statistics.median(times["edbatch-prefetch"])
    nodes = statistics.mean(p.num_nodes for p in packs)
    rows = []
    for impl, ts in times.items():
        if not ts:  # not timed (--eager-reps 0 for node by node)
            continue
        med = statistics.median(ts)
        # Each time is a training step: forward, backward and the SGD update.
        row = {"bench": "user_cells", "model": name, "impl": impl, "mode": "train",
               "train": True, "device": args.device,
               "batch": args.batch, "hidden": args.hidden, "nodes": round(nodes, 1),
               "threads": args.threads or torch.get_num_threads(), "reps": len(ts),
               "median_ms": round(med, 3), "p10_ms": round(ext.quantile(ts, 0.1), 3),
               "p90_ms": round(ext.quantile(ts, 0.9), 3), "ratio_to_edbatch": round(med / base, 2),
               "ratio_to_edbatch_prefetch": round(med / base_prefetch, 2),
               "first_loss": round(check[impl], 4), "last_loss": round(float(last[impl]), 4),
               "lr": args.lr, "steps_per_sync": args.steps_per_sync}
        rows.append(row)
        print(json_line(row), flush=True)
    return rows


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].rstrip(":") + ".",
                                 formatter_class=HelpFormatter)
    ext.add_shared_flags(ap, MODELS)
    ap.add_argument("--steps-per-sync", type=count(), default=1, metavar="N",
                    help="consecutive steps of one implementation between two waits for the "
                         "device, timed together (a repetition's time is theirs over N): 1 times "
                         "each step to its end, as a loop reading the loss every step; more "
                         "measures a loop's throughput, where the host queues a step while the "
                         "device still runs the one before")
    ap.add_argument("--warmup", type=count(0), default=3,
                    help="untimed repetitions first: prefetching holds a prepared runner while "
                         "another runs, so its second runner (an engine with, on a GPU, its own "
                         "stream and arenas) is made in the second repetition")
    ap.add_argument("--vocab", type=count(), default=2000, help="vocabulary of the synthetic data")
    ap.add_argument("--trees", default="", help="SST-format file for childsum (default synthetic)")
    ap.add_argument("--threads", type=count(0), default=0, help="edbatch threads (0: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the data and weights")
    ap.add_argument("--loss-rtol", type=float, default=1e-4,
                    help="how far apart (relative to the loss) the implementations' losses on the "
                         "first mini-batch may be")
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="SGD learning rate of every implementation (0.01 made the summed loss "
                         "of B = 128 diverge, and the saturated cells' denormal floats then slowed "
                         "the CPU steps of both sides several-fold)")
    ap.add_argument("--plan-cache", type=float, default=0, metavar="MB",
                    help="edbatch's plan cache budget (0: see bench_torch_ext.py)")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    ext.check_rates(ap, args)
    if args.trees and not os.path.isfile(args.trees):
        ap.error(f"--trees {args.trees}: no such file")
    edbatch.set_plan_cache(args.plan_cache)
    device = torch.device(args.device)
    drop_grads = device.type == "cuda"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            if name == "childsum":
                losses, params, packs = childsum_impls(args, device, drop_grads)
            else:
                losses, params, packs = lattice_impls(args, device, drop_grads, tmp)
            rows += time_model(name, losses, params, packs, args, device, drop_grads)
    print(f"\n{'model':<9} {'impl':<27} {'median ms':>10} {'p10':>9} {'p90':>9} {'x edbatch':>9} "
          f"{'x prefetch':>10}", file=sys.stderr)
    for r in rows:
        print(f"{r['model']:<9} {r['impl']:<27} {r['median_ms']:>10.2f} {r['p10_ms']:>9.2f} "
              f"{r['p90_ms']:>9.2f} {r['ratio_to_edbatch']:>9.2f} "
              f"{r['ratio_to_edbatch_prefetch']:>10.2f}", file=sys.stderr)
    # Every preparation taken by the step it was made for: none dropped, none left waiting.
    print(f"preparations: {edbatch.prepare_stats()}", file=sys.stderr)


if __name__ == "__main__":
    main()
