"""Property test of the extension's structure checks: seeded random valid packed structures, and
the same structures corrupted one field at a time (out-of-range or forward predecessors, cycles,
negative or inconsistent offsets, out-of-range rows and kinds, wrong dtypes, shapes and lengths),
through the built-in cells' op and through user cells (edbatch.nn.Propagate). Each call either
runs or raises ValueError / TypeError with the library's message; nothing may crash the process
(a crash fails the whole pytest run)."""
import random

import pytest
import torch

import edbatch

import structures

H, D = 6, 5
FIELDS = ("node_inputs", "node_types", "pred_ptr", "pred_ids", "arc_types", "arc_inputs",
          "instance_offsets")


def corrupt(packed, rng):
    """A copy of `packed` with one field broken in a random way (or left valid)."""
    p = edbatch.Packed(**{f: getattr(packed, f).clone() for f in FIELDS},
                       input_ids=packed.input_ids, input_kinds=packed.input_kinds,
                       labels=packed.labels)
    name = rng.choice(FIELDS)
    t = getattr(p, name)
    how = rng.choice(["value", "negative", "huge", "dtype", "length", "shape", "valid"])
    if how == "valid":
        return p, "valid"
    if how == "dtype":
        setattr(p, name, t.to(rng.choice([torch.int32, torch.float32])))
    elif how == "length":
        setattr(p, name, torch.cat([t, t[:1]]) if rng.random() < 0.5 or t.numel() == 0 else t[:-1])
    elif how == "shape":
        setattr(p, name, t.view(1, -1))
    elif t.numel():
        i = rng.randrange(t.numel())
        t[i] = {"value": t[i] + rng.choice([-2, -1, 1, 2, 7]), "negative": -rng.randrange(1, 9),
                "huge": 2 ** rng.randrange(31, 62)}[how]
    return p, f"{name}: {how}"


def builtin(packed, x, weights):
    return edbatch.run_cell("random_dag", x, packed, weights, H, num_node_types=3,
                            num_arc_types=3, threads=1)


class UserCell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.W, self.U = torch.nn.Linear(D, H), torch.nn.Linear(H, H, bias=False)

    def forward(self, x, m):
        return torch.tanh(self.W(x) + self.U(m))


@pytest.mark.parametrize("seed", range(4))
def test_random_and_corrupted_structures_run_or_raise(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    weights = [torch.randn(s) * 0.3 for _, s in edbatch.weight_shapes("random_dag", H, D, 3, 3)]
    user = edbatch.nn.Propagate([UserCell() for _ in range(3)], state_size=H, threads=1)
    outcomes = {"ran": 0, "refused": 0}
    for case in range(60):
        base = structures.packed(rng.choice(["dags", "trees", "lattices", "empty"]),
                                 seed * 100 + case)
        base.node_types = base.node_types.clamp(max=2)
        base.arc_types = base.arc_types.clamp(max=2)
        packed, what = corrupt(base, rng)
        rows = max(base.input_ids.numel(), 1)
        x = torch.randn(rows, D, requires_grad=True)
        for run in (lambda: builtin(packed, x, weights), lambda: user(packed, x=x)):
            try:
                out = run()
            except (ValueError, TypeError) as e:
                assert str(e).strip(), what
                outcomes["refused"] += 1
                continue
            outs = out if isinstance(out, (list, tuple)) else [out]
            total = sum(o.sum() for o in outs)
            if torch.is_tensor(total) and total.requires_grad:
                total.backward()
            outcomes["ran"] += 1
    assert outcomes["ran"] > 0 and outcomes["refused"] > 0, outcomes
