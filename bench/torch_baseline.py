#!/usr/bin/env python3
"""PyTorch baseline for edbatch: tree_lstm and lattice_lstm, node-by-node eager and hand-batched
by dependency level, on an edbatch data file with the weights edbatch saved.

  torch_baseline.py --model tree_lstm --data trees.txt --weights w.safetensors \\
      [--check-against outputs.jsonl] [--impl both] [--train] [--device cuda]

Prints one JSON line per result on stdout (field names as in `edbatch run --json` where they
overlap: instances_per_s, ms_per_minibatch {median, p10, p90, mean}, ...) and a short summary on
stderr. --check-against compares per-instance losses with `edbatch run --outputs` and exits 1 on
a mismatch beyond float32 tolerance. A loss that is not finite (a diverged training run) stops
the run with an error that names its mini-batch, as `edbatch run` does.

The helpers quantile, count, json_line and HelpFormatter are shared with the other Python
benchmarks (bench_torch_ext.py, bench_user_cells.py, torch_nmt.py).
"""

import argparse
import ctypes
import json
import math
import os
import resource
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def quantile(sorted_values, q):
    """Linear interpolation between the closest ranks, as `edbatch run --json` and the C++
    benchmarks (numpy's default percentile, statistics.quantiles(method="inclusive")): never
    outside the values, and the median of an even count is the mean of the middle two."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def count(minimum=1):
    """An argparse type: an integer >= minimum (1: a positive count), else a usage error."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < minimum:
            raise argparse.ArgumentTypeError(
                f"expected {'a positive integer' if minimum == 1 else f'an integer >= {minimum}'}"
                f", not {text!r}")
        return n
    parse.__name__ = "count"
    return parse


def finite(x):
    """x with every float that is not finite (NaN, infinities) replaced by None: JSON has no
    token for them (json.dumps would write NaN or Infinity, which JSON readers refuse)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def json_line(record):
    """One JSON line of a result, non-finite numbers written as null (see finite)."""
    return json.dumps(finite(record), allow_nan=False)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default after its help, where it has one (not for switches and
    flags without a default)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == "":
            return action.help
        return super()._get_help_string(action)


def spread(values):
    v = sorted(values)
    return {"median": quantile(v, 0.5), "p10": quantile(v, 0.1), "p90": quantile(v, 0.9),
            "mean": sum(v) / len(v) if v else 0.0}


def blas_libraries():
    """The BLAS/LAPACK libraries mapped into this process (Linux), to say what torch ran on."""
    try:
        with open("/proc/self/maps") as f:
            libs = {ln.split()[-1] for ln in f if "blas" in ln or "mkl" in ln or "lapack" in ln}
        return sorted(os.path.realpath(p) for p in libs if p.startswith("/"))
    except OSError:
        return []


def keep_freed_memory():
    """Keeps freed blocks in this process (glibc): no mmap for blocks under 32 MiB and no trimming,
    so a mini-batch reuses the pages the previous one touched instead of faulting in fresh ones.
    PyTorch's CPU allocator is malloc; this is the reuse it allows. False where not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and
                    libc.mallopt(m_trim_threshold, 1 << 30) and libc.mallopt(m_top_pad, 64 << 20))
    except (OSError, AttributeError):
        return False


def saved_words(path):
    """{word: id} of the data a safetensors file's weights were trained on (its metadata
    "edbatch.words", which `edbatch run --save-weights` writes for files of words), or None."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    words = header.get("__metadata__", {}).get("edbatch.words")
    return None if words is None else {w: i for i, w in enumerate(json.loads(words))}


def read_data(args):
    """--data as the weights saw it: a file of words continues their vocabulary (the ids
    `edbatch run --load-weights` gives), else ids by first appearance."""
    reader = torch_models.MODELS[args.model][1]
    words = saved_words(args.weights)
    if words is not None and reader is torch_models.read_trees:
        return reader(args.data, args.vocab_size, words=words)
    return reader(args.data, args.vocab_size)


class Runner:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        cls = torch_models.MODELS[args.model][0]
        self.data = read_data(args)
        weights = torch_models.read_safetensors(args.weights)
        self.model = cls(weights, args.device, requires_grad=args.train)
        if self.model.H != args.hidden:
            raise SystemExit(f"torch_baseline: --hidden {args.hidden} but the weights have "
                             f"hidden size {self.model.H}")

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def minibatch(self, k):
        """The k-th mini-batch, cycling over the data set in order."""
        b, n = self.args.batch, len(self.data)
        per_epoch = (n + b - 1) // b
        k %= per_epoch
        return self.data[k * b:min(n, (k + 1) * b)]

    def losses(self, impl, batch):
        m = self.model
        if impl == "eager":
            return m.eager_losses(batch)
        return m.batched_losses(batch, m.plan(batch))

    def step(self, impl, batch, train):
        """One mini-batch: forward (and backward plus SGD update); its time in ms."""
        t0 = time.perf_counter()
        if train:
            total = self.losses(impl, batch).sum()
            loss = total.item()
            total.backward()
            self.model.sgd_step(self.args.lr / len(batch))
        else:
            with torch.no_grad():
                loss = self.losses(impl, batch).sum().item()
        self.sync()
        return (time.perf_counter() - t0) * 1e3, loss

    def finite_loss(self, impl, loss, where):
        """Stops at a loss that is not finite, as `edbatch run` does (a diverged run's times
        would be those of NaN arithmetic, and its results would not be JSON)."""
        if math.isfinite(loss):
            return
        if self.args.train:
            raise SystemExit(f"torch_baseline: torch_{impl}, {where}: the training loss is "
                             f"{loss}; training stopped (lower --lr)")
        raise SystemExit(f"torch_baseline: torch_{impl}, {where}: the loss is {loss}, not "
                         "finite; the run stopped (check the weights and data)")

    def measure(self, impl):
        a = self.args
        iters = a.iters if impl == "batched" else a.eager_iters
        for w in range(a.warmup):
            _, loss = self.step(impl, self.minibatch(w), a.train)
            self.finite_loss(impl, loss, f"warm-up mini-batch {w + 1}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        wall0 = time.perf_counter()
        ms, losses, instances, per_repeat = [], [], 0, []
        k = 0
        for _ in range(a.repeats):
            rep_ms = rep_inst = 0
            for _ in range(iters):
                batch = self.minibatch(k)
                k += 1
                t, loss = self.step(impl, batch, a.train)
                self.finite_loss(impl, loss, f"measured mini-batch {k} of {a.repeats * iters}")
                ms.append(t)
                losses.append(loss)
                rep_ms += t
                rep_inst += len(batch)
            instances += rep_inst
            per_repeat.append(rep_inst / (rep_ms / 1e3))
        total_ms = sum(ms)
        r = {
            "framework": "pytorch", "impl": "torch_" + impl, "torch_version": torch.__version__,
            "model": a.model, "data": a.data, "data_instances": len(self.data),
            "batch": a.batch, "hidden": a.hidden, "vocab": a.vocab_size,
            "device": a.device, "threads": a.threads, "train": a.train, "lr": a.lr,
            "warmup_minibatches": a.warmup, "minibatches": len(ms), "repeats": a.repeats,
            "instances": instances,
            "instances_per_s": instances / (total_ms / 1e3) if total_ms > 0 else 0.0,
            "instances_per_s_per_repeat": per_repeat,
            "ms_per_minibatch": spread(ms),
            "mean_loss_per_instance": sum(losses) / instances if instances else None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "wall_s": time.perf_counter() - wall0,
            "blas": blas_libraries(),
            "malloc_keep_freed": self.args.malloc_keep_freed,
            "thread_env": {k: v for k, v in os.environ.items()
                           if k.startswith(("OMP_", "GOMP_", "OPENBLAS_", "MKL_"))},
        }
        if self.device.type == "cuda":
            r["gpu"] = torch.cuda.get_device_name()
            r["cuda_max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
        return r

    def check(self, impl, path):
        """Per-instance losses of a forward pass over the data against edbatch's --outputs."""
        a = self.args
        ref = {}
        with open(path) as f:
            for line in f:
                if line.strip():
                    j = json.loads(line)
                    ref[j["instance"]] = j["loss"]
        n = len(self.data) if a.check_limit == 0 else min(a.check_limit, len(self.data))
        if impl == "eager" and a.check_limit == 0:
            n = min(n, a.eager_check_limit)
        if n == 0:
            raise SystemExit(f"torch_baseline: loss check for {impl}: no instances in {a.data} "
                             "to check")
        ours = []
        with torch.no_grad():
            for k in range(0, n, a.batch):
                batch = self.data[k:min(n, k + a.batch)]
                ours.extend(self.losses(impl, batch).double().cpu().tolist())
        bad, worst_abs, worst_rel = [], 0.0, 0.0
        for i, x in enumerate(ours):
            if i not in ref or ref[i] is None:
                bad.append((i, x, None))
                continue
            d = abs(x - ref[i])
            worst_abs = max(worst_abs, d)
            worst_rel = max(worst_rel, d / max(abs(ref[i]), 1e-30))
            if not d <= a.atol + a.rtol * abs(ref[i]):  # a NaN on either side fails too
                bad.append((i, x, ref[i]))
        result = {"check": "pass" if not bad else "FAIL", "impl": "torch_" + impl,
                  "model": a.model, "data": a.data, "device": a.device, "instances": n,
                  "max_abs_diff": worst_abs, "max_rel_diff": worst_rel,
                  "rtol": a.rtol, "atol": a.atol, "mismatches": len(bad)}
        print(json_line(result), flush=True)
        if bad:
            for i, x, y in bad[:10]:
                print(f"torch_baseline: MISMATCH {a.model} {impl} instance {i}: pytorch {x!r} "
                      f"edbatch {y!r}", file=sys.stderr)
            raise SystemExit(f"torch_baseline: loss check FAILED for {impl}: {len(bad)} of {n} "
                             f"instances differ from {path} beyond atol {a.atol} + rtol "
                             f"{a.rtol} x |loss|")
        print(f"loss check {a.model} {impl}: {n} instances within tolerance "
              f"(max abs diff {worst_abs:.3g}, max rel diff {worst_rel:.3g})", file=sys.stderr)


def check_train_step(args, impl, path):
    """One SGD step on the whole data set as one mini-batch (the sum of its losses, lr / size),
    from --weights; the result must equal the weights `edbatch run --train --clip 0 --iters 1
    --warmup 0 --batch <size>` saved in `path` (no clipping: plain SGD). Checks the gradients of
    the whole model."""
    cls = torch_models.MODELS[args.model][0]
    data = read_data(args)
    start = torch_models.read_safetensors(args.weights)
    model = cls(start, args.device, requires_grad=True)
    before = cls(start, args.device)
    ref = cls(torch_models.read_safetensors(path), args.device)
    losses = model.eager_losses(data) if impl == "eager" else model.batched_losses(data)
    losses.sum().backward()
    model.sgd_step(args.lr / len(data))
    worst, worst_name, moved, bad = 0.0, "", 0.0, []
    with torch.no_grad():
        for name, p in model.params.items():
            d = (p - ref.params[name]).abs()
            tol = args.step_atol + args.step_rtol * ref.params[name].abs()
            moved = max(moved, (ref.params[name] - before.params[name]).abs().max().item())
            m = d.max().item()
            if not math.isnan(worst) and not m <= worst:  # a NaN is the worst
                worst, worst_name = m, name
            if not (d <= tol).all():  # a NaN on either side fails too
                bad.append(name)
    ok = not bad and moved > 0
    print(json_line({"check": "pass" if ok else "FAIL", "kind": "train_step",
                      "impl": "torch_" + impl, "model": args.model, "data": args.data,
                      "device": args.device, "instances": len(data),
                      "max_abs_diff": worst, "worst_tensor": worst_name,
                      "largest_update": moved, "mismatched_tensors": bad}), flush=True)
    if not ok:
        raise SystemExit(f"torch_baseline: train-step check FAILED for {impl}: tensors {bad} "
                         f"differ from {path} (largest update {moved:.3g})")
    print(f"train-step check {args.model} {impl}: {len(data)} instances, weights after one SGD "
          f"step within tolerance (max abs diff {worst:.3g} in {worst_name}, largest update "
          f"{moved:.3g})", file=sys.stderr)


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(torch_models.MODELS),
                   help="the model of the weights and data")
    p.add_argument("--data", required=True, help="an edbatch data file (edbatch run --write-data)")
    p.add_argument("--weights", required=True,
                   help="safetensors weights from edbatch run --save-weights")
    p.add_argument("--vocab-size", type=count(), default=256,
                   help="word ids fold modulo this, as in edbatch")
    p.add_argument("--batch", type=count(), default=32, help="instances per mini-batch")
    p.add_argument("--hidden", type=count(), default=128, help="must match the weights")
    p.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    p.add_argument("--impl", choices=["eager", "batched", "both"], default="both",
                   help="node-by-node eager, hand-batched by dependency level, or both")
    p.add_argument("--train", action="store_true",
                   help="forward, backward and an SGD update per mini-batch (a loss that is "
                        "not finite stops the run, naming its mini-batch)")
    p.add_argument("--lr", type=float, default=0.1,
                   help="SGD learning rate on the mean per-instance loss (as edbatch)")
    p.add_argument("--iters", type=count(), default=20, help="measured mini-batches (batched)")
    p.add_argument("--eager-iters", type=count(), default=5, help="measured mini-batches (eager)")
    p.add_argument("--warmup", type=count(0), default=2, help="unmeasured mini-batches first")
    p.add_argument("--repeats", type=count(), default=1, help="measured runs of --iters each")
    p.add_argument("--threads", type=count(), default=1, help="torch.set_num_threads")
    p.add_argument("--check-against", metavar="FILE",
                   help="edbatch run --outputs FILE on the same data and weights: compare "
                        "per-instance losses first and exit 1 on a mismatch")
    p.add_argument("--check-only", action="store_true", help="only the loss check, no timing")
    p.add_argument("--check-limit", type=count(0), default=0, metavar="N",
                   help="check the first N instances only (0: all; eager: at most "
                        "--eager-check-limit)")
    p.add_argument("--eager-check-limit", type=count(), default=128, metavar="N",
                   help="instances the eager implementation checks when --check-limit is 0")
    p.add_argument("--rtol", type=float, default=2e-5,
                   help="loss check: relative tolerance (times |edbatch's loss|)")
    p.add_argument("--atol", type=float, default=1e-4, help="loss check: absolute tolerance")
    p.add_argument("--check-train-step", metavar="FILE",
                   help="weights edbatch saved after one training step on the whole data as one "
                        "mini-batch (--train --iters 1 --warmup 0 --batch <size>) from "
                        "--weights: take the same step and compare every tensor, then exit")
    p.add_argument("--step-rtol", type=float, default=1e-4,
                   help="train-step check: relative tolerance (times |edbatch's weight|)")
    p.add_argument("--step-atol", type=float, default=2e-5,
                   help="train-step check: absolute tolerance")
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="leave glibc's malloc settings alone (see keep_freed_memory)")
    return p


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)
    for flag in ("rtol", "atol", "step_rtol", "step_atol"):
        if not getattr(a, flag) >= 0:
            p.error(f"--{flag.replace('_', '-')} {getattr(a, flag)}: expected a number >= 0")

    a.malloc_keep_freed = False if a.no_malloc_tuning else keep_freed_memory()
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("torch_baseline: --device cuda but torch has no CUDA device")
        torch.set_float32_matmul_precision("highest")  # float32 math, no TF32, as edbatch
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except (AttributeError, RuntimeError):
            pass
    impls = ["batched", "eager"] if a.impl == "both" else [a.impl]
    if a.check_train_step:
        for impl in impls:
            check_train_step(a, impl, a.check_train_step)
        return 0
    runner = Runner(a)
    if a.check_against:
        for impl in impls:
            runner.check(impl, a.check_against)
    if a.check_only:
        return 0
    for impl in impls:
        r = runner.measure(impl)
        print(json_line(r), flush=True)
        ms = r["ms_per_minibatch"]
        print(f"{a.model} torch_{impl} {a.device} x{a.threads} "
              f"{'train' if a.train else 'forward'}: {r['instances_per_s']:.0f} instances/s, "
              f"ms/mini-batch median {ms['median']:.2f} (p10 {ms['p10']:.2f}, "
              f"p90 {ms['p90']:.2f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
