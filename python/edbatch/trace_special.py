"""Special functions and float modulo in cell programs (docs/programs.md): the ops fmod,
remainder (and a % b) and copysign with Python numbers; floor and trunc division, signbit,
heaviside, special.ndtr, multigammaln / mvlgamma and polygamma(0, x) written with other
instructions; torch.special's aliases of softmax, log_softmax and round. The ops erfc, lgamma,
digamma and erfinv are trace_ops' activations. trace_ops merges these tables into its own."""
import math
import operator

import torch

from .trace_select import comparison
from .trace_values import (Refusal, apply, bind, broadcast_pair, is_number, operand_pair, ops,
                           plain, vector_or_constant)


def modulo(name):
    """torch.fmod and torch.remainder (and a % b, Python's modulo, which is remainder): ops of
    their own, a Python number for either argument; % of two numbers is the number's."""
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "other"), {})
        if name == "remainder" and is_number(a["input"]) and is_number(a["other"]):
            return a["input"] % a["other"]
        return apply(body, name, *operand_pair(body, a["input"], a["other"], name))
    return handle


def copysign(body, args, kwargs):
    """torch.copysign(a, b): |a| with b's sign bit (-0 and NaNs count), an op of its own; b may
    be a Python number. a's gradient is PyTorch's (0 where a is 0), b's 0."""
    a = bind(args, kwargs, ("input", "other"), {})
    if is_number(a["input"]):
        raise Refusal("copysign of a Python number is not supported: PyTorch takes a tensor "
                      "first", TypeError)
    x, y = body.vector(a["input"]), vector_or_constant(body, a["other"])
    return apply(body, "copysign", *broadcast_pair(body, x, y, "copysign"))


def signbit_of(body, x):
    """torch.signbit: a comparison (a mask) true where x's sign bit is set (-0 and negative
    NaNs too): copysign(1, x) < 0."""
    v = body.vector(x)
    ones = body.emit("const", v.size, [], value=1.0)
    return comparison("lt")(body, (apply(body, "copysign", ones, v), 0.0), {})


def heaviside(body, args, kwargs):
    """torch.heaviside(x, values): 1 where x > 0, values where x is 0 (either sign), else 0 (NaN
    gives 0, as in PyTorch). No gradient reaches x or values: PyTorch has no derivative for it
    (its backward raises), and it is flat wherever it has one."""
    a = bind(args, kwargs, ("input", "values"), {})
    if is_number(a["input"]):
        raise Refusal("heaviside of a Python number is not supported: PyTorch takes a tensor",
                      TypeError)
    v = vector_or_constant(body, a["values"])
    if not is_number(a["values"]):
        v = apply(body, "stop_gradient", v)
    x, v = broadcast_pair(body, body.vector(a["input"]), v, "heaviside")

    def versus_zero(op):
        return comparison(op)(body, (x, 0.0), {})
    return apply(body, "add", versus_zero("gt"), apply(body, "keep", v, versus_zero("eq")))


def ndtr_of(body, x):
    """torch.special.ndtr, the standard normal's distribution function: erfc(-x / sqrt 2) / 2,
    which keeps the lower tail."""
    v = apply(body, "scale", body.vector(x), alpha=-math.sqrt(0.5), beta=0.0)
    return apply(body, "scale", apply(body, "erfc", v), alpha=0.5, beta=0.0)


def multigammaln(body, args, kwargs):
    """torch.special.multigammaln / torch.mvlgamma(x, p): p (p - 1) / 4 log(pi) + the sum of
    lgamma(x - j / 2), j = 0 .. p - 1. PyTorch's check that every x > (p - 1) / 2 reads the
    values, which a traced cell does not: below it the sum is taken as it stands."""
    a = bind(args, kwargs, ("input", "p"), {})
    p = a["p"]
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise Refusal(f"multigammaln of p = {p!r}: p must be a positive integer", ValueError)
    v = body.vector(a["input"])
    total = None
    for j in range(p):
        term = apply(body, "lgamma", v if j == 0 else
                     apply(body, "scale", v, alpha=1.0, beta=-j / 2.0))
        total = term if total is None else apply(body, "add", total, term)
    return apply(body, "scale", total, alpha=1.0, beta=p * (p - 1) / 4.0 * math.log(math.pi))


def polygamma(body, args, kwargs):
    """torch.polygamma(n, x) / special.polygamma: digamma for n = 0; higher orders are refused
    (their gradients, polygamma(n + 1, x), are not ops)."""
    a = bind(args, kwargs, ("n", "input"), {})
    if a["n"] != 0:
        raise Refusal(f"polygamma of order {a['n']!r} is not supported: order 0 (digamma) is",
                      ValueError)
    return apply(body, "digamma", body.vector(a["input"]))


def _quotient_operands(body, x, y, what):
    """The operands of a rounded division, through stop_gradient: PyTorch's gradient of
    floor_divide and of div with a rounding_mode is 0 for both."""
    x, y = operand_pair(body, x, y, what)
    return apply(body, "stop_gradient", x), apply(body, "stop_gradient", y)


def floor_divide_of(body, x, y, what="floor_divide"):
    """a / b rounded down, step by step as PyTorch computes it for floats: the exact quotient
    (a - fmod(a, b)) / b, less 1 where fmod's sign differs from b's, floor of it and 1 more where
    it lay more than a half above its floor, and a / b where b is 0 (inf or NaN); of a / b's
    sign, a zero too. No gradient, as PyTorch's."""
    from .trace_compose import floor_of
    from .trace_select import logical, logical_xor, where_of
    a, b = _quotient_operands(body, x, y, what)
    quotient = apply(body, "div", a, b)
    mod = apply(body, "fmod", a, b)
    exact = apply(body, "div", apply(body, "sub", a, mod), b)
    signs = logical_xor(body, (comparison("lt")(body, (b, 0.0), {}),
                               comparison("lt")(body, (mod, 0.0), {})), {})
    moved = logical("and")(body, (comparison("ne")(body, (mod, 0.0), {}), signs), {})
    exact = where_of(body, moved, apply(body, "scale", exact, alpha=1.0, beta=-1.0), exact)
    down = floor_of(body, exact)
    up = comparison("gt")(body, (apply(body, "sub", exact, down), 0.5), {})
    rounded = where_of(body, up, apply(body, "scale", down, alpha=1.0, beta=1.0), down)
    rounded = where_of(body, comparison("eq")(body, (b, 0.0), {}), quotient, rounded)
    # The result has a / b's sign, its zeros too (a selection by masks keeps no -0).
    return apply(body, "copysign", rounded, quotient)


def floor_divide(body, args, kwargs):
    """torch.floor_divide / a // b (a Python number on either side)."""
    a = bind(args, kwargs, ("input", "other"), {})
    return floor_divide_of(body, a["input"], a["other"])


def divide(body, args, kwargs):
    """torch.div / divide / true_divide and their methods: with rounding_mode "floor" as
    floor_divide, "trunc" as trunc(a / b) (PyTorch's), both without gradient; otherwise a / b."""
    a = bind(args, kwargs, ("input", "other"), {"rounding_mode": None})
    mode = a.pop("rounding_mode")
    if mode is None:
        return ops().binary("div")(body, (a["input"], a["other"]), {})
    if mode == "floor":
        return floor_divide_of(body, a["input"], a["other"], "div(rounding_mode='floor')")
    if mode == "trunc":
        from .trace_compose import trunc_of
        x, y = _quotient_operands(body, a["input"], a["other"], "div(rounding_mode='trunc')")
        return trunc_of(body, apply(body, "div", x, y))  # of the quotient's sign
    raise Refusal(f"div with rounding_mode={mode!r}: PyTorch takes None, 'trunc' or 'floor'",
                  ValueError)


def _alias(name):
    """torch.special's name for an operation supported under another."""
    def handle(body, args, kwargs):
        return ops().FUNCTIONS[getattr(torch, name)](body, args, kwargs)
    return handle


FUNCTIONS = {
    torch.fmod: modulo("fmod"), torch.remainder: modulo("remainder"),
    operator.mod: modulo("remainder"), torch.copysign: copysign, torch.signbit: plain(signbit_of),
    torch.heaviside: heaviside, torch.polygamma: polygamma, torch.mvlgamma: multigammaln,
    torch.floor_divide: floor_divide, operator.floordiv: floor_divide,
    **{fn: divide for fn in (torch.div, torch.divide, torch.true_divide)},
    **{getattr(torch.special, name): h for name, h in (
        ("ndtr", plain(ndtr_of)), ("multigammaln", multigammaln), ("polygamma", polygamma),
        ("softmax", _alias("softmax")), ("log_softmax", _alias("log_softmax")),
        ("round", _alias("round"))) if hasattr(torch.special, name)},
}

METHODS = {
    "fmod": modulo("fmod"), "remainder": modulo("remainder"), "copysign": copysign,
    "signbit": plain(signbit_of), "heaviside": heaviside, "polygamma": polygamma,
    "mvlgamma": multigammaln, "floor_divide": floor_divide,
    **{name: divide for name in ("div", "divide", "true_divide")},
}

SUPPORTED = ("fmod, remainder and a % b, copysign (a Python number for the second argument, "
             "either for fmod and remainder), signbit, heaviside (no gradient), mvlgamma / "
             "special.multigammaln, polygamma of order 0 (torch. and method forms); "
             "torch.special.ndtr, softmax, log_softmax and round; floor_divide and a // b, div "
             "with rounding_mode 'floor' or 'trunc' (no gradient)")
