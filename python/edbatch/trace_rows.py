"""Elementwise operations of (batch,) values (trace_values.Rows: a reduction without
keepdim=True, x[:, i]) with one another and with numbers: `(q * k).sum(-1) / math.sqrt(d)`,
`torch.sigmoid(s)`, `x[:, 0] * y[:, 1]`, `torch.where(x[:, 0] > 0, ...)`. Each computes on the
size-1 values the Rows hold and gives a (batch,) value again. With a (batch, n) tensor or a
vector weight the handlers refuse them as before: PyTorch would broadcast a (batch,) value along
the features, not per row."""
import operator

import torch
import torch.nn.functional as F
from torch import nn

from .trace_values import Ids, Param, Rows, Stack, Vec

# Elementwise by name, in operator, torch, torch.nn.functional, torch.special and as methods
# (not max / min, whose one-tensor forms reduce, nor softmax and the other functions along a
# dim, which would run along the batch).
_NAMES = (
    "add sub mul truediv div true_divide subtract multiply divide rsub pow neg pos abs square "
    "rsqrt reciprocal sqrt exp log log1p expm1 exp2 log2 log10 sigmoid expit tanh relu gelu silu "
    "softplus logsigmoid leaky_relu elu selu celu mish softsign tanhshrink hardtanh relu6 "
    "hardsigmoid hardswish hardshrink softshrink threshold sin cos tan erf erfc erfinv atan "
    "arctan sinh cosh asinh arcsinh atanh arctanh asin arcsin acos arccos lgamma digamma clamp "
    "clip clamp_min clamp_max gt lt ge le eq ne greater less greater_equal less_equal not_equal "
    "where maximum minimum fmax fmin floor ceil round trunc fix frac sign logical_and logical_or "
    "logical_not logical_xor and_ or_ xor invert masked_fill lerp addcmul addcdiv atan2 arctan2 "
    "hypot fmod remainder copysign logaddexp logaddexp2 xlogy logit sinc floor_divide floordiv "
    "mod heaviside signbit isnan isinf isfinite nan_to_num detach clone float contiguous "
    "type_as").split()
_MODULES = (nn.Sigmoid, nn.Tanh, nn.ReLU, nn.Softplus, nn.SiLU, nn.LeakyReLU, nn.ELU,
            nn.LogSigmoid, nn.GELU, nn.Hardtanh, nn.ReLU6, nn.Mish, nn.Softsign, nn.Tanhshrink,
            nn.Hardsigmoid, nn.Hardswish, nn.SELU, nn.CELU, nn.Hardshrink, nn.Softshrink,
            nn.Threshold, nn.Identity)


def _per_row(args, kwargs):
    """Whether a call reads (batch,) values and, besides them, only numbers, flags and size-1
    weights (which broadcast as PyTorch broadcasts them)."""
    leaves = list(args) + list(kwargs.values())
    if not any(isinstance(v, Rows) for v in leaves):
        return False
    return not any(isinstance(v, (Vec, Stack, Ids, list, tuple))
                   or isinstance(v, Param) and v.tensor.numel() != 1 for v in leaves)


def _unwrapped(v):
    return v.vec if isinstance(v, Rows) else v


def per_row(handler):
    """handler, taking (batch,) values (_per_row) as their size-1 values and giving a (batch,)
    value for a tensor."""
    def handle(body, args, kwargs):
        if not _per_row(args, kwargs):
            return handler(body, args, kwargs)
        out = handler(body, tuple(map(_unwrapped, args)),
                      {k: _unwrapped(v) for k, v in kwargs.items()})
        return Rows(out) if isinstance(out, Vec) else out
    handle.per_row = True
    return handle


def per_row_of_module(handler):
    def handle(body, m, args, kwargs):
        return per_row(lambda b, a, k: handler(b, m, a, k))(body, args, kwargs)
    return handle


def install(functions, methods, modules):
    """Wraps the elementwise handlers of the tables (trace_ops') with per_row."""
    for name in _NAMES:
        for owner in (operator, torch, F, torch.special):
            fn = getattr(owner, name, None)
            if fn is not None and fn in functions and not hasattr(functions[fn], "per_row"):
                functions[fn] = per_row(functions[fn])
        if name in methods and not hasattr(methods[name], "per_row"):
            methods[name] = per_row(methods[name])
    for module in _MODULES:
        if module in modules:
            modules[module] = per_row_of_module(modules[module])
