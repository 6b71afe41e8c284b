"""`edbatch run` against the independent PyTorch models of bench/torch_models.py (node by node and
hand-batched by level): per-instance losses of a forward pass, and the weights after one SGD
training step, on seeded synthetic data at an awkward hidden size. The CLI is the program
EDBATCH_CLI names (CTest's python_cli_torch sets it)."""

import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
CLI = os.environ.get("EDBATCH_CLI")
pytestmark = pytest.mark.skipif(not CLI, reason="EDBATCH_CLI (the edbatch program) is not set")

HIDDEN = "24"


def run(*args):
    done = subprocess.run(list(args), capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def baseline(*args):
    return run(sys.executable, os.path.join(BENCH, "torch_baseline.py"), *args)


@pytest.mark.parametrize("model", ["tree_lstm", "lattice_lstm"])
def test_forward_losses_and_one_training_step(tmp_path, model):
    data, step_data = str(tmp_path / "data.txt"), str(tmp_path / "step.txt")
    weights, stepped = str(tmp_path / "w.safetensors"), str(tmp_path / "s.safetensors")
    outputs = str(tmp_path / "out.jsonl")
    common = ["--model", model, "--hidden", HIDDEN]
    run(CLI, "run", *common, "--seed", "5", "--data", "synthetic:45", "--write-data", data)
    run(CLI, "run", *common, "--seed", "5", "--batch", "13", "--data", data, "--iters", "1",
        "--warmup", "0", "--outputs", outputs, "--save-weights", weights)
    out = baseline(*common, "--data", data, "--weights", weights, "--check-against", outputs,
                   "--check-only", "--impl", "both", "--eager-check-limit", "45")
    assert out.count('"check": "pass"') == 2, out

    # One plain SGD step on 19 instances as one mini-batch, from the same weights.
    run(CLI, "run", *common, "--seed", "6", "--data", "synthetic:19", "--write-data", step_data)
    run(CLI, "run", *common, "--batch", "19", "--data", step_data, "--load-weights", weights,
        "--train", "--clip", "0", "--iters", "1", "--warmup", "0", "--save-weights", stepped)
    out = baseline(*common, "--data", step_data, "--weights", weights, "--check-train-step",
                   stepped, "--impl", "both")
    assert out.count('"check": "pass"') == 2, out


def test_the_step_check_sees_a_different_step(tmp_path):
    """Clipping to a small norm changes the step: the check must notice (it is not vacuous)."""
    data, weights, stepped = (str(tmp_path / n) for n in ("d.txt", "w.st", "s.st"))
    common = ["--model", "tree_lstm", "--hidden", HIDDEN]
    run(CLI, "run", *common, "--seed", "7", "--data", "synthetic:11", "--write-data", data)
    run(CLI, "run", *common, "--data", data, "--iters", "1", "--warmup", "0",
        "--save-weights", weights)
    run(CLI, "run", *common, "--batch", "11", "--data", data, "--load-weights", weights,
        "--train", "--clip", "0.01", "--iters", "1", "--warmup", "0", "--save-weights", stepped)
    done = subprocess.run([sys.executable, os.path.join(BENCH, "torch_baseline.py"), *common,
                           "--data", data, "--weights", weights, "--check-train-step", stepped,
                           "--impl", "batched"], capture_output=True, text=True)
    assert done.returncode != 0 and '"check": "FAIL"' in done.stdout, done.stdout + done.stderr
