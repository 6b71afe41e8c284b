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
