"""Comparisons and selections in a cell program (docs/programs.md): `a > b` and the other
comparisons as 0/1 masks (`step` of a difference, equal infinities mended), their logical
combinations, torch.where (`keep`: a selection, so the branch not taken may be inf or NaN), sign
and threshold. trace_ops merges these tables into its own."""
import operator

import torch
import torch.nn.functional as F

from .trace_values import (Mask, Param, Refusal, Vec, apply, bind, broadcast_pair, is_number,
                           note_inplace, ops, tensor_pair)

_BRANCHING = ("a cell cannot branch on tensor values (Python control flow is not traced): "
              "select with torch.where(a > b, x, y), or write the choice with arithmetic")


def _difference(body, a, b):
    """a - b (a number on either side folds into a `scale`)."""
    if is_number(b):
        v = body.vector(a)
        return apply(body, "scale", v, alpha=1.0, beta=-float(b))
    if is_number(a):
        v = body.vector(b)
        return apply(body, "scale", v, alpha=-1.0, beta=float(a))
    x, y = broadcast_pair(body, body.vector(a), body.vector(b), "a comparison of tensors")
    return apply(body, "sub", x, y)


def _mask(v):
    return Mask(v.index, v.size)


def _step(body, v, inclusive):
    return _mask(apply(body, "step", v, alpha=1.0 if inclusive else 0.0))


def _not(body, m):
    return _mask(apply(body, "scale", m, alpha=-1.0, beta=1.0))


_FLOAT_MAX = 3.4028234663852886e38  # the largest float32


def _infinite(body, v, sign):
    """1 where v is +inf (sign 1) or -inf (sign -1), else 0 (NaN included): sign * v beyond the
    largest float."""
    return _step(body, apply(body, "scale", v, alpha=float(sign), beta=-_FLOAT_MAX), False)


def _same_infinity(body, a, b):
    """1 where a and b are the same infinity (a - b is NaN there), else 0; None where that cannot
    happen (a finite number on either side)."""
    if is_number(a):
        a, b = b, a
    if is_number(b):
        return _infinite(body, body.vector(a), 1 if b > 0 else -1) if abs(b) == float("inf") \
            else None
    x, y = broadcast_pair(body, body.vector(a), body.vector(b), "a comparison of tensors")
    return apply(body, "add", *(apply(body, "mul", _infinite(body, x, s), _infinite(body, y, s))
                                for s in (1, -1)))


def _greater(body, a, b, inclusive):
    """a > b (a >= b): 1 where a - b > 0 (>= 0), else 0; NaN compares false, as in PyTorch. With
    `inclusive`, equal infinities (whose difference is NaN) compare true."""
    m = _step(body, _difference(body, a, b), inclusive)
    same = _same_infinity(body, a, b) if inclusive else None
    return m if same is None else _mask(apply(body, "add", m, same))


def _equal(body, a, b):
    return _mask(apply(body, "mul", _greater(body, a, b, True), _greater(body, b, a, True)))


def _isnan(body, v):
    """1 where v is NaN, else 0: any other value, an infinity too, is v >= 0 or -v > 0."""
    v = body.vector(v)
    negative = apply(body, "step", apply(body, "scale", v, alpha=-1.0, beta=0.0), alpha=0.0)
    return _not(body, apply(body, "add", apply(body, "step", v, alpha=1.0), negative))


_COMPARE = {
    "gt": lambda body, a, b: _greater(body, a, b, False),
    "ge": lambda body, a, b: _greater(body, a, b, True),
    "lt": lambda body, a, b: _greater(body, b, a, False),
    "le": lambda body, a, b: _greater(body, b, a, True),
    "eq": _equal,
    "ne": lambda body, a, b: _not(body, _equal(body, a, b)),
}


def comparison(name):
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "other"), {})
        x, y = a["input"], a["other"]
        if is_number(x) and is_number(y):
            return getattr(operator, name)(x, y)
        return _COMPARE[name](body, x, y)
    return handle


def _as_mask(body, m, what):
    if isinstance(m, Param) and m.mask:  # a comparison of weights alone
        return _mask(body.vector(m))
    if not isinstance(m, Mask):
        raise Refusal(f"{what} takes comparisons (a > b, ~m, m & n); a float tensor is not one "
                      f"(in PyTorch either)")
    return m


def logical_not(body, args, kwargs):
    return _not(body, _as_mask(body, args[0], "~ / logical_not"))


def logical(name):
    """m & n: the product of the masks; m | n: their larger."""
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "other"), {})
        what = "&" if name == "and" else "|"
        m, n = (_as_mask(body, v, what) for v in (a["input"], a["other"]))
        m, n = broadcast_pair(body, m, n, what)
        return _mask(apply(body, "mul" if name == "and" else "max", m, n))
    return handle


def where_of(body, cond, x, y):
    """keep(x, cond) + keep(y, ~cond): exactly x or y, whatever the other holds; the gradient
    goes to the branch taken."""
    cond = _as_mask(body, cond, "torch.where's condition")
    x, y = (v if is_number(v) else body.vector(v) for v in (x, y))
    size = max(v.size for v in (cond, x, y) if not is_number(v))

    def branch(v, m):
        if is_number(v) and v == 0:
            return None
        v = body.emit("const", size, [], value=float(v)) if is_number(v) else v
        v, m = broadcast_pair(body, v, m, "torch.where")
        return apply(body, "keep", v, m)

    parts = [p for p in (branch(x, cond), branch(y, _not(body, cond))) if p is not None]
    if not parts:
        return body.emit("const", size, [], value=0.0)
    return parts[0] if len(parts) == 1 else ops().binary("add")(body, tuple(parts), {})


def where(body, args, kwargs):
    a = bind(args, kwargs, ("condition", "input", "other"), {})
    if "input" not in a or "other" not in a:
        raise Refusal("torch.where(condition) (the indices where it holds) is not supported: "
                      "give both values, torch.where(condition, x, y)")
    return where_of(body, a["condition"], a["input"], a["other"])


def masked_fill(body, args, kwargs):
    """x.masked_fill(mask, value): value where the mask holds, else x."""
    a = bind(args, kwargs, ("input", "mask", "value"), {})
    if not is_number(a["value"]):
        raise Refusal("masked_fill with a tensor value is not supported (a Python number; "
                      "torch.where(mask, y, x) takes tensors)")
    return where_of(body, a["mask"], a["value"], a["input"])


def sign(body, args, kwargs):
    """step(x) - step(-x): 1, 0 or -1, gradient 0 (PyTorch's sign of NaN is NaN; here 0)."""
    v = body.vector(args[0])
    return apply(body, "sub", _step(body, v, False),
                 _step(body, apply(body, "scale", v, alpha=-1.0, beta=0.0), False))


def threshold(body, args, kwargs):
    """value where x <= threshold, else x (PyTorch's test: NaN stays NaN, its gradient passes)."""
    a = bind(args, kwargs, ("input", "threshold", "value", "inplace"), {"inplace": False})
    note_inplace(a["inplace"])
    v = body.vector(a["input"])
    return where_of(body, _greater(body, a["threshold"], v, True), a["value"], v)


def as_float(body, args, kwargs):
    """x.float(), .type_as(y), .to(torch.float32 / a device / y): a mask's 0/1 values as an
    ordinary tensor; anything else as it is."""
    v = args[0]
    target = args[1] if len(args) > 1 else kwargs.get("dtype")
    if not (target is None or target is torch.float32 or
            isinstance(target, (Vec, torch.device, str))):
        raise Refusal(f"converting to {target} is not supported (cells compute in float32)")
    return Vec(v.index, v.size) if isinstance(v, Mask) else v


def nan_to_num(body, args, kwargs):
    """torch.nan_to_num: NaN to `nan`, +inf and -inf to posinf and neginf (float32's largest and
    smallest by default), any other value as it is, with its gradient."""
    a = bind(args, kwargs, ("input", "nan", "posinf", "neginf"),
             {"nan": 0.0, "posinf": None, "neginf": None})
    v = body.vector(a["input"])
    high = _FLOAT_MAX if a["posinf"] is None else float(a["posinf"])
    low = -_FLOAT_MAX if a["neginf"] is None else float(a["neginf"])
    out = where_of(body, _infinite(body, v, 1), high, v)
    out = where_of(body, _infinite(body, v, -1), low, out)
    return where_of(body, _isnan(body, v), float(a["nan"]), out)


def nan_ignoring(op):
    """torch.fmax / fmin: the larger (smaller) of two tensors, where one is NaN the other (NaN
    where both are); at a tie the gradient goes to the first, as PyTorch's."""
    def handle(body, args, kwargs):
        from .trace_reduce import _extremum
        x, y = tensor_pair(body, args, kwargs, f"torch.f{op}")
        out = where_of(body, _isnan(body, y), x, _extremum(body, op, x, y, f"torch.f{op}"))
        return where_of(body, _isnan(body, x), y, out)
    return handle


def _infinities(body, v):
    return _mask(apply(body, "add", _infinite(body, v, 1), _infinite(body, v, -1)))


def _finite(body, v):
    """1 where v - v is 0: NaN for an infinity and for NaN."""
    return _equal(body, apply(body, "sub", v, v), 0.0)


def classify(test):
    """torch.isnan / isinf / isposinf / isneginf / isfinite as masks."""
    def handle(body, args, kwargs):
        return test(body, body.vector(bind(args, kwargs, ("input",), {})["input"]))
    return handle


def logical_xor(body, args, kwargs):
    """m ^ n of masks: |m - n|."""
    a = bind(args, kwargs, ("input", "other"), {})
    m, n = (_as_mask(body, v, "^ / logical_xor") for v in (a["input"], a["other"]))
    m, n = broadcast_pair(body, m, n, "^ / logical_xor")
    return _mask(apply(body, "abs", apply(body, "sub", m, n)))


def nan_reduction(mean):
    """torch.nansum / nanmean over the features: NaN entries taken as 0 (no gradient reaches
    them) and, for the mean, not counted (a row of NaN gives 0 / 0 = NaN, as PyTorch's)."""
    name = "nanmean" if mean else "nansum"

    def handle(body, args, kwargs):
        from .trace_reduce import _reduction_input, kept, sum_of
        v, a = _reduction_input(body, name, args, kwargs)
        nan = _isnan(body, v)
        total = sum_of(body, where_of(body, nan, 0.0, v))
        if mean:
            total = apply(body, "div", total, sum_of(body, _not(body, nan)))
        return kept(total, a)
    return handle


def typed(body, args, kwargs):
    """x.type(torch.float32): as x.to(...); x.type() without one gives a string, not a tensor."""
    target = args[1] if len(args) > 1 else kwargs.get("dtype")
    if target is None:
        raise Refusal("x.type() without a dtype gives the type's name, which a cell cannot use")
    if isinstance(target, str) and target not in ("torch.FloatTensor", "torch.cuda.FloatTensor"):
        raise Refusal(f"converting to {target} is not supported (cells compute in float32)")
    return as_float(body, (args[0], target), {})


def branching(body, args, kwargs):
    raise Refusal(f"all() / any() of a comparison: {_BRANCHING}")


_CLASSES = {"isnan": _isnan, "isinf": _infinities, "isfinite": _finite,
            "isposinf": lambda body, v: _infinite(body, v, 1),
            "isneginf": lambda body, v: _infinite(body, v, -1)}

_NAMES = {"gt": ("gt", "greater"), "ge": ("ge", "greater_equal"), "lt": ("lt", "less"),
          "le": ("le", "less_equal"), "eq": ("eq",), "ne": ("ne", "not_equal")}

FUNCTIONS = {
    torch.where: where, torch.masked_fill: masked_fill, torch.sign: sign, F.threshold: threshold,
    operator.invert: logical_not, torch.logical_not: logical_not,
    operator.and_: logical("and"), torch.logical_and: logical("and"),
    operator.or_: logical("or"), torch.logical_or: logical("or"),
    torch.all: branching, torch.any: branching, torch.nan_to_num: nan_to_num,
    torch.fmax: nan_ignoring("max"), torch.fmin: nan_ignoring("min"), torch.sgn: sign,
    torch.logical_xor: logical_xor, operator.xor: logical_xor,
    torch.nansum: nan_reduction(False), torch.nanmean: nan_reduction(True),
    **{getattr(torch, name): classify(test) for name, test in _CLASSES.items()},
    **{getattr(operator, name): comparison(name) for name in _COMPARE},
    **{getattr(torch, alias): comparison(name) for name, aliases in _NAMES.items()
       for alias in aliases},
}
if hasattr(F, "_threshold"):  # F.threshold calls it in some versions
    FUNCTIONS[F._threshold] = threshold

METHODS = {
    "sign": sign, "masked_fill": masked_fill, "logical_not": logical_not,
    "logical_and": logical("and"), "logical_or": logical("or"), "float": as_float,
    "type_as": as_float, "to": as_float, "type": typed, "nan_to_num": nan_to_num,
    "fmax": nan_ignoring("max"), "fmin": nan_ignoring("min"),
    "all": branching, "any": branching, "sgn": sign, "logical_xor": logical_xor,
    "nansum": nan_reduction(False), "nanmean": nan_reduction(True),
    **{name: classify(test) for name, test in _CLASSES.items()},
    **{alias: comparison(name) for name, aliases in _NAMES.items() for alias in aliases},
}

SUPPORTED = ("comparisons (> >= < <= == != with tensors or numbers, torch. and method forms) as "
             "masks, ~ & | and logical_not / and / or of them, torch.where(condition, x, y), "
             "masked_fill (a number), sign / sgn, F.threshold, mask.float(), "
             "x.type(torch.float32), nan_to_num, fmax, fmin; isnan / isinf / isposinf / "
             "isneginf / isfinite as masks, logical_xor (^) of masks; nansum / nanmean over the "
             "last dim")
