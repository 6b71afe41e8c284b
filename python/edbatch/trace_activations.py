"""Activations written with other instructions of a cell program (docs/programs.md): glu, mish,
softsign, tanhshrink, hardsigmoid, hardswish and softplus of any beta and threshold, in their F.,
torch. and module forms. trace_ops
merges these tables into its own."""
import math

import torch
import torch.nn.functional as F

from .trace_reduce import clamp_of
from .trace_values import Refusal, apply, bind, feature_dim, note_inplace, plain, with_inplace

nn = torch.nn


def glu_of(body, x, dim):
    """The first half times the sigmoid of the second, along the features."""
    feature_dim(dim, "glu")
    v = body.vector(x)
    if v.size % 2:
        raise Refusal(f"glu of an odd size ({v.size})", ValueError)
    h = v.size // 2
    a = body.emit("slice", h, [v], begin=0, end=h)
    b = body.emit("slice", h, [v], begin=h, end=v.size)
    return apply(body, "mul", a, apply(body, "sigmoid", b))


def glu(body, args, kwargs):
    a = bind(args, kwargs, ("input", "dim"), {"dim": -1})
    return glu_of(body, a["input"], a["dim"])


def mish_of(body, x):
    """x * tanh(softplus(x))."""
    v = body.vector(x)
    return apply(body, "mul", v, apply(body, "tanh", apply(body, "softplus", v)))


def softplus_of(body, x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold, as PyTorch's: its
    gradient there is 1, elsewhere sigmoid(beta x). At beta = 1 and a threshold of 20 or more
    the engine's softplus alone is the same in float (log1p(exp(-20)) is below half an ulp of
    20), so that common form is one instruction."""
    beta, threshold = float(beta), float(threshold)
    if beta == 0.0 or beta != beta:
        raise Refusal(f"softplus with beta={beta!r}: PyTorch divides by beta", ValueError)
    v = body.vector(x)
    if beta == 1.0 and threshold >= 20.0:
        return apply(body, "softplus", v)
    from .trace_select import comparison, where_of  # trace_select reads trace_ops' tables
    z = apply(body, "scale", v, alpha=beta, beta=0.0)
    y = apply(body, "scale", apply(body, "softplus", z), alpha=1.0 / beta, beta=0.0)
    return where_of(body, comparison("gt")(body, (z, threshold), {}), v, y)


def softplus(body, args, kwargs):
    a = bind(args, kwargs, ("input", "beta", "threshold"), {"beta": 1, "threshold": 20})
    return softplus_of(body, a["input"], a["beta"], a["threshold"])


def softsign_of(body, x):
    """x / (1 + |x|)."""
    v = body.vector(x)
    return apply(body, "div", v, apply(body, "scale", apply(body, "abs", v), alpha=1.0, beta=1.0))


def tanhshrink_of(body, x):
    """x - tanh(x)."""
    v = body.vector(x)
    return apply(body, "sub", v, apply(body, "tanh", v))


def hardsigmoid_of(body, x, inclusive=False):
    """clamp(x + 3, 0, 6) / 6 as PyTorch computes it (x + 3 is exact at the bounds), its
    gradient 1/6 strictly inside (-3, 3), as PyTorch's."""
    v = body.vector(x)
    c = clamp_of(body, apply(body, "scale", v, alpha=1.0, beta=3.0), 0.0, 6.0,
                 inclusive=inclusive)
    return apply(body, "scale", c, alpha=1.0 / 6.0, beta=0.0)


def hardswish_of(body, x):
    """x * hardsigmoid(x), the clamp's gradient passing at -3 and 3 so that the product's is
    x / 3 + 1/2 there, as PyTorch's CPU kernel has it."""
    v = body.vector(x)
    return apply(body, "mul", v, hardsigmoid_of(body, v, inclusive=True))


def rrelu_of(body, x, lower, upper, training, inplace):
    """Evaluation mode: leaky_relu with the slope (lower + upper) / 2, as PyTorch's. Training
    draws a random slope per entry, which is refused."""
    note_inplace(inplace)
    if training:
        raise Refusal("rrelu in training mode (a random slope per entry) is not supported: use "
                      "it in evaluation mode (training=False, module.eval()) or leaky_relu")
    v = body.vector(x)
    return body.emit("leaky_relu", v.size, [v], alpha=(float(lower) + float(upper)) / 2)


def rrelu(body, args, kwargs):
    a = bind(args, kwargs, ("input", "lower", "upper", "training", "inplace"),
             {"lower": 1.0 / 8, "upper": 1.0 / 3, "training": False, "inplace": False})
    return rrelu_of(body, a["input"], a["lower"], a["upper"], a["training"], a["inplace"])


def alpha_dropout_of(body, x, p, training, inplace, name):
    """The input itself in evaluation mode or at p = 0, as PyTorch's; training is refused."""
    note_inplace(inplace)
    if training and p != 0:
        raise Refusal(f"{name} in training mode is not supported (only nn.Dropout / F.dropout "
                      f"are): use it in evaluation mode")
    return body.vector(x)


def alpha_dropout(name):
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "p", "training", "inplace"),
                 {"p": 0.5, "training": False, "inplace": False})
        return alpha_dropout_of(body, a["input"], a["p"], a["training"], a["inplace"], name)
    return handle


def angle(factor):
    """deg2rad / rad2deg: x times pi / 180 or 180 / pi, as PyTorch multiplies."""
    return plain(lambda body, x: apply(body, "scale", body.vector(x), alpha=factor, beta=0.0))


def _module(of, inplace=True):
    def handle(body, m, args, kwargs):
        if inplace:
            note_inplace(getattr(m, "inplace", False))
        return of(body, args[0])
    return handle


FUNCTIONS = {
    F.glu: glu, F.softplus: softplus, F.mish: with_inplace(mish_of), F.softsign: plain(softsign_of),
    F.tanhshrink: plain(tanhshrink_of), F.hardsigmoid: with_inplace(hardsigmoid_of),
    F.hardswish: with_inplace(hardswish_of), F.rrelu: rrelu,
    F.alpha_dropout: alpha_dropout("alpha_dropout"),
    F.feature_alpha_dropout: alpha_dropout("feature_alpha_dropout"),
    torch.deg2rad: angle(math.pi / 180), torch.rad2deg: angle(180 / math.pi),
}

METHODS = {"deg2rad": FUNCTIONS[torch.deg2rad], "rad2deg": FUNCTIONS[torch.rad2deg]}

MODULES = {
    nn.GLU: lambda body, m, args, kwargs: glu_of(body, args[0], m.dim),
    nn.Mish: _module(mish_of), nn.Softsign: _module(softsign_of, False),
    nn.Tanhshrink: _module(tanhshrink_of, False), nn.Hardsigmoid: _module(hardsigmoid_of),
    nn.Hardswish: _module(hardswish_of),
    nn.Softplus: lambda body, m, args, kwargs: softplus_of(body, args[0], m.beta, m.threshold),
    nn.RReLU: lambda body, m, args, kwargs: rrelu_of(body, args[0], m.lower, m.upper,
                                                     m.training, m.inplace),
    nn.AlphaDropout: lambda body, m, args, kwargs: alpha_dropout_of(
        body, args[0], m.p, m.training, m.inplace, "nn.AlphaDropout"),
    nn.FeatureAlphaDropout: lambda body, m, args, kwargs: alpha_dropout_of(
        body, args[0], m.p, m.training, m.inplace, "nn.FeatureAlphaDropout"),
}

SUPPORTED = ("glu, mish, softsign, tanhshrink, hardsigmoid, hardswish, softplus of any beta "
             "and threshold, rrelu, alpha_dropout and feature_alpha_dropout in evaluation mode "
             "(F. and module forms); deg2rad, rad2deg")
