#!/usr/bin/env python3
"""Charts of edbatch's results (docs/performance.md), as PNG files:

  report.py throughput FILES... -o OUT.png [--x batch|hidden] [--model M,..] [--mode MODE]
      instances/s against mini-batch size (or hidden size), one line per implementation (edbatch
      and every baseline found) and configuration, one panel per model, mode (forward, train or
      greedy decoding) and the other size. Runs that differ in blocks, policy, packing,
      pipelining or benchmark are separate lines, labelled by what differs. Reads the JSON of
      `edbatch run --json` and the JSON lines of scripts/bench_torch.sh (results.jsonl),
      bench/torch_baseline.py, bench_cuda, bench_core, bench_blocks and bench/bench_torch_ext.py.
      A result whose instances/s is not a positive number (NaN, 0: a failed or empty run) stops
      the command with an error that names its file and line; remove it to draw the rest.
  report.py phases FILES... -o OUT.png [--share]
      time per mini-batch by phase (construction, scheduling, execution, backward, update),
      from `edbatch run --json` and bench_core / bench_blocks JSON lines, one bar per run,
      labelled by what sets it apart; --share draws each run's phases as percentages of its time.
  report.py curve CSV... -o OUT.png
      a policy trainer's learning curve (`edbatch train --curve`): batches per mini-batch by
      episode, on the training and validation mini-batches, against the validation lower bound.
  report.py epochs JSON... -o OUT.png
      a training run's loss per epoch (`edbatch run --train --epochs N --json`): the training
      loss and the held-out loss (`--eval`) on one axis, the held-out accuracies on a second.
      Each run is labelled by the settings that differ between the runs (optimizer, lr, ...),
      or by its file where none does.

Every command also takes --summary FILE: what was drawn (panels, series and their points) as
JSON. Needs matplotlib (Debian: python3-matplotlib); the rest of edbatch does not.
"""
import argparse
import csv
import json
import math
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import read_results  # noqa: E402  (scripts/result_files.py)

PHASES = ["construction", "scheduling", "execution", "backward", "update"]
BENCH_NAMES = {"core_tree_lstm_ops": "bench_core", "block_tree_lstm": "bench_blocks",
               "cuda": "bench_cuda"}
MODE_TEXT = {"forward": "forward", "train": "train", "decode": "greedy decoding"}


def config_parts(r):
    """[(field, text)] of the settings that set a run apart from another of the same model, mode
    and sizes: its benchmark, blocks or op level, policy, packing, pipelining and decoding
    length (bench_blocks' form is in the implementation's name). Fields that a record does not
    have are left out."""
    parts = []
    if r.get("bench"):
        parts.append(("bench", BENCH_NAMES.get(r["bench"], r["bench"])))
    if r.get("blocks") is not None:
        parts.append(("blocks", "blocks" if r["blocks"] else "op level"))
    if r.get("policy"):
        parts.append(("policy", r["policy"]))
    if r.get("packed") is not None:
        parts.append(("packed", "packed" if r["packed"] else "unpacked"))
    if r.get("pipeline") is not None:
        parts.append(("pipeline", "pipelined" if r["pipeline"] else "not pipelined"))
    if r.get("decode") and r.get("max_len") is not None:
        parts.append(("max_len", f"max len {r['max_len']}"))
    return parts


def distinct_labels(items, sep=", ", open_=" (", close=")"):
    """Labels of [(base, [(field, text)])]: each base, followed by the texts of the fields whose
    values differ between items of that base, so that unlike items never share a label."""
    by_base = {}
    for base, parts in items:
        by_base.setdefault(base, []).append(dict(parts))
    labels = []
    for base, parts in items:
        others = by_base[base]
        texts = [text for field, text in parts
                 if any(o.get(field) != text for o in others)]
        labels.append(f"{base}{open_}{sep.join(texts)}{close}" if texts else base)
    return labels


def number_duplicates(labels):
    """The labels, with " #2", " #3", ... after the second and later copies of one label."""
    seen, out = {}, []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def _median(v):
    return v.get("median") if isinstance(v, dict) else v


def run_mode(r):
    """forward, train or decode (greedy decoding; `"decode": true`, absent in older files)."""
    if r.get("decode"):
        return "decode"
    mode = r.get("mode") or ("train" if (r.get("train") or r.get("backward")) else "forward")
    return mode.replace("-pipelined", "")


def throughput_row(r):
    """(model, impl, mode, device, threads, batch, hidden, config, instances/s, low, high) of one
    result, or None for records that are not throughput results (checks, GEMM timings, ...).
    config: config_parts(r). low and high: the instances/s at the p90 and p10 times per
    mini-batch, where known. A throughput that is not a positive number raises ValueError."""
    bench = r.get("bench")
    if "check" in r or bench in ("gemm", "block_cell", "fsm", "cudnn_lstm"):
        return None
    model = r.get("model") or r.get("cell") or ("tree_lstm" if bench else None)
    batch, hidden = r.get("batch"), r.get("hidden")
    if model is None or batch is None or hidden is None:
        return None
    # Panels are forward, train or decode; pipelining is a way to run, drawn as its own line.
    mode = run_mode(r)
    pipelined = (r.get("mode") or "").endswith("-pipelined") or bool(r.get("pipeline"))
    impl = r.get("impl") or ("edbatch" if bench in (None, "cuda") else None)
    if bench == "block_tree_lstm":
        impl = "edbatch " + r["form"]
    if bench == "core_tree_lstm_ops":
        impl = "edbatch op level"
    if impl is None:
        return None
    pipelined = pipelined or impl.endswith("_pipelined")
    impl = impl.replace("_pipelined", "")
    if pipelined and impl.startswith("edbatch"):
        impl += " pipelined"
    ms = r.get("ms_per_minibatch", r.get("ms_per_batch", r.get("ms_median", r.get("median_ms"))))
    lo_ms = r.get("ms_p90", r.get("p90_ms"))
    hi_ms = r.get("ms_p10", r.get("p10_ms"))
    if isinstance(ms, dict):
        lo_ms, hi_ms, ms = ms.get("p90"), ms.get("p10"), ms.get("median")
    per_s = r.get("instances_per_s", r.get("trees_per_s"))
    if per_s is None and ms is not None:
        per_s = batch / ms * 1e3 if ms > 0 else 0.0
    if per_s is None:
        return None
    if not isinstance(per_s, (int, float)) or not math.isfinite(per_s) or per_s <= 0:
        field = next((k for k in ("instances_per_s", "trees_per_s") if k in r),
                     "ms per mini-batch")
        raise ValueError(f"{field} is {per_s!r}, not a positive number of instances/s")
    low = batch / lo_ms * 1e3 if lo_ms else None
    high = batch / hi_ms * 1e3 if hi_ms else None
    if r.get("instances_per_s_min") is not None:  # a range over rounds, as tables record it
        low, high = r["instances_per_s_min"], r["instances_per_s_max"]
    return dict(model=model, impl=impl, mode=mode, device=r.get("device", "cpu"),
                threads=r.get("threads"), batch=int(batch), hidden=int(hidden),
                config=tuple(config_parts(r)), per_s=float(per_s), low=low, high=high)


def _median_of(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def throughput_series(sourced, x, model=None, mode=None):
    """{panel title: {series label: [(x, instances/s, low, high)]}} of [(where, record)]. A series
    is one implementation in one configuration (config_parts), labelled by what sets it apart
    from the panel's other series of that implementation; repeated results (rounds) of one
    point are reduced to their median, and their range becomes the error bar."""
    other = "hidden" if x == "batch" else "batch"
    points, order = {}, {}
    for where, record in sourced:
        try:
            r = throughput_row(record)
        except ValueError as e:
            raise SystemExit(f"report.py throughput: {where}: {e} (a failed or empty run?)")
        if r is None:
            continue
        if (model and r["model"] not in model.split(",")) or (mode and r["mode"] != mode):
            continue
        title = (f"{r['model']}, {MODE_TEXT.get(r['mode'], r['mode'])}, {other} {r[other]}, "
                 f"{r['device']}"
                 + (f" x{r['threads']}" if r["threads"] and r["device"] == "cpu" else ""))
        order[title] = (r["model"], r["mode"], r[other], r["device"], r["threads"] or 0)
        series = points.setdefault(title, {}).setdefault((r["impl"], r["config"]), {})
        series.setdefault(r[x], []).append(r)
    panels = {}
    for title, by_series in sorted(points.items(), key=lambda kv: order[kv[0]]):
        panels[title] = {}
        labels = distinct_labels(list(by_series))
        for label, by_x in zip(labels, by_series.values()):
            line = []
            for xv, rs in sorted(by_x.items()):
                mid = _median_of([r["per_s"] for r in rs])
                if len(rs) > 1:
                    low, high = min(r["per_s"] for r in rs), max(r["per_s"] for r in rs)
                else:
                    low, high = rs[0]["low"], rs[0]["high"]
                line.append((xv, mid, low, high))
            panels[title][label] = line
    return panels


def _impl_order(name):
    return (0 if name.startswith("edbatch") else 1, name)


def _grid(plt, n, width=4.2, height=3.2):
    cols = 2 if n in (2, 4) else min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def draw_throughput(plt, sourced, args):
    panels = throughput_series(sourced, args.x, args.model, args.mode)
    if not panels:
        raise SystemExit("report.py throughput: no throughput results in the files")
    fig, axes = _grid(plt, len(panels))
    summary = {}
    for ax, (title, impls) in zip(axes, panels.items()):
        summary[title] = {}
        if all(len(line) == 1 for line in impls.values()):
            _bars(ax, title, impls, args.x, summary[title])
            continue
        for impl in sorted(impls, key=_impl_order):
            line = impls[impl]
            xs = [p[0] for p in line]
            ys = [p[1] for p in line]
            err = None
            if all(p[2] is not None and p[3] is not None for p in line):
                err = [[max(0.0, y - p[2]) for y, p in zip(ys, line)],
                       [max(0.0, p[3] - y) for y, p in zip(ys, line)]]
            style = "-o" if impl.startswith("edbatch") else "--s"
            ax.errorbar(xs, ys, yerr=err, fmt=style, ms=4, capsize=2, label=impl)
            summary[title][impl] = [[x, y] for x, y in zip(xs, ys)]
        ax.set_title(title, fontsize=9)
        ax.set_xscale("log", base=2)
        ticks = sorted({p[0] for line in impls.values() for p in line})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("mini-batch size" if args.x == "batch" else "hidden size")
        ax.set_ylabel("instances/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return fig, summary


def _bars(ax, title, impls, x, summary):
    """One configuration only: a bar per implementation, with its range."""
    names = sorted(impls, key=_impl_order)
    points = [impls[n][0] for n in names]
    ys = [p[1] for p in points]
    err = None
    if all(p[2] is not None and p[3] is not None for p in points):
        err = [[max(0.0, y - p[2]) for y, p in zip(ys, points)],
               [max(0.0, p[3] - y) for y, p in zip(ys, points)]]
    colors = [f"C{i}" for i in range(len(names))]
    ax.bar(range(len(names)), ys, yerr=err, capsize=3, color=colors)
    for i, y in enumerate(ys):
        ax.text(i, y, f"{y:,.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([textwrap.fill(n.replace("_", " "), 14) for n in names], fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("instances/s")
    ax.set_title(f"{title}, {x} {points[0][0]}", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    for n, p in zip(names, points):
        summary[n] = [[p[0], p[1]]]


def phase_row(r):
    """(label, config, {phase: ms}) of a result that has phase times, else None; config:
    config_parts(r), for draw_phases to tell unlike runs with one label apart."""
    times = {}
    for p in PHASES:
        v = r.get(f"{p}_ms")
        if v is not None:
            times[p] = float(_median(v))
    if not times:
        return None
    model = r.get("model") or r.get("form") or r.get("bench", "?")
    label = f"{model}\n{MODE_TEXT[run_mode(r)]} b{r.get('batch')} h{r.get('hidden')}"
    if r.get("device") and r.get("device") != "cpu":
        label += f" {r['device']}"
    return label, config_parts(r), times


def draw_phases(plt, sourced, args):
    rows = [x for x in (phase_row(r) for _, r in sourced) if x]
    if not rows:
        raise SystemExit("report.py phases: no per-phase times in the files")
    labels = number_duplicates(distinct_labels([(label, config) for label, config, _ in rows],
                                               sep="\n", open_="\n", close=""))
    rows = [(label, times) for label, (_, _, times) in zip(labels, rows)]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rows) + 2), 4.2))
    bottoms = [0.0] * len(rows)
    totals = [sum(t.values()) or 1.0 for _, t in rows]
    summary = {}
    for p in PHASES:
        v = [t.get(p, 0.0) for _, t in rows]
        if args.share:
            v = [100.0 * x / total for x, total in zip(v, totals)]
        if not any(v):
            continue
        ax.bar(range(len(rows)), v, bottom=bottoms, label=p)
        bottoms = [b + x for b, x in zip(bottoms, v)]
        summary[p] = v
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([label for label, _ in rows], fontsize=7)
    ax.set_ylabel("% of the mini-batch's time (medians)" if args.share
                  else "ms per mini-batch (medians)")
    ax.set_title("Time per phase", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    return fig, {"bars": [label for label, _ in rows], "phases": summary}


def draw_curve(plt, paths, args):
    fig, ax = plt.subplots(figsize=(6, 4))
    summary = {}
    for path in paths:
        with open(path) as f:
            rows = list(csv.DictReader(f))
        need = {"episode", "mean_batches", "validation_batches", "lower_bound"}
        if not rows or not need <= set(rows[0]):
            raise SystemExit(f"report.py curve: {path}: expected the CSV columns of "
                             f"`edbatch train --curve` ({', '.join(sorted(need))})")
        name = os.path.splitext(os.path.basename(path))[0]
        ep = [int(r["episode"]) for r in rows]
        # Training: the mean of each round's exploring rollouts (and of the candidate tables at
        # the start and the end); validation: the greedy table on held-out mini-batches.
        for col, what, style in (("mean_batches", "training", "-"),
                                 ("validation_batches", "validation", "-o")):
            ys = [float(r[col]) for r in rows]
            label = f"{name}: {what}"
            ax.plot(ep, ys, style, ms=3, label=label)
            summary[label] = [[e, y] for e, y in zip(ep, ys)]
        # The CSV's bound is that of the validation mini-batches, not of the training ones.
        ax.plot(ep, [float(r["lower_bound"]) for r in rows], ":", color="gray",
                label=f"{name}: validation lower bound")
    ax.set_xlabel("episode")
    ax.set_ylabel("batches per mini-batch")
    ax.set_title("FSM policy learning curve", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig, summary


def epoch_series(record):
    """{name: [(epoch, value)]} of one run's per-epoch records: its training loss and, from each
    epoch's `eval` object, the held-out loss and accuracies. Timings (wall_s, seconds, ...) and
    counts are left out."""
    out = {}

    def add(epoch, key, v, prefix=""):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (
                "loss" in key or "accuracy" in key):
            out.setdefault(prefix + key.replace("_", " "), []).append((epoch, float(v)))

    for e in record.get("epochs") or []:
        for key, v in e.items():
            if key == "eval" and isinstance(v, dict):
                for k, x in v.items():
                    add(e["epoch"], k, x, "held-out ")
            elif key != "epoch":
                add(e["epoch"], key, v)
    return out


def run_settings(r):
    """[(field, text)] of a training run's settings, to tell runs of one model and sizes apart."""
    opt = r.get("optimizer")
    opt = opt if isinstance(opt, dict) else {"name": opt}
    lr = opt.get("lr", r.get("lr"))
    parts = [("optimizer", opt.get("name"))] if opt.get("name") else []
    if lr is not None:
        parts.append(("lr", f"lr {lr:g}"))
    for key in ("momentum", "weight_decay", "clip"):
        if opt.get(key) is not None:
            parts.append((key, f"{key.replace('_', ' ')} {opt[key]:g}"))
    parts += [(key, f"{key} {r[key]}") for key in ("data", "seed", "policy", "device", "threads")
              if r.get(key) is not None]
    return parts + [p for p in config_parts(r) if p[0] != "policy"]


def run_labels(runs):
    """Labels of [(where, record)]: model and sizes, then the settings that differ between the
    runs, then the file where nothing else does."""
    labels = distinct_labels([(f"{r.get('model', '?')} h{r.get('hidden')} b{r.get('batch')}",
                               run_settings(r)) for _, r in runs])
    count = {label: labels.count(label) for label in labels}
    labels = [label if count[label] == 1 else f"{label} [{os.path.basename(where)}]"
              for label, (where, _) in zip(labels, runs)]
    return number_duplicates(labels)


def draw_epochs(plt, sourced, args):
    runs = [(where, r) for where, r in sourced if epoch_series(r)]
    if not runs:
        raise SystemExit("report.py epochs: no per-epoch records in the files (run "
                         "`edbatch run --train --epochs N --json FILE`)")
    fig, ax = plt.subplots(figsize=(6, 4))
    acc_ax = None
    summary = {}
    for run, (_, r) in zip(run_labels(runs), runs):
        for key, pts in sorted(epoch_series(r).items()):
            target = ax
            if "accuracy" in key:
                acc_ax = acc_ax or ax.twinx()
                target = acc_ax
            label = f"{run}: {key}"
            target.plot([p[0] for p in pts], [p[1] for p in pts],
                        "--^" if target is acc_ax else "-o", ms=3, label=label)
            summary[label] = [list(p) for p in pts]
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss per instance")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if acc_ax:
        acc_ax.set_ylabel("accuracy")
        h2, l2 = acc_ax.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=7)
    ax.set_title("Training by epoch", fontsize=10)
    return fig, summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="chart", required=True)
    for name in ("throughput", "phases", "curve", "epochs"):
        p = sub.add_parser(name)
        p.add_argument("files", nargs="+")
        p.add_argument("-o", "--output", required=True, help="the PNG to write")
        p.add_argument("--summary", help="write what was drawn as JSON here")
        p.add_argument("--title", help="a title over the whole figure")
        p.add_argument("--dpi", type=int, default=80)
        if name == "throughput":
            p.add_argument("--x", choices=["batch", "hidden"], default="batch")
            p.add_argument("--model", help="only these models (comma-separated)")
            p.add_argument("--mode", choices=["forward", "train", "decode"],
                           help="only these runs (decode: greedy decoding)")
        if name == "phases":
            p.add_argument("--share", action="store_true",
                           help="each bar as shares of its run's time (100%%)")
    args = parser.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("report.py: matplotlib is not installed (Debian: apt-get install "
                         "python3-matplotlib; elsewhere: pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for path in args.files:
        if not os.path.exists(path):
            raise SystemExit(f"report.py: {path}: no such file")
    if args.chart == "curve":
        fig, summary = draw_curve(plt, args.files, args)
    else:
        draw = {"throughput": draw_throughput, "phases": draw_phases, "epochs": draw_epochs}
        fig, summary = draw[args.chart](plt, read_results(args.files, "report.py"), args)
    if args.title:
        fig.suptitle(args.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(args.output, dpi=args.dpi)
    plt.close(fig)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"report.py: wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
