#!/usr/bin/env python3
"""Markdown table from the JSON lines of `edbatch run --json` (scripts/bench_models.sh).

One row per run: instances/s, ms per mini-batch (median, p10-p90) split into construction,
scheduling and execution (+ backward when training), batches vs the lower bound, bytes copied,
peak memory. Runs that failed are listed after the table with their error.
"""
import json
import sys


def fmt_bytes(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def main(argv):
    if len(argv) != 2:
        print("usage: bench_table.py RESULTS.jsonl", file=sys.stderr)
        return 2
    rows, failed = [], []
    with open(argv[1]) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                (failed if "error" in r else rows).append(r)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
