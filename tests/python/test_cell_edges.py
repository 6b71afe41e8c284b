"""User cells at the edges of PyTorch's semantics, each against the same cells run node by node
(reference.propagate_reference): selections (relu, where, masked_fill, threshold) that cut off an
infinite gradient, values only compared, logsumexp of infinite rows, a namedtuple state,
parameters and buffers that a module gains, loses or reshapes after its first call, and
functional_call's overrides. On the CPU, and on CUDA where there is a GPU."""
import collections
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import stateless

import edbatch

import reference

D, H = 3, 5  # awkward sizes
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def packed_trees():
    return edbatch.pack_trees([(1, 2), ((3, 4), 5), 6, (7, (8, 9, 10))])


class Cell(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f, self.W, self.U = f, nn.Linear(D, H), nn.Linear(H, H)

    def forward(self, x, m):
        return self.f(self.W(x) + self.U(m))


def outputs_and_grads(model, packed, x, run):
    """run(model, packed, x) -> state; its outputs and the gradients of sum(state * r)."""
    x = x.detach().clone().requires_grad_()
    out = run(model, packed, x)
    r = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
    (out * r).sum().backward()
    grads = [p.grad.detach().cpu().clone() for p in model.parameters()] + [x.grad.cpu()]
    return out.detach().cpu(), grads


def check_against_reference(cell, packed, x, device, **options):
    prop = edbatch.nn.Propagate(copy.deepcopy(cell), state_size=H, **options).to(device)
    got = outputs_and_grads(prop, packed.to(device), x.to(device),
                            lambda m, p, xs: m(p, x=xs))
    want = outputs_and_grads(copy.deepcopy(cell), packed, x,
                             lambda m, p, xs: reference.propagate_reference(
                                 m, None, p, x=xs, state_size=H))
    for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,f", [
    ("relu", lambda a: torch.relu(a).sqrt()),
    ("where", lambda a: torch.where(a > 0, a, 0.0).sqrt()),
    ("masked_fill", lambda a: a.masked_fill(a < 0, 0.0).sqrt()),
    ("threshold", lambda a: F.threshold(a, 0.0, 0.0).log().clamp(min=-5)),
    ("relu then reciprocal", lambda a: (torch.relu(a) + (a <= 0).float()).reciprocal()),
])
def test_selections_pass_no_gradient_where_they_cut_an_infinite_one(device, name, f):
    """sqrt(relu(a)) has an infinite derivative where relu cut a off: PyTorch selects, so the
    gradient there is 0, not inf * 0."""
    torch.manual_seed(1)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    cell = Cell(f)
    with torch.no_grad():  # some entries cut off exactly at 0 (a relu of exactly 0)
        cell.W.bias[0] = -100.0
    check_against_reference(cell, packed, x, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,f", [
    ("a norm compared", lambda a: torch.where(
        torch.sqrt((a * a).sum(-1, keepdim=True)) > 1.0, 0.5 * a, a)),
    ("a log compared", lambda a: torch.where(torch.log(a.abs()) > 0, a, 2 * a)),
    ("a quotient compared", lambda a: a * (1.0 / a.abs() > 2.0).float()),
])
def test_values_only_compared_pass_no_gradient(device, name, f):
    """A value read only by a comparison gets no gradient in PyTorch: here, one whose derivative
    is infinite at a node whose pre-activation is exactly 0 (a leaf of zeros) must not turn the
    batch's weight gradients into NaN (0 * inf)."""
    torch.manual_seed(3)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    x[0] = 0.0  # leaf 0: W x + U(0) = 0 with both biases 0
    cell = Cell(f)
    with torch.no_grad():
        cell.W.bias.zero_()
        cell.U.bias.zero_()
    check_against_reference(cell, packed, x, device)


@pytest.mark.parametrize("device", DEVICES)
def test_logsumexp_of_infinite_rows_is_infinite_as_in_pytorch(device):
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.W = nn.Linear(D, H)
            self.register_buffer("mask", torch.tensor([True, True, False, True, True]))

        def forward(self, x, m):
            a = self.W(x) + m
            s = a.masked_fill(self.mask, float("-inf")).logsumexp(-1, keepdim=True)
            full = a.masked_fill(self.mask | ~self.mask, float("-inf"))
            top = a.masked_fill(~self.mask, float("inf")).logsumexp(-1, keepdim=True)
            return torch.tanh(a + s) + full.logsumexp(-1, keepdim=True).exp() * top.exp().tanh()

    torch.manual_seed(2)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    cell = Masked().to(device)
    got = edbatch.nn.Propagate(cell, state_size=H)(packed.to(device), x=x.to(device)).cpu()
    want = reference.propagate_reference(cell.cpu(), None, packed, x=x, state_size=H)
    assert not torch.isnan(want).any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


State = collections.namedtuple("State", "h c")


class NamedState(nn.Module):
    def __init__(self):
        super().__init__()
        self.W, self.U = nn.Linear(D, H), nn.Linear(H, H)

    def forward(self, x, message):
        h, c = message
        c = torch.tanh(self.W(x) + self.U(h)) + 0.5 * c
        return State(torch.sigmoid(c), c)


def test_a_namedtuple_state_reads_as_its_fields():
    torch.manual_seed(3)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    cell = NamedState()
    got = edbatch.nn.Propagate(cell, state_size=(H, H))(packed, x=x)
    want = reference.propagate_reference(cell, None, packed, x=x, state_size=(H, H))
    assert isinstance(got, tuple) and len(got) == 2
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class Affine(nn.Module):
    def __init__(self, bias=True, affine=True):
        super().__init__()
        self.W = nn.Linear(D, H)
        self.U = nn.Linear(H, H, bias=bias)
        self.ln = nn.LayerNorm(H, elementwise_affine=affine)
        self.t = nn.Parameter(torch.tensor(0.7))

    def forward(self, x, m):
        return torch.tanh(self.ln(self.W(x) * self.t + self.U(m)))


@pytest.mark.parametrize("change", ["bias added", "bias removed", "affine added",
                                    "scalar to vector"])
def test_parameters_gained_lost_or_reshaped_after_the_first_call_are_traced_again(change):
    torch.manual_seed(4)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    cell = Affine(bias=change != "bias added", affine=change != "affine added")
    prop = edbatch.nn.Propagate(cell, state_size=H)
    prop(packed, x=x)  # traced
    if change == "bias added":
        cell.U.bias = nn.Parameter(torch.randn(H))
    elif change == "bias removed":
        cell.U.bias = None
    elif change == "affine added":
        cell.ln.weight = nn.Parameter(torch.full((H,), 3.0))
        cell.ln.bias = nn.Parameter(torch.ones(H))
    else:
        cell.t = nn.Parameter(torch.randn(H))
    got = outputs_and_grads(prop, packed, x, lambda m, p, xs: m(p, x=xs))
    want = outputs_and_grads(copy.deepcopy(cell), packed, x,
                             lambda m, p, xs: reference.propagate_reference(
                                 m, None, p, x=xs, state_size=H))
    for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.W, self.U = nn.Linear(D, H), nn.Linear(H, H)
        self.register_buffer("scale", torch.ones(H))

    def forward(self, x, m):
        return torch.tanh(self.W(x) + self.U(m) * self.scale)


class Model(nn.Module):
    def __init__(self, run):
        super().__init__()
        self.cell, self.run = Scaled(), run

    def forward(self, packed, x):
        return self.run(self.cell, packed, x)


def test_functional_call_overrides_buffers_and_parameters():
    torch.manual_seed(5)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    ours = Model(None)
    prop = edbatch.nn.Propagate(ours.cell, state_size=H)
    ours.run = lambda cell, p, xs: prop(p, x=xs)
    eager = Model(lambda cell, p, xs: reference.propagate_reference(cell, None, p, x=xs,
                                                                    state_size=H))
    eager.cell = copy.deepcopy(ours.cell)
    ours(packed, x)  # traced outside functional_call
    override = {"cell.scale": torch.full((H,), -2.0), "cell.W.weight": torch.randn(H, D)}
    got = stateless.functional_call(ours, override, (packed, x))
    want = stateless.functional_call(eager, override, (packed, x))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours(packed, x), eager(packed, x), rtol=1e-5, atol=1e-6)


def test_an_inference_mode_x_is_refused_with_what_to_do():
    packed = packed_trees()
    with torch.inference_mode():
        x = torch.randn(packed.input_ids.numel(), D)
    with pytest.raises(RuntimeError, match="x was made under torch.inference_mode.*x.clone()"):
        edbatch.nn.Propagate(Cell(torch.tanh), state_size=H)(packed, x=x)
    out = edbatch.nn.Propagate(Cell(torch.tanh), state_size=H)(packed, x=x.clone())
    assert out.requires_grad


def test_a_learned_initial_message_replaced_or_overridden_is_the_one_used():
    torch.manual_seed(6)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    cell = Cell(torch.tanh)
    prop = edbatch.nn.Propagate(cell, state_size=H, initial="learned")
    prop(packed, x=x)  # traced with the first initial vector
    new = nn.Parameter(torch.randn(H))
    prop.initial[0] = new
    got = prop(packed, x=x)
    want = reference.propagate_reference(cell, None, packed, x=x, state_size=H,
                                         initial=[new.detach()])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    got.sum().backward()
    assert new.grad is not None and new.grad.abs().sum() > 0
    other = torch.randn(H)
    over = stateless.functional_call(prop, {"initial.0": other}, (packed,), {"x": x})
    torch.testing.assert_close(over, reference.propagate_reference(
        cell, None, packed, x=x, state_size=H, initial=[other]), rtol=1e-5, atol=1e-6)


def test_torch_jit_trace_is_refused_by_name():
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    prop = edbatch.nn.Propagate(Cell(torch.tanh), state_size=H)
    prop(packed, x=x)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.prop = prop

        def forward(self, x):
            return self.prop(packed, x=x)

    with pytest.raises(RuntimeError, match="cannot be recorded by torch.jit.trace"):
        torch.jit.trace(Model(), (x,))


def test_a_first_trace_under_torch_2_functional_call_reads_the_module_afterwards():
    """torch 2.x's functional_call puts plain tensors where the module's parameters are for the
    call (done by hand where torch.func is missing): a cell first traced then uses them, and the
    next call outside it the module's own parameters, with their gradients."""
    torch.manual_seed(9)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    cell = Cell(torch.tanh)
    prop = edbatch.nn.Propagate(cell, state_size=H)
    other = torch.randn(H, D)
    if hasattr(torch, "func"):
        got = torch.func.functional_call(prop, {"node_cells.0.W.weight": other}, (packed,),
                                         {"x": x})
    else:
        own = cell.W._parameters["weight"]
        cell.W._parameters["weight"] = other
        try:
            got = prop(packed, x=x)
        finally:
            cell.W._parameters["weight"] = own
    swapped = copy.deepcopy(cell)
    with torch.no_grad():
        swapped.W.weight.copy_(other)
    want = reference.propagate_reference(swapped, None, packed, x=x, state_size=H)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    out = prop(packed, x=x)
    torch.testing.assert_close(
        out, reference.propagate_reference(cell, None, packed, x=x, state_size=H),
        rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert cell.W.weight.grad is not None and cell.W.weight.grad.abs().sum() > 0


def test_a_module_weight_that_is_a_buffer_or_a_plain_tensor():
    """nn.Linear's weight as a buffer is a fixed weight (no gradient), as buffers are elsewhere
    in cells; as a plain attribute (del lin.weight; lin.weight = 2 * v) it is a constant to a
    trace, refused as such rather than as a missing weight."""
    torch.manual_seed(10)
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    cell = Cell(torch.tanh)
    fixed = cell.U.weight.detach().clone()
    del cell.U.weight
    cell.U.register_buffer("weight", fixed)
    out = edbatch.nn.Propagate(cell, state_size=H)(packed, x=x)
    torch.testing.assert_close(
        out, reference.propagate_reference(cell, None, packed, x=x, state_size=H),
        rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert cell.W.weight.grad is not None and cell.U.bias.grad is not None
    cell = Cell(torch.tanh)
    v = nn.Parameter(torch.randn(H, H))
    del cell.U.weight
    cell.U.weight = 2 * v
    with pytest.raises(TypeError, match="the tensor attribute .*U.weight is a constant"):
        edbatch.nn.Propagate(cell, state_size=H)(packed, x=x)


def test_a_global_forward_hook_is_named_as_global():
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    handle = nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        with pytest.raises(TypeError, match="global forward_hooks .*register_module_forward_hook"
                                            ".* would run for nn.Linear"):
            edbatch.nn.Propagate(Cell(torch.tanh), state_size=H)(packed, x=x)
    finally:
        handle.remove()


def _functorch():
    if hasattr(torch, "func"):
        return torch.func
    return pytest.importorskip("functorch")


def test_function_transforms_are_refused_by_name():
    """torch.func / functorch's grad, vjp and jacrev are refused by name (torch 1.13's pass the
    op tensors without storage); autograd.grad of the same runs."""
    ft = _functorch()
    packed = packed_trees()
    x = torch.randn(packed.input_ids.numel(), D)
    prop = edbatch.nn.Propagate(Cell(torch.tanh), state_size=H)
    prop(packed, x=x)
    f = lambda v: prop(packed, x=v).sum()  # noqa: E731
    for transform in (lambda: ft.grad(f)(x), lambda: ft.vjp(f, x),
                      lambda: ft.jacrev(f)(x)):
        # torch 1.13's functorch reaches the op, which names what it supports; torch 2.x
        # refuses C++ autograd functions under these transforms itself.
        with pytest.raises((ValueError, RuntimeError), match="functorch transforms"):
            transform()
    x.requires_grad_()
    gx, = torch.autograd.grad(f(x), x)
    assert gx.shape == x.shape and torch.isfinite(gx).all()
