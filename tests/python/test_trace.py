"""The tracer's programs (docs/programs.md): instructions, sizes, weights and layouts,
deduplication, dropout sites; refusals name the operation, the cell and the line; the dropout
hash equals an independent uint32 implementation."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edbatch
from edbatch.trace import trace_program
from edbatch.trace_dropout import dropout_hash, dropout_key, dropout_threshold


def trace(node, edge=None, state_size=7, **options):
    options.setdefault("input_size", 5)
    return trace_program(node, edge, state_size=state_size, **options)


def body(program, cell=0):
    return [{k: v for k, v in ins.items() if k != "where"}
            for ins in program.doc["cells"][cell]["body"]]


class Simple(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 7)

    def forward(self, x, m):
        return torch.tanh(self.lin(x) + m)


def test_a_simple_cell():
    program = trace(Simple())
    doc = json.loads(program.text)
    assert doc["version"] == 1 and doc["input"] == {"kind": "x", "size": 5}
    assert doc["state"] == [7] and doc["message"] == [7] and doc["reduce"] == "sum"
    assert doc["node_cells"] == [0] and doc["edge_cells"] == [] and doc["initial_weights"] == []
    assert doc["weights"] == [
        {"name": "node_cells.0.lin.bias", "rows": 7, "cols": 0, "layout": "vector"},
        {"name": "node_cells.0.lin.weight", "rows": 7, "cols": 5, "layout": "transpose"}]
    assert body(program) == [
        {"op": "input", "size": 5, "slot": 0}, {"op": "input", "size": 7, "slot": 1},
        {"op": "linear", "size": 7, "args": [0], "weight": 1, "bias": 0},
        {"op": "add", "size": 7, "args": [2, 1]}, {"op": "tanh", "size": 7, "args": [3]}]
    assert doc["cells"][0]["outputs"] == [4]
    assert doc["cells"][0]["name"] == "node cell 0 (Simple)"
    where = doc["cells"][0]["body"][2]["where"]
    assert where.endswith(f"test_trace.py:{Simple.forward.__code__.co_firstlineno + 1}")


class Shared(nn.Module):
    """Weights used by a node cell and an edge cell."""

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(7, 3))  # (in, out): x @ W is as_is
        self.emb = nn.Embedding(11, 7)

    def node(self, ids, m):
        return torch.tanh(torch.cat([self.emb(ids) @ self.W, m @ self.W.t().t(), m[:, :1]], -1))

    def edge(self, h, ids):
        return h @ self.W @ self.W.T + self.emb(ids)


def test_layouts_and_weight_sharing():
    shared = Shared()
    program = trace(shared.node, shared.edge, input_kind="ids")
    doc = program.doc
    layouts = [(w["rows"], w["cols"], w["layout"]) for w in doc["weights"]]
    assert layouts.count((7, 3, "as_is")) == 1  # one weight for every use by both cells
    assert (7, 3, "transpose") in layouts and (11, 7, "lookup") in layouts
    assert len(layouts) == 3 and doc["input"] == {"kind": "ids", "size": 0}
    assert body(program, 0)[0] == {"op": "ids", "size": 1, "slot": 0}
    assert body(program, 0)[1] == {"op": "input", "size": 7, "slot": 1}
    assert [i["op"] for i in body(program, 1)][:3] == ["input", "ids", "linear"]
    weights = program.weights()
    assert sum(w is shared.W for w in weights) == 2 and any(w is shared.emb.weight
                                                            for w in weights)


def test_scalars_and_unary_minus():
    program = trace(lambda x, m: (2 - m) + m / 4 + 3 / m + (-m) * 0.5 + (m - 1))
    ops = [(i["op"], i.get("alpha"), i.get("beta")) for i in body(program)[2:]]
    assert ops == [("scale", -1.0, 2.0), ("scale", 0.25, 0.0), ("add", None, None),
                   ("rdiv", 3.0, None), ("add", None, None), ("scale", -1.0, 0.0),
                   ("scale", 0.5, 0.0), ("add", None, None), ("scale", 1.0, -1.0),
                   ("add", None, None)]


def test_chunk_split_and_slice_sizes():
    def node(x, m):
        a, b, c = m.chunk(3, -1)           # 7 -> 3, 3, 1
        d, e = torch.split(m, [2, 5], 1)
        f = m[..., -4:-1]
        return torch.cat([a, b, c, d, e, f, x.narrow(-1, 1, 2)], -1)[:, 4:11]

    program = trace(node)
    slices = [(i["begin"], i["end"], i["size"]) for i in body(program) if i["op"] == "slice"]
    assert slices == [(0, 3, 3), (3, 6, 3), (6, 7, 1), (0, 2, 2), (2, 7, 5), (3, 6, 3),
                      (1, 3, 2), (4, 11, 7)]


def test_dropout_in_training_only_and_sites():
    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.25)

        def forward(self, x, m):
            return F.dropout(self.drop(m), 0.5, self.training) + F.dropout(m, 0.1, False)

    cell = Cell()
    edge = lambda h, x: F.dropout(h, 0.3)  # noqa: E731  (F.dropout's training=True default)
    program = trace(cell.train(), [edge, edge])
    assert [i["p"] for i in body(program) if i["op"] == "dropout"] == [0.25, 0.5]
    assert program.cell_sites == [0, 2] and program.has_dropout
    assert program.doc["edge_cells"] == [1, 1]  # one cell for both arc kinds
    program = trace(cell.eval())
    assert not program.has_dropout


def test_layer_norm_softmax_and_learned_initial():
    ln = nn.LayerNorm(7, eps=1e-3)
    init = nn.Parameter(torch.zeros(7))
    program = trace(lambda x, m: torch.log_softmax(ln(m), -1), initial="learned",
                    initial_weights=[("initial.0", init)])
    ops = body(program)
    assert ops[2] == {"op": "layer_norm", "size": 7, "args": [1], "eps": 1e-3, "weight": 0,
                      "bias": 1}
    assert ops[3] == {"op": "log_softmax", "size": 7, "args": [2]}
    assert program.doc["initial_weights"] == [2]
    assert program.doc["weights"][2] == {"name": "initial.0", "rows": 7, "cols": 0,
                                         "layout": "vector"}


def test_input_kind_none_keeps_slot_zero():
    program = trace(lambda x, s: (s[0] * 2, s[1]), state_size=(7, 3), input_kind="none")
    assert body(program)[:2] == [{"op": "input", "size": 7, "slot": 1},
                                 {"op": "input", "size": 3, "slot": 2}]
    assert program.doc["cells"][0]["outputs"] == [2, 1]


def test_edge_cells_define_the_message():
    program = trace(lambda x, m: torch.tanh(m[0][:, :7] + m[1]),
                    lambda s, x: (torch.cat([s, s], -1), s), state_size=7)
    assert program.doc["message"] == [14, 7] and program.message_tuple
    edge = program.doc["cells"][1]
    assert [i["slot"] for i in edge["body"] if i["op"] == "input"] == [0, 1]  # state, then x


# ---- refusals ----

def refused(error, *patterns, **options):
    def check(node, edge=None):
        with pytest.raises(error) as info:
            trace(node, edge, **options)
        for p in patterns:
            assert p in str(info.value), (p, str(info.value))
        return str(info.value)
    return check


class _IntegerBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.arange(7))

    def forward(self, x, m):
        return m * self.steps


class _BadWeightProduct(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(7, 3))

    def forward(self, x, m):
        return m @ (self.w @ self.w)


class _WritesWeight(nn.Module):
    def __init__(self, writes):
        super().__init__()
        self.w, self.writes = nn.Parameter(torch.ones(7, 7)), writes

    def forward(self, x, m):
        self.writes(self.w)
        return m @ self.w


class _Column(nn.Module):
    """A (n, 1) weight would broadcast to (n, n) against a row, not along the features."""

    def __init__(self):
        super().__init__()
        self.c = nn.Parameter(torch.ones(7, 1))

    def forward(self, x, m):
        return m + self.c


class ArgSorts(nn.Module):
    def forward(self, x, m):
        return torch.argsort(m, dim=-1)


def test_unsupported_operation_names_op_cell_and_line():
    line = ArgSorts.forward.__code__.co_firstlineno + 1
    message = refused(TypeError, "torch.argsort is not supported",
                      "node cell 0 (ArgSorts)", f"test_trace.py:{line}",
                      "torch.argsort(m, dim=-1)", "cells may contain")(ArgSorts())
    assert "nn.Linear" in message and "torch.einsum of the forms" in message
    # The reason and the user's line first; the long list of what is supported after them.
    head = message[:message.index("cells may contain")]
    assert "torch.argsort(m, dim=-1)" in head and len(head) < 300


def _viewed_twice(g):
    g[:, :5][:, :2].mul_(2)
    return g


def _negated_first(mask):
    mask[:, 0].logical_not_()  # a comparison's view: refused as a view
    return mask


def _viewed_through_a_view(g):
    v = g[:, :4]
    w = v[:, :2]
    del v
    g.mul_(2)
    return torch.cat([g[:, :5], w], -1)


def _overlapping(g):
    kept = g[:, 2:5]
    g[:, :3].mul_(2)
    return g + kept.sum(-1, keepdim=True)


def _reshaped_then_changed(g):
    kept = g.view(-1, 7)
    g.mul_(2)
    return g + kept


def _dropped_then_changed(t):
    F.relu(F.dropout(t, 0.5, False), inplace=True)  # t is the tensor changed
    return t


def _assigned(h, key, value):
    h[key] = value
    return h


class _Viewed(nn.Module):
    """In PyTorch `a += m` changes `first`, a view of a, too."""

    def forward(self, x, m):
        a = torch.tanh(m)
        first = a[:, :3]
        a += m
        return torch.cat([first, a[:, 3:]], -1)


class _Stopped(nn.Module):
    def __init__(self):
        super().__init__()
        self.U = nn.Linear(7, 7)

    def forward(self, x, m):
        with torch.no_grad():
            g = torch.sigmoid(self.U(m))
        return m * g


class _TensorConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.full((7,), 2.0)  # neither a buffer nor a parameter

    def forward(self, x, m):
        h = torch.tanh(m)
        return h * self.scale


def test_silent_differences_from_pytorch_are_refused_at_their_line():
    """In-place changes that PyTorch would make visible where the trace cannot follow them,
    gradients turned off in the cell (whatever the caller's mode), and a tensor attribute: each
    named at its own line."""
    first = _Viewed.forward.__code__.co_firstlineno
    refused(TypeError, "the in-place operator += changes a value that has a view (an index or a "
            "slice x[...])", f"test_trace.py:{first + 3}", "a += m")(_Viewed())
    refused(TypeError, "the in-place operator *= changes an input of the cell")(
        lambda x, m: m.__imul__(2.0))
    refused(TypeError, "Tensor.add_ changes an input of the cell")(
        lambda x, m: torch.tanh(m) + m.add_(1))
    refused(TypeError, "Tensor.mul_ changes an input of the cell")(
        lambda x, m: torch.cat([m[:, :3].mul_(2), m[:, 3:]], -1))
    refused(TypeError, "Tensor.mul_ changes a view of a view")(
        lambda x, m: _viewed_twice(torch.tanh(m)))
    refused(TypeError, "Tensor.mul_ changes a view of a value whose other view (an index or a "
            "slice x[...]) shares its features")(lambda x, m: _overlapping(torch.tanh(m)))
    refused(TypeError, "Tensor.sigmoid_ changes a view (a piece of torch.chunk) that PyTorch "
            "does not let change")(
        lambda x, m: torch.cat([p.sigmoid_() for p in torch.chunk(torch.tanh(m), 7, -1)], -1))
    refused(TypeError, "Tensor.add_ changes a view (Tensor.contiguous)")(
        lambda x, m: torch.tanh(m).contiguous().add_(1))
    refused(TypeError, "Tensor.mul_ changes a value that has a view (an index or a slice")(
        lambda x, m: _viewed_through_a_view(torch.tanh(m)))  # its name gone, not its view's
    refused(TypeError, "Tensor.logical_not_ changes a view (an index or a slice")(
        lambda x, m: torch.where(_negated_first(m > 0), m, -m))
    refused(TypeError, "Tensor.mul_ changes a value that has a view (Tensor.view)")(
        lambda x, m: _reshaped_then_changed(torch.tanh(m)))
    refused(TypeError, "F.relu(..., inplace=True) changes a tensor that torch.tanh and "
            "F.dropout both give")(
        lambda x, m: _dropped_then_changed(torch.tanh(m)))
    refused(ValueError, "Tensor.add_ would change the shape or dtype", "a (batch, 1) float "
            "tensor into a (batch, 7) float tensor")(
        lambda x, m: m + torch.tanh(m).sum(-1, keepdim=True).add_(m))
    refused(TypeError, "x[...] = v changes an input of the cell")(
        lambda x, m: _assigned(m, (slice(None), 0), 1.0))
    refused(TypeError, "x[...] = v changes a view (Tensor.view)")(
        lambda x, m: _assigned(torch.tanh(m).view(-1, 7), (slice(None), 0), 1.0))
    refused(ValueError, "the batch dim is not indexed")(
        lambda x, m: _assigned(torch.tanh(m), 0, 1.0))
    refused(ValueError, "PyTorch refuses a (batch, 1) one")(
        lambda x, m: _assigned(torch.tanh(m), (slice(None), 0), m[:, :1]))
    refused(ValueError, "x[...] = v: a value of 7 features for 2 positions")(
        lambda x, m: _assigned(torch.tanh(m), (slice(None), slice(0, 2)), m))
    refused(ValueError, "x[mask] = value takes a Python number")(
        lambda x, m: _assigned(torch.tanh(m), m > 0, m))
    refused(ValueError, "requires_grad_(False) of a value the cell computes")(
        lambda x, m: torch.tanh(m).requires_grad_(False))
    refused(TypeError, "Tensor.index_add_ is not supported in cells")(
        lambda x, m: torch.tanh(m).index_add_(1, torch.tensor([0]), m[:, :1]))
    refused(ValueError, "fill_ with a tensor value is not supported")(
        lambda x, m: torch.tanh(m).fill_(m[:, :1]))
    first = _Stopped.forward.__code__.co_firstlineno
    with torch.no_grad():  # the caller's mode is not the cell's
        refused(TypeError, "gradients turned off inside a cell", f"test_trace.py:{first + 2}")(
            _Stopped())
    first = _TensorConstant.forward.__code__.co_firstlineno
    refused(TypeError, "the tensor attribute node_cells.0.scale is a constant",
            f"test_trace.py:{first + 2}", "h * self.scale")(_TensorConstant())


class _Temperature(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = nn.Parameter(torch.tensor(2.0))
        self.register_buffer("scale", torch.tensor([1.0, 2.0]))

    def forward(self, x, m):
        return torch.tanh(m / self.t.item())

    def of_buffer(self, x, m):
        return m * self.scale.tolist()[1] + m * self.scale.max().item()


def test_python_values_of_weights_are_refused():
    """.item() / .tolist() of a weight would be the trace's constant, its value when the cell
    was traced, not after an optimizer step: refused at its line, in a cell, a bound-method cell
    and a closure (sizes of weights are kept)."""
    first = _Temperature.forward.__code__.co_firstlineno
    refused(ValueError, "Tensor.item of a weight gives a Python value", "not x / self.t.item()",
            f"test_trace.py:{first + 1}")(_Temperature())
    cell = _Temperature()
    refused(ValueError, "Tensor.item of a weight")(cell.forward)
    refused(ValueError, "Tensor.item of a weight")(lambda x, m, c=cell: m * c.t.item())
    refused(ValueError, "Tensor.tolist of a weight")(lambda x, m, c=cell: m * c.t.tolist())
    refused(ValueError, "Tensor.tolist of a weight")(
        type("Buffered", (_Temperature,), {"forward": _Temperature.of_buffer})())
    trace(lambda x, m, c=cell: m * c.t.dim() / c.t.numel())  # sizes: constants


class _SubclassedLSTMCell(nn.LSTMCell):
    def forward(self, x, state):
        h, c = super().forward(x, state)
        return torch.tanh(h), c


def test_refusals_of_everyday_idioms_say_what_is_wrong():
    """Each of these was refused with a message that did not fit (fx's own advice, an index
    error, the batch dim, an attribute the cell does not have, 'torch.no_grad')."""
    refused(TypeError, "len() of a traced tensor is not supported", "x.size(0) is the batch")(
        lambda x, m: m + torch.zeros(len(m), 7))
    refused(ValueError, "x[:, 1:3, None] is not supported", "x[:, i, None]")(
        lambda x, m: m * m[:, 1:3, None].sum(-1).sum(-1, keepdim=True))
    refused(ValueError, "x[:, 9, None]: 9 is out of range for 7 features")(
        lambda x, m: m * m[:, 9, None])
    refused(ValueError, "torch.stack of (batch,) values along dim 0 would move the batch dim")(
        lambda x, m: torch.stack([m.sum(-1), m.sum(-1)], 0).sum(0, keepdim=True) + m)
    refused(TypeError, "a tensor made in the cell from Python values (torch.tensor",
            "of shape (1, 1, 1)")(lambda x, m: m * torch.tensor([[[2.0]]]))
    # a 0-d integer one may be a dim or an index (m.sum(torch.tensor(1)) in PyTorch): refused
    refused(TypeError, "(0-d floating-point)", "a Python number for a 0-d integer one")(
        lambda x, m: m * torch.tensor(2))
    refused(TypeError, "is not supported in cells", "inside torch's own nn/modules/rnn.py",
            "call the module itself", state_size=(7, 7))(_SubclassedLSTMCell(5, 7))
    with pytest.raises(ValueError, match="without edge cells the messages are the states"):
        trace(lambda x, m: m, message_size=8)


def test_einsums_without_a_program_form_are_refused():
    w = nn.Parameter(torch.ones(7, 7))
    refused(ValueError, "torch.einsum 'bij,bk->bijk' of stacks is not supported",
            "at most two subscripts besides the batch's")(
        lambda x, m: torch.einsum("bij,bk->bijk", torch.stack([m, m], 1), m).sum(-1))
    refused(TypeError, "one or two operands")(
        lambda x, m, w=w: torch.einsum("bi,ij,bj->b", m, w, m))
    refused(TypeError, "the batch subscript 'b' first")(
        lambda x, m: torch.einsum("bi,bi->i", m, m))
    refused(TypeError, "one or two operands without '...'")(
        lambda x, m: torch.einsum("...i,...i->...i", m, m))
    refused(ValueError, "subscripts 'i' for a weight of 2 dims")(
        lambda x, m, w=w: torch.einsum("bi,i->bi", m, w))


def test_multihead_attention_refuses_masks_dropout_and_tensors_of_other_shapes():
    mha = nn.MultiheadAttention(7, 1, batch_first=True, dropout=0.1)
    sequence_first = nn.MultiheadAttention(7, 1)
    s = lambda m: torch.stack([m, m], 1)  # noqa: E731
    refused(TypeError, "with attn_mask is not supported")(
        lambda x, m: mha.eval()(s(m), s(m), s(m), attn_mask=m > 0)[0].sum(1))
    refused(TypeError, "attention dropout is not supported")(
        lambda x, m: mha.train()(s(m), s(m), s(m))[0].sum(1))
    refused(TypeError, "average_attn_weights=False")(
        lambda x, m: mha.eval()(s(m), s(m), s(m), average_attn_weights=False)[1].sum(1))
    refused(ValueError, "query is a tensor: a cell gives it (batch, L, E)")(
        lambda x, m: mha.eval()(m, s(m), s(m))[0])
    refused(ValueError, "key is a stack of tensors", "(L, batch, E)")(
        lambda x, m: sequence_first(m.unsqueeze(0), s(m), s(m))[0][0])


def test_positional_arguments_past_the_supported_form_are_refused_not_dropped():
    """A method call is not checked by PyTorch while it is traced: an argument the handler does
    not name must not vanish (m.sum(-1, True) without its keepdim would change the shape)."""
    from edbatch.trace_values import Refusal, bind
    assert bind((1, 2), {}, ("input", "dim"), {"keepdim": False}) == {
        "input": 1, "dim": 2, "keepdim": False}
    with pytest.raises(Refusal, match=r"3 positional arguments, of which only 2 \(input, dim\) "
                                      r"are supported; not True"):
        bind((1, 2, True), {}, ("input", "dim"), {"keepdim": False})


def test_unsupported_module_and_methods():
    refused(TypeError, "nn.LSTM is not supported", "node cell 0")(
        lambda x, m, cell=nn.LSTM(7, 7): cell(m)[0])
    refused(ValueError, "view / reshape is supported only as (batch, features) -> itself")(
        lambda x, m: m.view(-1, 14))
    refused(ValueError, "a new tensor of shape (-1, 3, 7)")(
        lambda x, m: m + torch.zeros(m.size(0), 3, 7).sum(1))
    refused(TypeError, "a new tensor with dtype=torch.float64")(
        lambda x, m: m + torch.zeros(m.size(0), 7, dtype=torch.float64))
    refused(ValueError, "a new tensor of shape (3, 7)")(lambda x, m: m + torch.zeros(3, 7))
    for name in ("rand", "randn"):  # named, whatever their arguments
        refused(TypeError, f"torch.{name} is not supported")(
            lambda x, m, n=name: m + getattr(torch, n)(m.size(0), 7))
    refused(TypeError, "Tensor.add_ changes an input")(lambda x, m: m.add_(1))
    refused(ValueError, "group_norm of 7 channels in 3 groups")(lambda x, m: F.group_norm(m, 3))
    refused(ValueError, "repeat_interleave without dim")(lambda x, m: m.repeat_interleave(2)[:7])
    refused(ValueError, "repeat_interleave's repeats must be known")(
        lambda x, m: m.repeat_interleave(torch.tensor([1, 0]), dim=-1))
    refused(TypeError, "inplace=True")(lambda x, m, r=nn.ReLU(inplace=True): r(m))
    refused(ValueError, "softplus with beta=0.0")(lambda x, m: F.softplus(m, beta=0))
    refused(IndexError, "x[:, [3, 7]]: index 7 is out of range for 7 features")(
        lambda x, m: m[:, [3, 7]])
    refused(ValueError, "or of one bool per feature (7)")(lambda x, m: m[:, [True, False]])
    refused(ValueError, "index_select with a value of shape (batch,)", "known when the cell")(
        lambda x, m: m.index_select(-1, m[:, 0]))
    refused(TypeError, "an integer tensor made in the cell", "feature indices")(
        lambda x, m: m * torch.arange(7))
    refused(TypeError, "a tensor made in the cell from Python values", "torch.uint8")(
        lambda x, m: m[:, torch.tensor([1, 0, 1, 1, 0, 0, 1], dtype=torch.uint8)])  # a mask
    refused(ValueError, "torch.arange of the batch size")(
        lambda x, m: m * torch.arange(m.size(0), device=m.device).unsqueeze(-1))
    refused(TypeError, "of shape (7,) and dtype torch.float64 is not supported in cells")(
        lambda x, m: m * torch.tensor([0.5] * 7, dtype=torch.float64))
    refused(ValueError, "movedim of a tensor from 0 to 1")(lambda x, m: m.movedim(0, 1))
    refused(ValueError, "unflatten of a tensor along dim 0")(
        lambda x, m: m.unflatten(0, (1, -1)).sum(1))
    refused(TypeError, "rrelu in training mode")(lambda x, m: F.rrelu(m, training=True))
    refused(TypeError, "alpha_dropout in training mode")(
        lambda x, m: F.alpha_dropout(m, 0.2, True))
    refused(TypeError, "softmax with dtype=torch.float64")(
        lambda x, m: torch.softmax(m, -1, dtype=torch.float64))
    refused(TypeError, "an empty piece (no features) of tensor_split")(
        lambda x, m: m + torch.tensor_split(m, [7, 7], 1)[2].sum(-1, keepdim=True))
    refused(TypeError, "softmax with dtype=torch.float64")(
        lambda x, m: m.softmax(-1, torch.float64))  # positional, as Tensor.softmax takes it
    refused(TypeError, "sum with dtype=torch.float64")(
        lambda x, m: m + m.sum(-1, True, dtype=torch.float64))
    refused(TypeError, "x ** 1.5 is not supported", "integers from -16 to 16")(
        lambda x, m: m ** 1.5)
    refused(TypeError, "x ** 17 is not supported")(lambda x, m: m ** 17)
    refused(ValueError, "celu with alpha=0")(lambda x, m: F.celu(m, alpha=0.0))
    refused(TypeError, "tensor value=")(lambda x, m: torch.addcmul(m, m, m, value=m))
    refused(TypeError, "inplace=True")(lambda x, m: F.selu(m, True))
    refused(TypeError, "tensor exponent")(lambda x, m: m ** m)
    refused(TypeError, "must be > 0")(lambda x, m: (-2) ** m)
    refused(TypeError, "inplace=True")(lambda x, m, r=nn.SiLU(inplace=True): r(m))
    refused(TypeError, "inplace=True")(lambda x, m: F.leaky_relu(m, 0.1, True))
    refused(TypeError, "inplace=True")(lambda x, m, r=nn.ELU(inplace=True): r(m))
    refused(TypeError, "dtype torch.bool is not supported in cells")(
        lambda x, m: m * torch.tensor([True] * 7))
    refused(ValueError, "the buffer node_cells.0.steps holds torch.int64")(_IntegerBuffer())
    refused(ValueError, "operator.matmul of weights failed: RuntimeError")(_BadWeightProduct())
    for writes in (lambda w: w.mul_(2), lambda w: torch.nn.init.zeros_(w),
                   lambda w: w.__setitem__(0, 5.0), lambda w: w.__iadd__(1.0),
                   lambda w: torch.mul(w, 2, out=w)):
        cell = _WritesWeight(writes)
        with pytest.raises(TypeError):
            trace(cell)
        assert torch.equal(cell.w, torch.ones(7, 7))  # the parameter was not written
    hooked = nn.Linear(7, 7)
    hooked.register_forward_hook(lambda module, args, out: 2 * out)
    refused(TypeError, "nn.Linear has forward_hooks, which cells do not run")(
        lambda x, m, f=hooked: f(m))
    refused(TypeError, "nn.Linear has forward_pre_hooks")(
        lambda x, m, f=nn.utils.weight_norm(nn.Linear(7, 7)): f(m))
    refused(TypeError, "a TorchScript module (RecursiveScriptModule) cannot be traced")(
        lambda x, m, f=torch.jit.script(nn.Linear(7, 7)): f(m))
    inner = edbatch.nn.Propagate(lambda x, m: torch.tanh(m), state_size=7)
    refused(TypeError, "a cell cannot call an edbatch module (Propagate)", "outside the cell")(
        lambda x, m, f=inner, p=edbatch.pack_trees([(1, 2)]): m + f(p, x=x))
    refused(ValueError, "a weight of shape (7, 1) used elementwise")(_Column())
    refused(TypeError, "integer input")(lambda x, m, e=nn.Embedding(3, 7): e(x))


def test_control_flow_is_refused_with_its_line():
    def branches(x, m):
        if m:
            return m
        return -m

    def compares(x, m):
        return m if (m > 0).all() else -m

    line = branches.__code__.co_firstlineno + 1
    refused(TypeError, "control flow", f"test_trace.py:{line}", "node cell 0 (branches)")(
        branches)
    refused(TypeError, "cannot branch on tensor values", "compares")(compares)


def test_comparisons_are_refused_where_pytorch_would_not_take_them():
    refused(TypeError, "torch.where's condition takes comparisons")(
        lambda x, m: torch.where(torch.sigmoid(m), m, -m))
    refused(TypeError, "add of two comparisons")(lambda x, m: (m > 0) + (m < 1))
    refused(TypeError, "returns a comparison")(lambda x, m: m > 0)
    refused(TypeError, "give both values")(lambda x, m: m + torch.where(m > 0)[0])
    refused(TypeError, "converting to torch.float64")(lambda x, m: (m > 0).to(torch.float64))
    refused(TypeError, "& takes comparisons")(lambda x, m: m * ((m > 0) & m).float())


def test_wrong_sizes_are_refused_naming_the_cell():
    refused(ValueError, "node cell 0 (<lambda>) returns a state of sizes (5,)",
            "state_size is 7")(lambda x, m: m[:, :5])
    refused(ValueError, "node cell 1", "between kinds")(
        [lambda x, m: m, lambda x, m: m[:, :5]])
    refused(ValueError, "edge cell 1 (<lambda>) returns a message of sizes (3,)",
            "edge cell 0")(lambda x, m: m, [lambda h, x: h, lambda h, x: h[:, :3]])
    refused(ValueError, "sizes 7 and 5")(lambda x, m: m + x)
    refused(ValueError, "expecting 7 inputs")(lambda x, m, lin=nn.Linear(7, 7): lin(x))


def test_state_sizes_are_ints():
    """NumPy integers are ints; a float, a bool or a non-positive size is refused by name."""
    assert edbatch.nn.Propagate(lambda x, m: m, state_size=np.int64(4)).state_size == 4
    assert edbatch.nn.Propagate(lambda x, m: m, state_size=(np.int32(2), 3)).state_size == (2, 3)
    for bad in (4.0, True, 0, (3, 2.5), "4", ()):
        with pytest.raises(ValueError, match="state_size must be a positive int"):
            edbatch.nn.Propagate(lambda x, m: m, state_size=bad)


def test_feature_reductions_and_extrema_refuse_what_pytorch_would_shape_otherwise():
    # Without keepdim=True: shape (batch,), which PyTorch broadcasts along the features.
    refused(ValueError, "a value of shape (batch,)", "unsqueeze(-1) it first")(
        lambda x, m: m * m.sum(-1))
    refused(ValueError, "a value of shape (batch,)")(lambda x, m: torch.sigmoid(m[:, 0]) * m)
    refused(ValueError, "a value of shape (batch,)")(  # a vector weight, not a size-1 one
        lambda x, m, b=nn.Parameter(torch.ones(7)): (m.sum(-1) * b) * m)
    refused(ValueError, "a value of shape (batch,)")(  # along its only dim: the batch's
        lambda x, m: torch.softmax(m.sum(-1), -1).unsqueeze(-1) * m)
    refused(TypeError, "returns a value of shape (batch,)")(lambda x, m: m.mean(-1))
    refused(ValueError, "squeeze is supported along the last dim only")(
        lambda x, m: m[:, :1].squeeze() * m)
    refused(ValueError, "unsqueeze(-4) of a (batch, features) value is not supported")(
        lambda x, m: m.unsqueeze(-4))
    refused(TypeError, "returns a stack of tensors")(lambda x, m: m.unsqueeze(0))
    refused(ValueError, "unsqueeze of a stack of tensors", "is not supported")(
        lambda x, m: m.unsqueeze(1).unsqueeze(1))
    refused(ValueError, "torch.linalg.norm is supported over the features (dim=-1) only")(
        lambda x, m: m / torch.linalg.norm(m))
    refused(TypeError, "atan2 of a Python number")(lambda x, m: torch.atan2(m, 2.0))
    refused(TypeError, "hypot of a Python number")(lambda x, m: m.hypot(1.0))
    refused(TypeError, "xlogy of two Python numbers")(lambda x, m: m * torch.xlogy(2.0, 3.0))
    refused(TypeError, "torch.fmax of a Python number")(lambda x, m: torch.fmax(m, 0.0))
    refused(TypeError, "x.type() without a dtype")(lambda x, m: m * len(m.type()))
    refused(TypeError, "converting to torch.DoubleTensor is not supported")(
        lambda x, m: m.type("torch.DoubleTensor"))
    refused(ValueError, "tile is supported as torch.tile(x, (k,)) or x.tile((1, k))")(
        lambda x, m: torch.tile(m, (2, 1)))
    # per-row products: rows on the left, equal inner sizes, squeeze with a dim
    refused(ValueError, "per-row products take rows on the left")(
        lambda x, m: torch.bmm(m.unsqueeze(2), m.unsqueeze(1)).sum(1))
    refused(ValueError, "torch.bmm of (batch, 1, 7) by (batch, 3, 1): the inner sizes differ")(
        lambda x, m: torch.bmm(m.unsqueeze(1), m[:, :3].unsqueeze(2)).squeeze(1))
    refused(ValueError, "squeeze of a stack is supported along dim 1 or 2")(
        lambda x, m: (m.unsqueeze(1) @ m.unsqueeze(-1)).squeeze() * m)
    refused(ValueError, "torch.bmm of a tensor")(lambda x, m: torch.bmm(m, m.unsqueeze(2)))
    refused(ValueError, "x[:, 7] is not supported")(lambda x, m: m[:, 7])
    refused(ValueError, "x[:, 9::2] selects no features of 7")(lambda x, m: m[:, 9::2])
    refused(ValueError, "flip along dims (0,) is not supported")(lambda x, m: m.flip(0))
    refused(ValueError, "mean over every element", "mean(-1, keepdim=True)")(
        lambda x, m: m - m.mean())
    # a branch on a whole-tensor value: the message names the way to write it
    refused(ValueError, "sum over every element", "select with torch.where")(
        lambda x, m: m if m.sum() > 0 else -m)
    refused(ValueError, "batch dim")(lambda x, m: m.sum(0, keepdim=True))
    refused(ValueError, "var of 1 feature(s) with correction 1 divides by 0")(
        lambda x, m: m + m[:, :1].var(-1, keepdim=True))
    refused(ValueError, "a value of shape (batch,)")(lambda x, m: m - torch.max(m, -1)[0])
    refused(TypeError, "the indices of a max, min, sort")(
        lambda x, m: m * m.max(-1, keepdim=True).indices)
    refused(TypeError, "the indices of a max, min, sort")(lambda x, m: m + torch.sort(m)[1])
    refused(ValueError, "topk of k = 8 from 7 features")(lambda x, m: torch.topk(m, 8).values)
    refused(ValueError, "kthvalue of k = 0")(lambda x, m: m.kthvalue(0, keepdim=True).values)
    refused(ValueError, "sort along the batch dim (dim 0) is not supported")(
        lambda x, m: m.sort(0).values)
    refused(ValueError, "topk is supported along the features (dim=-1) only")(
        lambda x, m: m.topk(2, dim=None).values)
    refused(ValueError, "median over every element is not supported")(
        lambda x, m: m * m.median())
    refused(ValueError, "torch.msort sorts along dim 0")(lambda x, m: torch.msort(m))
    refused(ValueError, "polygamma of order 1 is not supported")(
        lambda x, m: torch.polygamma(1, m))
    refused(ValueError, "multigammaln of p = 0")(lambda x, m: torch.mvlgamma(m, 0))
    refused(TypeError, "min of every element")(lambda x, m: m - m.min())
    # var's third positional argument is unbiased, not keepdim: refused, not read as keepdim
    refused(ValueError, "a value of shape (batch,)")(lambda x, m: m - m.var(-1, True))
    refused(ValueError, "var over every element")(lambda x, m: m - torch.var(m, True))
    refused(ValueError, "p=3 are not supported", "p=1 or p=2")(
        lambda x, m: m * m.norm(3, -1, True))
    refused(ValueError, "p=inf are not supported")(lambda x, m: F.normalize(m, math.inf))
    refused(ValueError, "p=3 are not supported")(
        lambda x, m: m * F.pairwise_distance(m, m * 2, 3, keepdim=True))
    refused(ValueError, "softshrink's lambd must be at least 0")(
        lambda x, m: F.softshrink(m, -0.5))
    refused(TypeError, "logaddexp of a Python number")(lambda x, m: torch.logaddexp(m, 2.0))
    refused(ValueError, "round with decimals=2 is not supported")(
        lambda x, m: torch.round(m, decimals=2))
    refused(ValueError, "cosine_similarity along the batch dim")(
        lambda x, m: m * F.cosine_similarity(m, m * 2, 0))
    refused(ValueError, "cosine_similarity of sizes 7 and 3")(
        lambda x, m: m * F.cosine_similarity(m, m[:, :3]).unsqueeze(-1))
    refused(ValueError, "a value of shape (batch,)")(lambda x, m: m * F.cosine_similarity(m, m))
    bilinear = nn.Bilinear(7, 4, 7)
    refused(ValueError, "bilinear of sizes 7 and 7 with a weight for 7 and 4")(
        lambda x, m: bilinear(m, m))
    refused(TypeError, "bilinear is supported with its (out, in1, in2) weight")(
        lambda x, m: F.bilinear(m, m, m))
    refused(ValueError, "clamp without min or max")(lambda x, m: torch.clamp(m))
    refused(TypeError, "returns a stack of tensors")(
        lambda x, m: torch.stack([m, m]).sum(-1))  # (2, batch)
    refused(ValueError, "sum of a 3-D stack along dim 3")(
        lambda x, m: torch.stack([m, m], 1).sum(3))  # a 3-D value has no dim 3
    refused(ValueError, "indexing a stack along 2 is supported as one tensor of it")(
        lambda x, m: torch.stack([m, m], -1).max(-1, keepdim=True).values[:, 0, 0])
    refused(TypeError, "returns a stack of tensors (torch.stack, unsqueeze: reduce it")(
        lambda x, m: torch.stack([m, m]) * 2)
    refused(ValueError, "unbind of a stack is supported along the stacked dim (1)")(
        lambda x, m: m.view(-1, 7, 1).unbind(2)[0].view(-1, 7))
    refused(ValueError, "indexing a stack along 0 is supported as one tensor of it (s[i])")(
        lambda x, m: torch.stack([m, m])[:, 0])
    refused(ValueError, "unbind of a (batch, features) value")(lambda x, m: m.unbind(0)[0])
    refused(ValueError, "repeat is supported as x.repeat(1, k)")(lambda x, m: m.repeat(2, 1))
    refused(ValueError, "flatten is supported over the dims after the batch")(
        lambda x, m: m.flatten() + m)
    refused(ValueError, "flatten is supported over the dims after the batch")(
        lambda x, m: torch.stack([m, m], 1).flatten(0, 1))
    refused(ValueError, "only \"constant\"")(lambda x, m: F.pad(m, (1, 1), mode="reflect"))
    refused(ValueError, "(left, right, 0, 0) at most")(lambda x, m: F.pad(m, (0, 0, 1, 0)))
    refused(ValueError, "cuts away all 7 features")(lambda x, m: F.pad(m, (-4, -3)) + 1)
    refused(TypeError, "inplace=True")(lambda x, m: F.relu6(m, True))
    refused(ValueError, "expanding a size-7 tensor to 9")(
        lambda x, m: torch.cat([m, m], -1)[:, :7].expand(-1, 9)[:, :7])
    refused(ValueError, "add of tensors of sizes 7 and 5")(lambda x, m: m + x)


def test_size_one_values_broadcast_through_one_instruction():
    program = trace(lambda x, m: m * m.sum(-1, keepdim=True) + m.mean(-1, keepdim=True))
    ops = [(ins["op"], ins["size"]) for ins in body(program)]
    assert ops == [("input", 5), ("input", 7), ("sum_features", 1), ("broadcast", 7),
                   ("mul", 7), ("sum_features", 1), ("scale", 1), ("broadcast", 7), ("add", 7)]


def test_operations_along_the_batch_dim_are_refused():
    refused(ValueError, "batch dim")(lambda x, m: torch.cat([m, m], 0)[:1])
    refused(ValueError, "batch dim")(lambda x, m: m[1:])
    refused(ValueError, "batch dim")(lambda x, m: torch.softmax(m, 0))
    refused(ValueError, "batch size")(lambda x, m: m * m.shape[0])


# ---- dropout hash ----

def _mix(h):
    h = np.uint32(h)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h


def test_dropout_hash_equals_uint32_arithmetic():
    with np.errstate(over="ignore"):
        for seed in (0, 1, 12345678901234, 2 ** 62 + 3):
            for index, site in ((0, 0), (7, 1), (123456, 5)):
                s = np.uint64(seed)
                key = _mix(_mix(np.uint32(s & np.uint64(0xFFFFFFFF)) ^ _mix(
                    np.uint32(s >> np.uint64(32)))) ^ _mix(np.uint32(index)) ^ (
                    np.uint32(site) * np.uint32(0x9E3779B9)))
                assert dropout_key(seed, index, site) == int(key)
                for i in (0, 1, 128):
                    h = _mix(key ^ (np.uint32(i) * np.uint32(0x27D4EB2F)) ^
                             np.uint32(0x165667B1))
                    assert dropout_hash(int(key), i) == int(h)
    mask = edbatch.dropout_mask(5, 3, 1, 64, 0.25)
    key = dropout_key(5, 3, 1)
    assert mask.tolist() == [dropout_hash(key, i) >= 0.25 * 2 ** 32 for i in range(64)]
    # The engine holds p as a float32: 0.1 is 0.100000001490116..., whose threshold is 6 above
    # the double's (kernels/op_math.h, dropout_threshold).
    for p in (0.1, 0.3, 0.25, 1e-9):
        assert dropout_threshold(p) == int(np.ceil(np.float64(np.float32(p)) * 2.0 ** 32))
    assert dropout_threshold(0.1) - int(np.ceil(0.1 * 2.0 ** 32)) == 6
