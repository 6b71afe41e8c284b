"""Random user cells: seeded random programs over the supported operations (products with
weights, elementwise math, broadcasting feature reductions, slices, concatenation, layer norm,
softmax), whose intermediate values feed several later operations, some of them none at all,
traced and run over random trees, lattices and DAGs with random reductions and edge cells.
Outputs and gradients equal the same cells applied node by node in float64, within a few times
the error of that eager reference run in float32 (random programs of norms and divisions
amplify rounding differently from node to node, so a fixed tolerance would fail on rounding or
hide real errors), and CUDA equals the CPU where a GPU is present
(test_propagate_cuda.assert_cuda_equals_cpu).

What the fixed per-operation cells of cells.OPS do not reach: operations in random orders and
widths, a value read by several steps of a chain, values sliced at random offsets, chains of
widths that change midway, and cells whose dead values trace to nothing."""
import copy
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edbatch

import structures
from test_propagate import gradients, inputs_for, reference_of
from test_propagate_cuda import assert_cuda_equals_cpu

D = 5
WIDTHS = (1, 3, 7, 13)

# Operations on one value (each keeps the width; values stay bounded over deep structures).
UNARY = {
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu,
    "softplus": F.softplus, "exp": lambda v: torch.exp(torch.tanh(v)),
    "log": lambda v: torch.log(v * v + 1), "sqrt": lambda v: torch.sqrt(v * v + 0.5),
    "neg": lambda v: -v, "affine": lambda v: 0.5 * v - 0.25, "div": lambda v: v / 3,
    "rdiv": lambda v: 1 / (v * v + 1), "softmax": lambda v: torch.softmax(v, -1),
    "log_softmax": lambda v: F.log_softmax(v, dim=-1) / 4,
}
# Operations on two values of one width, or a value and a (batch, 1) value that broadcasts.
BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "/": lambda a, b: a / (b * b + 1)}
# Reductions over the features, kept as a (batch, 1) value.
REDUCE = {"sum": lambda v: v.sum(-1, keepdim=True) / v.shape[-1],
          "mean": lambda v: v.mean(-1, keepdim=True),
          "amax": lambda v: v.amax(-1, keepdim=True)}


def _small(module, scale=0.5):
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(scale)
    return module


class RandomCell(nn.Module):
    """A cell (input, message) -> state of `size` whose body is a random program of `steps`
    operations. Values 0 and 1 are projections of the input and the message; each step appends
    one value computed from earlier ones (the latest more often); the state is tanh of a sum of
    products: of the last value and of every value no step reads. A step is (kind, parameter,
    the indices of the values it reads...): the operation's name, a layer's index, or a slice's
    (start, width)."""

    def __init__(self, seed, size, input_size, message_size, steps=10):
        super().__init__()
        rng = random.Random(seed)
        width0 = rng.choice(WIDTHS[1:])
        self.x_in = nn.Linear(input_size, width0)
        self.m_in = _small(nn.Linear(message_size, width0), 0.3)
        self.layers = nn.ModuleList()
        self.norms = nn.ModuleList()
        self.program, widths = [], [width0, width0]
        for _ in range(steps):
            a = self._pick(rng, widths)
            kind = rng.choice(["unary", "unary", "binary", "binary", "linear", "slice", "cat",
                               "reduce", "norm"])
            w = widths[a]
            if kind == "unary":
                op = rng.choice(sorted(UNARY))
                if op in ("softmax", "log_softmax") and w == 1:
                    op = "tanh"
                self.program.append(("unary", op, a))
            elif kind == "binary":
                op = rng.choice(sorted(BINARY))
                same = [j for j, wj in enumerate(widths) if (wj == w or wj == 1) and
                        (j != a or op != "-")]  # (a - a is zero: its gradients test nothing)
                if not same:
                    same, op = [a], "*"
                b = rng.choice(same)
                self.program.append(("binary", op, a, b))
                w = max(w, widths[b])
            elif kind == "linear":
                w = rng.choice(WIDTHS)
                self.layers.append(_small(nn.Linear(widths[a], w, bias=rng.random() < 0.7)))
                self.program.append(("linear", len(self.layers) - 1, a))
            elif kind == "slice" and w > 1:
                start = rng.randrange(w)
                w = rng.randint(1, w - start)
                self.program.append(("slice", (start, w), a))
            elif kind == "cat":
                b = self._pick(rng, widths)
                self.program.append(("cat", None, a, b))
                w += widths[b]
            elif kind == "reduce":
                self.program.append(("reduce", rng.choice(sorted(REDUCE)), a))
                w = 1
            elif kind == "norm" and w > 1:
                self.norms.append(nn.LayerNorm(w, elementwise_affine=rng.random() < 0.7))
                self.program.append(("norm", len(self.norms) - 1, a))
            else:
                self.program.append(("unary", "tanh", a))
            widths.append(w)
        # Every value no step reads reaches the state through a product of its own.
        read = {j for step in self.program for j in step[2:]}
        self.sinks = [j for j in range(len(widths) - 1) if j not in read]
        self.last = nn.Linear(widths[-1], size)
        self.outs = nn.ModuleList(_small(nn.Linear(widths[j], size, bias=False), 0.3)
                                  for j in self.sinks)
        self.dead = rng.randrange(len(widths))

    @staticmethod
    def _pick(rng, widths):
        """An earlier value: the latest one half of the time."""
        return len(widths) - 1 if rng.random() < 0.5 else rng.randrange(len(widths))

    def forward(self, x, m):
        values = [self.x_in(x), self.m_in(m)]
        for kind, param, *args in self.program:
            a = [values[j] for j in args]
            if kind == "unary":
                v = UNARY[param](*a)
            elif kind == "binary":
                v = BINARY[param](*a)
            elif kind == "linear":
                v = self.layers[param](*a)
            elif kind == "slice":
                v = a[0][:, param[0]:param[0] + param[1]]
            elif kind == "cat":
                v = torch.cat(a, -1)
            elif kind == "reduce":
                v = REDUCE[param](*a)
            else:
                v = self.norms[param](*a)
            values.append(v)
        torch.sigmoid(values[self.dead]) * 2  # traced, and read by nothing
        out = self.last(values[-1])
        for j, layer in zip(self.sinks, self.outs):
            out = out + layer(values[j])
        return torch.tanh(out)


class RandomEdge(nn.Module):
    """Edge cell (source state, arc input) -> message: a RandomCell over them."""

    def __init__(self, seed, size, input_size):
        super().__init__()
        self.cell = RandomCell(seed, size, input_size, size, steps=6)

    def forward(self, state, x):
        return self.cell(x, state)


def random_model(seed, size, kinds=2):
    rng = random.Random(seed)
    nodes = [RandomCell(seed * 10 + k, size, D, size) for k in range(kinds)]
    edges = [RandomEdge(seed * 10 + 5 + k, size, D) for k in range(3)] if rng.random() < 0.6 \
        else None
    return edbatch.nn.Propagate(nodes, edges, reduce=rng.choice(["sum", "mean", "max"]),
                                state_size=size)


def random_packed(seed):
    kind = ["trees", "lattices", "dags"][seed % 3]
    packed = structures.packed(kind, seed, edge_inputs="parent")
    packed.node_types = (packed.pred_ptr[1:] > packed.pred_ptr[:-1]).long()  # leaf 0, inner 1
    packed.arc_types = packed.arc_types.clamp(max=2)
    return packed


def assert_as_exact_as_eager(model, packed, seed):
    """Outputs and gradients (of every parameter and of x): ours, and the eager reference in
    float32, against the eager reference in float64; ours may be off by 8 times the float32
    reference's largest error, or 2e-5 of the largest value, whichever is more."""
    x = inputs_for(packed, seed)["x"]
    params = list(model.parameters()) + [x]
    ours = model(packed, x=x)
    eager = reference_of(model, packed, {"x": x})
    model64, x64 = copy.deepcopy(model).double(), x.detach().double().requires_grad_()
    truth = reference_of(model64, packed, {"x": x64})
    upstream = torch.randn(truth.shape, generator=torch.Generator().manual_seed(seed + 7))
    got = [ours] + gradients([ours], [upstream], params)
    want = [eager] + gradients([eager], [upstream], params)
    exact = [truth] + gradients([truth], [upstream.double()], list(model64.parameters()) + [x64])
    names = ["output"] + [n for n, _ in model.named_parameters()] + ["x"]
    for name, a, b, c in zip(names, got, want, exact):
        if c is None:
            assert a is None or not a.any(), name
            continue
        assert a is not None and a.shape == c.shape, name
        tol = max(8 * (b.double() - c).abs().max().item(), 2e-5 * max(1.0, c.abs().max().item()))
        err = (a.double() - c).abs().max().item()
        assert err <= tol, f"{name}: off by {err:.3g} from float64 (allowed {tol:.3g})"


@pytest.mark.parametrize("seed", range(12))
def test_random_cells_equal_their_eager_reference(backend, seed):
    torch.manual_seed(seed)
    model = random_model(seed, [7, 13, 129][seed % 3])
    assert_as_exact_as_eager(model, random_packed(seed), seed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("seed", range(12))
def test_random_cells_on_cuda_equal_the_cpu(seed):
    torch.manual_seed(seed)
    model = random_model(seed, [7, 13, 129][seed % 3])
    assert_cuda_equals_cpu(model, random_packed(seed), seed=seed)
