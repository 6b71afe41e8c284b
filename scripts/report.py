#!/usr/bin/env python3
"""Charts of edbatch's results (docs/performance.md), as PNG files:

  report.py throughput FILES... -o OUT.png [--x batch|hidden] [--model M,..] [--mode MODE]
      instances/s against mini-batch size (or hidden size), one line per implementation (edbatch
      and every baseline found) and configuration, one panel per model, mode and the other
      size. The mode is a record's `mode` field, else train for `"train": true` and
      forward+backward (no update) for `"backward": true` (bench_core --backward), else forward;
      greedy decoding for `"decode": true`. Runs that differ in blocks, policy, packing,
      pipelining or benchmark are separate lines, labelled by what differs. Reads the JSON of
      `edbatch run --json` and the JSON lines of scripts/bench_torch.sh (results.jsonl),
      bench/torch_baseline.py, bench_cuda, bench_core, bench_blocks, bench/bench_torch_ext.py and
      bench/bench_user_cells.py. A result whose instances/s is not a positive number (NaN, 0,
      null: a failed or empty run) stops the command with an error that names its file and line;
      remove it to draw the rest. So does a field of the wrong type (a string batch, ...).
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
JSON. OUT (.png, .svg, .pdf, .eps or .ps) and the summary may not name a file read, a
directory or a file in a missing directory: such paths are refused (exit status 2) before
anything is read. Needs matplotlib (Debian: python3-matplotlib); the rest of edbatch does not.
"""
import argparse
import csv
import json
import math
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import check_outputs, read_results  # noqa: E402  (scripts/result_files.py)

PHASES = ["construction", "scheduling", "execution", "backward", "update"]
BENCH_NAMES = {"core_tree_lstm_ops": "bench_core", "block_tree_lstm": "bench_blocks",
               "cuda": "bench_cuda"}
# forward+backward: bench_core --backward, which times the backward pass but updates nothing.
MODE_TEXT = {"forward": "forward", "forward+backward": "forward+backward", "train": "train",
             "decode": "greedy decoding"}
FORMATS = ("png", "svg", "pdf", "eps", "ps")  # what -o may end with


def _number(r, key, kind="number"):
    """r[key]: None where absent or null, else a number; kind "size": a positive integer, "count":
    an integer >= 0. Anything else raises ValueError naming the field and what was expected."""
    v = r.get(key)
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if ok and kind != "number":
        ok = float(v).is_integer() and v >= (1 if kind == "size" else 0)
    if not ok:
        want = {"size": "a positive integer", "count": "an integer >= 0"}.get(kind, "a number")
        raise ValueError(f"{key} is {json.dumps(v)}, not {want}")
    return int(v) if kind != "number" else v


def _text(r, key, default=None):
    """r[key] (default where absent or null), which must be a string: else ValueError."""
    v = r.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise ValueError(f"{key} is {json.dumps(v)}, not a string")
    return v


def _each(chart, sourced, fn):
    """[(where, fn(record))] of the records for which fn returns something; a ValueError it
    raises (a field that is not what it should be) stops the command, naming the record."""
    out = []
    for where, r in sourced:
        try:
            x = fn(r)
        except ValueError as e:
            raise SystemExit(f"report.py {chart}: {where}: {e}")
        if x is not None:
            out.append((where, x))
    return out


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


def run_mode(r):
    """forward, forward+backward, train or decode (greedy decoding; `"decode": true`, absent in
    older files). A `mode` field (bench_cuda, bench_nmt, bench/bench_torch_ext.py, ...) says it,
    "-pipelined" after it being a way to run; else `"train": true` (`edbatch run --json`,
    bench/torch_baseline.py) is a training step and `"backward": true` (bench_core --backward)
    forward+backward without an update. An unknown mode raises ValueError."""
    if r.get("decode"):
        return "decode"
    mode = r.get("mode")
    if mode is None:
        return ("train" if r.get("train") else "forward+backward" if r.get("backward")
                else "forward")
    base = mode.replace("-pipelined", "") if isinstance(mode, str) else None
    if base not in MODE_TEXT:
        raise ValueError(f"mode is {json.dumps(mode)}, expected one of "
                         f"{', '.join(MODE_TEXT)} (or forward-pipelined, train-pipelined)")
    return base


def throughput_row(r):
    """(model, impl, mode, device, threads, batch, hidden, config, instances/s, low, high) of one
    result, or None for records that are not throughput results (checks, GEMM timings, ...).
    config: config_parts(r). low and high: the instances/s at the p90 and p10 times per
    mini-batch, where known. A throughput that is not a positive number, or a field that is not
    what it should be, raises ValueError."""
    bench = r.get("bench")
    if "check" in r or bench in ("gemm", "block_cell", "fsm", "cudnn_lstm"):
        return None
    model = _text(r, "model") or _text(r, "cell") or ("tree_lstm" if bench else None)
    batch, hidden = _number(r, "batch", "size"), _number(r, "hidden", "size")
    if model is None or batch is None or hidden is None:
        return None
    # Panels are forward, train or decode; pipelining is a way to run, drawn as its own line.
    mode = run_mode(r)
    pipelined = (r.get("mode") or "").endswith("-pipelined") or bool(r.get("pipeline"))
    impl = _text(r, "impl") or ("edbatch" if bench in (None, "cuda") else None)
    if bench == "block_tree_lstm":
        impl = "edbatch " + _text(r, "form", "")
        if impl == "edbatch ":
            raise ValueError("no field 'form' (bench_blocks names the form of each result)")
    if bench == "core_tree_lstm_ops":
        impl = "edbatch op level"
    if impl is None:
        return None
    pipelined = pipelined or impl.endswith("_pipelined")
    impl = impl.replace("_pipelined", "")
    if pipelined and impl.startswith("edbatch"):
        impl += " pipelined"
    times = r
    ms_key = _first(r, ("ms_per_minibatch", "ms_per_batch", "ms_median", "median_ms"))
    lo_key, hi_key = _first(r, ("ms_p90", "p90_ms")), _first(r, ("ms_p10", "p10_ms"))
    if isinstance(r.get(ms_key), dict):  # {median, p10, p90} of `edbatch run --json`
        times = {f"{ms_key}.{k}": v for k, v in r[ms_key].items()}
        ms_key, lo_key, hi_key = (f"{ms_key}.{k}" for k in ("median", "p90", "p10"))
    ms, lo_ms, hi_ms = (_number(times, k) if k else None for k in (ms_key, lo_key, hi_key))
    field = _first(r, ("instances_per_s", "trees_per_s"))
    per_s = r[field] if field else None
    if field and per_s is None:
        raise ValueError(f"{field} is null, not a number of instances/s (a failed or empty run?)")
    if per_s is None and ms is not None:
        per_s, field = (batch / ms * 1e3 if ms > 0 else 0.0), "ms per mini-batch"
    if per_s is None:
        return None
    if (not isinstance(per_s, (int, float)) or isinstance(per_s, bool)
            or not math.isfinite(per_s) or per_s <= 0):
        raise ValueError(f"{field} is {per_s!r}, not a positive number of instances/s (a "
                         "failed or empty run?)")
    low = batch / lo_ms * 1e3 if lo_ms else None
    high = batch / hi_ms * 1e3 if hi_ms else None
    lowest, highest = _number(r, "instances_per_s_min"), _number(r, "instances_per_s_max")
    if (lowest is None) != (highest is None):
        have, lack = (("min", "max") if highest is None else ("max", "min"))
        raise ValueError(f"instances_per_s_{have} without instances_per_s_{lack} (a range "
                         "over rounds has both)")
    if lowest is not None:  # a range over rounds, as tables record it
        low, high = lowest, highest
    return dict(model=model, impl=impl, mode=mode, device=_text(r, "device", "cpu"),
                threads=_number(r, "threads", "count"), batch=batch, hidden=hidden,
                config=tuple(config_parts(r)), per_s=float(per_s), low=low, high=high)


def _first(r, keys):
    """The first of keys that r has (null or not), else None."""
    return next((k for k in keys if k in r), None)


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
    for _, r in _each("throughput", sourced, throughput_row):
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
    """One point per implementation: a bar each, with its range. The panel's title gives the
    points' x where they share it, else each bar's label gives its own."""
    names = sorted(impls, key=_impl_order)
    points = [impls[n][0] for n in names]
    shared = len({p[0] for p in points}) == 1
    labels = [textwrap.fill(n.replace("_", " "), 14) + ("" if shared else f"\n{x} {p[0]}")
              for n, p in zip(names, points)]
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
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("instances/s")
    ax.set_title(f"{title}, {x} {points[0][0]}" if shared else title, fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    for n, p in zip(names, points):
        summary[n] = [[p[0], p[1]]]


def phase_row(r):
    """(label, config, {phase: ms}) of a result that has phase times, else None; config:
    config_parts(r), for draw_phases to tell unlike runs with one label apart. A time or mode
    that is not what it should be raises ValueError."""
    times = {}
    for p in PHASES:
        v, key = r.get(f"{p}_ms"), f"{p}_ms"
        if isinstance(v, dict):  # {median, p10, p90} of `edbatch run --json`
            v, key = v.get("median"), f"{p}_ms.median"
        if v is not None:
            times[p] = float(_number({key: v}, key))
    if not times:
        return None
    model = r.get("model") or r.get("form") or r.get("bench", "?")
    label = f"{model}\n{MODE_TEXT[run_mode(r)]} b{r.get('batch')} h{r.get('hidden')}"
    if r.get("device") and r.get("device") != "cpu":
        label += f" {r['device']}"
    return label, config_parts(r), times


def draw_phases(plt, sourced, args):
    rows = [row for _, row in _each("phases", sourced, phase_row)]
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
        for n, r in enumerate(rows, 2):  # line 1: the header
            for col in sorted(need):
                try:
                    float(r[col])
                except (TypeError, ValueError):
                    raise SystemExit(f"report.py curve: {path}:{n}: {col} is {r[col]!r}, not a "
                                     "number")
            if not float(r["episode"]).is_integer():
                raise SystemExit(f"report.py curve: {path}:{n}: episode is {r['episode']!r}, not "
                                 "an integer")
        name = os.path.splitext(os.path.basename(path))[0]
        ep = [int(float(r["episode"])) for r in rows]
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
    counts are left out. `epochs` that is not a list of objects with an `epoch` number raises
    ValueError."""
    out = {}
    epochs = record.get("epochs")
    if epochs is not None and not isinstance(epochs, list):
        raise ValueError(f"epochs is {json.dumps(epochs)}, not a list of per-epoch objects (as "
                         "`edbatch run --train --epochs N --json` writes)")
    for i, e in enumerate(epochs or []):
        if not isinstance(e, dict):
            raise ValueError(f"epochs[{i}] is {json.dumps(e)}, not a JSON object")
        if e.get("epoch") is None:
            raise ValueError(f"epochs[{i}] has no field 'epoch'")
        _number(e, "epoch")

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
    lr = _number(opt, "lr") if opt.get("lr") is not None else _number(r, "lr")
    parts = [("optimizer", opt.get("name"))] if opt.get("name") else []
    if lr is not None:
        parts.append(("lr", f"lr {lr:g}"))
    for key in ("momentum", "weight_decay", "clip"):
        if _number(opt, key) is not None:
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
    def drawn(r):  # a run with per-epoch records (its settings, for its label, checked)
        if not epoch_series(r):
            return None
        run_settings(r)
        return r

    runs = [(where, r) for where, r in sourced if _each("epochs", [(where, r)], drawn)]
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
    parsers = {}
    for name in ("throughput", "phases", "curve", "epochs"):
        p = parsers[name] = sub.add_parser(name)
        p.add_argument("files", nargs="+", help="the result files to read (never written)")
        p.add_argument("-o", "--output", required=True,
                       help=f"the chart to write: a .png (or {', .'.join(FORMATS[1:])}) file, "
                       "which must not be one of the files read")
        p.add_argument("--summary", help="write what was drawn as JSON here")
        p.add_argument("--title", help="a title over the whole figure")
        p.add_argument("--dpi", type=int, default=80, help="dots per inch (default 80)")
        if name == "throughput":
            p.add_argument("--x", choices=["batch", "hidden"], default="batch",
                           help="the x axis (default batch)")
            p.add_argument("--model", help="only these models (comma-separated)")
            p.add_argument("--mode", choices=list(MODE_TEXT),
                           help="only these runs (forward+backward: bench_core --backward, no "
                           "update; decode: greedy decoding)")
        if name == "phases":
            p.add_argument("--share", action="store_true",
                           help="each bar as shares of its run's time (100%%)")
    args = parser.parse_args(argv)
    for path in args.files:
        if not os.path.exists(path):
            raise SystemExit(f"report.py: {path}: no such file")
    usage = parsers[args.chart].error
    check_outputs(usage, args.files, [("-o", args.output), ("--summary", args.summary)])
    fmt = os.path.splitext(args.output)[1][1:]
    if fmt.lower() not in FORMATS:
        usage(f"-o {args.output}: " + (f"unsupported extension .{fmt}" if fmt else "no extension")
              + f" (expected a file name ending in .{', .'.join(FORMATS)})")
    if args.dpi < 1:
        usage(f"--dpi {args.dpi}: expected a positive number of dots per inch")
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("report.py: matplotlib is not installed (Debian: apt-get install "
                         "python3-matplotlib; elsewhere: pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
