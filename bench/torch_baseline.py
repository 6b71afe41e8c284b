#!/usr/bin/env python3
"""PyTorch baseline for edbatch: tree_lstm and lattice_lstm, node-by-node eager and hand-batched
by dependency level, on an edbatch data file with the weights edbatch saved.

  torch_baseline.py --model tree_lstm --data trees.txt --weights w.safetensors \\
      [--check-against outputs.jsonl] [--impl both] [--train] [--device cuda]

Prints one JSON line per result on stdout (field names as in `edbatch run --json` where they
overlap: instances_per_s, ms_per_minibatch {median, p10, p90, mean}, ...) and a short summary on
stderr. --check-against compares per-instance losses with `edbatch run --outputs` and exits 1 on
a mismatch beyond float32 tolerance.
"""

import argparse
import ctypes
import json
import os
import resource
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def quantile(sorted_values, q):
    """Linear interpolation between the closest ranks (as edbatch's metrics)."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


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

    def measure(self, impl):
        a = self.args
        iters = a.iters if impl == "batched" else a.eager_iters
        for w in range(a.warmup):
            self.step(impl, self.minibatch(w), a.train)
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
            if d > a.atol + a.rtol * abs(ref[i]):
                bad.append((i, x, ref[i]))
        result = {"check": "pass" if not bad else "FAIL", "impl": "torch_" + impl,
                  "model": a.model, "data": a.data, "device": a.device, "instances": n,
                  "max_abs_diff": worst_abs, "max_rel_diff": worst_rel,
                  "rtol": a.rtol, "atol": a.atol, "mismatches": len(bad)}
        print(json.dumps(result), flush=True)
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
            if d.max().item() > worst:
                worst, worst_name = d.max().item(), name
            if (d > tol).any():
                bad.append(name)
    ok = not bad and moved > 0
    print(json.dumps({"check": "pass" if ok else "FAIL", "kind": "train_step",
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=sorted(torch_models.MODELS))
    p.add_argument("--data", required=True, help="an edbatch data file (edbatch run --write-data)")
    p.add_argument("--weights", required=True,
                   help="safetensors weights from edbatch run --save-weights")
    p.add_argument("--vocab-size", type=int, default=256,
                   help="word ids fold modulo this, as in edbatch (default 256)")
    p.add_argument("--batch", type=int, default=32, help="instances per mini-batch (32)")
    p.add_argument("--hidden", type=int, default=128, help="must match the weights (128)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    p.add_argument("--impl", choices=["eager", "batched", "both"], default="both")
    p.add_argument("--train", action="store_true",
                   help="forward, backward and an SGD update per mini-batch")
    p.add_argument("--lr", type=float, default=0.1,
                   help="SGD learning rate on the mean per-instance loss (0.1, as edbatch)")
    p.add_argument("--iters", type=int, default=20, help="measured mini-batches (batched)")
    p.add_argument("--eager-iters", type=int, default=5, help="measured mini-batches (eager)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured mini-batches first (2)")
    p.add_argument("--repeats", type=int, default=1, help="measured runs of --iters each (1)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1)")
    p.add_argument("--check-against", metavar="FILE",
                   help="edbatch run --outputs FILE on the same data and weights: compare "
                        "per-instance losses first and exit 1 on a mismatch")
    p.add_argument("--check-only", action="store_true", help="only the loss check, no timing")
    p.add_argument("--check-limit", type=int, default=0,
                   help="check the first N instances only (0: all; eager: at most "
                        "--eager-check-limit)")
    p.add_argument("--eager-check-limit", type=int, default=128)
    p.add_argument("--rtol", type=float, default=2e-5)
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--check-train-step", metavar="FILE",
                   help="weights edbatch saved after one training step on the whole data as one "
                        "mini-batch (--train --iters 1 --warmup 0 --batch <size>) from "
                        "--weights: take the same step and compare every tensor, then exit")
    p.add_argument("--step-rtol", type=float, default=1e-4)
    p.add_argument("--step-atol", type=float, default=2e-5)
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="leave glibc's malloc settings alone (see keep_freed_memory)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.iters < 1 or a.eager_iters < 1 or a.repeats < 1 or a.threads < 1:
        p.error("--batch, --iters, --eager-iters, --repeats and --threads must be positive")

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
        print(json.dumps(r), flush=True)
        ms = r["ms_per_minibatch"]
        print(f"{a.model} torch_{impl} {a.device} x{a.threads} "
              f"{'train' if a.train else 'forward'}: {r['instances_per_s']:.0f} instances/s, "
              f"ms/mini-batch median {ms['median']:.2f} (p10 {ms['p10']:.2f}, "
              f"p90 {ms['p90']:.2f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
