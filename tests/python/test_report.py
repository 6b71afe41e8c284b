"""scripts/report.py renders PNG charts from recorded results (data/report/: a
scripts/bench_torch.sh sweep over two mini-batch sizes, `edbatch run --json` of a forward run and of
a training run by epochs, an `edbatch train --curve` CSV), and draws what the files hold: the
series and points are counted and computed here from the files themselves."""
import csv
import importlib.util
import json
import os
import struct
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "report")
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "report.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("edbatch_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT = _load_script()


def report(tmp_path, *args, ok=True):
    """Runs report.py in this process (matplotlib is imported once); returns what it drew, or
    with ok=False the message it stopped with."""
    png = str(tmp_path / "chart.png")
    summary = str(tmp_path / "summary.json")
    if not ok:
        with pytest.raises(SystemExit) as stop:
            REPORT.main([*args, "-o", png, "--summary", summary])
        return str(stop.value)
    assert REPORT.main([*args, "-o", png, "--summary", summary]) == 0
    with open(png, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 100 and height > 100
    assert os.path.getsize(png) < 200_000
    return json.load(open(summary))


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def test_throughput_against_batch_size(tmp_path):
    path = os.path.join(DATA, "torch_sweep.jsonl")
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if "check" not in r]
    drawn = report(tmp_path, "throughput", path, "--x", "batch")
    # One panel per mode (one model, hidden size and thread count in the file).
    modes = {"train" if r["train"] else "forward" for r in rows}
    assert len(drawn) == len(modes) == 2
    for title, series in drawn.items():
        mode = "train" if ", train," in title else "forward"
        want_impls = {r["impl"].replace("_pipelined", " pipelined") for r in rows
                      if ("train" if r["train"] else "forward") == mode}
        assert set(series) == want_impls
        for impl, points in series.items():
            raw = impl.replace(" pipelined", "_pipelined")
            for batch, per_s in points:
                rounds = [r["instances_per_s"] for r in rows if r["impl"] == raw and
                          r["batch"] == batch and ("train" if r["train"] else "forward") == mode]
                assert len(rounds) == 2
                assert per_s == pytest.approx(median(rounds))
            assert [p[0] for p in points] == sorted({r["batch"] for r in rows})


def test_throughput_against_hidden_size_and_filters(tmp_path):
    path = os.path.join(DATA, "torch_sweep.jsonl")
    drawn = report(tmp_path, "throughput", path, "--x", "hidden", "--mode", "train")
    # Panels per mini-batch size now, training only; every line has the file's one hidden size.
    assert len(drawn) == 2 and all(", train, batch " in t for t in drawn)
    for series in drawn.values():
        assert all([p[0] for p in points] == [16] for points in series.values())
    assert "no throughput results" in report(tmp_path, "throughput", path, "--model", "nope",
                                             ok=False)


def test_phases(tmp_path):
    files = [os.path.join(DATA, f) for f in ("run_forward.json", "run_epochs.json")]
    runs = [json.load(open(f)) for f in files]
    drawn = report(tmp_path, "phases", *files)
    assert len(drawn["bars"]) == 2
    assert drawn["bars"][0].startswith("lattice_lstm\nforward b16 h8")
    for phase in ("construction", "scheduling", "execution"):
        assert drawn["phases"][phase] == [pytest.approx(r[f"{phase}_ms"]["median"]) for r in runs]
    # Backward exists for the training run only; the forward run's bar has none of it.
    assert drawn["phases"]["backward"] == [0.0, pytest.approx(runs[1]["backward_ms"]["median"])]


def test_learning_curve(tmp_path):
    path = os.path.join(DATA, "curve.csv")
    rows = list(csv.DictReader(open(path)))
    drawn = report(tmp_path, "curve", path)
    assert set(drawn) == {"curve: training", "curve: validation"}
    assert drawn["curve: validation"] == [
        [int(r["episode"]), pytest.approx(float(r["validation_batches"]))] for r in rows]


def test_epochs_with_and_without_accuracy(tmp_path):
    path = os.path.join(DATA, "run_epochs.json")
    run = json.load(open(path))
    drawn = report(tmp_path, "epochs", path)
    label = "tree_gru h8 b16: mean loss per instance"
    assert list(drawn) == [label]
    assert drawn[label] == [[e["epoch"], pytest.approx(e["mean_loss_per_instance"])]
                            for e in run["epochs"]]
    # Per-epoch accuracies, when a run records them, go on a second axis as their own series.
    for i, e in enumerate(run["epochs"]):
        e["eval_accuracy"] = 0.2 + 0.1 * i
    with_acc = tmp_path / "acc.json"
    with_acc.write_text(json.dumps(run))
    drawn = report(tmp_path, "epochs", str(with_acc))
    assert drawn["tree_gru h8 b16: eval accuracy"] == [[1, 0.2], [2, pytest.approx(0.3)],
                                                       [3, pytest.approx(0.4)]]
    assert "no per-epoch records" in report(tmp_path, "epochs",
                                            os.path.join(DATA, "run_forward.json"), ok=False)


def test_bad_files_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "tree_lstm"}\nnot json\n')
    assert f"{bad}:2: not JSON" in report(tmp_path, "phases", str(bad), ok=False)
    assert "no such file" in report(tmp_path, "phases", str(tmp_path / "missing.json"), ok=False)
    assert "expected the CSV columns" in report(tmp_path, "curve", str(bad), ok=False)


def test_without_matplotlib_says_so(tmp_path):
    # A matplotlib that cannot be imported, first on the path.
    (tmp_path / "matplotlib.py").write_text("raise ImportError('no matplotlib here')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, SCRIPT, "curve", os.path.join(DATA, "curve.csv"),
                           "-o", str(tmp_path / "x.png")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    assert "matplotlib is not installed" in done.stderr
    assert not (tmp_path / "x.png").exists()


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def test_epochs_draw_held_out_numbers_apart_from_timings(tmp_path):
    files = [os.path.join(DATA, f) for f in ("epochs_sgd.json", "epochs_adam.json")]
    drawn = report(tmp_path, "epochs", *files)
    names = ["mean loss per instance", "held-out loss per instance", "held-out root accuracy",
             "held-out node accuracy"]
    # Two runs of one model and sizes, told apart by optimizer and learning rate.
    for path, run in zip(files, ("tree_lstm h16 b8 (sgd, lr 0.1)",
                                 "tree_lstm h16 b8 (adam, lr 0.001)")):
        epochs = json.load(open(path))["epochs"]
        assert drawn[f"{run}: held-out loss per instance"] == [
            [e["epoch"], pytest.approx(e["eval"]["loss_per_instance"])] for e in epochs]
        assert drawn[f"{run}: held-out root accuracy"] == [
            [e["epoch"], pytest.approx(e["eval"]["root_accuracy"])] for e in epochs]
        assert drawn[f"{run}: mean loss per instance"] == [
            [e["epoch"], pytest.approx(e["mean_loss_per_instance"])] for e in epochs[1:]]
    assert sorted(drawn) == sorted(f"{run}: {n}" for run in ("tree_lstm h16 b8 (sgd, lr 0.1)",
                                                             "tree_lstm h16 b8 (adam, lr 0.001)")
                                   for n in names)
    # Losses on the loss axis, accuracies on the second one; no timings on either.
    plt = _pyplot()
    fig, _ = REPORT.draw_epochs(plt, REPORT.read_results(files, "report.py"), None)
    loss_ax, acc_ax = fig.axes
    assert all("loss" in line.get_label() for line in loss_ax.get_lines())
    assert all("accuracy" in line.get_label() for line in acc_ax.get_lines())
    assert len(loss_ax.get_lines()) == len(acc_ax.get_lines()) == 4
    plt.close(fig)


def test_epochs_of_like_runs_are_named_by_file(tmp_path):
    run = json.load(open(os.path.join(DATA, "epochs_sgd.json")))
    for name in ("first.json", "second.json"):
        (tmp_path / name).write_text(json.dumps(run, indent=1))
    drawn = report(tmp_path, "epochs", str(tmp_path / "first.json"), str(tmp_path / "second.json"))
    assert len(drawn) == 8
    assert "tree_lstm h16 b8 [first.json]: held-out loss per instance" in drawn
    assert "tree_lstm h16 b8 [second.json]: held-out loss per instance" in drawn


def test_throughput_keeps_configurations_apart(tmp_path):
    path = os.path.join(DATA, "configs.jsonl")
    rows = [json.loads(l) for l in open(path)]
    drawn = report(tmp_path, "throughput", path)
    # Forward runs in one panel, the greedy-decoding run in its own.
    assert sorted(drawn) == ["tree_lstm, forward, hidden 16, cpu x1",
                             "tree_lstm, greedy decoding, hidden 16, cpu x1"]
    forward = drawn["tree_lstm, forward, hidden 16, cpu x1"]
    # One series per configuration (none merged into a median of unlike runs).
    assert sorted(p[0][1] for p in forward.values()) == sorted(
        r["instances_per_s"] for r in rows if not r.get("decode"))
    assert forward["edbatch (op level, depth, unpacked)"] == [[32, 6000.0]]
    assert forward["edbatch (blocks, lb-greedy, packed)"] == [[32, 22000.0]]
    assert forward["edbatch pipelined"] == [[32, 26000.0]]
    decode = report(tmp_path, "throughput", path, "--mode", "decode")
    assert decode == {"tree_lstm, greedy decoding, hidden 16, cpu x1": {"edbatch": [[32, 3000.0]]}}


def test_bench_core_and_bench_blocks_rows_stay_apart(tmp_path):
    path = os.path.join(DATA, "bench_core_blocks.jsonl")
    rows = [json.loads(l) for l in open(path)]
    (series,) = report(tmp_path, "throughput", path).values()
    assert len(series) == len(rows) == 5
    assert sorted(p[0][1] for p in series.values()) == pytest.approx(
        sorted(r["trees_per_s"] for r in rows))
    assert "edbatch op level (bench_core, depth)" in series
    assert "edbatch op level (bench_blocks, lb-greedy)" in series


def test_phases_label_what_sets_runs_apart(tmp_path):
    drawn = report(tmp_path, "phases", os.path.join(DATA, "configs.jsonl"))
    bars = drawn["bars"]
    assert len(bars) == len(set(bars)) == 7
    assert bars[2] == "tree_lstm\nforward b32 h16\nop level\ndepth\nunpacked\nnot pipelined"
    assert bars[6].startswith("tree_lstm\ngreedy decoding b32 h16")


def test_throughput_that_is_not_a_number_is_named(tmp_path):
    run = json.load(open(os.path.join(DATA, "run_forward.json")))
    run["instances_per_s"] = float("nan")
    one = tmp_path / "nan.json"
    one.write_text(json.dumps(run, indent=2))
    said = report(tmp_path, "throughput", str(one), ok=False)
    assert said.startswith(f"report.py throughput: {one}: instances_per_s is nan")
    lines = tmp_path / "zero.jsonl"
    ok = json.load(open(os.path.join(DATA, "run_forward.json")))
    lines.write_text(json.dumps(ok) + "\n" + json.dumps(dict(ok, instances_per_s=0.0)) + "\n")
    assert f"{lines}:2: instances_per_s is 0.0" in report(tmp_path, "throughput", str(lines),
                                                          ok=False)


def test_curve_names_the_validation_lower_bound():
    plt = _pyplot()
    fig, _ = REPORT.draw_curve(plt, [os.path.join(DATA, "curve.csv")], None)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["curve: training", "curve: validation", "curve: validation lower bound"]
    plt.close(fig)


def test_docs_charts_help_and_unknown_arguments(tmp_path):
    # A copy of the script in an empty tree: nothing may be written next to it.
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "docs_charts.sh"
    script.write_text(open(os.path.join(HERE, "..", "..", "scripts", "docs_charts.sh")).read())
    env = dict(os.environ, PYTHON="false")
    for flag in ("--help", "-h"):
        done = subprocess.run(["bash", str(script), flag], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("usage: ")
    done = subprocess.run(["bash", str(script), "--bogus"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "unknown argument '--bogus'" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scripts"]


def usage_error(capsys, *args):
    """Runs report.py with args that it must refuse as a usage error (exit status 2) before
    writing anything; returns the message."""
    with pytest.raises(SystemExit) as stop:
        REPORT.main(list(args))
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_outputs_never_replace_inputs(tmp_path, capsys):
    run = tmp_path / "run.json"
    run.write_text(open(os.path.join(DATA, "run_forward.json")).read())
    before = run.read_bytes()
    png = str(tmp_path / "chart.png")
    said = usage_error(capsys, "phases", str(run), "-o", png, "--summary", str(run))
    assert f"--summary {run}: is the input file {run}" in said
    # The same file by another name: a hard link, a symbolic link, a path through "..".
    os.link(run, tmp_path / "hard.json")
    os.symlink(run, tmp_path / "soft.json")
    (tmp_path / "sub").mkdir()
    for other in ("hard.json", "soft.json", os.path.join("sub", "..", "run.json")):
        said = usage_error(capsys, "phases", str(run), "-o", png, "--summary",
                           str(tmp_path / other))
        assert "is the input file" in said
    said = usage_error(capsys, "throughput", str(run), "-o", str(tmp_path / "hard.json"))
    assert "-o" in said and "is the input file" in said
    said = usage_error(capsys, "throughput", str(run), "-o", png, "--summary", png)
    assert "is the file -o writes too" in said
    assert run.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.json", "run.json", "soft.json",
                                                          "sub"]


def test_output_paths_that_cannot_be_written_are_usage_errors(tmp_path, capsys):
    run = os.path.join(DATA, "run_forward.json")
    said = usage_error(capsys, "throughput", run, "-o", str(tmp_path / "nodir" / "x.png"))
    assert "no directory" in said and "nodir" in said
    said = usage_error(capsys, "throughput", run, "-o", str(tmp_path / "out.txt"))
    assert "unsupported extension .txt" in said and ".png" in said
    said = usage_error(capsys, "throughput", run, "-o", str(tmp_path / "noext"))
    assert "no extension" in said and ".png" in said
    (tmp_path / "d").mkdir()
    said = usage_error(capsys, "throughput", run, "-o", str(tmp_path / "d"))
    assert "is a directory" in said
    said = usage_error(capsys, "throughput", run, "-o", str(tmp_path / "x.png"), "--summary",
                       str(tmp_path / "nodir" / "s.json"))
    assert "--summary" in said and "no directory" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert list((tmp_path / "d").iterdir()) == []
    # Another format that matplotlib writes.
    assert REPORT.main(["throughput", run, "-o", str(tmp_path / "x.svg")]) == 0
    assert (tmp_path / "x.svg").read_text().lstrip().startswith("<?xml")


def write_records(tmp_path, *records):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_modes_of_the_benchmarks(tmp_path):
    core = json.loads(open(os.path.join(DATA, "bench_core_blocks.jsonl")).readline())
    ext = {"bench": "torch_ext", "model": "tree_lstm", "impl": "edbatch", "mode": "train",
           "train": True, "device": "cpu", "batch": 32, "hidden": 32, "threads": 1,
           "median_ms": 4.0, "p10_ms": 3.0, "p90_ms": 5.0}
    path = write_records(tmp_path, ext, dict(core, backward=True),
                         dict(core, backward=False, policy="agenda"))
    drawn = report(tmp_path, "throughput", path)
    # bench_torch_ext's training steps are training; bench_core --backward updates nothing.
    assert sorted(drawn) == sorted(["tree_lstm, forward, hidden 32, cpu x1",
                                    "tree_lstm, forward+backward, hidden 32, cpu x1",
                                    "tree_lstm, train, hidden 32, cpu x1"])
    assert drawn["tree_lstm, train, hidden 32, cpu x1"] == {"edbatch": [[32, 8000.0]]}
    only = report(tmp_path, "throughput", path, "--mode", "forward+backward")
    assert list(only) == ["tree_lstm, forward+backward, hidden 32, cpu x1"]
    bars = report(tmp_path, "phases", path)["bars"]
    assert [b.split("\n")[1] for b in bars] == ["forward+backward b32 h32", "forward b32 h32"]


def test_bars_at_different_sizes_say_each_size(tmp_path):
    rows = [{"model": "tree_lstm", "impl": "edbatch", "batch": 4, "hidden": 8, "threads": 1,
             "train": False, "instances_per_s": 20000.0},
            {"model": "tree_lstm", "impl": "torch_batched", "batch": 64, "hidden": 8,
             "threads": 1, "train": False, "instances_per_s": 500.0}]
    args = REPORT.argparse.Namespace(x="batch", model=None, mode=None)
    plt = _pyplot()
    for batches, title, ticks in (
            ((4, 64), "tree_lstm, forward, hidden 8, cpu x1",
             ["edbatch\nbatch 4", "torch batched\nbatch 64"]),
            ((4, 4), "tree_lstm, forward, hidden 8, cpu x1, batch 4",
             ["edbatch", "torch batched"])):
        sourced = [("r", dict(r, batch=b)) for r, b in zip(rows, batches)]
        fig, _ = REPORT.draw_throughput(plt, sourced, args)
        (ax,) = fig.axes
        assert ax.get_title() == title
        assert [t.get_text() for t in ax.get_xticklabels()] == ticks
        plt.close(fig)


@pytest.mark.parametrize("chart,change,message", [
    ("throughput", {"instances_per_s_min": 900.0}, "instances_per_s_min without "
     "instances_per_s_max"),
    ("throughput", {"batch": "16"}, 'batch is "16", not a positive integer'),
    ("throughput", {"hidden": 0}, "hidden is 0, not a positive integer"),
    ("throughput", {"mode": "eval"}, 'mode is "eval", expected one of forward, '),
    ("throughput", {"instances_per_s": None}, "instances_per_s is null"),
    ("throughput", {"ms_per_minibatch": {"median": "fast"}, "instances_per_s": 1.0},
     'ms_per_minibatch.median is "fast", not a number'),
    ("phases", {"mode": "eval"}, 'mode is "eval"'),
    ("phases", {"execution_ms": {"median": None, "p10": 1.0}, "construction_ms": "1"},
     'construction_ms is "1", not a number'),
    ("epochs", {"epochs": 8}, "epochs is 8, not a list of per-epoch objects"),
    ("epochs", {"epochs": [{"mean_loss_per_instance": 1.0}]}, "epochs[0] has no field 'epoch'"),
    ("epochs", {"epochs": [{"epoch": "1", "mean_loss_per_instance": 1.0}]},
     'epoch is "1", not a number'),
    ("epochs", {"lr": "fast"}, 'lr is "fast", not a number'),
])
def test_fields_of_the_wrong_kind_are_named(tmp_path, chart, change, message):
    base = "run_epochs.json" if chart == "epochs" else "run_forward.json"
    run = json.load(open(os.path.join(DATA, base)))
    path = write_records(tmp_path, run, dict(run, **change))
    said = report(tmp_path, chart, path, ok=False)
    assert said.startswith(f"report.py {chart}: {path}:2: {message}"), said


def test_partial_benchmark_lines_are_named(tmp_path):
    block = {"bench": "block_tree_lstm", "batch": 4, "hidden": 8, "trees_per_s": 100.0}
    path = write_records(tmp_path, block)  # one line: named by its file
    said = report(tmp_path, "throughput", path, ok=False)
    assert said.startswith(f"report.py throughput: {path}: no field 'form'")
    # bench_core --reps 0: no time measured, so no throughput (null), not 0.
    core = json.loads(open(os.path.join(DATA, "bench_core_blocks.jsonl")).readline())
    path = write_records(tmp_path, dict(core, trees_per_s=None, ms_per_batch=0.0, ms_p10=0.0,
                                        ms_p90=0.0))
    assert f"{path}: trees_per_s is null" in report(tmp_path, "throughput", path, ok=False)


def test_curve_cells_that_are_not_numbers_are_named(tmp_path):
    rows = open(os.path.join(DATA, "curve.csv")).read().splitlines()
    head = rows[0].split(",")
    cells = rows[2].split(",")
    cells[head.index("validation_batches")] = "many"
    bad = tmp_path / "curve.csv"
    bad.write_text("\n".join(rows[:2] + [",".join(cells)] + rows[3:]) + "\n")
    said = report(tmp_path, "curve", str(bad), ok=False)
    assert said == f"report.py curve: {bad}:3: validation_batches is 'many', not a number"
