#!/usr/bin/env python3
"""Markdown table from the results of `edbatch run --json` (scripts/bench_models.sh).

One row per run: instances/s, ms per mini-batch (median, p10-p90) split into construction,
scheduling and execution (+ backward when training), batches vs the lower bound, bytes copied,
peak memory; a mode column (forward, train, greedy decoding) when the runs mix modes or decode.
Runs that failed are listed after the table with their error.

Then, where a file has runs with and without blocks, the speed-up of blocks over op level per
model and thread count, for forward runs and for greedy-decoding runs apart (training runs have
none): the best op-level median of `depth`/`agenda` over the blocks median (the default policy
`lb-greedy`, and the best blocks policy), each ratio taken within one file. Given several files
(repeated runs of bench_models.sh), the first file's table is printed and the ratios are
summarised as median [min-max] over the files, plus the ratio of the fastest op-level time to
the fastest blocks time over all files (robust to noise that only ever adds time).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import read_results  # noqa: E402  (scripts/result_files.py)

MODE_TEXT = {"forward": "forward", "train": "train", "decode": "greedy decoding"}


def fmt_bytes(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def field(where, r, *keys):
    """r[keys[0]][keys[1]]...; a missing field stops with a message naming the record and it."""
    v = r
    for i, key in enumerate(keys):
        if not isinstance(v, dict) or v.get(key) is None:
            raise SystemExit(f"bench_table.py: {where}: no field '{'.'.join(keys[:i + 1])}' "
                             f"(expected the JSON of `edbatch run --json`)")
        v = v[key]
    return v


def mode(r):
    """forward, train or decode (greedy decoding; `"decode": true`, absent in older files)."""
    return "decode" if r.get("decode") else "train" if r.get("train") else "forward"


def load(path):
    """([(where, run)], [(where, failed run)]) of one file."""
    rows, failed = [], []
    for where, r in read_results([path], "bench_table.py"):
        (failed if "error" in r else rows).append((where, r))
    return rows, failed


def ratios(rows, run_mode):
    """{(model, threads): (op-level best ms, blocks lb-greedy ms, blocks best ms)} of the runs of
    one mode (forward or decode)."""
    ms = {}
    for where, r in rows:
        if mode(r) != run_mode:
            continue
        key = (field(where, r, "model"), field(where, r, "threads"))
        config = (field(where, r, "blocks"), field(where, r, "policy"))
        ms.setdefault(key, {})[config] = field(where, r, "ms_per_minibatch", "median")
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


def print_ratios(files, run_mode):
    per_file = [ratios(load(p)[0], run_mode) for p in files]
    keys = sorted({k for r in per_file for k in r}, key=lambda k: (k[0], k[1]))
    if not keys:
        return
    print()
    print(f"Blocks vs op level ({MODE_TEXT[run_mode]}; {len(files)} run(s): median [min-max] over "
          "runs; ratio = best of depth/agenda without blocks over blocks, within one run)")
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


def table_row(where, r, train, with_mode):
    def f(*keys):
        return field(where, r, *keys)

    cells = [f("model")] + ([MODE_TEXT[mode(r)]] if with_mode else []) + [
        "on" if f("blocks") else "off", f("policy"), str(f("threads")),
        f"{f('instances_per_s'):.0f}",
        f"{f('ms_per_minibatch', 'median'):.2f} ({f('ms_per_minibatch', 'p10'):.2f}-"
        f"{f('ms_per_minibatch', 'p90'):.2f})",
        f"{f('construction_ms', 'median'):.2f}", f"{f('scheduling_ms', 'median'):.2f}",
        f"{f('execution_ms', 'median'):.2f}"]
    if train:
        cells.append(f"{f('backward_ms', 'median'):.2f}" if mode(r) == "train" else "-")
    return cells + [f"{f('batches_per_minibatch', 'median'):.0f}",
                    f"{f('lower_bound_per_minibatch', 'median'):.0f}",
                    f"{f('batches_over_lower_bound'):.3f}",
                    fmt_bytes(f("bytes_copied_per_minibatch", "median")),
                    fmt_bytes(f("peak_rss_bytes"))]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="bench_table.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__, epilog="""\
Each file holds results of `edbatch run --json`: JSON lines (one run per line, as
scripts/bench_models.sh writes results.jsonl, with `error` lines for failed runs) or one
indented JSON object (the file `edbatch run --json FILE` writes). The tables, in Markdown, go to
standard output. A file without runs, or a run without a field the table needs, is an error
that names the file, line and field (exit status 1).""")
    parser.add_argument("files", nargs="+", metavar="RESULTS",
                        help="results of `edbatch run --json`; the first file's runs make the "
                        "table, every file's runs the ratios")
    args = parser.parse_args(argv)
    rows, failed = load(args.files[0])
    if not rows and not failed:
        raise SystemExit(f"bench_table.py: {args.files[0]}: no runs (expected the JSON of "
                         "`edbatch run --json`)")
    modes = {mode(r) for _, r in rows}
    train = "train" in modes
    with_mode = len(modes) > 1 or "decode" in modes
    head = ["model"] + (["mode"] if with_mode else []) + [
        "blocks", "policy", "threads", "inst/s", "ms/mb (p10-p90)", "constr", "sched",
        "exec"] + (["bwd"] if train else []) + \
        ["batches", "LB", "batches/LB", "copied/mb", "peak RSS"]
    lines = [table_row(where, r, train, with_mode) for where, r in rows]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for cells in lines:
        print("| " + " | ".join(cells) + " |")
    if failed:
        print()
        for _, r in failed:
            print(f"- failed: {r.get('model', '?')} blocks={'on' if r.get('blocks') else 'off'} "
                  f"{r.get('policy', '?')} x{r.get('threads', '?')}: {r['error']}")
    for run_mode in ("forward", "decode"):
        print_ratios(args.files, run_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
