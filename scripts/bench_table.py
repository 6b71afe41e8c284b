#!/usr/bin/env python3
"""Markdown table from the results of `edbatch run --json` (scripts/bench_models.sh).

One row per run: instances/s, ms per mini-batch (median, p10-p90) split into construction,
scheduling and execution (+ backward when training), batches vs the lower bound, bytes copied,
peak memory; a mode column (forward, train, greedy decoding) when the runs mix modes or decode.
Runs that failed are listed after the table with their error.

Then, where a file has runs with and without blocks, the speed-up of blocks over op level per
model, mini-batch size, hidden size and thread count (and device, data, vocabulary, pipelining,
decoding length and seed where runs differ in them: a column each then), for forward runs and
for greedy-decoding runs apart (training runs have none): the best op-level median of
`depth`/`agenda` over the blocks median (the default configuration, unpacked `lb-greedy`, and
the best blocks run), each ratio taken within one file. Two runs of one configuration in one
file are an error that names both (give repeated runs in separate files). Given several files
(repeated runs of bench_models.sh), the first file's table is printed and the ratios are
summarised as median [min-max] over the files, plus the ratio of the fastest op-level time to
the fastest blocks time over all files (robust to noise that only ever adds time).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import read_results  # noqa: E402  (scripts/result_files.py)

MODE_TEXT = {"forward": "forward", "train": "train", "decode": "greedy decoding"}
# The settings of a run besides blocks, packing and policy: runs compared by a ratio share them.
# The first four are always shown; the others get a column where runs differ in them.
SETTINGS = ("model", "batch", "hidden", "threads", "device", "data", "vocab", "pipeline",
            "max_len", "seed")


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


def settings(where, r):
    """The values of SETTINGS of one run (model, batch, hidden and threads required)."""
    return tuple(field(where, r, k) if i < 4 else r.get(k) for i, k in enumerate(SETTINGS))


def ratios(rows, run_mode):
    """{settings: (op-level best ms, blocks lb-greedy ms, blocks best ms)} of the runs of one mode
    (forward or decode); lb-greedy: the default blocks run (unpacked). Two runs of one
    configuration stop with a message naming both."""
    ms, seen = {}, {}
    for where, r in rows:
        if mode(r) != run_mode:
            continue
        key = settings(where, r)
        config = (field(where, r, "blocks"), bool(r.get("packed")), field(where, r, "policy"))
        if (key, config) in seen:
            shown = ", ".join(f"{k} {json.dumps(v)}" for k, v in zip(SETTINGS, key)
                              if v is not None)
            raise SystemExit(f"bench_table.py: {where}: the same configuration as "
                             f"{seen[key, config]} ({shown}, blocks "
                             f"{'on' if config[0] else 'off'}{', packed' if config[1] else ''}, "
                             f"policy {config[2]}); give repeated runs in separate files")
        seen[key, config] = where
        ms.setdefault(key, {})[config] = field(where, r, "ms_per_minibatch", "median")
    out = {}
    for key, m in ms.items():
        ops = [m[(False, False, p)] for p in ("depth", "agenda") if (False, False, p) in m]
        blocks = [v for (b, _, _), v in m.items() if b]
        if ops and blocks:
            out[key] = (min(ops), m.get((True, False, "lb-greedy")), min(blocks))
    return out


def varying(keys):
    """Indexes of SETTINGS to show: the first four, and those whose values differ in keys."""
    return [i for i in range(len(SETTINGS)) if i < 4 or len({k[i] for k in keys}) > 1]


def span(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def print_ratios(per_file, run_mode):
    """per_file: ratios() of each file, for one mode."""
    keys = sorted({k for r in per_file for k in r}, key=lambda k: json.dumps(k))
    if not keys:
        return
    shown = varying(keys)
    print()
    print(f"Blocks vs op level ({MODE_TEXT[run_mode]}; {len(per_file)} run(s): median [min-max] "
          "over runs; ratio = best of depth/agenda without blocks over blocks, within one run)")
    print()
    head = [SETTINGS[i] for i in shown] + [
        "op level best ms", "blocks lb-greedy ms", "blocks best ms", "ratio (lb-greedy)",
        "ratio (best blocks)", "ratio of fastest runs"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for k in keys:
        rs = [r[k] for r in per_file if k in r]
        ops = [r[0] for r in rs]
        lb = [r[1] for r in rs]
        best = [r[2] for r in rs]
        ratio_lb = [o / b for o, b in zip(ops, lb) if b]
        ratio_best = [o / b for o, b in zip(ops, best)]
        cells = ["-" if k[i] is None else str(k[i]) for i in shown]
        print(f"| {' | '.join(cells)} | {span(ops)} | {span(lb)} | {span(best)} | "
              f"{span(ratio_lb)} | {span(ratio_best)} | {min(ops) / min(best):.2f} |")


def table_row(where, r, train, with_mode, extra):
    def f(*keys):
        return field(where, r, *keys)

    cells = [f("model")] + ([MODE_TEXT[mode(r)]] if with_mode else []) + [
        "-" if r.get(k) is None else str(r[k]) for k in extra] + [
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
standard output. A file without runs (any of them), a run without a field the table needs, or
two runs of one configuration in one file (for the ratios) is an error that names the file,
line and field (exit status 1).""")
    parser.add_argument("files", nargs="+", metavar="RESULTS",
                        help="results of `edbatch run --json`; the first file's runs make the "
                        "table, every file's runs the ratios")
    args = parser.parse_args(argv)
    loaded = [load(path) for path in args.files]
    for path, (rows, failed) in zip(args.files, loaded):
        if not rows and not failed:
            raise SystemExit(f"bench_table.py: {path}: no runs (expected the JSON of "
                             "`edbatch run --json`)")
    rows, failed = loaded[0]
    modes = {mode(r) for _, r in rows}
    train = "train" in modes
    with_mode = len(modes) > 1 or "decode" in modes
    # Settings the first file's runs differ in (threads has its own column).
    extra = [k for k in SETTINGS[1:] if k != "threads" and
             len({json.dumps(r.get(k)) for _, r in rows}) > 1]
    head = ["model"] + (["mode"] if with_mode else []) + extra + [
        "blocks", "policy", "threads", "inst/s", "ms/mb (p10-p90)", "constr", "sched",
        "exec"] + (["bwd"] if train else []) + \
        ["batches", "LB", "batches/LB", "copied/mb", "peak RSS"]
    lines = [table_row(where, r, train, with_mode, extra) for where, r in rows]
    per_mode = {m: [ratios(file_rows, m) for file_rows, _ in loaded] for m in ("forward", "decode")}
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for cells in lines:
        print("| " + " | ".join(cells) + " |")
    if failed:
        print()
        for _, r in failed:
            print(f"- failed: {r.get('model', '?')} blocks={'on' if r.get('blocks') else 'off'} "
                  f"{r.get('policy', '?')} x{r.get('threads', '?')}: {r['error']}")
    for run_mode, per_file in per_mode.items():
        print_ratios(per_file, run_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
