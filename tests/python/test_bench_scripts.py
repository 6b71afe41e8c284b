"""The Python benchmarks of bench/ (bench_torch_ext.py, bench_user_cells.py, bench_beam.py,
torch_nmt.py, torch_baseline.py): their flags (counts checked, every flag described with its
default), their percentiles (those of `edbatch run --json`), the first-mini-batch loss check
that precedes the timing, a diverged run stopped at its first non-finite loss, and the mode
their results carry for scripts/report.py. Runs use the smallest settings: what is checked is
what the scripts write, never how fast anything ran."""
import argparse
import importlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")
sys.path.insert(0, BENCH)

baseline = importlib.import_module("torch_baseline")
nmt = importlib.import_module("torch_nmt")


def _bench(name):
    """A benchmark module that needs the extension, or a skip where it cannot be loaded."""
    try:
        importlib.import_module("edbatch")
    except (ImportError, OSError) as e:
        pytest.skip(f"{name}: the edbatch extension cannot be loaded ({e})")
    return importlib.import_module(name)


def _report():
    spec = importlib.util.spec_from_file_location(
        "edbatch_report_for_benches", os.path.join(HERE, "..", "..", "scripts", "report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def usage_error(capsys, main, *args):
    """The message of a usage error (exit status 2) of main(args)."""
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("values", [[100.0, 200.0], [10.0, 100.0, 110.0], [3.0, 1.0, 2.0, 7.0],
                                    [5.0] * 9 + [50.0]])
def test_percentiles_interpolate_between_ranks(values):
    inclusive = statistics.quantiles(values, n=10, method="inclusive")
    got = [baseline.quantile(sorted(values), q / 10) for q in range(1, 10)]
    assert got == pytest.approx(inclusive)
    # Never outside the values (the exclusive method extrapolates: 70 and 230 for 100, 200).
    assert min(values) <= got[0] <= got[-1] <= max(values)
    assert baseline.quantile(sorted(values), 0.5) == pytest.approx(statistics.median(values))


def test_extension_benchmarks_use_the_same_percentiles():
    ext = _bench("bench_torch_ext")
    times = [4.0, 1.0, 3.0, 2.0]
    assert [ext.quantile(times, q) for q in (0.1, 0.5, 0.9)] == pytest.approx([1.3, 2.5, 3.7])


def test_torch_nmt_reports_percentiles_within_the_rates(capsys):
    args = argparse.Namespace(device="cpu")
    nmt.report("train", args, 8, 2, [200.0, 100.0])
    out = capsys.readouterr().out
    row = json.loads(out.splitlines()[-1])
    assert (row["per_s_p10"], row["per_s_median"], row["per_s_p90"]) == pytest.approx(
        (110.0, 150.0, 190.0))
    assert "(p10 110.0, p90 190.0)" in out


def test_torch_nmt_counts_are_usage_errors(capsys):
    for flag, value in (("--reps", "0"), ("--pairs", "-1"), ("--max-len", "0"),
                        ("--threads", "0"), ("--vocab", "3"), ("--reps", "x")):
        said = usage_error(capsys, nmt.main, flag, value)
        assert f"argument {flag}: expected" in said and repr(value) in said
    said = usage_error(capsys, nmt.main, "--batch", "32,0")
    assert "argument --batch: expected comma-separated positive integers, not '32,0'" in said
    assert nmt.parser().parse_args(["--hidden", "8,16"]).hidden == [8, 16]


def _described(parser, defaults):
    """Every flag of parser has a help text, and --help shows the given defaults."""
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help"
    entries = [" ".join(e.split()) for e in re.split(r"\n  (?=-)", parser.format_help())]
    for flag, default in defaults:
        (entry,) = [e for e in entries if e.startswith(flag + " ")]
        assert entry.endswith(f"(default: {default})"), entry


def test_help_describes_every_flag_and_its_default():
    _described(nmt.parser(), [("--reps", 10), ("--hidden", "128,256"), ("--vocab", 256)])
    _described(baseline.parser(), [("--batch", 32), ("--eager-check-limit", 128),
                                    ("--rtol", 2e-05), ("--check-limit", 0)])
    ext = _bench("bench_torch_ext")
    _described(ext.parser(), [("--reps", 9), ("--eager-reps", 3),
                              ("--models", "tree_lstm,lattice_lstm")])
    cells = _bench("bench_user_cells")
    _described(cells.parser(), [("--steps-per-sync", 1), ("--batch", 32),
                                ("--models", "childsum,lattice")])
    beam = _bench("bench_beam")
    _described(beam.parser(), [("--batch", "32,128"), ("--beam", 4), ("--max-differ", 0.05)])


def test_extension_benchmarks_check_their_counts_and_models(capsys):
    ext = _bench("bench_torch_ext")
    cells = _bench("bench_user_cells")
    for main in (ext.main, cells.main):
        for flag, value in (("--reps", "0"), ("--batch", "0"), ("--hidden", "-8"),
                            ("--batches", "0"), ("--eager-reps", "-1"), ("--warmup", "-1"),
                            ("--threads", "-1")):
            said = usage_error(capsys, main, flag, value)
            assert f"argument {flag}: expected" in said
        assert "--loss-rtol -1.0" in usage_error(capsys, main, "--loss-rtol", "-1")
    said = usage_error(capsys, cells.main, "--steps-per-sync", "0")
    assert "argument --steps-per-sync: expected a positive integer, not '0'" in said
    said = usage_error(capsys, ext.main, "--models", "tree_lstm,tree_gru")
    assert "unknown model(s) 'tree_gru'" in said and "tree_lstm, lattice_lstm" in said
    said = usage_error(capsys, cells.main, "--models", "childsum,tree")
    assert "unknown model(s) 'tree'" in said and "childsum, lattice" in said


def test_first_mini_batch_losses_are_compared(capsys):
    ext = _bench("bench_torch_ext")
    ext.check_first_losses("tree_lstm", {"edbatch": 1000.0, "hand-batched": 1000.05}, 1e-4)
    assert "equal within --loss-rtol 0.0001" in capsys.readouterr().err
    for other in (1000.2, float("nan")):
        with pytest.raises(SystemExit) as stop:
            ext.check_first_losses("tree_lstm", {"edbatch": 1000.0, "node-by-node": other},
                                   1e-4)
        said = str(stop.value)
        assert said.startswith("tree_lstm: the first mini-batch's losses differ beyond")
        assert "node-by-node" in said and "do not compute the same model" in said


def _rows(out):
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


SMALL = ["--hidden", "8", "--batch", "2", "--batches", "1", "--reps", "1", "--eager-reps", "1",
         "--warmup", "0", "--vocab", "20", "--threads", "1"]


def run_script(name, *args):
    """bench/<name> in its own process (the benchmarks set torch's thread counts and edbatch's
    plan cache for the whole process): (exit status, stdout, stderr)."""
    done = subprocess.run([sys.executable, os.path.join(BENCH, name), *args],
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def test_extension_benchmark_rows_are_training_steps():
    _bench("bench_torch_ext")  # skips where the extension cannot be loaded
    code, out, err = run_script("bench_torch_ext.py", "--models", "tree_lstm", *SMALL)
    assert code == 0, err
    assert "tree_lstm: first mini-batch loss edbatch" in err and "equal within" in err
    rows = _rows(out)
    assert {r["impl"] for r in rows} >= {"edbatch", "hand-batched", "node-by-node"}
    report = _report()
    for r in rows:
        assert r["mode"] == "train" and r["train"] is True
        assert report.run_mode(r) == "train"
        assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
    # --eager-reps 0: node by node is not timed, and has no row.
    code, out, err = run_script("bench_torch_ext.py", "--models", "tree_lstm", *SMALL[:-6],
                                "--eager-reps", "0", "--warmup", "0", "--vocab", "20")
    assert code == 0, err
    assert "node-by-node" not in {r["impl"] for r in _rows(out)}


def test_user_cell_rows_are_training_steps():
    _bench("bench_user_cells")
    code, out, err = run_script("bench_user_cells.py", "--models", "childsum", *SMALL)
    assert code == 0, err
    assert "childsum: first mini-batch loss" in err and "equal within" in err
    rows = _rows(out)
    assert rows and all(r["mode"] == "train" and r["train"] is True for r in rows)
    assert all(_report().run_mode(r) == "train" for r in rows)


def test_beam_benchmark_rows_checks_and_usage_errors():
    beam = _bench("bench_beam")
    code, out, err = run_script("bench_beam.py", "--batch", "3,5", "--hidden", "6", "--embed",
                                "4", "--vocab", "12", "--beam", "2", "--max-len", "6",
                                "--reps", "1", "--warmup", "0", "--no-compile")
    assert code == 0, err
    rows = _rows(out)
    assert [(r["batch"], r["impl"]) for r in rows] == [
        (b, i) for b in (3, 5) for i in ("edbatch", "pytorch-module", "pytorch-lstmcell")]
    assert all(r["sent_per_s"] > 0 and 1 <= r["mean_steps"] <= r["max_steps"] <= 6 for r in rows)
    assert all(r["edbatch_speedup"] == 1.0 for r in rows if r["impl"] == "edbatch")
    # The check before the timing: one sentence of four with another best hypothesis stops it.
    args = beam.parser().parse_args([])
    best, tokens, steps = torch.zeros(4), torch.zeros(4, 3, dtype=torch.long), torch.ones(4)
    beam.check_same("B=4", {"edbatch": (best, tokens, steps),
                            "pytorch-module": (best + 1e-5, tokens, steps)}, args)
    other = tokens.clone()
    other[2, 1] = 7
    with pytest.raises(SystemExit, match="differs from edbatch's on 25% of the sentences"):
        beam.check_same("B=4", {"edbatch": (best, tokens, steps),
                                "pytorch-module": (best, other, steps)}, args)
    for bad in (["--batch", "3,x"], ["--batch", "0"], ["--beam", "0"],
                ["--vocab", "6", "--beam", "4"], ["--time-step", "4,0"], ["--time-step", "x"],
                ["--calls"], ["--calls", "--time-step", "4", "--device", "cpu"],
                ["--time-start", "0"], ["--time-start", "3", "--time-step", "3"]):
        code, out, err = run_script("bench_beam.py", *bad)
        assert code == 2 and not out and "error:" in err, bad
    # The decoder's step and reorder alone: a row per row count, 31 steps (a second loop's
    # first step too), so 29 reorders.
    code, out, err = run_script("bench_beam.py", "--time-step", "3,7", "--steps", "31",
                                "--hidden", "6", "--embed", "4")
    assert code == 0, err
    rows = _rows(out)
    assert [(r["bench"], r["rows"], r["steps"]) for r in rows] == [
        ("beam_step", 3, 31), ("beam_step", 7, 31)]
    assert all(0 < r["p10_step_us"] <= r["step_us"] <= r["p90_step_us"] and
               0 < r["p10_reorder_us"] <= r["reorder_us"] <= r["p90_reorder_us"] for r in rows)
    # A loop's start and first step: a row per row count and kind of start state, --reps loops.
    code, out, err = run_script("bench_beam.py", "--time-start", "3,7", "--reps", "4",
                                "--warmup", "1", "--hidden", "6", "--embed", "4")
    assert code == 0, err
    rows = _rows(out)
    assert [(r["bench"], r["rows"], r["states"], r["loops"]) for r in rows] == [
        ("beam_start", R, s, 4) for R in (3, 7) for s in ("zeros", "given")]
    assert all(0 < r["p10_start_us"] <= r["start_us"] <= r["p90_start_us"] and
               0 < r["p10_first_step_us"] <= r["first_step_us"] <= r["p90_first_step_us"]
               for r in rows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_beam_step_counts_cuda_runtime_calls():
    # A step on the device queues its kernels: each counted step launches at least one.
    _bench("bench_beam")
    code, out, err = run_script("bench_beam.py", "--device", "cuda", "--time-step", "5",
                                "--steps", "31", "--hidden", "6", "--embed", "4", "--calls")
    assert code == 0, err
    (row,) = _rows(out)
    calls = row["calls_per_step"]
    assert calls.get("cudaLaunchKernel", 0) >= 1 and "CUDA runtime calls per step" in err


def test_fan_in_benchmark_rows_and_usage_errors():
    _bench("bench_fan_in")
    code, out, err = run_script("bench_fan_in.py", "--fan-in", "3,70", "--reps", "1",
                                "--hidden", "4")
    assert code == 0, err
    rows = _rows(out)
    assert [(r["reduce"], r["fan_in"]) for r in rows] == [
        ("sum", 3), ("sum", 70), ("softmax", 3), ("softmax", 70)]
    assert all(r["median_s"] > 0 and r["us_per_arc"] > 0 for r in rows)
    assert all(r["relative_error"] < 1e-6 for r in rows if r["reduce"] == "sum")
    assert all(r["relative_error"] is None for r in rows if r["reduce"] == "softmax")
    for bad in (["--fan-in", "3,x"], ["--fan-in", "0"], ["--reduce", "min"]):
        code, out, err = run_script("bench_fan_in.py", *bad)
        assert code == 2 and not out and "error:" in err, bad


def test_json_lines_have_no_nan_tokens():
    line = baseline.json_line({"loss": float("nan"), "rates": [1.0, float("inf")],
                               "ms": {"p90": float("-inf")}})
    assert json.loads(line) == {"loss": None, "rates": [1.0, None], "ms": {"p90": None}}
    assert "NaN" not in line and "Infinity" not in line


@pytest.fixture
def tree_files(tmp_path):
    """A few synthetic SST trees and tree_lstm weights (hidden 8, 20 words) for torch_baseline."""
    ext = _bench("bench_torch_ext")
    data = tmp_path / "trees.txt"
    data.write_text("\n".join(ext.synthetic_sst(8, vocab_size=20, seed=1)) + "\n")
    weights = tmp_path / "w.safetensors"
    ext.torch_models.write_safetensors(str(weights), ext.zoo_weights("tree_lstm", 20, 8, 5, 1))
    return ["--model", "tree_lstm", "--data", str(data), "--weights", str(weights),
            "--hidden", "8", "--vocab-size", "20"]


def test_torch_baseline_refuses_checks_of_nothing(capsys, tree_files):
    said = usage_error(capsys, baseline.main, *tree_files, "--check-only", "--check-against",
                       "x.jsonl", "--check-limit", "-1")
    assert "argument --check-limit: expected an integer >= 0, not '-1'" in said
    said = usage_error(capsys, baseline.main, *tree_files, "--check-only", "--check-against",
                       "x.jsonl", "--eager-check-limit", "0")
    assert "argument --eager-check-limit: expected a positive integer, not '0'" in said
    said = usage_error(capsys, baseline.main, *tree_files, "--warmup", "-1")
    assert "argument --warmup: expected an integer >= 0" in said


def run_baseline(*args):
    """torch_baseline.py in its own process (it sets torch's thread counts and malloc's
    settings for the whole process): (exit status, stdout, stderr)."""
    return run_script("torch_baseline.py", *args)


def test_torch_baseline_loss_check_fails_on_nan(tmp_path, tree_files):
    # References that are all NaN: no instance is within tolerance of them.
    ref = tmp_path / "outputs.jsonl"
    ref.write_text("".join(f'{{"instance": {i}, "loss": NaN}}\n' for i in range(8)))
    code, out, err = run_baseline(*tree_files, "--check-only", "--check-against", str(ref),
                                  "--impl", "batched")
    assert code == 1
    assert "loss check FAILED for batched: 8 of 8 instances differ" in err
    result = json.loads(out.splitlines()[0])
    assert result["check"] == "FAIL" and result["mismatches"] == 8


def test_torch_baseline_stops_a_diverged_run(tmp_path, tree_files):
    # Weights with an infinite entry: the loss is not finite from the first step on, whatever
    # the machine's arithmetic does with a large learning rate.
    ext = _bench("bench_torch_ext")
    weights = tmp_path / "inf.safetensors"
    w = ext.zoo_weights("tree_lstm", 20, 8, 5, 1)
    w["W_out"][0, 0] = float("inf")
    ext.torch_models.write_safetensors(str(weights), w)
    args = list(tree_files)
    args[args.index("--weights") + 1] = str(weights)
    code, out, err = run_baseline(*args, "--impl", "batched", "--train", "--lr", "0.1",
                                  "--warmup", "0", "--batch", "4", "--iters", "4")
    assert code == 1
    said = err.strip().splitlines()[-1]
    assert said.startswith("torch_baseline: torch_batched, measured mini-batch 1 of "), err
    assert "the training loss is " in said and "lower --lr" in said
    assert "NaN" not in out and not _rows(out)  # nothing timed is reported