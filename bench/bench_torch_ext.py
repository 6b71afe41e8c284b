#!/usr/bin/env python3
"""Training step time (forward + backward + SGD update) of Tree-LSTM and Lattice-LSTM through the
edbatch PyTorch extension vs the node-by-node and the hand-batched (by dependency level) PyTorch
implementations of bench/torch_models.py, on the same synthetic mini-batches and weights.

The implementations run round-robin (one step each per repetition) so machine noise hits them
alike; per implementation: median, p10 and p90 over the repetitions, ratios to edbatch from the
same run. One JSON line per result on stdout, a table on stderr. Structure packing (ours) and
level plans (hand-batched) are made once per mini-batch, outside the timed step. edbatch runs
twice: plain (graph build, scheduling and planning inside the step) and edbatch-prefetch, whose
step starts edbatch.prepare on the next mini-batch first (that host work then overlaps the step,
on a worker thread), as edbatch.prefetch does in a training loop: an untimed step before each
timed one starts its preparation, and an untimed step after it takes the one it started, so the
preparation overlaps exactly one step, as in a loop, and no plain step finds one. edbatch-loss and
edbatch-loss-prefetch run the same steps with the loss head inside the engine (the modules'
classes= option and loss()), where the others compute it in PyTorch from the returned states.
edbatch-step and edbatch-step-prefetch run the whole step in one engine call with no autograd
graph (loss_step(packed, lr=...): the loss, its backward and the SGD update of every parameter,
the embeddings' rows included); edbatch-step-prefetch2 prepares two mini-batches ahead
(edbatch.prefetch's depth=2, with two untimed lead-in and drain steps), for mini-batches whose
preparation takes longer than a step.

Before timing, the implementations' losses on the first mini-batch (before any update) are
compared: they compute one model from the same weights, so a difference beyond --loss-rtol
(relative to the loss's magnitude) stops the benchmark with exit status 1. Each JSON line has
"mode": "train" and "train": true (report.py draws them as training steps); a loss that is not
finite is written as null.

Both implementations update their parameters with the same code (torch_models.sgd_update: one
multi-tensor add over the parameters with gradients, p -= lr * grad; --lr, default 1e-3).
Gradients (--grads): both implementations either drop them after the update ("drop": PyTorch's
zero_grad(set_to_none=True) default, so autograd hands over fresh gradient tensors) or zero them
in place ("zero": buffers reused, and backward adds into them). The default is "drop" on CUDA,
where the caching allocator reuses the memory, and "zero" on the CPU, where fresh gradient
buffers would be touched page by page again every step.

    /usr/bin/python3 bench/bench_torch_ext.py [--hidden 128 --batch 32 --reps 9 --device cpu]
"""
import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import torch_models  # noqa: E402
from torch_baseline import HelpFormatter, count, json_line  # noqa: E402
import torch_baseline  # noqa: E402

try:
    import edbatch
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    for build in ("build", "build-torch"):
        lib = os.path.join(ROOT, build, "libedbatch_torch.so")
        if "EDBATCH_LIBRARY" not in os.environ and os.path.exists(lib):
            os.environ["EDBATCH_LIBRARY"] = lib
    import edbatch
from edbatch.packing import synthetic_lattices, synthetic_sst  # noqa: E402


MODELS = ("tree_lstm", "lattice_lstm")


def quantile(xs, q):
    """The q-quantile of xs, interpolated as `edbatch run --json` (torch_baseline.quantile)."""
    return torch_baseline.quantile(sorted(xs), q)


def model_list(choices):
    """An argparse type: a comma-separated list of names from choices, else a usage error."""
    def parse(text):
        names = text.split(",")
        bad = [n for n in names if n not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown model(s) {', '.join(map(repr, bad))} "
                                             f"(expected a comma-separated list of "
                                             f"{', '.join(choices)})")
        return names
    parse.__name__ = "models"
    return parse


def check_first_losses(name, losses, rtol):
    """Stops (exit status 1) when the implementations' losses on one mini-batch, {impl: loss},
    differ by more than rtol times their magnitude (at least 1), or one is not finite: they
    compute one model from the same weights. Else prints them on stderr."""
    text = ", ".join(f"{k} {v:.6g}" for k, v in losses.items())
    scale = max([1.0] + [abs(v) for v in losses.values() if math.isfinite(v)])
    spread = max(losses.values()) - min(losses.values())
    if not all(math.isfinite(v) for v in losses.values()) or not spread <= rtol * scale:
        raise SystemExit(f"{name}: the first mini-batch's losses differ beyond --loss-rtol "
                         f"{rtol:g} x {scale:.6g} ({text}): the implementations do not compute "
                         "the same model")
    print(f"{name}: first mini-batch loss {text} (equal within --loss-rtol {rtol:g})",
          file=sys.stderr)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---- data and weights shared by every implementation ----

class Prefetching:
    """A training step on mini-batch i that first starts module.prepare on mini-batch i + depth,
    as edbatch.prefetch(..., depth=depth) does in a training loop. Run it as a loop does:
    lead_in() before a block of timed steps, drain() after it."""

    def __init__(self, module, step, packs, depth=1):
        self.module, self.step, self.packs, self.depth = module, step, packs, depth

    def __call__(self, i, prepare=True):
        i %= len(self.packs)
        if prepare:
            self.module.prepare(self.packs[(i + self.depth) % len(self.packs)])
        return self.step(i)


def lead_in(step, first, run):
    """Untimed steps first - depth .. first - 1 of a Prefetching step (run(step, i, prepare)
    runs one), which start the preparations of timed steps first, first + 1, ...: each timed
    step's mini-batch is then prepared exactly `depth` steps before it, as in a training loop
    (never during other implementations' steps)."""
    for i in range(first - getattr(step, "depth", 0), first):
        run(step, i, True)


def drain(step, end, run):
    """Untimed steps end .. end + depth - 1 of a Prefetching step, preparing nothing: they take
    the preparations the timed steps left, so that no other implementation of the same module
    finds one."""
    for i in range(end, end + getattr(step, "depth", 0)):
        run(step, i, False)


def tree_data(args, tmp):
    lines = synthetic_sst(args.batch * args.batches, vocab_size=args.vocab, seed=args.seed)
    path = os.path.join(tmp, "trees.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    vocab = {}
    packs = [edbatch.pack_sst(lines[i:i + args.batch], vocab)
             for i in range(0, len(lines), args.batch)]
    trees = torch_models.read_trees(path, vocab=0)  # ids by first appearance, as pack_sst
    groups = [trees[i:i + args.batch] for i in range(0, len(trees), args.batch)]
    return packs, groups, len(vocab)


def lattice_data(args, tmp):
    records = synthetic_lattices(args.batch * args.batches, vocab_size=args.vocab,
                                 seed=args.seed)
    path = os.path.join(tmp, "lattices.txt")
    with open(path, "w") as f:
        f.write(f"{len(records)}\n")
        for r in records:
            f.write(f"{len(r['tags'])}\n{' '.join(map(str, r['tags']))}\n")
            for arcs in r["arcs"]:
                f.write(" ".join([str(len(arcs))] + [f"{j} {i}" for j, i in arcs]) + "\n")
    packs = [edbatch.pack_lattices(records[i:i + args.batch])
             for i in range(0, len(records), args.batch)]
    lats = torch_models.read_lattices(path, vocab=0)
    groups = [lats[i:i + args.batch] for i in range(0, len(lats), args.batch)]
    return packs, groups, args.vocab


def zoo_weights(model, vocab, H, classes, seed):
    """Weights under the zoo's names (what torch_models reads)."""
    g = torch.Generator().manual_seed(seed)
    scale = 1.0 / H ** 0.5
    rnd = lambda *s: (torch.rand(*s, generator=g) * 2 - 1) * scale  # noqa: E731
    w = {"W_out": rnd(classes, H)}
    if model == "tree_lstm":
        w["E"] = rnd(vocab, H)
        for name, shape in edbatch.weight_shapes("tree_lstm", H, H):
            w[name] = rnd(*shape)
    else:
        for t in ("char", "word"):
            w[f"{t}.E"] = rnd(vocab, H)
        for name, shape in edbatch.weight_shapes("lattice_lstm", H, H, 1, 2):
            w[name.replace("char_", "char.").replace("word_", "word.")] = rnd(*shape)
    return w


class Ours:
    """The extension's module with the zoo's loss head: sum over nodes of -log softmax, in PyTorch
    (step) or inside the engine (step_in_engine: a second module sharing every parameter, made
    with classes=, whose head weight is W_out and whose bias stays zero)."""

    def __init__(self, model, w, vocab, H, device, threads, drop_grads, lr=1e-3):
        classes = w["W_out"].shape[0]
        Module = edbatch.nn.TreeLSTM if model == "tree_lstm" else edbatch.nn.LatticeLSTM
        self.m = Module(vocab, H, H, threads=threads)
        self.mh = Module(vocab, H, H, threads=threads, classes=classes)
        tables = [w["E"]] if model == "tree_lstm" else [w["char.E"], w["word.E"]]
        with torch.no_grad():
            for emb, table in zip(self.m.embeddings, tables):
                emb.weight.copy_(table)
            for name in self.m.cell.weight_names:
                key = name.replace("char_", "char.").replace("word_", "word.")
                getattr(self.m.cell, name).copy_(w[key])
        self.W_out = torch.nn.Parameter(w["W_out"].clone())
        self.m.to(device)
        self.W_out.data = self.W_out.data.to(device)
        self.mh.embeddings = self.m.embeddings
        for name in self.m.cell.weight_names:
            setattr(self.mh.cell, name, getattr(self.m.cell, name))
        self.mh.head.weight = self.W_out
        self.mh.head.bias = torch.nn.Parameter(torch.zeros(classes, device=device),
                                               requires_grad=False)
        self.params = list(self.m.parameters()) + [self.W_out]
        self.drop_grads, self.lr = drop_grads, lr

    def loss(self, packed):
        h = self.m(packed)[0]
        return torch.nn.functional.cross_entropy(h @ self.W_out.t(), packed.labels,
                                                 reduction="sum")

    def update(self):
        """The same SGD update as the PyTorch models' (torch_models.sgd_update)."""
        torch_models.sgd_update(self.params, self.lr, self.drop_grads)

    def step(self, packed):
        loss = self.loss(packed)
        loss.backward()
        self.update()
        return loss

    def step_in_engine(self, packed):
        loss = self.mh.loss(packed)
        loss.backward()
        self.update()
        return loss

    def whole_step_in_engine(self, packed):
        """The loss, its backward and the same SGD update in one engine call (loss_step)."""
        return self.mh.loss_step(packed, lr=self.lr)


def profile(ours, packs, device, n, model):
    """Where an edbatch training step's time goes: each phase waited for, then torch.profiler."""
    phases = {"forward": [], "loss": [], "backward": [], "optimizer": []}
    for i in range(n):
        p = packs[i % len(packs)]
        sync(device)
        t0 = time.perf_counter()
        h = ours.m(p)[0]
        sync(device)
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(h @ ours.W_out.t(), p.labels, reduction="sum")
        sync(device)
        t2 = time.perf_counter()
        loss.backward()
        sync(device)
        t3 = time.perf_counter()
        ours.update()
        sync(device)
        t4 = time.perf_counter()
        for name, a, b in (("forward", t0, t1), ("loss", t1, t2), ("backward", t2, t3),
                           ("optimizer", t3, t4)):
            phases[name].append((b - a) * 1e3)
    print(f"{model}: edbatch step by phase, median ms over {n}: " +
          ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items()), file=sys.stderr)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(n):
            ours.step(packs[i % len(packs)])
        sync(device)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)


def add_shared_flags(ap, models):
    """The flags this benchmark shares with bench_user_cells.py: models, sizes, repetitions."""
    ap.add_argument("--models", type=model_list(models), default=",".join(models),
                    help=f"comma-separated, of {', '.join(models)}")
    ap.add_argument("--hidden", type=count(), default=128, help="hidden size")
    ap.add_argument("--batch", type=count(), default=32, help="instances per mini-batch")
    ap.add_argument("--batches", type=count(), default=3, help="distinct mini-batches, cycled")
    ap.add_argument("--reps", type=count(), default=9, help="timed repetitions")
    ap.add_argument("--eager-reps", type=count(0), default=3,
                    help="timed node-by-node repetitions (0: node by node is not timed)")


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter)
    add_shared_flags(ap, MODELS)
    ap.add_argument("--warmup", type=count(0), default=3,
                    help="untimed repetitions first: prefetching holds a prepared runner while "
                         "another runs, so its second runner (an engine with, on a GPU, its own "
                         "stream and arenas) is made in the second repetition")
    ap.add_argument("--vocab", type=count(), default=2000, help="vocabulary of the synthetic data")
    ap.add_argument("--threads", type=count(0), default=0, help="edbatch threads (0: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    ap.add_argument("--grads", choices=("drop", "zero"), default=None,
                    help="after each update, drop the gradients (set to None) or zero them in "
                         "place; both implementations alike (default: drop on cuda, zero on cpu)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the synthetic data and weights")
    ap.add_argument("--loss-rtol", type=float, default=1e-4,
                    help="how far apart (relative to the loss) the implementations' losses on the "
                         "first mini-batch may be")
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="SGD learning rate of every implementation (larger rates can make the "
                         "summed loss diverge, and saturated cells' denormal floats then slow the "
                         "CPU steps of both sides several-fold)")
    ap.add_argument("--plan-cache", type=float, default=0, metavar="MB",
                    help="edbatch's plan cache budget (edbatch.set_plan_cache). Default 0: the "
                         "few mini-batches cycled here would otherwise run on reused plans from "
                         "their third step, as no reshuffled training data does")
    ap.add_argument("--profile", type=count(0), default=0, metavar="N",
                    help="after timing, N edbatch steps phase by phase (forward, loss, backward, "
                         "optimizer; each waited for) and under torch.profiler, on stderr")
    return ap


def check_rates(ap, args):
    """Usage errors for --plan-cache and --loss-rtol below 0 (or NaN)."""
    for flag in ("plan_cache", "loss_rtol"):
        if not getattr(args, flag) >= 0:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected a number >= 0")


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    check_rates(ap, args)
    edbatch.set_plan_cache(args.plan_cache)
    device = torch.device(args.device)
    drop_grads = (args.grads or ("drop" if device.type == "cuda" else "zero")) == "drop"
    H = args.hidden
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            packs, groups, vocab = (tree_data if model == "tree_lstm" else lattice_data)(args, tmp)
            classes = 5 if model == "tree_lstm" else 18
            w = zoo_weights(model, vocab, H, classes, args.seed)
            ours = Ours(model, w, vocab, H, device, args.threads, drop_grads, args.lr)
            Ref = torch_models.TreeLstm if model == "tree_lstm" else torch_models.LatticeLstm
            ref = Ref(w, device=device, requires_grad=True)
            plans = [Ref.plan(g) for g in groups]
            packs = [p.to(device) for p in packs]

            def ref_step(fn):
                loss = fn().sum()
                loss.backward()
                ref.sgd_step(args.lr, drop_grads)
                return loss

            def prefetched(module, step, depth=1):
                # The host work (edbatch.prepare) of the mini-batch `depth` steps later overlaps
                # this step, as edbatch.prefetch(..., depth=depth) does in a training loop.
                return Prefetching(module, lambda i: step(packs[i]), packs, depth)

            def run(step, i, prepare):
                if isinstance(step, Prefetching):
                    return step(i, prepare)
                return step(i)

            # A prefetching step's timed step takes the mini-batch its untimed lead-in step
            # prepared, and its untimed drain step takes what the timed one prepared, so no
            # plain step finds one prepared. The -loss steps run the loss head inside the engine
            # (Ours.mh), the -step ones the whole step.
            impls = {
                "edbatch-prefetch": prefetched(ours.m, ours.step),
                "edbatch": lambda i: ours.step(packs[i]),
                "edbatch-loss-prefetch": prefetched(ours.mh, ours.step_in_engine),
                "edbatch-step-prefetch": prefetched(ours.mh, ours.whole_step_in_engine),
                "edbatch-step-prefetch2": prefetched(ours.mh, ours.whole_step_in_engine, 2),
                "edbatch-loss": lambda i: ours.step_in_engine(packs[i]),
                "edbatch-step": lambda i: ours.whole_step_in_engine(packs[i]),
                "hand-batched": lambda i: ref_step(lambda: ref.batched_losses(groups[i], plans[i])),
                "node-by-node": lambda i: ref_step(lambda: ref.eager_losses(groups[i])),
            }
            # The same loss before any update: the three compute the same model.
            with torch.no_grad():
                check = {"edbatch": ours.loss(packs[0]).item(),
                         "edbatch-loss": ours.mh.loss(packs[0]).item(),
                         "hand-batched": ref.batched_losses(groups[0], plans[0]).sum().item(),
                         "node-by-node": ref.eager_losses(groups[0]).sum().item()}
            check_first_losses(model, check, args.loss_rtol)
            times = {name: [] for name in impls}
            last = {}  # each implementation's loss at its last step: a diverging run shows there
            for rep in range(args.warmup + args.reps):
                for name, step in impls.items():
                    if name == "node-by-node" and rep >= args.warmup + args.eager_reps:
                        continue
                    i = rep % len(packs)
                    lead_in(step, i, run)
                    sync(device)
                    t0 = time.perf_counter()
                    loss = step(i).detach()
                    sync(device)
                    if rep >= args.warmup:
                        times[name].append((time.perf_counter() - t0) * 1e3)
                    last[name] = loss
                    drain(step, i + 1, run)
            if args.profile:
                profile(ours, packs, device, args.profile, model)
            nodes = statistics.mean(p.num_nodes for p in packs)
            base = statistics.median(times["edbatch"])
            base_prefetch = statistics.median(times["edbatch-prefetch"])
            for name, ts in times.items():
                if not ts:  # not timed (--eager-reps 0 for node by node)
                    continue
                med = statistics.median(ts)
                # Each time is a training step: forward, backward and the SGD update.
                row = {"bench": "torch_ext", "model": model, "impl": name, "mode": "train",
                       "train": True, "device": args.device,
                       "batch": args.batch, "hidden": H, "nodes": round(nodes, 1),
                       "threads": args.threads or torch.get_num_threads(), "reps": len(ts),
                       "grads": "drop" if drop_grads else "zero",
                       "median_ms": round(med, 3), "p10_ms": round(quantile(ts, 0.1), 3),
                       "p90_ms": round(quantile(ts, 0.9), 3),
                       "ratio_to_edbatch": round(med / base, 2),
                       "ratio_to_edbatch_prefetch": round(med / base_prefetch, 2),
                       "last_loss": round(float(last[name]), 4), "lr": args.lr}
                rows.append(row)
                print(json_line(row), flush=True)
    print(f"\n{'model':<13} {'impl':<22} {'median ms':>10} {'p10':>9} {'p90':>9} {'x edbatch':>9} "
          f"{'x prefetch':>10}", file=sys.stderr)
    for r in rows:
        print(f"{r['model']:<13} {r['impl']:<22} {r['median_ms']:>10.2f} {r['p10_ms']:>9.2f} "
              f"{r['p90_ms']:>9.2f} {r['ratio_to_edbatch']:>9.2f} "
              f"{r['ratio_to_edbatch_prefetch']:>10.2f}", file=sys.stderr)
    # Every preparation taken by the step it was made for: none dropped, none left waiting.
    print(f"preparations: {edbatch.prepare_stats()}", file=sys.stderr)


if __name__ == "__main__":
    main()
