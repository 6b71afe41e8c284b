"""PyTorch's recurrent cells inside a cell program (docs/programs.md): nn.GRUCell, nn.LSTMCell and
nn.RNNCell, written out as their documented equations over the module's own parameters (the
input and hidden products are `linear` instructions, so the block compiler fuses them as for
any cell). trace_ops merges MODULES into its own."""
from torch import nn

from .trace_values import Refusal, Vec, apply, ops


def _products(body, m, x, h):
    """W_ih x + b_ih and W_hh h + b_hh (either bias absent with bias=False)."""
    if not isinstance(x, Vec):
        raise Refusal(f"{type(m).__name__} needs a tensor input (the cell's input or a value)")
    gi = ops().linear_of(body, x, body.param_of(m, "weight_ih"), body.param_of(m, "bias_ih"),
                         "linear")
    gh = ops().linear_of(body, h, body.param_of(m, "weight_hh"), body.param_of(m, "bias_hh"),
                         "linear")
    return gi, gh


def _state(body, hx, size):
    return body.emit("const", size, [], value=0.0) if hx is None else body.vector(hx)


def gru_cell(body, m, args, kwargs):
    """r, z = sigmoid(gi_r + gh_r), sigmoid(gi_z + gh_z); n = tanh(gi_n + r * gh_n);
    h' = (1 - z) * n + z * h = n + z * (h - n)."""
    x, hx = (list(args) + [kwargs.get("hx")])[:2]
    H = m.hidden_size
    h = _state(body, hx, H)
    gi, gh = _products(body, m, x, h)
    (ir, iz, i_n), (hr, hz, hn) = (ops().pieces(body, g, [H, H, H]) for g in (gi, gh))
    r = apply(body, "sigmoid", apply(body, "add", ir, hr))
    z = apply(body, "sigmoid", apply(body, "add", iz, hz))
    n = apply(body, "tanh", apply(body, "add", i_n, apply(body, "mul", r, hn)))
    return apply(body, "add", n, apply(body, "mul", z, apply(body, "sub", h, n)))


def lstm_cell(body, m, args, kwargs):
    """i, f, g, o = chunks of W_ih x + b_ih + W_hh h + b_hh; c' = sigmoid(f) c + sigmoid(i)
    tanh(g); h' = sigmoid(o) tanh(c'). Returns (h', c')."""
    x, hx = (list(args) + [kwargs.get("hx")])[:2]
    H = m.hidden_size
    if hx is None:
        h = c = _state(body, None, H)
    elif isinstance(hx, (tuple, list)) and len(hx) == 2:
        h, c = body.vector(hx[0]), body.vector(hx[1])
    else:
        raise Refusal("nn.LSTMCell takes its state as a tuple (h, c)")
    gi, gh = _products(body, m, x, h)
    i, f, g, o = ops().pieces(body, apply(body, "add", gi, gh), [H, H, H, H])
    c2 = apply(body, "add", apply(body, "mul", apply(body, "sigmoid", f), c),
               apply(body, "mul", apply(body, "sigmoid", i), apply(body, "tanh", g)))
    return apply(body, "mul", apply(body, "sigmoid", o), apply(body, "tanh", c2)), c2


def rnn_cell(body, m, args, kwargs):
    """h' = tanh or relu of W_ih x + b_ih + W_hh h + b_hh."""
    x, hx = (list(args) + [kwargs.get("hx")])[:2]
    h = _state(body, hx, m.hidden_size)
    gi, gh = _products(body, m, x, h)
    return apply(body, m.nonlinearity, apply(body, "add", gi, gh))


MODULES = {nn.GRUCell: gru_cell, nn.LSTMCell: lstm_cell, nn.RNNCell: rnn_cell}

SUPPORTED = "nn.GRUCell, nn.LSTMCell, nn.RNNCell (their equations over their own parameters)"
