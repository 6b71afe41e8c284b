"""edbatch's optimizers (edbatch/optim.h) against torch.optim over several steps: the C++
optimizers run in tests/tools/optim_steps.cpp (the program EDBATCH_OPTIM_STEPS names; CTest's
python_optim sets it) on parameters and gradients this test draws, and PyTorch's SGD, Adam,
Adagrad, SparseAdam and clip_grad_norm_ run on the same data. Where PyTorch has no counterpart
(lazy lookup-table updates with momentum or weight decay), the documented formula written here
is the reference."""

import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from torch_models import read_safetensors, write_safetensors  # noqa: E402

STEPS_PROGRAM = os.environ.get("EDBATCH_OPTIM_STEPS")
pytestmark = pytest.mark.skipif(not STEPS_PROGRAM,
                                reason="EDBATCH_OPTIM_STEPS (edbatch_optim_steps) is not set")

DENSE = {"W": [7, 3], "b": [13], "s": [1], "V": [5, 11]}  # awkward sizes; [1]: a 1x1
STEPS = 5


def draw(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    init = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=gen) * (1 + k) for n, s in shapes.items()}
             for k in range(STEPS)]
    return init, grads


def edbatch_steps(tmp_path, init, grads, meta, rows=None):
    """Values after each step ([{name: tensor}] per step) and the final state."""
    tensors = {f"param.{n}": t for n, t in init.items()}
    for k, g in enumerate(grads, 1):
        tensors.update({f"grad.{k}.{n}": t for n, t in g.items()})
        for n, r in (rows[k - 1] if rows else {}).items():
            tensors[f"rows.{k}.{n}"] = torch.tensor(r, dtype=torch.float32)
    meta = {"steps": len(grads), **meta}
    write_safetensors(tmp_path / "in.safetensors", tensors, meta)
    subprocess.run([STEPS_PROGRAM, str(tmp_path / "in.safetensors"),
                    str(tmp_path / "out.safetensors")], check=True)
    out = read_safetensors(tmp_path / "out.safetensors")
    values = [{n: out[f"{k}.{n}"] for n in init} for k in range(1, len(grads) + 1)]
    state = {n[len("state."):]: t for n, t in out.items() if n.startswith("state.")}
    return values, state


def torch_steps(init, grads, make, clip=0.0, grad_scale=1.0, sparse=()):
    """The same steps through torch.optim: gradients scaled, clipped, then the optimizers step.
    Tables in `sparse` get a sparse gradient of their nonzero rows."""
    params = {n: torch.nn.Parameter(t.clone()) for n, t in init.items()}
    opts = make(params)
    values = []
    for g in grads:
        for n, p in params.items():
            grad = g[n] * grad_scale
            if n in sparse:
                rows = grad.abs().sum(1).nonzero().squeeze(1)
                grad = torch.sparse_coo_tensor(rows.unsqueeze(0), grad[rows], grad.shape)
            p.grad = grad
        if clip:
            torch.nn.utils.clip_grad_norm_(params.values(), clip)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        values.append({n: p.detach().clone() for n, p in params.items()})
    return values, opts


def assert_steps(ours, theirs, rtol=2e-5, atol=2e-6):
    for k, (a, b) in enumerate(zip(ours, theirs), 1):
        for n in a:
            torch.testing.assert_close(a[n], b[n], rtol=rtol, atol=atol,
                                       msg=lambda m: f"step {k}, {n}: {m}")


CASES = [
    ("sgd", {"lr": 0.07}, lambda p: [torch.optim.SGD(p.values(), lr=0.07)]),
    ("sgd", {"lr": 0.03, "momentum": 0.8, "weight_decay": 0.01},
     lambda p: [torch.optim.SGD(p.values(), lr=0.03, momentum=0.8, weight_decay=0.01)]),
    ("momentum", {"weight_decay": 0.003},
     lambda p: [torch.optim.SGD(p.values(), lr=0.01, momentum=0.9, weight_decay=0.003)]),
    ("adam", {}, lambda p: [torch.optim.Adam(p.values())]),
    ("adam", {"lr": 0.02, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6, "weight_decay": 0.02},
     lambda p: [torch.optim.Adam(p.values(), lr=0.02, betas=(0.8, 0.95), eps=1e-6,
                                 weight_decay=0.02)]),
    ("adagrad", {}, lambda p: [torch.optim.Adagrad(p.values(), lr=0.05)]),
    ("adagrad", {"lr": 0.3, "eps": 1e-6, "weight_decay": 0.01},
     lambda p: [torch.optim.Adagrad(p.values(), lr=0.3, eps=1e-6, weight_decay=0.01)]),
]


@pytest.mark.parametrize("clip,grad_scale", [(0.0, 1.0), (0.7, 1 / 3), (1e3, 0.25)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_dense_steps_equal_torch_optim(tmp_path, case, clip, grad_scale):
    name, hyper, make = CASES[case]
    init, grads = draw(DENSE, 11 + case)
    meta = {"optimizer": name, "clip": clip, "grad_scale": grad_scale, **hyper}
    ours, state = edbatch_steps(tmp_path, init, grads, meta)
    theirs, opts = torch_steps(init, grads, make, clip=clip, grad_scale=grad_scale)
    assert_steps(ours, theirs)
    # The state under PyTorch's names.
    params = opts[0].param_groups[0]["params"]
    for n, p in zip(init, params):
        for slot, value in opts[0].state[p].items():
            if slot != "step" and value is not None:
                torch.testing.assert_close(state[f"{n}.{slot}"], value, rtol=2e-5, atol=2e-6)


def test_clipping_scales_the_global_norm_exactly(tmp_path):
    # Plain SGD at lr 1: the step is the clipped gradient, whose global norm is the clip.
    init, grads = draw(DENSE, 5)
    ours, _ = edbatch_steps(tmp_path, init, grads[:1], {"optimizer": "sgd", "lr": 1.0,
                                                         "clip": 0.5, "grad_scale": 2.0})
    step = torch.cat([(init[n] - ours[0][n]).reshape(-1) for n in init])
    raw = torch.cat([g.reshape(-1) for g in grads[0].values()])
    assert float(2 * raw.norm()) > 0.5
    torch.testing.assert_close(step, raw * (0.5 / raw.norm()), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(step.norm(), torch.tensor(0.5), rtol=1e-5, atol=0)


VOCAB, DIM = 17, 6


def table_steps(seed):
    """A table E of VOCAB x DIM and a dense W; step k touches a few rows of E (at least one)."""
    init, grads = draw({"E": [VOCAB, DIM], "W": [3, 5]}, seed)
    gen = torch.Generator().manual_seed(seed + 100)
    rows = []
    for g in grads:
        touched = sorted(set(torch.randint(VOCAB, (4,), generator=gen).tolist()))
        mask = torch.zeros(VOCAB, 1)
        mask[touched] = 1
        g["E"] = g["E"] * mask
        rows.append({"E": touched})
    return init, grads, rows


SPARSE_CASES = [
    ("sgd", {"lr": 0.2}, lambda p: [torch.optim.SGD(p.values(), lr=0.2)]),
    ("adagrad", {"lr": 0.1}, lambda p: [torch.optim.Adagrad(p.values(), lr=0.1)]),
    # SparseAdam divides eps by sqrt(1 - beta2^t) (edbatch: eps after the bias correction, as
    # Adam), a relative difference of eps / sqrt(v_hat (1 - beta2^t)), below 1e-6 here.
    ("adam", {"lr": 0.01}, lambda p: [torch.optim.Adam([p["W"]], lr=0.01),
                                      torch.optim.SparseAdam([p["E"]], lr=0.01)]),
]


@pytest.mark.parametrize("case", range(len(SPARSE_CASES)))
def test_lazy_lookup_tables_equal_sparse_torch_optim(tmp_path, case):
    name, hyper, make = SPARSE_CASES[case]
    init, grads, rows = table_steps(40 + case)
    ours, _ = edbatch_steps(tmp_path, init, grads, {"optimizer": name, "lookups": "E", **hyper},
                            rows)
    theirs, _ = torch_steps(init, grads, make, sparse=("E",))
    assert_steps(ours, theirs)
    # Rows never touched keep their values.
    never = sorted(set(range(VOCAB)) - {r for step in rows for r in step["E"]})
    assert never, "every row was touched: draw fewer"
    torch.testing.assert_close(ours[-1]["E"][never], init["E"][never], rtol=0, atol=0)


@pytest.mark.parametrize("name,hyper,make", [
    ("sgd", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.02},
     lambda p: [torch.optim.SGD(p.values(), lr=0.05, momentum=0.9, weight_decay=0.02)]),
    ("adam", {"lr": 0.01, "weight_decay": 0.01},
     lambda p: [torch.optim.Adam(p.values(), lr=0.01, weight_decay=0.01)]),
    ("adagrad", {"lr": 0.1, "weight_decay": 0.01},
     lambda p: [torch.optim.Adagrad(p.values(), lr=0.1, weight_decay=0.01)]),
])
def test_dense_lookup_tables_equal_dense_torch_optim(tmp_path, name, hyper, make):
    # sparse_lookups = false: every column of a table steps, as PyTorch's optimizers step a dense
    # nn.Embedding gradient (zero rows included: momentum and weight decay move them).
    init, grads, rows = table_steps(60)
    meta = {"optimizer": name, "lookups": "E", "sparse_lookups": 0, "clip": 2.0, **hyper}
    ours, _ = edbatch_steps(tmp_path, init, grads, meta, rows)
    theirs, _ = torch_steps(init, grads, make, clip=2.0)
    assert_steps(ours, theirs)


def test_lazy_momentum_and_weight_decay_follow_the_formula(tmp_path):
    # No PyTorch optimizer takes sparse gradients with momentum or weight decay: the reference is
    # the documented rule on the touched rows only, g = s grad + wd w, b = mu b + g, w -= lr b.
    lr, mu, wd, scale = 0.05, 0.9, 0.02, 0.5
    init, grads, rows = table_steps(80)
    meta = {"optimizer": "sgd", "lookups": "E", "lr": lr, "momentum": mu, "weight_decay": wd,
            "grad_scale": scale}
    ours, state = edbatch_steps(tmp_path, init, grads, meta, rows)
    w = {n: t.double().clone() for n, t in init.items()}
    b = {n: torch.zeros_like(t) for n, t in w.items()}
    for k, g in enumerate(grads):
        for n in w:
            r = rows[k]["E"] if n == "E" else slice(None)
            step = scale * g[n].double()[r] + wd * w[n][r]
            b[n][r] = mu * b[n][r] + step
            w[n][r] -= lr * b[n][r]
        for n in w:
            torch.testing.assert_close(ours[k][n].double(), w[n], rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(state["E.momentum_buffer"].double(), b["E"], rtol=2e-5, atol=2e-6)
