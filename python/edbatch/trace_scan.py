"""Scans along a cell's features: torch.cumsum, cumprod, cummax, cummin and logcumsumexp
(docs/programs.md). A scan of n features is ceil(log2 n) doubling steps: step k combines every
feature with the running value 2^k places before it, where there is one, so a few instructions
per step rather than one per feature. trace_ops merges these tables into its own."""
import math

import torch

from .trace_reduce import Extreme
from .trace_values import Indices, Refusal, bind, feature_dim, float32_only


def _op(name):
    def combine(body, y, earlier):
        return body.emit(name, y.size, [y, earlier])
    return combine


def _logaddexp(body, y, earlier):
    """logaddexp's composition (trace_compose.py): stable at every step, where a sum of exp(x - m)
    with one m for the row would underflow to log(0) for entries far below the row's largest."""
    from .trace_compose import logaddexp
    return logaddexp(False)(body, (y, earlier), {})


# How each scan combines the running values with earlier ones, and its identity: -0.0 for the
# sum, since -0.0 + x is x for every x (a leading -0.0 stays -0.0, as PyTorch's cumsum keeps it),
# where 0.0 + -0.0 would be 0.0. cummin is cummax of -x, negated.
_SCANS = {"cumsum": (_op("add"), -0.0), "cumprod": (_op("mul"), 1.0),
          "cummax": (_op("max"), -math.inf), "logcumsumexp": (_logaddexp, -math.inf)}


def scan_of(body, v, name):
    """The inclusive scan of v's features by `name`'s op: each step takes the running values
    `shift` places earlier (a `slice` of all but the last `shift`, behind `shift` identity
    constants, in one `cat`) and combines them with the running values, which come first: `max`
    gives a tie's gradient to its first argument, so a maximum's gradient goes to the last of
    equal entries, as PyTorch's cummax takes the last one's index."""
    if name == "cummin":
        v = body.emit("scale", v.size, [v], alpha=-1.0, beta=0.0)
        y = scan_of(body, v, "cummax")
        return body.emit("scale", v.size, [y], alpha=-1.0, beta=0.0)
    combine, identity = _SCANS[name]
    y, shift = v, 1
    while shift < v.size:
        earlier = body.emit("slice", v.size - shift, [y], begin=0, end=v.size - shift)
        front = body.emit("const", shift, [], value=identity)
        y = combine(body, y, body.emit("cat", v.size, [front, earlier]))
        shift *= 2
    return y


def scan(name):
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "dim", "dtype"), {"dtype": None})
        float32_only(a["dtype"], name)
        if "dim" not in a:
            raise Refusal(f"{name} needs dim=-1 (the features)", ValueError)
        feature_dim(a["dim"], name)
        y = scan_of(body, body.vector(a["input"]), name)
        # cummax / cummin give (values, indices), and only the values may be used
        return Extreme(y, Indices()) if name in ("cummax", "cummin") else y
    return handle


_NAMES = ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")
FUNCTIONS = {getattr(torch, name): scan(name) for name in _NAMES}
METHODS = {name: scan(name) for name in _NAMES}

SUPPORTED = ("torch.cumsum / cumprod / cummax / cummin / logcumsumexp over the last dim (and "
             "the methods; cummax and cummin give (values, indices), and only values may be "
             "used)")
