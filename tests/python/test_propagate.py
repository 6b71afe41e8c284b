"""edbatch.nn.Propagate with user cells: outputs and gradients (of x and of every parameter)
equal the user's own cells applied node by node in eager PyTorch (reference.propagate_reference),
on seeded trees of mixed arity, lattices, DAGs, single-node instances and empty batches.

Every case runs on two backends (conftest.py's `backend`): "program", the traced program run in
Python (program_runner.py: checks the tracer and the program format without the extension's op),
and "op", torch.ops.edbatch.propagate (skipped while the loaded extension does not register it).
"""
import dataclasses
import math
import operator
import re
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize

import edbatch
from edbatch import propagate as propagate_module

import cells
import reference
import structures

D = 5
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def inputs_for(packed, seed, ids=False):
    g = torch.Generator().manual_seed(seed)
    if ids:
        return {"ids": packed.input_ids.clone()}
    return {"x": torch.randn(packed.input_ids.numel(), D, generator=g).requires_grad_()}


def reference_of(model, packed, inputs, dropout=None, message_size=None):
    initial = list(model.initial) if model.initial_kind == "learned" else None
    edges = list(model.edge_cells) or None
    return reference.propagate_reference(list(model.node_cells), edges, packed, **inputs,
                                         state_size=model.state_size, reduce=model.reduce,
                                         initial=initial, dropout=dropout,
                                         message_size=message_size or model.message_size)


def gradients(outputs, upstream, params):
    for p in params:
        p.grad = None
    total = sum((o * g).sum() for o, g in zip(outputs, upstream))
    if torch.is_tensor(total) and total.requires_grad:  # not for an empty batch
        total.backward()
    return [None if p.grad is None else p.grad.clone() for p in params]


def assert_same(model, packed, inputs, seed=0, **reference_options):
    """The module's outputs and gradients equal the eager reference's."""
    params = [p for p in model.parameters()] + [v for v in inputs.values() if v.is_floating_point()]
    torch.manual_seed(seed)
    ours = model(packed, **inputs)
    ref = reference_of(model, packed, inputs, **reference_options)
    ours, ref = _components(ours), _components(ref)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape == (packed.num_nodes, b.shape[1])
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, _max(b)))
    g = torch.Generator().manual_seed(seed + 7)
    upstream = [torch.randn(o.shape, generator=g) for o in ref]
    got, want = gradients(ours, upstream, params), gradients(ref, upstream, params)
    names = [n for n, _ in model.named_parameters()] + list(inputs)
    for name, a, b in zip(names, got, want):
        if b is None or a is None:
            assert (a is None or not a.any()) and (b is None or not b.any()), name
            continue
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, _max(b)),
                                   msg=lambda m: f"gradient of {name}: {m}")


def assert_same_at_widths(body, widths, seed):
    """Propagate over trees and lattices at each width of the cell body(lin(x) + m / 2, m), lin a
    linear map of the input to that width: outputs and gradients equal the cell run eagerly."""
    for width in widths:
        lin = nn.Linear(D, width)
        torch.manual_seed(seed + width)
        model = edbatch.nn.Propagate(lambda x, m, lin=lin: body(lin(x) + m * 0.5, m),
                                     state_size=width)
        model.lin = lin
        for kind in ("trees", "lattices"):
            packed = structures.packed(kind, seed)
            assert_same(model, packed, inputs_for(packed, seed))


def _components(out):
    return list(out) if isinstance(out, tuple) else [out]


def _max(t):
    return t.abs().max().item() if t.numel() else 0.0


# ---- every operation ----

@pytest.mark.parametrize("op", list(cells.OPS))
def test_each_operation(backend, op):
    torch.manual_seed(1)
    model = edbatch.nn.Propagate(cells.OpCell(op, 7, D), state_size=7)
    packed = structures.packed("trees", 1)
    assert_same(model, packed, inputs_for(packed, 1))


def test_tensor_methods_called_unbound(backend):
    """torch.Tensor.sigmoid(m), torch.Tensor.add(a, b): the C methods' descriptors refuse a
    traced value, so while a cell is traced torch.Tensor holds functions of its own for them;
    afterwards it holds none, and torch.overrides still knows the C methods."""
    lin = nn.Linear(D, 7)

    def cell(x, m):
        return (torch.Tensor.tanh(torch.Tensor.add(lin(x), torch.Tensor.sigmoid(m))) *
                torch.Tensor.mul(m, 0.5) + torch.Tensor.sum(m, -1, keepdim=True))
    torch.manual_seed(4)
    model = edbatch.nn.Propagate(cell, state_size=7)
    model.lin = lin
    packed = structures.packed("trees", 4)
    assert_same(model, packed, inputs_for(packed, 4))
    assert not any(name in vars(torch.Tensor) for name in ("sigmoid", "add", "mul", "sum"))
    assert torch.overrides.is_tensor_method_or_property(torch.Tensor.add)
    unsupported = edbatch.nn.Propagate(lambda x, m: torch.Tensor.argsort(m, -1),
                                       state_size=7)
    with pytest.raises(TypeError, match="Tensor.argsort is not supported in cells"):
        unsupported(packed, **inputs_for(packed, 4))


class _HalvesItsArgument(nn.Module):
    def forward(self, h):
        h.mul_(0.5)
        return torch.tanh(h)


def test_in_place_changes_reach_every_name_of_the_value(backend):
    """What an in-place call returns names the value it changed, a submodule's in-place change
    of its argument reaches the caller, items of a tuple output change alone, and a value read
    before a change keeps the old one: as the cell run eagerly."""
    lin, sub, lstm = nn.Linear(D, 7), _HalvesItsArgument(), nn.LSTMCell(7, 7)

    def cell(x, m):
        h = lin(x)
        old = h * 3.0
        y = h.add_(m)
        y.mul_(2.0)
        t = sub(h)
        hh, cc = lstm(t, (m, m))
        hh.mul_(0.5)
        cc += 1.0
        y -= old
        return h + t + hh * cc + old
    torch.manual_seed(6)
    model = edbatch.nn.Propagate(cell, state_size=7)
    model.lin, model.sub, model.lstm = lin, sub, lstm
    for kind in ("trees", "lattices"):
        packed = structures.packed(kind, 6)
        assert_same(model, packed, inputs_for(packed, 6))


def test_an_mlp_with_in_place_activations(backend):
    """nn.Sequential with nn.ReLU(inplace=True) and nn.LeakyReLU(inplace=True) between its linear
    maps, as MLPs are usually written, equals the cell run eagerly."""
    mlp = nn.Sequential(nn.Linear(D + 7, 16), nn.ReLU(inplace=True), nn.Linear(16, 16),
                        nn.LeakyReLU(0.1, inplace=True), nn.Linear(16, 7), nn.Tanh())

    def cell(x, m):
        return mlp(torch.cat([x, m], -1)).requires_grad_()
    torch.manual_seed(8)
    model = edbatch.nn.Propagate(cell, state_size=7)
    model.mlp = mlp
    for kind in ("trees", "lattices", "dags"):
        packed = structures.packed(kind, 8)
        assert_same(model, packed, inputs_for(packed, 8))


def test_logaddexp_shrinks_and_roundings_at_infinities_ties_and_nan_as_in_pytorch(backend):
    """logaddexp of two -inf is -inf and of a +inf is +inf (its shift by the larger argument is
    not infinite); hardshrink keeps NaN and the bounds' ties give 0; round takes halves to even;
    floor, ceil, round, trunc and frac keep the infinities and NaN as PyTorch's (trunc and frac
    may give +0 for PyTorch's -0, as torch.where does: both compare equal). softshrink of NaN
    is NaN, as in PyTorch 2.x (1.13 gave 0), so the eager reference leaves that column out.
    nan_to_num maps NaN and both infinities, by default and to given numbers; fmax and fmin pass
    over a NaN; atan2 at signed zeros, the cut and the infinities; hypot beside NaN and where
    the squares would overflow; xlogy of 0 (by NaN, inf, 0 and -0) and by NaN and infinities."""
    def cell(x, m):
        return torch.cat([torch.logaddexp(x[:, :2], x[:, 2:4]), F.hardshrink(x, 0.5),
                          F.softshrink(x[:, :4], 0.5), torch.floor(x), torch.ceil(x),
                          torch.round(x), torch.trunc(x), torch.frac(x), torch.round(-x),
                          torch.nan_to_num(x), x.nan_to_num(0.5, posinf=2.0, neginf=-3.0),
                          torch.fmax(x[:, :2], x[:, 3:]), x[:, 3:].fmin(x[:, :2]),
                          torch.atan2(x, torch.cat([x[:, 4:], x[:, :4]], -1)),
                          torch.atan2(x, -x), torch.hypot(x, torch.cat([x[:, 4:], x[:, :4]], -1)),
                          torch.hypot(x * 3e19, torch.cat([x[:, 2:], x[:, :2]], -1) * 3e19),
                          torch.xlogy(x, torch.cat([x[:, 4:], x[:, :4]], -1)),
                          torch.xlogy(x * 0, x), x.xlogy(x)], -1)
    model = edbatch.nn.Propagate(cell, state_size=90)
    packed = structures.packed("trees", 3)
    x = torch.randn(packed.input_ids.numel(), D)
    x[0] = torch.tensor([-math.inf, math.inf, -math.inf, 1.0, math.nan])
    x[1] = torch.tensor([0.5, -0.5, 2.0, 2.0, -0.25])
    x[2] = torch.tensor([1.5, 2.5, -0.0, -2.5, -0.7])
    with torch.no_grad():
        h = model(packed, x=x)
    rows = packed.node_inputs
    v = torch.where(rows[:, None] >= 0, x[rows.clamp(min=0)], torch.zeros(1, D))
    torch.testing.assert_close(h, cell(v, None), equal_nan=True)
    assert torch.isinf(h).any() and torch.isnan(h).any()
    with torch.no_grad():
        shrunk = edbatch.nn.Propagate(lambda x, m: F.softshrink(x, 0.5), state_size=D)(packed, x=x)
    assert torch.equal(torch.isnan(shrunk), torch.isnan(v))


def test_special_functions_and_modulo_at_poles_zeros_and_nan_as_in_pytorch(backend):
    """erfc, lgamma, digamma, erfinv and ndtr at their poles, signed zeros, the ends of erfinv's
    domain, the infinities and NaN; fmod, remainder (and %) and copysign by signed zeros,
    infinities and NaN; signbit of -0 and NaN; heaviside at signed zeros and NaN (which gives
    0). Values as PyTorch's, and gradients too but for heaviside (PyTorch has none, and raises;
    the engine's is 0, checked below), for
    digamma where its argument is a negative integer (its gradient there, trigamma at a pole,
    is +inf in the engine and a large finite number in PyTorch, whose pi x is not quite an
    integer) and a number % a tensor (PyTorch has no derivative for it)."""
    def cell(x, m, values=True):
        r = torch.cat([x[:, 4:], x[:, :4]], -1)
        parts = [torch.erfc(x), torch.lgamma(x), torch.erfinv(x), torch.special.ndtr(x),
                 torch.fmod(x, r), torch.remainder(x, r), x % 0.75, torch.copysign(x, r),
                 x.copysign(-0.0), torch.signbit(x).float()]
        return torch.cat(parts + ([torch.digamma(x), 1.5 % r, torch.heaviside(x, r),
                                   x.heaviside(torch.tensor(0.5))] if values else []), -1)
    packed = structures.packed("trees", 3)
    x = torch.randn(packed.input_ids.numel(), D)
    x[0] = torch.tensor([-math.inf, math.inf, -0.0, 1.0, math.nan])
    x[1] = torch.tensor([0.0, -1.0, -2.0, 0.999, 0.5])
    x[2] = torch.tensor([-0.5, 3.0, -4.5, -1e-30, -0.9999])
    rows = packed.node_inputs
    v = torch.where(rows[:, None] >= 0, x[rows.clamp(min=0)], torch.zeros(1, D))
    with torch.no_grad():
        h = edbatch.nn.Propagate(cell, state_size=14 * D)(packed, x=x)
    torch.testing.assert_close(h, cell(v, None), equal_nan=True)
    assert torch.isinf(h).any() and torch.isnan(h).any()
    # Gradients: the random rows and the rows above but the negative integers' digamma.
    model = edbatch.nn.Propagate(lambda x, m: cell(x, m, values=False), state_size=10 * D)
    g = x.clone()
    g[1, 1:3] = 0.25
    ours = g.clone().requires_grad_()
    model(packed, x=ours).sum().backward()
    eager = g.clone().requires_grad_()
    e = torch.where(rows[:, None] >= 0, eager[rows.clamp(min=0)], torch.zeros(1, D))
    cell(e, None, values=False).sum().backward()
    # erfinv's gradient e^(y^2) near 1 magnifies y's last bit (the engine rounds a double erfinv)
    torch.testing.assert_close(ours.grad, eager.grad, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert torch.isinf(ours.grad).any() and torch.isfinite(ours.grad).sum() > ours.grad.numel() // 2
    flat, plain = g.clone().requires_grad_(), g.clone().requires_grad_()
    edbatch.nn.Propagate(lambda x, m: torch.heaviside(x, x * 3) + x, state_size=D)(
        packed, x=flat).sum().backward()
    edbatch.nn.Propagate(lambda x, m: x, state_size=D)(packed, x=plain).sum().backward()
    assert torch.equal(flat.grad, plain.grad) and plain.grad.sum() > 0


@pytest.mark.parametrize("width", [7, 21, 64])
def test_sort_topk_kthvalue_median_with_nan_infinities_and_ties_as_in_pytorch(backend, width):
    """Sorting along the features at awkward sizes (7 and 21: padded to 8 and 32 inside; 21
    and 64 take the stages of close pairs in place) puts NaN last ascending and first
    descending, the infinities and signed zeros in order; median is NaN where the row holds a
    NaN. Values as PyTorch's; gradients too on rows without ties (a tie's gradient may go to
    either of the equal entries)."""
    def cell(x, m):
        return torch.cat([torch.sort(x, -1).values, x.sort(descending=True)[0],
                          torch.topk(x, 3).values, x.topk(2, largest=False).values,
                          torch.kthvalue(x, 2, -1, keepdim=True).values,
                          x.median(-1, keepdim=True).values,
                          torch.median(x[:, :4], dim=-1).values.unsqueeze(-1)], -1)
    packed = structures.packed("trees", 3)
    x = torch.randn(packed.input_ids.numel(), width)
    x[0, :7] = torch.tensor([-math.inf, math.inf, -0.0, 1.0, math.nan, 0.5, 1.5])
    x[1, :7] = torch.tensor([2.0, 2.0, -1.0, math.nan, math.nan, 3.0, -math.inf])
    x[2, :7] = torch.tensor([0.3, math.nan, -0.2, 0.1, 5.0, -7.0, 0.0])
    x[2, 7::3] = math.nan
    model = edbatch.nn.Propagate(cell, state_size=2 * width + 3 + 2 + 1 + 1 + 1)
    ours = x.clone().requires_grad_()
    h = model(packed, x=ours)
    rows = packed.node_inputs
    eager = x.clone().requires_grad_()
    want = cell(torch.where(rows[:, None] >= 0, eager[rows.clamp(min=0)],
                            torch.zeros(1, width)), None)
    torch.testing.assert_close(h, want, equal_nan=True)
    assert torch.isnan(h).any() and torch.isinf(h).any()
    w = torch.randn_like(h)
    (h * w).nansum().backward()
    (want * w).nansum().backward()
    torch.testing.assert_close(ours.grad[2:], eager.grad[2:])
    assert ours.grad[2:].abs().sum() > 0


def test_constants_of_one_size_are_told_apart_by_their_bits(backend):
    """NaN, 0, -0 and 1 filled to the same size are four constants: NaN (which compares equal to
    no value) and -0 (equal to 0) each keep their own."""
    def cell(x, m):
        return torch.cat([torch.zeros_like(x) + x, torch.full_like(x, math.nan),
                          torch.signbit(torch.full_like(x, -0.0)).float(),
                          torch.signbit(torch.zeros_like(x)).float(), torch.ones_like(x)], -1)
    packed = structures.packed("trees", 3)
    x = torch.randn(packed.input_ids.numel(), D)
    with torch.no_grad():
        h = edbatch.nn.Propagate(cell, state_size=5 * D)(packed, x=x)
    assert h[:, D:2 * D].isnan().all() and (h[:, 2 * D:3 * D] == 1).all()
    assert (h[:, 3 * D:4 * D] == 0).all() and (h[:, 4 * D:] == 1).all()


def test_xlogy_values_and_gradients_where_x_is_zero(backend):
    """xlogy of x = 0 is 0 by any y but NaN (an infinite one too); x's gradient is log(y), 0
    where x is 0 and y <= 0 (not 0 * log(0)'s NaN), as PyTorch's; y's is x / y, as PyTorch's
    except where x is 0 and y is 0, below 0 or NaN (0 in the engine, whose gradients pass no
    NaN from a zero upstream gradient; PyTorch's NaN or -0, and the Python runner's autograd
    keeps PyTorch's), and x's at x = 0, y = inf (0 in the engine, PyTorch's inf, the Python
    runner's NaN)."""
    def cell(x, m):
        return torch.xlogy(x[:, :2], x[:, 2:4])
    model = edbatch.nn.Propagate(cell, state_size=2)
    packed = structures.packed("trees", 3)
    x = torch.randn(packed.input_ids.numel(), D)
    x[:, 0] = 0.0
    x[:, 3] = 0.0
    x[::3, 2] = 0.0
    x[1::3, 2] = math.nan
    x[2::6, 2] = math.inf
    ours = x.clone().requires_grad_()
    h = model(packed, x=ours)
    h.sum().backward()
    eager = x.clone().requires_grad_()
    rows = packed.node_inputs
    want_h = cell(torch.where(rows[:, None] >= 0, eager[rows.clamp(min=0)], torch.zeros(1, D)),
                  None)
    want_h.sum().backward()
    torch.testing.assert_close(h, want_h, equal_nan=True)
    used = torch.zeros(len(x), dtype=torch.bool)
    used[rows[rows >= 0]] = True
    y = x[:, 2]
    want = eager.grad.clone()
    own = (y <= 0) | y.isnan()
    want[own, 2] = 0.0 if backend == "op" else eager.grad[own, 2]
    want[y == math.inf, 0] = 0.0 if backend == "op" else math.nan  # autograd's 0 * inf
    torch.testing.assert_close(ours.grad, want, equal_nan=True)
    # What the cases are: log(y) at x = 0 where y > 0, 0 at y <= 0, NaN by NaN; log(0) beside a
    # nonzero x.
    assert torch.allclose(want[used & (y > 0) & (y < math.inf), 0],
                          y[used & (y > 0) & (y < math.inf)].log())
    assert (want[used & (y <= 0), 0] == 0).all() and want[used & y.isnan(), 0].isnan().all()
    assert torch.isneginf(want[used, 1]).all() and (h[:, 0] == 0).sum() > len(h) // 2


def test_flips_and_step_slices_of_more_features_than_a_cat_takes_at_once(backend):
    """A flip of 21 features is a cat of 21 one-feature slices (the program's cat takes 8 at a
    time); step slices of it, with a start, a stop and steps 2 and 5; outputs and gradients
    equal the cell run eagerly."""
    lin = nn.Linear(D, 21)

    def cell(x, m):
        h = torch.tanh(lin(x) + m.flip(-1) * 0.5)
        return h + torch.cat([h[:, ::2].flip(-1), h[:, 1:20:5], m[:, 3::3]], -1) * 0.25
    torch.manual_seed(7)
    model = edbatch.nn.Propagate(cell, state_size=21)
    model.lin = lin
    for kind in ("trees", "lattices"):
        packed = structures.packed(kind, 7)
        assert_same(model, packed, inputs_for(packed, 7))


def test_cumsum_and_cumprod_of_awkward_widths_zeros_and_signed_zeros(backend):
    """Scans of 1, 21 and 129 features (doubling steps past the last power of two): outputs and
    gradients equal the cell run eagerly, with zeros in the products (whose gradients PyTorch
    takes apart specially) and a leading -0.0 that stays -0.0 in the sum."""
    def body(h, m):
        # factors in [0.5, 1.5] (a long product neither overflows nor underflows, where PyTorch's
        # own cumprod backward divides by its factors) and a few zeros per row
        g = (h.abs() > 0.05).float() * (1 + 0.5 * torch.tanh(h))
        return torch.tanh(torch.cumsum(h, -1) * 0.1 + g.cumprod(dim=-1) * 0.1
                          + m.cumsum(1, dtype=torch.float32) * 0.1
                          + torch.cumprod(1 + 0.2 * m, -1) * 0.1)
    assert_same_at_widths(body, (1, 21, 129), seed=5)
    model = edbatch.nn.Propagate(lambda x, m: torch.cumsum(x[:, :5], -1), state_size=5)
    packed = structures.packed("trees", 3)
    x = torch.full((packed.input_ids.numel(), D), -0.0)
    x[:, 3] = 0.0
    h = model(packed, x=x)[packed.node_inputs >= 0]
    assert (h == 0).all() and len(h) > 0
    assert torch.signbit(h[:, :3]).all() and not torch.signbit(h[:, 3:]).any()


def test_cummax_and_cummin_give_a_tie_s_gradient_to_the_last_of_equal_entries(backend):
    """Inputs of a few values, so most rows hold ties: cummax's and cummin's values and the
    inputs' gradients equal PyTorch's, which takes the last of equal entries' index."""
    def cell(x, m):
        values, _ = torch.cummax(x[:, :9], -1)
        return torch.cat([values, x[:, 9:].cummin(dim=1).values], -1) * (1 + m * 0.25)
    model = edbatch.nn.Propagate(cell, state_size=20)
    for kind in ("trees", "lattices"):
        packed = structures.packed(kind, 6)
        g = torch.Generator().manual_seed(6)
        x = torch.randint(-2, 3, (packed.input_ids.numel(), 20), generator=g) * 0.5
        assert_same(model, packed, {"x": x.float().requires_grad_()})


def test_logcumsumexp_prod_roll_and_diff_of_awkward_widths(backend):
    """logcumsumexp (a row far below its largest entry stays finite), prod with zeros among the
    factors, roll both ways and diff with n, prepend and append, at 2, 21 and 129 features:
    outputs and gradients equal the cell run eagerly; logcumsumexp keeps -inf, inf and NaN as
    PyTorch's does."""
    def body(h, m):
        g = (h.abs() > 0.05).float() * (1 + 0.5 * torch.tanh(h))
        return torch.tanh(
            torch.logcumsumexp(h * 3 - 40, -1) * 0.05 + g.prod(-1, keepdim=True) * 0.1
            + torch.prod(1 + 0.2 * m, dim=1).unsqueeze(-1) * 0.1 + torch.roll(h, 3, -1)
            + m.roll(-1, dims=(1,)) * 0.5 + torch.diff(h, prepend=m[:, :1])
            + m.diff(n=2, append=h[:, :2]) * 0.5 + h.logcumsumexp(dim=1) * 0.05)
    assert_same_at_widths(body, (2, 21, 129), seed=4)

    def special(x, m):
        return torch.logcumsumexp(x[:, :5], -1)
    model = edbatch.nn.Propagate(special, state_size=5)
    packed = structures.packed("trees", 3)
    row = torch.tensor([-math.inf, -math.inf, -200.0, math.inf, 1.0])
    x = row.repeat(packed.input_ids.numel(), 1)
    x[1::2, 4] = math.nan
    used = packed.node_inputs >= 0
    h = model(packed, x=x)[used]
    torch.testing.assert_close(h, special(x[packed.node_inputs[used]], None), equal_nan=True)
    assert torch.isneginf(h[:, :2]).all() and (h[:, 2] == -200).all() and h[:, 3].isinf().all()


def test_floor_and_trunc_division_bitwise_as_pytorch_with_signed_zeros(backend):
    """a // b, torch.floor_divide, div(rounding_mode="floor" / "trunc") and trunc / frac over
    every pair of signed zeros, infinities, NaN, halves, numbers whose float quotient lands a
    hair off an integer (0.3 / 0.1) and ones past float's integers: bitwise PyTorch's values,
    the sign of a zero included, and no gradient but frac's 1."""
    vals = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 7.0, -7.0, 0.3, -0.3, 0.1, 1e30, -1e-30, 3.0,
            math.inf, -math.inf, math.nan, 5.5, -4.0, 0.9, 3e7, -1.5]
    a = torch.tensor([u for u in vals for _ in vals]).view(-1, 1)
    b = torch.tensor([w for _ in vals for w in vals]).view(-1, 1)
    x = torch.cat([a, b], 1)
    packed = edbatch.pack_edges([{"num_nodes": len(a), "edges": [],
                                  "inputs": list(range(len(a)))}])

    def cell(v, m):
        u, w = v[:, :1], v[:, 1:]
        return torch.cat([u // w, torch.floor_divide(w, u), u.div(w, rounding_mode="floor"),
                          torch.div(u, w, rounding_mode="trunc"), u // 0.3, 2.0 // w,
                          torch.div(u, -0.7, rounding_mode="trunc"), torch.trunc(u / 3),
                          torch.frac(w * 1.5)], -1)
    ours = x.clone().requires_grad_()
    h = edbatch.nn.Propagate(cell, state_size=9)(packed, x=ours)
    want = cell(x, None)
    assert torch.equal(torch.isnan(h), torch.isnan(want))
    same = torch.isnan(want) | (h == want) & (torch.signbit(h) == torch.signbit(want))
    assert same.all(), [(x[i].tolist(), j, h[i, j].item(), want[i, j].item())
                        for i, j in (~same).nonzero().tolist()[:5]]
    h.sum().backward()
    frac = torch.zeros_like(x)
    frac[:, 1] = 1.5
    assert torch.equal(ours.grad, frac)


def test_nan_aware_reductions_classes_logit_and_sinc_at_special_values(backend):
    """isnan / isinf / isposinf / isneginf / isfinite, nansum and nanmean, logit with and without
    eps and sinc, of NaN, both infinities, 0, 1 and values between: outputs and gradients equal
    PyTorch's (logit's inf gradients at 0 and 1, sinc's 0 at 0, nansum's and nanmean's 0 at
    NaN), except logit's gradient without eps outside [0, 1], where its value is NaN: PyTorch's
    gradient is NaN there, the engine's 1 / x + 1 / (1 - x)."""
    row = [math.nan, math.inf, -math.inf, 0.0, 1.0, 0.25, 0.75, -0.5, 1e-30, 2.5]

    def cell(x, m, logit=torch.logit):
        v = x[:, :len(row)]
        masks = [torch.isnan(v), v.isinf(), torch.isposinf(v), torch.isneginf(v),
                 torch.isfinite(v)]
        return torch.cat([mask.float() for mask in masks] + [
            torch.nansum(v, -1, keepdim=True), v.nanmean(-1, keepdim=True), logit(v),
            torch.logit(v, eps=0.25), torch.sinc(v)], -1)

    def documented(v):  # torch.logit, with the engine's gradient outside [0, 1]
        return torch.log(v) - torch.log(1 - v)
    model = edbatch.nn.Propagate(cell, state_size=5 * len(row) + 2 + 3 * len(row))
    packed = structures.packed("trees", 3)
    used = packed.node_inputs >= 0
    x = torch.tensor(row).repeat(packed.input_ids.numel(), 1)
    x[1::2, 0] = 0.5  # rows without NaN: their nanmean counts every entry
    ours = x.clone().requires_grad_()
    h = model(packed, x=ours)[used]
    upstream = torch.randn(h.shape, generator=torch.Generator().manual_seed(3))
    (h * upstream).sum().backward()
    grads = []
    for logit in (torch.logit, documented):
        eager = x.clone().requires_grad_()
        want = cell(eager[packed.node_inputs[used]], None, logit)
        torch.testing.assert_close(h, want, equal_nan=True)
        (want * upstream).sum().backward()
        grads.append(eager.grad)
    # The Python runner's autograd passes sinc's untaken 0 / 0 at 0 (and its t^2 underflowing
    # at 1e-30) on as NaN, where the engine's selection passes no gradient.
    columns = list(range(len(row))) if backend == "op" else [0, 1, 2, 4, 5, 6, 7, 9]
    torch.testing.assert_close(ours.grad[:, columns], grads[1][:, columns], equal_nan=True)
    inside = (x >= 0) & (x <= 1)
    torch.testing.assert_close(grads[0][inside], grads[1][inside])
    assert torch.isinf(grads[0][packed.node_inputs[used], 3]).all()  # logit at 0


def test_aminmax_equals_amin_and_amax_run_eagerly(backend):
    """torch.aminmax / x.aminmax (whose gradient torch 1.13 does not implement): outputs and
    gradients equal amin's and amax's run eagerly."""
    def cell(x, m):
        low, high = torch.aminmax(x * 2 + m[:, :1], dim=-1, keepdim=True)
        return torch.cat([low, high, m.aminmax(dim=-1, keepdim=True).max], -1)

    def eager(x, m):
        v = x * 2 + m[:, :1]
        return torch.cat([v.amin(-1, keepdim=True), v.amax(-1, keepdim=True),
                          m.amax(-1, keepdim=True)], -1)
    model, twin = (edbatch.nn.Propagate(f, state_size=3) for f in (cell, eager))
    for kind in ("trees", "dags"):  # (lattice nodes read no x: arcs do)
        packed = structures.packed(kind, 8)
        inputs = inputs_for(packed, 8)
        ours, ref = model(packed, **inputs), reference_of(twin, packed, inputs)
        torch.testing.assert_close(ours, ref)
        upstream = [torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))]
        torch.testing.assert_close(gradients([ours], upstream, [inputs["x"]])[0],
                                   gradients([ref], upstream, [inputs["x"]])[0])


def test_attention_over_a_stack_of_five_written_with_broadcasting(backend):
    """Scaled dot-product attention of the node's query over five tensors, written as PyTorch
    users write it (unsqueeze, broadcast products, sums over dim -1 and 1, softmax), with a
    weight vector and numbers in the arithmetic, nn.Linear and @ of a weight on each row, a
    (batch, 5, 1) column against the (batch, 5, 13) stack and a stack along 2; outputs and gradients equal the cell run eagerly, at 13
    features, on trees, lattices and DAGs."""
    lin, key = nn.Linear(D, 13), nn.Linear(13, 13)
    scale = nn.Parameter(torch.rand(13) + 0.5)
    proj = nn.Parameter(torch.randn(13, 13) * 0.3)

    def cell(x, m):
        q = lin(x)
        s = torch.stack([m, q, key(m), torch.tanh(q - m), m * q], 1)  # (batch, 5, 13)
        w = torch.softmax((q.unsqueeze(1) * key(s) * scale).sum(-1) / 13 ** 0.5, dim=-1)
        pooled = (w.unsqueeze(-1) * (s @ proj)).sum(1)
        cols = torch.stack([q, m], 2)  # (batch, 13, 2)
        mixed = (torch.relu(cols) * w[:, :2].unsqueeze(1)).sum(-1)
        return torch.tanh(pooled + mixed + (1 - s).mean(dim=1) * s.amax(-1).mean(-1, True))
    torch.manual_seed(3)
    model = edbatch.nn.Propagate(cell, state_size=13)
    model.lin, model.key, model.scale, model.proj = lin, key, scale, proj
    for kind in ("trees", "lattices", "dags"):
        packed = structures.packed(kind, 9)
        assert_same(model, packed, inputs_for(packed, 9))
    packed = structures.packed("trees", 1)
    for bad, message in (
            (lambda x, m: (torch.stack([m, m], 1) * m).sum(1),
             "mul of tensors of a (batch, k, n) stack and a (batch, n) tensor"),
            (lambda x, m: (torch.stack([m, m], 1) + torch.stack([m, m, m], 1)).sum(1),
             "add of tensors of (batch, 2, 7) and (batch, 3, 7): the sizes do not broadcast"),
            (lambda x, m: F.normalize(torch.stack([m, m], 1)).sum(1),
             "supported along its last dim (dim=-1), got dim=1"),
            (lambda x, m: torch.einsum("bij,bjk->bik", torch.stack([m, m], 1),
                                       torch.stack([m, m], 2)).sum(1),
             "at most two subscripts besides the batch's"),
            (lambda x, m: torch.einsum("bii->bi", torch.stack([m, m], 1)),
             "a subscript twice in one operand"),
            (lambda x, m: torch.stack([m, m], 1).permute(1, 0, 2).sum(1),
             "the batch dim stays first"),
            (lambda x, m: (torch.stack([m, m]) * torch.stack([m, m], 1)).sum(0),
             "mul of tensors of a stack along 0 and one along 1"),
            (lambda x, m: (torch.stack([m, m]).sum(-1) * torch.stack([m, m])).sum(0),
             "unsqueeze(-1) the (k, batch) value first"),
            (lambda x, m: torch.stack([m, m]).sum(1),
             "sum of a stack along 0 along dim 1, its batch dim"),
            (lambda x, m: torch.stack([m, m], 1).mean(0),
             "mean of a stack along 1 along dim 0, its batch dim")):
        with pytest.raises(ValueError, match=re.escape(message)):
            edbatch.nn.Propagate(bad, state_size=7)(packed, **inputs_for(packed, 1))


def test_multihead_attention_with_several_heads_and_both_layouts(backend):
    """nn.MultiheadAttention with 1, 2 and 3 heads, with and without biases, batch first and
    not: outputs and gradients (its parameters' too) equal the module run eagerly, the weights
    averaged over the heads."""
    for batch_first in (True, False):
        for heads, bias in ((1, True), (3, False), (2, True)):
            mha = nn.MultiheadAttention(6, heads, batch_first=batch_first, bias=bias)
            dim = 1 if batch_first else 0

            def cell(x, m, mha=mha, dim=dim):
                s = torch.stack([m, torch.tanh(m), m * 0.5], dim)
                out, w = mha(m.unsqueeze(dim), s, s)
                return (out.squeeze(dim) + w.sum(-1) * 0.1
                        + mha(s, s, s, need_weights=False)[0].mean(dim))
            torch.manual_seed(heads)
            model = edbatch.nn.Propagate(cell, state_size=6)
            model.mha = mha
            packed = structures.packed("dags", heads)
            assert_same(model, packed, inputs_for(packed, heads))


def test_division_by_zero_is_infinite_as_in_pytorch(backend):
    """x / 0.0 is inf, -inf or NaN by x's sign as in PyTorch, not an error when tracing."""
    model = edbatch.nn.Propagate(lambda x, m: x / 0.0, state_size=D)
    packed = structures.packed("trees", 3)
    x = torch.randn(packed.input_ids.numel(), D)
    x[0, :2] = 0.0
    with torch.no_grad():
        h = model(packed, x=x)
    rows = packed.node_inputs
    want = torch.where(rows[:, None] >= 0, x[rows.clamp(min=0)], torch.zeros(1, D)) / 0.0
    torch.testing.assert_close(h, want, equal_nan=True)
    assert torch.isinf(h).any() and torch.isnan(h).any()


def test_negated_zeros_keep_their_sign_as_in_pytorch(backend):
    """-x of +0 is -0 (and x * -2, x / -3 and -(-x) of zeros keep PyTorch's signs), so a
    division by it is -inf, as in PyTorch, not +inf."""
    def cell(x, m):
        return torch.cat([1 / -x, 1 / (x * -2), 1 / (x / -3), 1 / x.neg(), 1 / -(-x)], -1)
    model = edbatch.nn.Propagate(cell, state_size=5 * D)
    packed = structures.packed("trees", 3)
    x = torch.randn(packed.input_ids.numel(), D)
    x[0] = torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0])
    with torch.no_grad():
        h = model(packed, x=x)
    rows = packed.node_inputs
    want = cell(torch.where(rows[:, None] >= 0, x[rows.clamp(min=0)], torch.zeros(1, D)), None)
    torch.testing.assert_close(h, want)  # infinities by sign
    assert torch.equal(h[0], want[0])  # the zeros' row exactly
    assert (h[0] == -math.inf).sum() == 10 and (h[0] == math.inf).sum() == 10


def test_a_nan_is_the_largest_value_as_in_pytorch(backend):
    """reduce='max' over a NaN message, and maximum / amax / max of a NaN in a cell, are NaN
    whatever the order, as torch.amax and torch.maximum give."""
    x = torch.tensor([[2.0, 1.0], [-1.0, -1.0], [1.0, 3.0]])  # log(-1): node 1's state is NaN
    for edges in ([(0, 2), (1, 2)], [(1, 2), (0, 2)]):
        packed = edbatch.pack_edges([{"num_nodes": 3, "edges": edges, "inputs": [0, 1, 2]}])
        model = edbatch.nn.Propagate(lambda x, m: torch.log(x) + m, reduce="max", state_size=2)
        with torch.no_grad():
            h = model(packed, x=x)
        want = torch.log(x[:2]).amax(0) + torch.log(x[2])
        torch.testing.assert_close(h[2], want, equal_nan=True)
        assert torch.isnan(h[2]).all()
    packed = edbatch.pack_trees([5])
    for cell in (lambda x, m: torch.maximum(x[:, :1], torch.log(x[:, 1:])),
                 lambda x, m: torch.log(x).amax(-1, keepdim=True),
                 lambda x, m: torch.log(x).max(-1, keepdim=True).values):
        y = torch.tensor([[1.0, -1.0]])
        with torch.no_grad():
            got = edbatch.nn.Propagate(cell, state_size=1)(packed, x=y)
        torch.testing.assert_close(got, cell(y, None), equal_nan=True)
        assert torch.isnan(got).all()


_SPECIAL = [float("inf"), float("-inf"), float("nan"), 3.4028234663852886e38,
            -3.4028234663852886e38, 0.0, -0.0, 1.0]


@pytest.mark.parametrize("op", ["eq", "ne", "ge", "le", "gt", "lt"])
def test_comparisons_of_infinities_and_nan_as_in_pytorch(backend, op):
    """Equal infinities compare equal (their difference is NaN), NaN compares false, the largest
    float is not infinite: every pair of special values, and each against numbers."""
    n = len(_SPECIAL)
    a = torch.tensor(_SPECIAL).repeat_interleave(n)[None]
    b = torch.tensor(_SPECIAL).repeat(n)[None]
    packed = edbatch.pack_trees([5])
    compare = getattr(operator, op)  # a == b, a != b, ...
    cells = [lambda x, m: compare(x[:, :n * n], x[:, n * n:]).float()]
    cells += [lambda x, m, v=v: compare(x[:, :n * n], v).float() for v in _SPECIAL]
    cells += [lambda x, m, v=v: compare(x[:, :n * n], torch.full_like(x[:, :1], v)).float()
              for v in _SPECIAL]  # against a one-column tensor, broadcast
    cells.append(lambda x, m: compare(x[:, :n * n], x[:, :n * n]).float())  # x == x
    x = torch.cat([a, b], 1)
    for cell in cells:
        with torch.no_grad():
            got = edbatch.nn.Propagate(cell, state_size=n * n)(packed, x=x)
        torch.testing.assert_close(got, cell(x, None), rtol=0, atol=0)


def test_threshold_keeps_nan_as_pytorch(backend):
    """F.threshold tests x <= threshold: NaN stays NaN and its gradient passes, as in PyTorch."""
    packed = edbatch.pack_trees([5])
    cell = lambda x, m: F.threshold(x, 0.5, -2.0)  # noqa: E731
    x = torch.tensor([_SPECIAL]).requires_grad_()
    xe = x.detach().clone().requires_grad_()
    got, want = edbatch.nn.Propagate(cell, state_size=len(_SPECIAL))(packed, x=x), cell(xe, None)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, rtol=0, atol=0)


_RECTIFIED = [float("inf"), float("-inf"), float("nan"), 3.4028234663852886e38,
              -3.4028234663852886e38, 0.0, -0.0, 1.0, -2.5, 1e-40, 88.8, -104.0]
_ELEMENTWISE = {
    "relu": F.relu, "relu6": F.relu6, "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "elu": F.elu,
    "softplus": F.softplus, "hardtanh": F.hardtanh, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "exp": torch.exp, "abs": torch.abs}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(_ELEMENTWISE))
def test_activations_of_nan_and_infinities_as_in_pytorch(op, device):
    """NaN stays NaN (relu(NaN) was 0 on the GPU), the infinities and float's extremes map as
    PyTorch maps them, on each device, over more nodes than the kernels take in vector registers."""
    f = _ELEMENTWISE[op]
    packed = edbatch.pack_trees(list(range(37)))
    x = torch.tensor(_RECTIFIED).repeat(37, 1)
    model = edbatch.nn.Propagate(lambda x, m: f(x), state_size=len(_RECTIFIED)).to(device)
    with torch.no_grad():
        got = model(packed.to(device), x=x.to(device)).cpu()
    torch.testing.assert_close(got, f(x), equal_nan=True, rtol=1e-5, atol=1e-38)


@pytest.mark.parametrize("device", DEVICES)
def test_a_softmax_of_a_row_masked_whole_is_nan_as_in_pytorch(device):
    """softmax / log_softmax of x.masked_fill(mask, -inf): a row masked whole is NaN, the others
    as PyTorch gives them, on each device."""
    packed = edbatch.pack_trees(list(range(29)))
    x = torch.randn(29, 6, generator=torch.Generator().manual_seed(3))
    for f in (torch.softmax, torch.log_softmax):
        def cell(x, m, f=f):
            return f(x.masked_fill((x[:, :1] > 0) | (x < -1), float("-inf")), -1)
        model = edbatch.nn.Propagate(cell, state_size=6).to(device)
        with torch.no_grad():
            got = model(packed.to(device), x=x.to(device)).cpu()
        want = cell(x, None)
        assert torch.isnan(want).any() and not torch.isnan(want).all()
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("weight", [0.25, 0.5, 0.75, 1.0, 1.5, -0.7, "tensor", "parameter"])
def test_lerp_takes_pytorchs_form_by_the_weight(backend, weight):
    """torch.lerp is start + w (end - start) for |w| < 0.5, else end - (end - start) (1 - w), so
    lerp(1e8, 1, 1) is 1 (one form alone gives 0), per entry for a tensor weight; the gradients
    of start, end and the weight as PyTorch's."""
    # The Python runner's autograd sends 0 * inf = NaN into the form not taken; the op sends 0.
    starts = [1e8, 1e30, float("inf") if backend == "op" else 3e38, 1.0, -3.0, 2.0, 0.0, 5.0]
    ends = [1.0, 88.8, 0.0, 2.0, 4.0, float("nan"), -1.0, 5.0]
    weights = [1.0, 0.3, 0.75, 1.0, -0.6, 0.5, 0.49, 2.0]
    n = len(starts)

    class Lerp(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.tensor(weights))

        def forward(self, x, m):
            w = {"tensor": x[:, 2 * n:], "parameter": self.w}.get(weight, weight)
            return torch.lerp(x[:, :n], x[:, n:2 * n], w)

    packed = edbatch.pack_trees([5, 6])
    x = torch.tensor(starts + ends + weights).repeat(2, 1).requires_grad_()
    xe = x.detach().clone().requires_grad_()
    cell, eager = Lerp(), Lerp()
    got, want = edbatch.nn.Propagate(cell, state_size=n)(packed, x=x), eager(xe, None)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=0)
    if not isinstance(weight, str) and abs(weight) >= 0.5:
        assert got[0, 0].item() == want[0, 0].item()
    upstream = torch.arange(1.0, 2 * n + 1).view(2, n)
    (got * upstream).sum().backward()
    (want * upstream).sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, equal_nan=True, rtol=1e-6, atol=0)
    if weight == "parameter":
        torch.testing.assert_close(cell.w.grad, eager.w.grad, equal_nan=True, rtol=1e-6, atol=0)


@pytest.mark.parametrize("op", ["sqrt", "log", "rsqrt"])
def test_roots_and_logs_of_infinities_and_subnormals_as_in_pytorch(backend, op):
    """At every float, with as many nodes as the kernels take in vector registers (the value of
    a node must not depend on its batch-mates): +inf, subnormals, 0, negatives and NaN."""
    special = [float("inf"), 1e-40, 3e-39, 1.1754942e-38, 1e-45, 0.0, -0.0, -2.0, float("nan"),
               4.0, 3.4028234663852886e38, 0.37]
    f = getattr(torch, op)
    packed = edbatch.pack_trees(list(range(37)))  # 37 single-node trees, one batch
    x = torch.tensor(special).repeat(37, 1).requires_grad_()
    xe = x.detach().clone().requires_grad_()
    got = edbatch.nn.Propagate(lambda x, m: f(x), state_size=len(special))(packed, x=x)
    want = f(xe)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=2e-7, atol=0)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, equal_nan=True, rtol=1e-6, atol=0)


@pytest.mark.parametrize("e", [-2, -3, -5, -16])
def test_negative_powers_of_small_numbers_have_pytorchs_gradients(backend, e):
    """x ** -n where x ** -2n overflows float32 and PyTorch's gradient -n x ** -(n + 1) does
    not (x ** -3 at 2e-7: -1.9e27; it was -inf), and at the large, negative and signed-zero x."""
    xs = [2e-7, 1e-6, -3e-7, 0.013, 1e-3, -0.5, 1.7, 40.0, 1e7, -2e8, 0.0, -0.0]
    packed = edbatch.pack_trees(list(range(5)))
    x = torch.tensor(xs).repeat(5, 1).requires_grad_()
    xe = x.detach().clone().requires_grad_()
    got = edbatch.nn.Propagate(lambda x, m: x ** e, state_size=len(xs))(packed, x=x)
    want = xe ** e
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-38)  # subnormals
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, equal_nan=True, rtol=1e-5, atol=1e-38)


@pytest.mark.parametrize("size", [13, 129])
@pytest.mark.parametrize("op", ["chunk", "slicing", "layer_norm", "softmax", "@", "torch.cat",
                                "var", "size-1 gate, expand"])
def test_operations_at_other_sizes(backend, op, size):
    torch.manual_seed(2)
    model = edbatch.nn.Propagate(cells.OpCell(op, size, D), state_size=size)
    packed = structures.packed("dags", 2)
    assert_same(model, packed, inputs_for(packed, 2))


def test_clamps_at_their_bounds_pass_or_stop_gradients_as_pytorch(backend):
    """Inputs exactly at the bounds: clamp passes the gradient there (as PyTorch's, inclusive),
    hardtanh and relu6 stop it (exclusive); torch.maximum / minimum of equal values give it to
    the first argument (PyTorch splits it), so they are checked without ties."""
    def cell(x, m):
        return (torch.clamp(x, -1.0, 1.0) + 2 * F.hardtanh(x) + 3 * F.relu6(x + 5) +
                4 * x.clamp_min(0.0) + 5 * torch.clamp(x, max=1.0) + m)
    model = edbatch.nn.Propagate(cell, state_size=D)
    packed = structures.packed("trees", 4)
    g = torch.Generator().manual_seed(4)
    bounds = torch.tensor([-1.0, 1.0, 0.0, 0.5, -3.0, -5.0])  # relu6 at 0 and 6: -5 and 1
    x = bounds[torch.randint(0, 6, (packed.input_ids.numel(), D), generator=g)].requires_grad_()
    assert_same(model, packed, {"x": x})


def test_hard_activations_at_their_bounds_have_the_documented_derivatives(backend):
    """hardsigmoid's derivative is 1/6 strictly inside (-3, 3); hardswish's is x / 3 + 1/2 on
    [-3, 3] (PyTorch's CPU definition; some PyTorch versions take 0 and 1 at -3 and 3 on CUDA),
    0 below and 1 above."""
    x0 = torch.tensor([[-3.0, 3.0, -4.0, 4.0, 0.5]])
    want = {"hardsigmoid": [0.0, 0.0, 0.0, 0.0, 1 / 6],
            "hardswish": [-0.5, 1.5, 0.0, 1.0, 0.5 / 3 + 0.5]}
    packed = edbatch.pack_edges([{"num_nodes": 1, "inputs": [0]}])
    for name, derivative in want.items():
        fn = getattr(F, name)
        model = edbatch.nn.Propagate(lambda x, m, fn=fn: fn(x) + m, state_size=D)
        x = x0.clone().requires_grad_()
        model(packed, x=x).sum().backward()
        torch.testing.assert_close(x.grad, torch.tensor([derivative]), msg=name)


def test_embedding_of_ids(backend):
    torch.manual_seed(3)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, 0, vocab=structures.VOCAB),
                                 state_size=7)
    packed = structures.packed("dags", 3)  # every DAG node has an input id
    assert_same(model, packed, inputs_for(packed, 3, ids=True))


class _OneHot(nn.Module):
    """F.one_hot of the integer input, as a bag-of-ids cell writes it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(structures.VOCAB, 7)

    def forward(self, ids, m):
        hot = F.one_hot(ids, structures.VOCAB).float()
        return torch.tanh(self.lin(hot) + m) + F.one_hot(ids, num_classes=structures.VOCAB)[:, :7]


def test_one_hot_of_ids(backend):
    torch.manual_seed(3)
    model = edbatch.nn.Propagate(_OneHot(), state_size=7)
    packed = structures.packed("dags", 4)  # every DAG node has an input id
    assert_same(model, packed, inputs_for(packed, 4, ids=True))
    with pytest.raises(ValueError, match=r"F.one_hot with num_classes=-1: give the number"):
        edbatch.nn.Propagate(lambda ids, m: F.one_hot(ids).float() + m, state_size=7)(
            packed, ids=packed.input_ids)


def test_cells_with_tables_of_their_own_sizes(backend):
    """Arc kinds embedding with tables of different sizes (characters beside words): an id must
    fit only the tables of the cells that read its row; the results equal the same cells given
    x = each row's embedding in its own arc kind's table. An id outside the table of the cell
    that reads it is refused, naming the arc and the cell."""
    torch.manual_seed(31)
    chars, words = torch.nn.Embedding(12, D), torch.nn.Embedding(40, D)
    node, char_arc, word_arc = cells.LSTMCell(7, D), cells.GateEdge(7, D), cells.GateEdge(7, D)
    inside = edbatch.nn.Propagate(cells.EmbedFirst(words, node),
                                  [cells.EmbedFirst(chars, char_arc, edge=True),
                                   cells.EmbedFirst(words, word_arc, edge=True)],
                                  state_size=(7, 7))
    packed = structures.packed("lattices", 31)
    ids = packed.input_ids.clone()
    char_rows = packed.arc_inputs[(packed.arc_types == 0) & (packed.arc_inputs >= 0)]
    word_rows = packed.arc_inputs[(packed.arc_types == 1) & (packed.arc_inputs >= 0)]
    node_rows = packed.node_inputs[packed.node_inputs >= 0]
    ids[word_rows] = 12 + ids[word_rows] * 7 % 28
    ids[char_rows] %= 12
    assert (ids >= 12).any() and char_rows.numel() > 0
    ours = inside(packed, ids=ids)
    x = torch.zeros(ids.numel(), D)
    x[word_rows], x[node_rows] = words(ids[word_rows]), words(ids[node_rows])
    x[char_rows] = chars(ids[char_rows])
    outside = edbatch.nn.Propagate(node, [char_arc, word_arc], state_size=(7, 7))(packed, x=x)
    weights = [chars.weight, words.weight] + list(node.parameters())
    g = torch.Generator().manual_seed(32)
    upstream = [torch.randn(o.shape, generator=g) for o in outside]
    for a, b in zip(ours, outside):
        torch.testing.assert_close(a, b)
    for a, b in zip(gradients(ours, upstream, weights), gradients(outside, upstream, weights)):
        torch.testing.assert_close(a, b)
    if backend != "op":
        return  # the refusal is the op's check
    row = int(char_rows[0])
    ids[row] = 12
    arc = int(((packed.arc_inputs == row) & (packed.arc_types == 0)).nonzero()[0])
    with pytest.raises(ValueError, match=rf"arc {arc} reads ids\[{row}\] = 12, outside edge "
                                         r"cell 0 \(EmbedFirst\)'s embedding table of 12 rows"):
        inside(packed, ids=ids)


@pytest.mark.parametrize("kind", ["trees", "lattices", "dags"])
@pytest.mark.parametrize("direct", [False, True])
def test_ids_of_rows_minus_one_embed_zeros(backend, kind, direct):
    """Cells that embed their ids, where nodes and arcs without an input row (-1: a tree's inner
    nodes, the parent rows of edge_inputs="parent") embed to zeros: the same outputs and
    gradients as the same cells given x = embedding(ids) outside, where row -1 reads zeros."""
    torch.manual_seed(30)
    embed = torch.nn.Embedding(structures.VOCAB, D)
    node, edge = cells.LSTMCell(7, D), cells.GateEdge(7, D)
    scale = torch.nn.Linear(D, D) if direct else None
    inside = edbatch.nn.Propagate(cells.EmbedFirst(embed, node, scale=scale),
                                  cells.EmbedFirst(embed, edge, edge=True, scale=scale), reduce="sum",
                                  state_size=(7, 7))
    packed = structures.packed(kind, 30, edge_inputs="parent")
    ids = packed.input_ids.clone()
    ours = inside(packed, ids=ids)
    if scale is None:
        outside = edbatch.nn.Propagate(node, edge, reduce="sum", state_size=(7, 7))
    else:  # the same cells after the embedding's own gate, as x cells
        outside = edbatch.nn.Propagate(_Gated(node, scale), _Gated(edge, scale, edge=True),
                                       reduce="sum", state_size=(7, 7))
    rows = [packed.node_inputs, packed.arc_inputs]
    assert any((r < 0).any() for r in rows) or kind == "dags"
    want = outside(packed, x=embed(ids))
    g = torch.Generator().manual_seed(31)
    upstream = [torch.randn(o.shape, generator=g) for o in want]
    params = list(inside.parameters())
    got_grads = gradients(ours, upstream, params)
    want_grads = gradients(want, upstream, params)
    for a, b in zip(ours, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for (name, _), a, b in zip(inside.named_parameters(), got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


class _Gated(torch.nn.Module):
    """cell(..., x * sigmoid(scale(x))): _Embedded's direct read, for x given outside."""

    def __init__(self, cell, scale, edge=False):
        super().__init__()
        self.cell, self.scale, self.edge = cell, scale, edge

    def forward(self, a, b):
        x = b if self.edge else a
        x = x * self.scale(x).sigmoid()
        return self.cell(a, x) if self.edge else self.cell(x, b)


def test_ids_outside_the_tables_are_refused(backend):
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, 0, vocab=structures.VOCAB),
                                 state_size=7)
    packed = structures.packed("dags", 3)
    ids = packed.input_ids.clone()
    ids[2] = structures.VOCAB
    with pytest.raises((RuntimeError, ValueError, IndexError), match="ids|index"):
        model(packed, ids=ids)


# ---- structures, reduce, initial, kinds ----

@pytest.mark.parametrize("kind", ["trees", "lattices", "dags", "empty"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_structures_and_reduce(backend, kind, reduce):
    torch.manual_seed(4)
    model = edbatch.nn.Propagate(cells.LSTMCell(7, D), cells.GateEdge(7, D), reduce=reduce,
                                 state_size=(7, 7))
    packed = structures.packed(kind, 4, edge_inputs="parent")
    assert_same(model, packed, inputs_for(packed, 4))


def attention(initial="zeros"):
    return edbatch.nn.Propagate(cells.AttentionNode(7, D), cells.AttentionEdge(7, D),
                                reduce="softmax", state_size=(7, 7), message_size=(1, 7, 7),
                                initial=initial)


@pytest.mark.parametrize("kind", ["trees", "lattices", "dags", "empty", "star"])
def test_attention_over_the_messages(backend, kind):
    """reduce="softmax": the node gets the scores' log-sum-exp and the values weighted by their
    softmax, over fan-ins of 1 to 6, lattices, DAGs, and one node reading 300 others."""
    torch.manual_seed(17)
    model = attention()
    if kind == "star":
        packed = edbatch.pack_edges([{"num_nodes": 301, "edges": [(j, 300) for j in range(300)],
                                      "inputs": list(range(301))}], edge_inputs="target")
    else:
        packed = structures.packed(kind, 17, edge_inputs="parent")
    assert_same(model, packed, inputs_for(packed, 17))


class FarScoreEdge(torch.nn.Module):
    """Scores that sit far from 0 (every arc masked at -1e9, or all near 3e7): the weights are
    still the softmax of the differences, uniform here."""

    def __init__(self, offset):
        super().__init__()
        self.offset = offset
        self.score = torch.nn.Linear(7, 1)
        self.value = torch.nn.Linear(7, 7)

    def forward(self, state, x):
        h, c = state
        return 0 * self.score(h) + self.offset, self.value(h), c


class ValueNode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = torch.nn.Linear(D, 7)

    def forward(self, x, message):
        _, v, c = message
        h = torch.tanh(self.x(x) + v)
        return h, 0.5 * c + h


@pytest.mark.parametrize("offset", [-1e9, 3e7])
def test_attention_with_scores_far_from_zero(backend, offset):
    torch.manual_seed(19)
    model = edbatch.nn.Propagate(ValueNode(), FarScoreEdge(offset), reduce="softmax",
                                 state_size=(7, 7), message_size=(1, 7, 7))
    packed = structures.packed("dags", 19, edge_inputs="target")
    assert_same(model, packed, inputs_for(packed, 19))


class _ScoreFirst(nn.Module):
    """Edge cell: the child's first feature as the score, the others as the value."""

    def forward(self, child, x):
        return child[:, :1] * 1.0, child[:, 1:] * 1.0


def test_attention_over_masked_and_infinite_scores_as_torch_logsumexp(backend):
    """A masked arc (-inf) first or last, every arc masked, finite scores far apart: the
    log-sum-exp is torch.logsumexp's and the context softmax's, NaN only where PyTorch's is. A
    +inf score gives a NaN log-sum-exp (PyTorch: inf; documented), the context NaN in both."""
    inf = float("inf")

    def node(x, message):
        lse, context = message
        return torch.cat([x[:, :1] + lse, x[:, 1:] + context], -1)
    model = edbatch.nn.Propagate(node, _ScoreFirst(), reduce="softmax", state_size=3,
                                 message_size=(1, 2))
    packed = edbatch.pack_trees([(0, 1)])  # two leaves, then the root (its x row: zeros)
    for scores in ((-inf, 0.0), (0.0, -inf), (inf, 0.0), (-inf, -inf), (-3e38, 3e38)):
        x = torch.tensor([[scores[0], 1.0, 2.0], [scores[1], 3.0, 4.0], [0.0, 0.0, 0.0]])
        with torch.no_grad():
            root = model(packed, x=x)[-1]
        s = torch.tensor(scores)
        want = torch.cat([torch.logsumexp(s, 0)[None],
                          (torch.softmax(s, 0)[:, None] * x[:2, 1:]).sum(0)])
        if inf in scores and backend == "op":
            want[0] = float("nan")
        torch.testing.assert_close(root, want, equal_nan=True, msg=lambda m: f"{scores}: {m}")


def test_attention_over_a_node_of_large_fan_in(backend):
    """A node fed by 3,000 arcs (its work linear in the fan-in), against eager PyTorch."""
    torch.manual_seed(21)
    model = attention()
    packed = edbatch.pack_trees([tuple(range(3000))])
    assert_same(model, packed, inputs_for(packed, 21))


def test_attention_with_a_learned_initial_message_and_its_refusals(backend):
    torch.manual_seed(18)
    model = attention(initial="learned")
    with torch.no_grad():
        for p in model.initial:
            p.normal_()
    packed = structures.packed("dags", 18, edge_inputs="target")
    assert_same(model, packed, inputs_for(packed, 18))
    packed = structures.packed("trees", 18)
    for edge in (None, cells.GateEdge(7, D)):  # messages (h, c): no size-1 score first
        model = edbatch.nn.Propagate(cells.LSTMCell(7, D), edge, reduce="softmax",
                                     state_size=(7, 7))
        with pytest.raises(ValueError, match="reduce='softmax' attends over the messages"):
            model(packed, **inputs_for(packed, 18))


@pytest.mark.parametrize("size", [7, 13, 129])
def test_learned_initial_state(backend, size):
    torch.manual_seed(5)
    model = edbatch.nn.Propagate(cells.LSTMCell(size, D), state_size=(size, size),
                                 initial="learned")
    with torch.no_grad():
        for p in model.initial:
            p.normal_()
    packed = structures.packed("lattices", 5)
    assert_same(model, packed, inputs_for(packed, 5))


def test_norms_of_zero_vectors_give_pytorchs_gradients(backend):
    """A learned initial state at zero: its norm's gradient is 0 and F.normalize's is 1 / eps
    there (so too in cosine_similarity and pairwise_distance), and std's of a constant row 0, as
    in PyTorch (a sum of squares floored with the constant first, never 0 * inf)."""
    lin = nn.Linear(D, 7)

    def cell(x, m):
        return (torch.tanh(lin(x)) + m.norm(dim=-1, keepdim=True) +
                1e-6 * F.normalize(m, eps=1e-3) + F.normalize(lin(x), dim=-1) * 0.5 +
                torch.linalg.vector_norm(lin(x), dim=-1, keepdim=True) +
                1e-3 * (m.std(-1, keepdim=True) + (m + 2).std(-1, unbiased=False, keepdim=True)) +
                1e-6 * F.cosine_similarity(lin(x), m, eps=1e-3).unsqueeze(-1) +
                F.pairwise_distance(m, m * 2, eps=0.0, keepdim=True))
    torch.manual_seed(9)
    model = edbatch.nn.Propagate(cell, state_size=7, initial="learned")
    model.lin = lin  # registered, so its parameters are checked too
    packed = structures.packed("trees", 9)
    assert_same(model, packed, inputs_for(packed, 9))
    assert not model.initial[0].any()  # the zero vector of the test


def test_long_concatenations_and_deviations_of_constant_rows(backend):
    """torch.cat of more than 64 pieces and x.repeat(1, k > 64) (a block step reads at most 64
    operands: they become concatenations of concatenations); var and std of a constant row are
    exactly 0, the variance of equal numbers (PyTorch's batched CPU kernels give 0 too; a single
    row's, 3e-8 here), so that a normalize after them gives 0, not a unit vector."""
    lin = nn.Linear(D, 7)

    def cell(x, m):
        c = lin(x)
        wide = torch.cat([c[:, i % 7:i % 7 + 1] * (1 + i) for i in range(70)] + [m], -1)
        return torch.tanh(wide[:, 60:67] * 0.05 + m[:, :1].repeat(1, 130)[:, 100:107])

    def constant_rows(x, m):
        flat = (x[:, :1] * 0 + 0.3).expand(-1, 33).clamp_min(0.1)
        s = flat.std(-1, keepdim=True, unbiased=False) + flat.var(-1, keepdim=True)
        return torch.cat([s, F.normalize(s.expand(-1, 6), dim=-1)], -1)
    torch.manual_seed(12)
    model = edbatch.nn.Propagate(cell, state_size=7)
    model.lin = lin
    packed = structures.packed("trees", 11)
    assert_same(model, packed, inputs_for(packed, 11))
    out = edbatch.nn.Propagate(constant_rows, state_size=7)(packed, **inputs_for(packed, 11))
    assert torch.equal(out, torch.zeros_like(out))


def test_activations_at_zero_give_pytorchs_gradients(backend):
    """A learned initial state at zero: prelu's gradient there is its weight, selu's scale *
    alpha, celu's and elu's 1, relu's 0, as in PyTorch (the kinks of the compositions); and
    comparisons at equality (>= and == hold, > does not)."""
    lin = nn.Linear(D, 7)
    w = nn.Parameter(torch.linspace(0.1, 0.7, 7))

    def cell(x, m):
        return torch.tanh(lin(x) + 0.2 * (
            F.prelu(m, w) + F.selu(m) * 0.5 + F.celu(m, 0.6) + torch.relu(m) +
            F.gelu(m, approximate="tanh") + torch.log1p(m * m) + torch.expm1(m) + m ** 4 +
            torch.where(m >= 0, m + 1, m - 1) + (m == 0).float() - (m > 0).float() * 3 +
            torch.sign(m) + torch.where(m <= w, 0.5, -m)))
    torch.manual_seed(10)
    model = edbatch.nn.Propagate(cell, state_size=7, initial="learned")
    model.lin, model.w = lin, w  # registered, so their gradients are checked too
    packed = structures.packed("trees", 9)
    assert_same(model, packed, inputs_for(packed, 9))
    assert not model.initial[0].any()  # the zero vector of the test


def test_node_and_edge_kinds(backend):
    torch.manual_seed(6)
    nodes = [cells.OpCell("sigmoid", 7, D), cells.OpCell("chunk", 7, D)]
    edges = {0: cells.ScaleEdge(7, 1.0), 1: cells.ScaleEdge(7, -0.5), 2: cells.ScaleEdge(7, 2)}
    model = edbatch.nn.Propagate(nodes, edges, reduce="mean", state_size=7)
    packed = structures.packed("dags", 6)
    assert set(packed.node_types.tolist()) == {0, 1}
    assert_same(model, packed, inputs_for(packed, 6))


def test_cells_of_kinds_a_batch_lacks_get_zero_gradients(backend):
    # Documented: zeros (not None, as eager PyTorch leaves them), so DDP needs no
    # find_unused_parameters; the used kinds' gradients are those of eager PyTorch.
    torch.manual_seed(16)
    model = edbatch.nn.Propagate([cells.OpCell("tanh", 5, D) for _ in range(3)], state_size=5)
    packed = edbatch.pack_dags([{"types": [0, 2, 2], "inputs": [0, 1, 2],
                                 "arcs": [[], [(0, 0)], [(0, 0), (1, 0)]]}])
    assert_same(model, packed, inputs_for(packed, 16))
    if backend != "op":
        return  # the Python runner leaves unused weights out of autograd as eager does
    model.zero_grad(set_to_none=True)
    model(packed, **inputs_for(packed, 16)).sum().backward()
    for kind, cell in enumerate(model.node_cells):
        for name in ("lin.weight", "lin.bias"):  # a = lin(x) + U(m), m zero at kind 0
            grad = cell.get_parameter(name).grad
            assert grad is not None, (kind, name)
            assert bool(grad.any()) == (kind != 1), (kind, name)


class _FixedWeights(nn.Module):
    """Buffers and frozen parameters as fixed weights, and weights of one row, (1, n) or
    (n, 1).t(), broadcast over the rows as PyTorch does (trainable and frozen)."""

    def __init__(self, size):
        super().__init__()
        S = size
        self.lin = nn.Linear(D + S, S)
        self.register_buffer("shift", torch.randn(S))
        self.register_buffer("row", torch.randn(1, S))
        self.register_buffer("mix", 0.3 * torch.randn(S, S))
        self.frozen = nn.Parameter(torch.randn(1, S), requires_grad=False)
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(1, S))
        self.column = nn.Parameter(0.5 * torch.randn(S, 1))

    def forward(self, x, m):
        a = self.lin(torch.cat([x, m], -1)) * self.scale + self.shift - self.row * self.frozen
        return torch.tanh(a @ self.mix + self.column.t())


def test_buffers_frozen_and_row_weights(backend):
    torch.manual_seed(12)
    cell = _FixedWeights(7)
    model = edbatch.nn.Propagate(cell, state_size=7)
    for kind in ("trees", "dags"):
        packed = structures.packed(kind, 12)
        assert_same(model, packed, inputs_for(packed, 12))
    assert cell.frozen.grad is None and cell.scale.grad is not None and cell.column.grad is not None
    # A buffer is read on every call: assigned again, the new value is the one used.
    packed = structures.packed("trees", 13)
    inputs = inputs_for(packed, 13)
    before = model(packed, **inputs).detach()
    cell.shift = torch.full((7,), 3.0)
    cell.row.mul_(-1)
    after = model(packed, **inputs).detach()
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, reference_of(model, packed, inputs), rtol=1e-5, atol=1e-5)


class _Hooked(nn.Module):
    """Forward hooks and pre-hooks on the cell and on a module of the user's own: they run while
    the cell is traced, so the program has them (hooks on torch.nn's modules are refused)."""

    def __init__(self, size):
        super().__init__()
        self.inner = cells.OpCell("tanh", size, D)
        self.inner.register_forward_pre_hook(lambda module, args: (0.5 * args[0], args[1]))
        self.inner.register_forward_hook(lambda module, args, out: 2 * out)

    def forward(self, x, m):
        return self.inner(x, m)


def test_hooks_of_user_modules_are_traced(backend):
    torch.manual_seed(14)
    cell = _Hooked(7)
    cell.register_forward_hook(lambda module, args, out: out - 0.25)
    model = edbatch.nn.Propagate(cell, state_size=7)
    packed = structures.packed("dags", 14)
    assert_same(model, packed, inputs_for(packed, 14))


def test_backward_hooks_are_refused_by_module_and_kind():
    """Backward hooks of a module (the cell or a submodule) cannot run per node: the cells run
    as one program. They are refused when the cell is traced, naming the module and the kind."""
    def model_with(hook):
        cell = _Hooked(7)
        hook(cell)
        return edbatch.nn.Propagate(cell, state_size=7)

    cases = [(lambda c: c.register_full_backward_hook(lambda *a: None),
              "the cell (_Hooked) has a full backward hook (register_full_backward_hook)"),
             (lambda c: c.inner.U.register_full_backward_hook(lambda *a: None),
              "submodule inner.U (nn.Linear) has a full backward hook"),
             (lambda c: c.inner.register_backward_hook(lambda *a: None),
              "submodule inner (OpCell) has a backward hook (register_backward_hook)")]
    if hasattr(nn.Module, "register_full_backward_pre_hook"):  # torch 2.0 and later
        cases.append((lambda c: c.register_full_backward_pre_hook(lambda *a: None),
                      "the cell (_Hooked) has a full backward pre-hook"))
    for hook, message in cases:
        with pytest.raises(TypeError, match="Tensor.register_hook") as info:
            model_with(hook).program("x", D)
        assert "node cell 0 (_Hooked)" in str(info.value) and message in str(info.value)
    handle = nn.modules.module.register_module_full_backward_hook(lambda *a: None)
    try:
        with pytest.raises(TypeError, match="a global module full backward hook"):
            model_with(lambda c: None).program("x", D)
    finally:
        handle.remove()


def test_hooks_added_or_removed_after_the_first_call_are_seen(backend):
    """Hooks added to or removed from a cell or its submodules after the first call take effect
    at the next call, as a first call would have them (traced, or refused)."""
    torch.manual_seed(17)
    model = edbatch.nn.Propagate(_Hooked(7), state_size=7)
    cell = model.node_cells[0]
    packed = structures.packed("trees", 17)
    inputs = inputs_for(packed, 17)
    assert_same(model, packed, inputs)
    handle = cell.register_forward_hook(lambda module, args, out: 2 * out - 0.5)
    assert_same(model, packed, inputs)
    pre = cell.inner.register_forward_pre_hook(lambda module, args: (args[0], -args[1]))
    assert_same(model, packed, inputs)
    handle.remove()
    assert_same(model, packed, inputs)
    pre.remove()
    assert_same(model, packed, inputs)
    program = model.program("x", D)
    assert model.program("x", D) is program  # nothing changed since: the same program
    for add in (lambda: cell.inner.U.register_forward_hook(lambda module, args, out: 0 * out),
                lambda: cell.register_full_backward_hook(lambda *a: None),
                lambda: nn.modules.module.register_module_forward_hook(lambda *a: None)):
        handle = add()
        try:
            with pytest.raises(TypeError, match="hook"):
                model(packed, **inputs)
        finally:
            handle.remove()
        assert_same(model, packed, inputs)
    nn.utils.weight_norm(cell.inner.U)  # works through a forward pre-hook
    with pytest.raises(TypeError, match="nn.Linear has forward_pre_hooks"):
        model(packed, **inputs)


def test_retained_graph_and_double_backward(backend):
    """Two backwards through one forward (the first with retain_graph=True) equal one backward of
    the sum; the op's gradients refuse a second differentiation (the program runner, plain
    PyTorch, differentiates twice; its second-order values are not checked here)."""
    torch.manual_seed(15)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), cells.ScaleEdge(7), state_size=7)
    packed = structures.packed("dags", 15)
    x = inputs_for(packed, 15)["x"]
    params = list(model.parameters()) + [x]
    g = torch.randn(packed.num_nodes, 7)
    h = model(packed, x=x)
    want = gradients([h, h], [g, 2 * h.detach()], params)
    for p in params:
        p.grad = None
    h = model(packed, x=x)
    (h * g).sum().backward(retain_graph=True)
    h.pow(2).sum().backward()
    assert sum(w is not None for w in want) > 3
    for p, b in zip(params, want):
        if b is not None:
            torch.testing.assert_close(p.grad, b, rtol=1e-5, atol=1e-5 * max(1.0, _max(b)))
    grad_x, = torch.autograd.grad(model(packed, x=x).pow(2).sum(), x, create_graph=True)
    h = model(packed, x=x)
    want_x = gradients([h], [2 * h.detach()], [x])[0]
    torch.testing.assert_close(grad_x.detach(), want_x, rtol=1e-5,
                               atol=1e-5 * max(1.0, _max(want_x)))
    if backend == "op":
        with pytest.raises(RuntimeError, match="cannot be differentiated again"):
            grad_x.pow(2).sum().backward()


def test_changes_in_place_between_forward_and_backward_are_refused(backend):
    """x or a weight changed in place after the forward (an optimizer step before backward) makes
    the backward raise PyTorch's error, as in eager PyTorch, rather than give gradients at the
    old values; changes after the backward (a training loop's step) are as usual."""
    torch.manual_seed(19)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), cells.ScaleEdge(7), state_size=7,
                                 classes=3)
    cell = model.node_cells[0]
    packed = structures.packed("trees", 19)
    packed.labels = torch.randint(-1, 3, (packed.num_nodes,))
    x = inputs_for(packed, 19)["x"]
    start = {k: v.clone() for k, v in model.state_dict().items()}
    changes = [(lambda: cell.U.weight.add_(0.5), "node_cells.0.U.weight"),
               (lambda: x.mul_(2.0), "x")]
    eager = lambda packed, x: reference_of(model, packed, {"x": x})  # noqa: E731
    for change, name in changes:
        for run in (model, eager):
            h = run(packed, x=x)
            with torch.no_grad():
                change()
            with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
                h.pow(2).sum().backward()
            if run is model:
                assert f"{name} is at version" in str(info.value)
    if backend == "op":  # the loss head runs in the op only
        loss = model.loss(packed, x=x)
        with torch.no_grad():
            model.head.weight.mul_(0.5)
        with pytest.raises(RuntimeError, match="head.weight is at version"):
            loss.backward()
    model.load_state_dict(start)
    x = inputs_for(packed, 19)["x"]
    optimizer = torch.optim.SGD(list(model.parameters()) + [x], lr=0.1)
    for _ in range(2):  # forward, backward, step
        optimizer.zero_grad()
        model(packed, x=x).pow(2).sum().backward()
        optimizer.step()
    assert_same(model, packed, {"x": x})


def test_weights_of_another_dtype_or_device_are_named_as_the_module_has_them(backend):
    """A module made float64 (or a weight on another device) is refused by the weight's name in
    the module and PyTorch's dtype, with the remedy."""
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), state_size=7).double()
    packed = structures.packed("trees", 20)
    x = torch.randn(packed.input_ids.numel(), D)
    with pytest.raises(TypeError, match=r"^Propagate: weight node_cells\.0\.lin\.bias must be "
                                        r"float32, got torch\.float64 \(.*\.float\(\) the module"):
        model(packed, x=x)
    model.float()
    model.node_cells[0].U.to("meta")
    with pytest.raises(ValueError, match=r"^Propagate: weight node_cells\.0\.U\.bias is on meta "
                                         r"but x is on cpu"):
        model(packed, x=x)


def test_weight_expressions_follow_the_parameters(backend):
    """A weight expression (cells.OPS "weight slices", "weight arithmetic") is computed again on
    every call: after the parameters change, the outputs still equal the eager cell's."""
    torch.manual_seed(16)
    model = edbatch.nn.Propagate(cells.OpCell("weight arithmetic", 7, D), state_size=7)
    packed = structures.packed("trees", 16)
    inputs = inputs_for(packed, 16)
    assert_same(model, packed, inputs)
    with torch.no_grad():
        model.node_cells[0].W.mul_(-1.5)
        model.node_cells[0].s.add_(0.3)
    assert_same(model, packed, inputs)


def test_top_down_pass_over_the_reversed_batch(backend):
    """A pass over packed.reversed() goes from each root down: every node's state is its cell
    over its parent's state (zeros at the root), written here as that recursion directly."""
    torch.manual_seed(19)
    cell = cells.OpCell("tanh", 7, D)
    down = edbatch.nn.Propagate(cell, state_size=7)
    packed = structures.packed("trees", 19)
    x = inputs_for(packed, 19)["x"]
    reversed_, index = packed.reversed()
    ours = down(reversed_, x=x)[index]
    parent = {}
    for k in range(packed.num_nodes):
        for j in preds_of(packed, k):
            parent[j] = k
    want = [None] * packed.num_nodes
    for k in reversed(range(packed.num_nodes)):  # parents after their children in packed order
        row = int(packed.node_inputs[k])
        xk = x[row:row + 1] if row >= 0 else x.new_zeros(1, D)
        above = want[parent[k]] if k in parent else x.new_zeros(1, 7)
        want[k] = cell(xk, above)
    want = torch.cat(want)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)
    g = torch.randn(want.shape)
    got = torch.autograd.grad((ours * g).sum(), [x] + list(cell.parameters()), allow_unused=True)
    ref = torch.autograd.grad((want * g).sum(), [x] + list(cell.parameters()), allow_unused=True)
    for a, b in zip(got, ref):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def preds_of(packed, k):
    return packed.pred_ids[packed.pred_ptr[k]:packed.pred_ptr[k + 1]].tolist()


def test_function_cells_and_input_kind_none(backend):
    torch.manual_seed(7)
    W = torch.nn.Parameter(0.3 * torch.randn(7, 7))
    b = torch.nn.Parameter(torch.randn(7))

    def node(x, m):
        assert x is None
        return torch.tanh(m @ W + b)

    model = edbatch.nn.Propagate(node, lambda h, x: h * 0.5, state_size=7, initial="learned")
    with torch.no_grad():
        model.initial[0].normal_()
    packed = structures.packed("trees", 7)
    out = model(packed)
    ref = reference_of(model, packed, {})
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert W.grad is not None and b.grad is not None  # parameters outside a module train too


def test_same_cell_for_every_kind(backend):
    """A single cell (not a list) serves every node kind and arc kind of the data."""
    torch.manual_seed(8)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), cells.ScaleEdge(7), state_size=7)
    packed = structures.packed("dags", 8)
    assert packed.arc_types.max() == 2
    assert_same(model, packed, inputs_for(packed, 8))


class _XChainNode(torch.nn.Module):
    """The part that reads only x (a linear layer, a nonlinearity, a slice) is computed for every
    x row ahead of the propagation; x is also read directly (by a concat)."""

    def __init__(self, S, D):
        super().__init__()
        self.Wx, self.U, self.V = torch.nn.Linear(D, 2 * S), torch.nn.Linear(S, S), torch.nn.Linear(D, S)
        self.C = torch.nn.Linear(D + S, S)
        self.S = S

    def forward(self, x, message):
        m, c = message
        p = torch.tanh(self.Wx(x))
        gate = torch.sigmoid(p[:, :self.S] + self.U(m))
        h = gate * p[:, self.S:] + self.V(x * x) * 0.5 + self.C(torch.cat([x, m], -1))
        return h, 0.5 * c + self.V(x)


class _XEdge(torch.nn.Module):
    """An edge cell projecting its arc's x row: W(x) + U(h), and the x projection alone."""

    def __init__(self, S, D):
        super().__init__()
        self.W, self.U = torch.nn.Linear(D, S), torch.nn.Linear(S, S, bias=False)

    def forward(self, state, x):
        h, c = state
        f = torch.sigmoid(self.W(x) + self.U(h))
        return f * h, c + self.W(x)


@pytest.mark.parametrize("kind", ["trees", "lattices", "dags"])
def test_cells_whose_x_part_is_computed_ahead(backend, kind):
    torch.manual_seed(12)
    model = edbatch.nn.Propagate(_XChainNode(13, D), _XEdge(13, D), state_size=(13, 13))
    packed = structures.packed(kind, 12, edge_inputs="parent")
    assert_same(model, packed, inputs_for(packed, 12))


def test_dropout_on_x_before_a_linear_layer_keeps_its_masks(backend):
    """Dropout reads per-call masks, so what follows it is not computed ahead."""
    torch.manual_seed(13)

    class Cell(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.W, self.U, self.drop = torch.nn.Linear(D, 7), torch.nn.Linear(7, 7), torch.nn.Dropout(0.3)

        def forward(self, x, m):
            return torch.tanh(self.W(self.drop(x)) + self.U(m))

    model = edbatch.nn.Propagate(Cell(), state_size=7).train()
    packed = structures.packed("trees", 13)
    inputs = inputs_for(packed, 13)
    torch.manual_seed(14)
    model(packed, **inputs)
    nodes, edges = dropout_sites(model, packed)
    assert_same(model, packed, inputs, seed=14, dropout=(model.last_seed, nodes, edges))


def test_eval_mode_and_no_grad(backend):
    torch.manual_seed(9)
    model = edbatch.nn.Propagate(cells.LSTMCell(7, D, dropout=0.5), state_size=(7, 7)).eval()
    packed = structures.packed("trees", 9)
    inputs = inputs_for(packed, 9)
    assert not model.program("x", D).has_dropout
    with torch.no_grad():
        h, c = model(packed, **inputs)
    assert not h.requires_grad
    ref_h, _ = reference_of(model, packed, inputs)
    torch.testing.assert_close(h, ref_h.detach(), rtol=1e-5, atol=1e-5)


# ---- dropout ----

def dropout_sites(model, packed, kind="x", size=D):
    nk, ak = packed.kinds()
    program = model.program(kind, size, nk, ak)
    doc = program.doc
    return ([program.cell_sites[c] for c in doc["node_cells"]],
            [program.cell_sites[c] for c in doc["edge_cells"]])


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_uses_the_shared_masks(backend, p):
    torch.manual_seed(10)
    model = edbatch.nn.Propagate(cells.LSTMCell(13, D, dropout=p), cells.GateEdge(13, D, p),
                                 state_size=(13, 13)).train()
    packed = structures.packed("trees", 10, edge_inputs="parent")
    inputs = inputs_for(packed, 10)
    torch.manual_seed(11)
    model(packed, **inputs)
    seed = model.last_seed
    assert seed != 0
    nodes, edges = dropout_sites(model, packed)
    assert nodes == [0] and set(edges) == {1}  # node cell first, then the edge cell
    # The same call again (same global seed) draws the same masks; compare with the reference.
    assert_same(model, packed, inputs, seed=11, dropout=(seed, nodes, edges))
    torch.manual_seed(12)
    model(packed, **inputs)
    assert model.last_seed != seed  # every training call draws a new seed


def test_functional_dropout_draws_masks_in_eval_mode(backend):
    """F.dropout(..., training=True) (Monte Carlo dropout at inference) drops in eval mode too,
    with new masks every call, as in PyTorch; nn.Dropout in eval mode does not."""
    torch.manual_seed(13)
    model = edbatch.nn.Propagate(lambda x, m: F.dropout(x, 0.5, training=True) + m,
                                 state_size=D).eval()
    packed = structures.packed("trees", 13)
    inputs = inputs_for(packed, 13)
    torch.manual_seed(14)
    first = model(packed, **inputs)
    seed = model.last_seed
    assert seed != 0
    nodes, edges = dropout_sites(model, packed)
    assert_same(model, packed, inputs, seed=14, dropout=(seed, nodes, edges))
    torch.manual_seed(15)
    assert not torch.equal(model(packed, **inputs), first) and model.last_seed != seed


def test_dropout_mask_statistics():
    """Keep rate 1 - p within 5 binomial standard deviations, for several keys and sizes."""
    for p in (0.1, 0.5, 0.9):
        kept = total = 0
        for index in range(200):
            mask = edbatch.dropout_mask(12345, index, index % 3, 129, p)
            kept += int(mask.sum())
            total += mask.numel()
        sd = (total * p * (1 - p)) ** 0.5
        assert abs(kept - total * (1 - p)) < 5 * sd, (p, kept, total)
    a = edbatch.dropout_mask(1, 0, 0, 64, 0.5)
    assert not torch.equal(a, edbatch.dropout_mask(1, 0, 1, 64, 0.5))  # sites differ
    assert not torch.equal(a, edbatch.dropout_mask(1, 1, 0, 64, 0.5))  # invocations differ
    assert not torch.equal(a, edbatch.dropout_mask(2 << 32, 0, 0, 64, 0.5))  # high seed bits


def test_dropout_output_statistics(backend):
    """The op's dropout of ones: entries are 0 or 1 / (1 - p), kept at rate 1 - p."""
    p = 0.3
    model = edbatch.nn.Propagate(lambda x, m: torch.nn.functional.dropout(x, p, True),
                                 state_size=129)
    packed = edbatch.pack_trees([1] * 100)
    out = model(packed, x=torch.ones(100, 129))
    kept = (out != 0)
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    n, rate = out.numel(), kept.float().mean().item()
    assert abs(rate - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    for k in range(3):
        want = edbatch.dropout_mask(model.last_seed, k, 0, 129, p)
        assert torch.equal(kept[k], want)


# ---- the module ----

def test_module_parameters_state_dict_and_programs():
    torch.manual_seed(13)
    node = cells.LSTMCell(7, D)
    model = edbatch.nn.Propagate(node, cells.GateEdge(7, D), state_size=(7, 7),
                                 initial="learned")
    names = [n for n, _ in model.named_parameters()]
    assert "node_cells.0.W.weight" in names and "edge_cells.0.V.bias" in names
    assert "initial.0" in names and "initial.1" in names
    assert set(model.state_dict()) >= set(names)
    doc = model.program("x", D).doc
    assert doc["weights"][doc["initial_weights"][0]]["name"] == "initial.0"
    assert {w["name"] for w in doc["weights"]} <= set(names)
    training = model.program("x", D)
    assert model.program("x", D) is training  # cached
    model.eval()
    assert model.program("x", D) is not training  # one program per mode


def test_missing_op_is_explained(monkeypatch):
    monkeypatch.setattr(propagate_module, "has_propagate_op", lambda: False)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), state_size=7)
    with pytest.raises(RuntimeError, match="no torch.ops.edbatch.propagate"):
        model(edbatch.pack_trees([1]), x=torch.randn(1, D))


def test_bad_arguments(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # where policy "auto" keeps what it learns
    with pytest.raises(TypeError, match="state_size"):
        edbatch.nn.Propagate(cells.OpCell("tanh", 7, D))
    with pytest.raises(ValueError, match="reduce must be"):
        edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), reduce="min", state_size=7)
    # Policies and thread counts are checked when the module is made, not at its first forward.
    for options, message in [(dict(policy="lb_greedy"), "policy must be one of none, depth"),
                             (dict(policy="fsm:"), "or fsm:FILE"),
                             (dict(threads=-1), "threads must be an int from 0"),
                             (dict(threads=2.5), "threads must be an int from 0"),
                             (dict(threads=2 ** 31), "threads must be an int from 0")]:
        with pytest.raises(ValueError, match=message):
            edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), state_size=7, **options)
        with pytest.raises(ValueError, match=message):
            edbatch.nn.TreeLSTM(30, 6, 5, **options)
        with pytest.raises(ValueError, match=message):
            edbatch.nn.StepDecoder(edbatch.nn.Propagate(cells.OpCell("tanh", 7, D),
                                                        state_size=7), input_size=D, **options)
    # The op's own check, for callers of the ops: no thread count wraps around 32 bits.
    weights = [torch.randn(s) for _, s in edbatch.weight_shapes("tree_lstm", 5, D)]
    with pytest.raises(ValueError, match="threads must be from 0 .* to 1024, got 4294967297"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D), edbatch.pack_trees([(1, (2, 3)), 4]),
                         weights, 5, threads=2 ** 32 + 1)
    # Every policy the engine names (torch.ops.edbatch.policies) is accepted and runs.
    assert {"none", "lb-greedy", "auto"} <= set(edbatch.ops.policies())
    packed, x = edbatch.pack_trees([(1, (2, 3)), 4]), torch.randn(4, D)
    want = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), state_size=7, policy="none")
    for policy in edbatch.ops.policies():
        model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), state_size=7, policy=policy)
        model.load_state_dict(want.state_dict())
        torch.testing.assert_close(model(packed, x=x), want(packed, x=x), rtol=1e-5, atol=1e-6)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), state_size=7)
    packed = edbatch.pack_trees([1])
    with pytest.raises(TypeError, match="x must be a float32"):
        model(packed, x=torch.randn(1, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="not both"):
        model(packed, x=torch.randn(1, D), ids=packed.input_ids)
    # Not a packed batch (a list of trees), for Propagate and a built-in module.
    for module in (model, edbatch.nn.TreeLSTM(30, 6, 5)):
        with pytest.raises(TypeError, match="expected a packed batch .*got list"):
            module([(1, 2)])
    # A cell that reads its input, called with neither x nor ids.
    with pytest.raises(TypeError, match="the cell's input is None: the call was given neither"):
        edbatch.nn.Propagate(lambda x, m: torch.tanh(torch.cat([x, m], -1)), state_size=7)(packed)


class _Symmetric(nn.Module):
    def forward(self, X):
        return (X + X.t()) / 2


class _ParametrizedCell(nn.Module):
    """A node cell over weights that nn.utils.parametrize computes: an orthogonal U, called as
    its module, and a symmetric V, read directly."""

    def __init__(self):
        super().__init__()
        self.W = nn.Linear(D, 7)
        self.U, self.V = nn.Linear(7, 7, bias=False), nn.Linear(7, 7, bias=False)
        parametrizations.orthogonal(self.U)
        parametrize.register_parametrization(self.V, "weight", _Symmetric())

    def forward(self, x, m):
        return torch.tanh(self.W(x) + self.U(m) + m @ self.V.weight.t())


def test_parametrized_weights(backend):
    """Parametrized tensors are weight expressions: PyTorch computes them on every call and
    their gradients reach the parametrizations' originals, as in the eager cell."""
    torch.manual_seed(3)
    model = edbatch.nn.Propagate(_ParametrizedCell(), state_size=7)
    names = [n for n, _ in model.named_parameters()]
    assert "node_cells.0.U.parametrizations.weight.original" in names
    for seed in (11, 12):
        packed = structures.packed("trees", seed)
        assert_same(model, packed, inputs_for(packed, seed))


class _PaddedEmbedding(nn.Module):
    """A node cell that embeds its id with padding_idx (given negative: counted from the end)."""

    def __init__(self, padding_idx):
        super().__init__()
        self.emb = nn.Embedding(structures.VOCAB, 7, padding_idx=padding_idx)
        with torch.no_grad():
            self.emb.weight[padding_idx] = 0.5  # not zero: the lookup still reads the row
        self.U = nn.Linear(7, 7)

    def forward(self, ids, m):
        return torch.tanh(self.emb(ids) + self.U(m))


@pytest.mark.parametrize("padding_idx", [0, 3, -1])
def test_embedding_with_padding_idx(backend, padding_idx):
    """As nn.Embedding: the padding row is read as it is and gets no gradient."""
    torch.manual_seed(5)
    model = edbatch.nn.Propagate(_PaddedEmbedding(padding_idx), state_size=7)
    packed = structures.packed("dags", 7)
    ids = packed.input_ids.clone()
    ids[::3] = padding_idx % structures.VOCAB  # the padding row is read
    assert_same(model, packed, {"ids": ids})
    model(packed, ids=ids).sum().backward()
    grad = model.node_cells[0].emb.weight.grad
    assert grad[padding_idx].abs().sum() == 0 and grad.abs().sum() > 0


def test_loss_step_with_padding_idx():
    """The step ops return a lookup table's gradient as sparse rows: the padding row is left
    out of it, into .grad as loss().backward() gives it, and with lr the table is updated in
    place, p - lr * grad, its padding row unchanged."""
    torch.manual_seed(6)
    model = edbatch.nn.Propagate(_PaddedEmbedding(0), state_size=7, classes=3)
    packed = structures.packed("dags", 8)
    ids = packed.input_ids.clone()
    ids[::2] = 0
    labels = torch.randint(0, 3, (packed.num_nodes,))
    table = model.node_cells[0].emb.weight
    want = model.loss(packed, ids=ids, labels=labels)
    want.backward()
    want_grad = table.grad.clone()
    assert want_grad[0].abs().sum() == 0 and want_grad.abs().sum() > 0
    model.zero_grad()
    got = model.loss_step(packed, ids=ids, labels=labels)
    torch.testing.assert_close(got, want.detach())
    torch.testing.assert_close(table.grad, want_grad, rtol=1e-6, atol=1e-7)
    model.zero_grad()
    before = table.detach().clone()
    model.loss_step(packed, ids=ids, labels=labels, lr=0.5)
    assert table.grad is None or not table.grad.any()  # .grad left as zero_grad() left it
    torch.testing.assert_close(table.detach(), before - 0.5 * want_grad, rtol=1e-6, atol=1e-6)
    assert torch.equal(table[0].detach(), before[0])


class _Settings(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.act, self.drop, self.temp = nn.Linear(D, 7), nn.LeakyReLU(0.01), \
            nn.Dropout(0.5), 1.0

    def forward(self, x, m):
        return self.act(self.drop(self.lin(x)) / self.temp + m)


def test_changed_settings_are_traced_again(backend):
    """What the trace reads as constants, a submodule's plain settings and training flag and a
    cell's own attributes, takes effect at the next call as in eager PyTorch."""
    torch.manual_seed(8)
    model = edbatch.nn.Propagate(_Settings(), state_size=7).eval()
    cell = model.node_cells[0]
    packed = structures.packed("trees", 9)
    inputs = inputs_for(packed, 9)
    assert_same(model, packed, inputs)
    cell.act.negative_slope = 0.5
    assert_same(model, packed, inputs)
    cell.temp = 3.0
    assert_same(model, packed, inputs)
    cell.act = nn.Tanh()  # a module without weights, replaced
    assert_same(model, packed, inputs)
    program = model.program("x", D)
    assert model.program("x", D) is program  # nothing changed: the same program
    model.train()
    cell.drop.p = 0.0  # a dropout schedule at its end
    assert_same(model, packed, inputs)
    cell.drop.p = 0.5
    cell.drop.eval()  # one submodule in eval mode
    assert not model.program("x", D).has_dropout
    assert_same(model, packed, inputs)


class _Configured(nn.Module):
    """A cell reading a setting from an object it holds (a config namespace or dataclass)."""

    def __init__(self, config):
        super().__init__()
        self.lin, self.cfg = nn.Linear(D, 7), config

    def forward(self, x, m):
        return torch.tanh(self.lin(x) * self.cfg.scale + m)


@dataclasses.dataclass
class _Config:
    scale: float = 1.0
    name: str = "cell"


def test_changed_settings_of_propagate_and_of_held_objects_are_traced_again(backend):
    """Propagate's own settings (reduce...) and the plain settings of an object a cell holds
    (self.cfg.scale) changed after the first call take effect at the next call."""
    torch.manual_seed(18)
    packed = structures.packed("dags", 18)
    inputs = inputs_for(packed, 18)
    for config in (types.SimpleNamespace(scale=1.0), _Config()):
        model = edbatch.nn.Propagate(_Configured(config), state_size=7)
        assert_same(model, packed, inputs)
        config.scale = 3.0
        assert_same(model, packed, inputs)
        model.node_cells[0].cfg = type(config)(scale=0.5)  # replaced
        assert_same(model, packed, inputs)
        program = model.program("x", D)
        assert model.program("x", D) is program  # nothing changed since: the same program
        for reduce in ("mean", "max", "sum"):
            model.reduce = reduce
            assert_same(model, packed, inputs)
            assert model.program("x", D).doc["reduce"] == reduce
    model.reduce = "min"
    with pytest.raises(ValueError, match="Propagate: reduce must be 'sum', 'mean', 'max' or "
                                         "'softmax', got 'min'"):
        model(packed, **inputs)
    model.reduce, model.initial_kind = "sum", "learned"
    with pytest.raises(ValueError, match="make the module with initial='learned'"):
        model(packed, **inputs)


class _InputKeywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.ln, self.drop = nn.Linear(D, 7), nn.LayerNorm(7), nn.Dropout(0.0)

    def forward(self, x, m):
        h = self.ln(input=self.lin(input=x)) + self.drop(input=m)
        g = torch.matmul(input=x, other=self.lin.weight.t())
        return torch.tanh(input=h) * F.logsigmoid(input=g)


class _ShapeIdioms(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, 7)
        self.half = np.float32(0.5)  # a NumPy scalar setting

    def forward(self, x, m):
        B, F_ = x.size()
        _, H = m.shape
        dots = [(m[:, k:k + 2] * m[:, :2]).sum(-1) for k in range(3)]  # (batch,) each
        per_row = torch.stack(dots, 1)  # (batch, 3), as an RNTN's bilinear scores
        h = self.lin(x) * self.half + m.new_zeros(B, H) + m[:, 1, None] * m[..., -1, None]
        return torch.tanh(h + torch.cat([per_row, m[:, :4]], -1) / F_)


@pytest.mark.parametrize("cell, kind", [(_InputKeywords, "trees"), (_ShapeIdioms, "dags")])
def test_keyword_inputs_and_shape_idioms_trace_as_pytorch_computes(backend, cell, kind):
    """f(input=x) for the translated modules and functions (it failed inside tracing); B, D =
    x.size() (and x.shape), torch.stack of (batch,) values along dim 1, x[:, i, None] and NumPy
    scalar settings (each was refused)."""
    torch.manual_seed(11)
    model = edbatch.nn.Propagate(cell(), state_size=7)
    packed = structures.packed(kind, 9)
    assert_same(model, packed, {"x": torch.randn(packed.input_ids.numel(), D).requires_grad_()})


class _OwnsItsCell(nn.Module):
    """A model whose cell is its own method (Propagate(self.cell))."""

    def __init__(self):
        super().__init__()
        self.U = nn.Linear(7, 7)
        self.W = nn.Parameter(torch.randn(D, 7) * 0.5)
        self.calls = 0
        self.prop = edbatch.nn.Propagate(self.cell, state_size=7)

    def cell(self, x, m):
        return torch.tanh(x @ self.W + self.U(m))


def test_a_bound_method_cell_follows_its_module(backend):
    """A cell that is a module's own method reads that module's submodules and parameters: one
    replaced (model.U = nn.Linear(...), model.W = nn.Parameter(...)) makes the next call trace
    again, as a cell's own would (the old layer was run and trained); a plain attribute of the
    module (a step counter) keeps the program."""
    torch.manual_seed(9)
    model = _OwnsItsCell()
    packed = structures.packed("trees", 9)
    x = torch.randn(packed.input_ids.numel(), D)

    def check():
        params = [model.W, *model.U.parameters()]
        ours = model.prop(packed, x=x)
        ref = reference_of(model.prop, packed, {"x": x})
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
        up = [torch.randn(ref.shape)]
        for a, b in zip(gradients([ours], up, params), gradients([ref], up, params)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    check()
    program = model.prop.program("x", D)
    model.calls += 1
    assert model.prop.program("x", D) is program
    model.U = nn.Linear(7, 7)
    check()
    model.W = nn.Parameter(torch.randn(D, 7))
    check()


def test_a_replaced_submodule_is_traced_again(backend):
    """The program reads weights from the modules it was traced from: a submodule replaced
    after the first forward (or a whole cell) makes the next call trace the cells again, so the
    new module's weights are read; an unchanged module keeps its program."""
    torch.manual_seed(8)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, D), state_size=7)
    packed = structures.packed("trees", 9)
    x = torch.randn(packed.input_ids.numel(), D)
    model(packed, x=x)
    program = model.program("x", D)
    model(packed, x=x)
    assert model.program("x", D) is program  # nothing replaced: the same program
    model.node_cells[0].U = nn.Linear(7, 7)
    assert_same(model, packed, {"x": x.clone().requires_grad_()})
    model.node_cells[0] = cells.OpCell("sigmoid", 7, D)
    assert_same(model, packed, {"x": x.clone().requires_grad_()})
