#!/usr/bin/env python3
"""Markdown table from the JSON lines of `edbatch run --json` (scripts/bench_models.sh).

One row per run: instances/s, ms per mini-batch (median, p10-p90) split into construction,
scheduling and execution (+ backward when training), batches vs the lower bound, bytes copied,
peak memory. Runs that failed are listed after the table with their error.

Then, where a file has runs with and without blocks, the speed-up of blocks over op level per
model and thread count: the best op-level median of `depth`/`agenda` over the blocks median (the
default policy `lb-greedy`, and the best blocks policy), each ratio taken within one file. Given
several files (repeated runs of bench_models.sh), the first file's table is printed and the
ratios are summarised as median [min-max] over the files, plus the ratio of the fastest op-level
time to the fastest blocks time over all files (robust to noise that only ever adds time).
"""
import statistics
import json
import sys


def fmt_bytes(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def load(path):
    rows, failed = [], []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                (failed if "error" in r else rows).append(r)
    return rows, failed


def ratios(rows):
    """{(model, threads): (op-level best ms, blocks lb-greedy ms, blocks best ms)}"""
    ms = {}
    for r in rows:
        if r.get("train"):
            continue
        key = (r["model"], r["threads"])
        ms.setdefault(key, {})[(r["blocks"], r["policy"])] = r["ms_per_minibatch"]["median"]
    out = {}
    for key, m in ms.items():
        ops = [m[(False, p)] for p in ("depth", "agenda") if (False, p) in m]
        blocks = [v for (b, _), v in m.items() if b]
        if ops and blocks:
            out[key] = (min(ops), m.get((True, "lb-greedy")), min(blocks))
    return out


def span(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def print_ratios(files):
    per_file = [ratios(load(p)[0]) for p in files]
    keys = sorted({k for r in per_file for k in r}, key=lambda k: (k[0], k[1]))
    if not keys:
        return
    print()
    print(f"Blocks vs op level (forward; {len(files)} run(s): median [min-max] over runs; ratio = "
          "best of depth/agenda without blocks over blocks, within one run)")
    print()
    print("| model | threads | op level best ms | blocks lb-greedy ms | blocks best ms | "
          "ratio (lb-greedy) | ratio (best blocks) | ratio of fastest runs |")
    print("|---|---|---|---|---|---|---|---|")
    for k in keys:
        rs = [r[k] for r in per_file if k in r]
        ops = [r[0] for r in rs]
        lb = [r[1] for r in rs]
        best = [r[2] for r in rs]
        ratio_lb = [o / b for o, b in zip(ops, lb) if b]
        ratio_best = [o / b for o, b in zip(ops, best)]
        print(f"| {k[0]} | {k[1]} | {span(ops)} | {span(lb)} | {span(best)} | {span(ratio_lb)} | "
              f"{span(ratio_best)} | {min(ops) / min(best):.2f} |")


def main(argv):
    if len(argv) < 2:
        print("usage: bench_table.py RESULTS.jsonl [MORE_RESULTS.jsonl ...]", file=sys.stderr)
        return 2
    rows, failed = load(argv[1])
    train = any(r.get("train") for r in rows)
    head = ["model", "blocks", "policy", "threads", "inst/s", "ms/mb (p10-p90)", "constr",
            "sched", "exec"] + (["bwd"] if train else []) + \
           ["batches", "LB", "batches/LB", "copied/mb", "peak RSS"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        ms = r["ms_per_minibatch"]
        cells = [r["model"], "on" if r["blocks"] else "off", r["policy"], str(r["threads"]),
                 f"{r['instances_per_s']:.0f}",
                 f"{ms['median']:.2f} ({ms['p10']:.2f}-{ms['p90']:.2f})",
                 f"{r['construction_ms']['median']:.2f}", f"{r['scheduling_ms']['median']:.2f}",
                 f"{r['execution_ms']['median']:.2f}"]
        if train:
            cells.append(f"{r['backward_ms']['median']:.2f}")
        cells += [f"{r['batches_per_minibatch']['median']:.0f}",
                  f"{r['lower_bound_per_minibatch']['median']:.0f}",
                  f"{r['batches_over_lower_bound']:.3f}",
                  fmt_bytes(r["bytes_copied_per_minibatch"]["median"]),
                  fmt_bytes(r["peak_rss_bytes"])]
        print("| " + " | ".join(cells) + " |")
    if failed:
        print()
        for r in failed:
            print(f"- failed: {r['model']} blocks={'on' if r.get('blocks') else 'off'} "
                  f"{r['policy']} x{r['threads']}: {r['error']}")
    print_ratios(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
