"""Feature reductions (sum, mean, var, max, min, logsumexp over the last dim, kept as a size-1
value that broadcasts), elementwise maxima and minima, clamps and explicit expands in a cell
program (docs/programs.md). trace_ops merges these tables into its own."""
import math
from collections import namedtuple

import torch
import torch.nn.functional as F

from .trace_values import (Batch, Indices, Refusal, Rows, Shape, Stack, TensorConstant, Vec,
                           bind, broadcast_pair, describe, feature_dim, float32_only, is_number,
                           note_inplace, ops, same_size)

nn = torch.nn


# ---- reductions over the features ----

def _reduction_input(body, name, args, kwargs, extra=None, names=("input", "dim", "keepdim")):
    """The feature vector a reduction reads, after checking dim=-1, and its arguments (without
    keepdim=True, the handler's result is `kept(result, a)`: Rows); `names`: PyTorch's
    positional order (var's third is unbiased, norm's second p)."""
    a = bind(args, kwargs, names,
             {"dim": None, "keepdim": False, "dtype": None, **(extra or {})})
    float32_only(a["dtype"], name)
    dim = a["dim"]
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    if dim is None or isinstance(dim, (tuple, list, bool)):
        raise Refusal(f"{name} over every element is not supported: reduce the features with "
                      f"{name}(-1, keepdim=True), one value per row (a cell sees one node's "
                      f"row; to branch on a value, select with torch.where: Python control "
                      f"flow is not traced)", ValueError)
    feature_dim(dim, name)
    return body.vector(a["input"]), a


def kept(value, a):
    """A reduction's size-1 result, as (batch, 1) with keepdim=True or else (batch,)."""
    return value if a["keepdim"] else Rows(value)


# ---- stacks: torch.stack reduced over the stacked dim ----

def _axis(dim):
    """A dim of a stack's 3-D value as 0, 1 or 2; None if it is not one."""
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or isinstance(dim, bool) or not -3 <= dim <= 2:
        return None
    return dim % 3


def stack(body, args, kwargs):
    a = bind(args, kwargs, ("tensors", "dim"), {"dim": 0})
    tensors = list(a["tensors"])
    if tensors and all(isinstance(t, Rows) for t in tensors):
        # (batch,) values side by side, (batch, k): the cat of their (batch, 1) columns
        if a["dim"] not in (1, -1):
            raise Refusal(f"torch.stack of (batch,) values along dim {a['dim']!r} would move the "
                          "batch dim: stack them along dim 1 (or -1)", ValueError)
        return body.emit("cat", len(tensors), [t.vec for t in tensors])
    parts = [body.vector(t) for t in tensors]
    if not parts:
        raise Refusal("torch.stack of no tensors", ValueError)
    for p in parts[1:]:
        same_size(parts[0], p, "torch.stack")
    dim = _axis(a["dim"])
    if dim is None:
        raise Refusal(f"torch.stack along dim {a['dim']!r}: (batch, features) values stack "
                      f"along 0, 1 or 2", ValueError)
    return Stack(parts, dim)


def _stack_dim(s, dim, what):
    if _axis(dim) != s.dim:
        raise Refusal(f"{what} of a stack is supported along the stacked dim ({s.dim})",
                      ValueError)


def unbind(body, args, kwargs):
    """unbind of a stack along its stacked dim: its tensors."""
    a = bind(args, kwargs, ("input", "dim"), {"dim": 0})
    s = a["input"]
    if not isinstance(s, Stack):
        raise Refusal("unbind of a (batch, features) value is not supported (it would split the "
                      "batch); chunk or split the features instead", ValueError)
    _stack_dim(s, a["dim"], "unbind")
    return tuple(s.parts)


def stack_item(body, s, index):
    """s[i] (a stack along 0), s[:, i] (along 1), s[..., i] or s[:, :, i] (along 2), with any
    trailing full slices (s[:, i, :])."""
    index = index if isinstance(index, tuple) else (index,)
    if index[:1] == (Ellipsis,) and len(index) == 2:
        index = (slice(None),) * 2 + index[1:]
    while len(index) > s.dim + 1 and (index[-1] is Ellipsis or index[-1] == slice(None)):
        index = index[:-1]  # s[:, i, :] is s[:, i]
    if len(index) == s.dim + 1 and all(i == slice(None) for i in index[:-1]):
        i = index[-1]
        if isinstance(i, int) and not isinstance(i, bool) and -len(s.parts) <= i < len(s.parts):
            return s.parts[i]
    if s.dim in (1, 2) and len(index) in (2, 3) and index[0] == slice(None) and all(
            isinstance(i, slice) or isinstance(i, int) and not isinstance(i, bool)
            for i in index[1:]):
        from .trace_stack import item
        v = item(body, s, index[1], index[2] if len(index) == 3 else slice(None))
        if v is not None:
            return v
    raise Refusal(f"indexing a stack along {s.dim} is supported as one tensor of it "
                  f"({['s[i]', 's[:, i]', 's[..., i]'][s.dim]}), and a (batch, k, n) stack by "
                  "an int or a slice along dim 1 or 2 (s[:, i], s[:, :, a:b])", ValueError)


def _stack_reduction(body, name, args, kwargs):
    """sum / mean / max / min of a Stack over its stacked dim, or None for other inputs. max and
    min: at a tie the gradient goes to the first of the stack."""
    a = bind(args, kwargs, ("input", "dim", "keepdim"),
             {"dim": None, "keepdim": False, "dtype": None})
    s = a["input"]
    if not isinstance(s, Stack):
        return None
    float32_only(a["dtype"], name)
    from .trace_stack import _stack_dims, reduce
    if isinstance(a["dim"], (tuple, list)) and len(a["dim"]) == 1:
        a["dim"] = a["dim"][0]
    dim = _stack_dims(s, a["dim"], name)
    return reduce(body, name, s, dim, a["keepdim"])


def _across(body, name, s):
    """sum / mean / max / min across a stack's tensors, elementwise."""
    op = {"sum": "add", "mean": "add", "max": "max", "amax": "max", "min": "min",
          "amin": "min"}[name]
    acc = s.parts[0]
    for p in s.parts[1:]:
        acc = body.emit(op, acc.size, [acc, p])
    if name == "mean" and len(s.parts) > 1:
        acc = body.emit("scale", acc.size, [acc], alpha=1.0 / len(s.parts), beta=0.0)
    return acc


def stack_aware(name, handler, with_indices=False):
    """A reduction's handler that also reduces stacks (max / min give (values, indices))."""
    def handle(body, args, kwargs):
        r = _stack_reduction(body, name, args, kwargs)
        if r is None:
            return handler(body, args, kwargs)
        return Extreme(r, Indices()) if with_indices else r
    return handle


def sum_of(body, v, scale=1.0):
    s = body.emit("sum_features", 1, [v])
    return s if scale == 1.0 else body.emit("scale", 1, [s], alpha=scale, beta=0.0)


def feature_sum(body, args, kwargs):
    v, a = _reduction_input(body, "sum", args, kwargs)
    return kept(sum_of(body, v), a)


def feature_mean(body, args, kwargs):
    v, a = _reduction_input(body, "mean", args, kwargs)
    return kept(sum_of(body, v, 1.0 / v.size), a)


def feature_var(body, args, kwargs, name="var"):
    """Sum of squared deviations over n - correction (PyTorch's default correction is 1); std:
    its square root, whose gradient is 0 where it is 0 (PyTorch's), not 0 * inf."""
    v, a = _reduction_input(body, name, args, kwargs, {"unbiased": None, "correction": None},
                            ("input", "dim", "unbiased", "keepdim"))
    if a["unbiased"] is not None and a["correction"] is not None:
        raise Refusal(f"{name} with both unbiased= and correction= is not supported")
    correction = 1 if a["unbiased"] is None else int(bool(a["unbiased"]))
    if a["correction"] is not None:
        correction = a["correction"]
    if v.size - correction <= 0:
        raise Refusal(f"{name} of {v.size} feature(s) with correction {correction} divides by "
                      f"{v.size - correction}", ValueError)
    # Deviations from the mean of the row shifted by its first entry: the same in exact
    # arithmetic, and exactly 0 for a constant row, as PyTorch's (the mean of equal floats is
    # not always that float, and a tiny variance where PyTorch has 0 turns a later normalize or
    # comparison around).
    if v.size > 1:
        first = body.emit("slice", 1, [v], begin=0, end=1)
        v = body.emit("sub", v.size, [v, body.emit("broadcast", v.size, [first])])
    mean = body.emit("broadcast", v.size, [sum_of(body, v, 1.0 / v.size)])
    d = body.emit("sub", v.size, [v, mean])
    var = sum_of(body, body.emit("mul", v.size, [d, d]), 1.0 / (v.size - correction))
    if name == "std":  # a constant row: no gradient through the root, as PyTorch's std
        var = body.emit("sqrt", 1, [_floored(body, var, 0.0)])
    return kept(var, a)


def feature_std(body, args, kwargs):
    return feature_var(body, args, kwargs, "std")


def spread_mean(std):
    """torch.var_mean / std_mean over the features: (var or std, mean), each as var / std and
    mean give it."""
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "dim", "unbiased", "keepdim"),
                 {"dim": None, "unbiased": None, "keepdim": False, "correction": None})
        spread = (feature_std if std else feature_var)(body, args, kwargs)
        return spread, feature_mean(body, (a["input"],), {"dim": a["dim"],
                                                          "keepdim": a["keepdim"]})
    return handle


MinMax = namedtuple("MinMax", "min max")


def aminmax(body, args, kwargs):
    """torch.aminmax over the features: (min, max), as amin and amax give them."""
    a = bind(args, kwargs, ("input",), {"dim": None, "keepdim": False})
    rest = {"dim": a["dim"], "keepdim": a["keepdim"]}
    return MinMax(*(feature_extreme(op, True)(body, (a["input"],), rest) for op in ("min", "max")))


def repeat(body, args, kwargs):
    """x.repeat(1, k): k copies of the features side by side (`cat`)."""
    v, reps = body.vector(args[0]), args[1:]
    if len(reps) == 1 and isinstance(reps[0], (tuple, list, torch.Size)):
        reps = tuple(reps[0])
    if len(reps) != 2 or reps[0] != 1 or not isinstance(reps[1], int) or reps[1] < 1:
        raise Refusal("repeat is supported as x.repeat(1, k) (copies of the features; the rows "
                      "are the nodes)", ValueError)
    return v if reps[1] == 1 else body.emit("cat", v.size * reps[1], [v] * reps[1])


def _largest(body, v, op):
    """The largest (op "max") or smallest entry of v: size 1; its gradient goes to that entry."""
    if op == "min":
        v = body.emit("scale", v.size, [v], alpha=-1.0, beta=0.0)
    m = body.emit("max_features", 1, [v])
    return m if op == "max" else body.emit("scale", 1, [m], alpha=-1.0, beta=0.0)


def feature_extreme(op, values_only=False):
    """x.max(-1, keepdim=True) as (values, indices) (values only for amax / amin); indices cannot
    be used."""
    name = ("a" if values_only else "") + op

    def handle(body, args, kwargs):
        v, a = _reduction_input(body, name, args, kwargs)
        values = kept(_largest(body, v, op), a)
        return values if values_only else Extreme(values, Indices())
    return handle


Extreme = namedtuple("Extreme", "values indices")


def finite_or_zero(body, m):
    """m where it is finite, else 0 (the shift of a log-sum-exp: an infinite one would give NaN)."""
    # inf - |m| > 0 holds for a finite m only (inf - inf is NaN, which compares false)
    finite = body.emit("step", m.size, [body.emit("scale", m.size, [body.emit("abs", m.size, [m])],
                                                  alpha=-1.0, beta=math.inf)], alpha=0.0)
    return body.emit("keep", m.size, [m, finite])


def logsumexp(body, args, kwargs):
    """m + log(sum(exp(x - m))) with m the largest entry, or 0 where that is infinite, as
    PyTorch computes it (a row of -inf gives -inf, one holding +inf gives +inf, not NaN)."""
    v, a = _reduction_input(body, "logsumexp", args, kwargs)
    m = finite_or_zero(body, _largest(body, v, "max"))
    d = body.emit("sub", v.size, [v, body.emit("broadcast", v.size, [m])])
    s = sum_of(body, body.emit("exp", v.size, [d]))
    return kept(body.emit("add", 1, [m, body.emit("log", 1, [s])]), a)


def feature_prod(body, args, kwargs):
    """The product of the features: halves multiplied while more than one is left (an odd size's
    last feature carried by a 1), so log2 n `mul`s whose gradient is the product rule, exact
    where a factor is 0."""
    v, a = _reduction_input(body, "prod", args, kwargs, names=("input", "dim", "keepdim"))
    while v.size > 1:
        half = v.size // 2
        low = body.emit("slice", half, [v], begin=0, end=half)
        high = body.emit("slice", v.size - half, [v], begin=half, end=v.size)
        if v.size % 2:
            low = body.emit("cat", half + 1, [low, body.emit("const", 1, [], value=1.0)])
        v = body.emit("mul", v.size - half, [low, high])
    return kept(v, a)


def _squares(body, v):
    return sum_of(body, body.emit("mul", v.size, [v, v]))


def _floored(body, s, floor):
    """max(floor, s) with the constant first: at a tie (a zero vector's sum of squares) the
    gradient goes to the constant, so s gets none, as PyTorch's norm and normalize give."""
    return body.emit("max", 1, [body.emit("const", 1, [], value=floor), s])


def _norm_order(p):
    """1 or 2: the norms supported."""
    if p in (2, 2.0, "fro", None):
        return 2
    if p in (1, 1.0) and not isinstance(p, bool):
        return 1
    raise Refusal(f"norms with p={p!r} are not supported (p=1 or p=2)", ValueError)


def _abs_sum(body, v):
    return sum_of(body, body.emit("abs", v.size, [v]))


def norm(body, args, kwargs):
    """sqrt(sum of squares): x.norm(dim=-1, keepdim=True), torch.linalg.vector_norm."""
    v, a = _reduction_input(body, "norm", args, kwargs, {"p": 2, "ord": None, "out": None},
                            ("input", "p", "dim", "keepdim"))  # vector_norm's ord is norm's p
    if a["out"] is not None:
        raise Refusal("norm with out= is not supported")
    if _norm_order(a["p"] if a["ord"] is None else a["ord"]) == 1:
        return kept(_abs_sum(body, v), a)
    return kept(body.emit("sqrt", 1, [_floored(body, _squares(body, v), 0.0)]), a)


def normalize(body, args, kwargs):
    """F.normalize: x / max(|x|, eps), as x / sqrt(max(sum of squares, eps^2)) for p=2 and
    x / max(sum of |x|, eps) for p=1."""
    a = bind(args, kwargs, ("input", "p", "dim", "eps", "out"),
             {"p": 2.0, "dim": 1, "eps": 1e-12, "out": None})
    order = _norm_order(a["p"])
    feature_dim(a["dim"], "normalize")
    v = body.vector(a["input"])
    if order == 1:
        n = _floored(body, _abs_sum(body, v), float(a["eps"]))
    else:
        n = body.emit("sqrt", 1, [_floored(body, _squares(body, v), float(a["eps"]) ** 2)])
    inv = body.emit("rdiv", 1, [n], alpha=1.0)
    return body.emit("mul", v.size, [v, body.emit("broadcast", v.size, [inv])])


# ---- maxima, minima, clamps ----

def _extremum(body, op, x, y, what):
    """max / min of two feature vectors (broadcast; a number made in the cell as a 0-d tensor
    is a size-1 constant); at a tie the gradient goes to x."""
    x, y = (body.emit("const", 1, [], value=float(v)) if isinstance(v, TensorConstant)
            else body.vector(v) for v in (x, y))
    x, y = broadcast_pair(body, x, y, what)
    return body.emit(op, x.size, [x, y])


def extremum(op, name):
    over_features = feature_extreme(op)

    def handle(body, args, kwargs):
        if "dim" in kwargs or (len(args) > 1 and is_number(args[1]) and
                               not isinstance(args[1], TensorConstant)):
            return over_features(body, args, kwargs)
        a = bind(args, kwargs, ("input", "other"), {"other": None})
        if a["other"] is None:
            raise Refusal(f"{name} of every element is not supported: {name}(-1, keepdim=True) "
                          f"takes it over the features, {name}imum(a, b) elementwise")
        return _extremum(body, op, a["input"], a["other"], f"{name} of tensors")
    return handle


def _bound(body, v, b):
    return body.emit("const", v.size, [], value=float(b)) if is_number(b) else body.vector(b)


def clamp_of(body, x, low, high, inclusive=True):
    """min(max(x, low), high). inclusive: the gradient passes at x == low or high (clamp); else
    it stops there (hardtanh), by putting the bound first in the max / min."""
    v = body.vector(x)
    if low is None and high is None:
        raise Refusal("clamp without min or max is not supported", ValueError)
    for bound, op in ((low, "max"), (high, "min")):
        if bound is not None:
            b = _bound(body, v, bound)
            v = _extremum(body, op, v, b, "clamp") if inclusive else _extremum(body, op, b, v,
                                                                               "clamp")
    return v


def clamp(body, args, kwargs):
    a = bind(args, kwargs, ("input", "min", "max"), {"min": None, "max": None})
    return clamp_of(body, a["input"], a["min"], a["max"])


def clamp_side(side):
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", side), {})
        return clamp_of(body, a["input"], *((a[side], None) if side == "min" else
                                            (None, a[side])))
    return handle


def hardtanh(body, args, kwargs):
    a = bind(args, kwargs, ("input", "min_val", "max_val", "inplace"),
             {"min_val": -1.0, "max_val": 1.0, "inplace": False})
    note_inplace(a["inplace"])
    return clamp_of(body, a["input"], a["min_val"], a["max_val"], inclusive=False)


def relu6(body, args, kwargs):
    a = bind(args, kwargs, ("input", "inplace"), {"inplace": False})
    note_inplace(a["inplace"])
    return clamp_of(body, a["input"], 0.0, 6.0, inclusive=False)


# ---- explicit broadcasts ----

def expand(body, args, kwargs):
    v, sizes = body.vector(args[0]), args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)):
        sizes = tuple(sizes[0])
    if len(sizes) != 2 or not isinstance(sizes[1], int):
        raise Refusal("expand is supported as x.expand(-1, n) (rows, features)", ValueError)
    return _expanded(body, v, sizes[1])


def expand_as(body, args, kwargs):
    v, other = body.vector(args[0]), body.vector(args[1])
    return _expanded(body, v, other.size)


def _expanded(body, v, n):
    if n in (-1, v.size):
        return v
    if v.size != 1:
        raise Refusal(f"expanding a size-{v.size} tensor to {n} features: only size 1 expands",
                      ValueError)
    return body.emit("broadcast", n, [v])


# ---- (batch,) values: squeeze, unsqueeze, view and reshape between (batch,) and (batch, 1) ----

def _dim_arg(args, kwargs, what):
    a = bind(args, kwargs, ("input", "dim"), {"dim": None})
    if a["dim"] not in (1, -1):
        raise Refusal(f"{what} is supported along the last dim only ({what}(-1)): the batch "
                      f"dim's size is not known when a cell is traced", ValueError)
    return a["input"]


def squeeze(body, args, kwargs):
    """x.squeeze(-1): a size-1 value becomes (batch,); a wider one stays (PyTorch's no-op)."""
    x = _dim_arg(args, kwargs, "squeeze")
    v = body.vector(x)
    return Rows(v) if v.size == 1 else v


def unsqueeze(body, args, kwargs):
    """x.unsqueeze(-1) of a (batch,) value: (batch, 1) again."""
    x = _dim_arg(args, kwargs, "unsqueeze")
    if not isinstance(x, Rows):
        raise Refusal(f"unsqueeze of {describe(x)} is not supported: it is supported on (batch,) "
                      "values (a reduction without keepdim=True, x[:, i], squeeze(-1)), which "
                      "become (batch, 1), and on (batch, features) values (unsqueeze(1), "
                      "unsqueeze(-1)) for products per row with torch.bmm", ValueError)
    return x.vec


def _shape(dims):
    """A shape argument (dims, or one tuple of them) with the batch size (x.size(0)) as -1."""
    if len(dims) == 1 and isinstance(dims[0], Shape):  # x.shape, x.size()
        return (-1, dims[0].size)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)):
        dims = tuple(dims[0])
    return tuple(-1 if isinstance(d, Batch) else d for d in dims)


def reshape(body, args, kwargs):
    """view / reshape that keeps the rows: (batch, n) as itself ((-1, n), (x.size(0), -1)),
    (batch,) to (batch, 1) and back, (batch, k * n) as (batch, k, n) (a stack of its k pieces
    along 1) and back."""
    x, shape = args[0], _shape(args[1:])
    if isinstance(x, Rows) and shape == (-1, 1):
        return x.vec
    if isinstance(x, Stack):
        size = sum(p.size for p in x.parts)
        if x.dim == 1 and len(shape) == 2 and shape[0] == -1 and shape[1] in (-1, size):
            return body.emit("cat", size, list(x.parts))
    elif len(shape) == 3 and shape[0] == -1 and isinstance(x, Vec):
        k, n = shape[1], shape[2]
        k = x.size // n if k == -1 and n > 0 else k
        n = x.size // k if n == -1 and k > 0 else n
        if k > 0 and n > 0 and k * n == x.size:
            return Stack(list(ops().pieces(body, x, [n] * k)), 1)
    elif not isinstance(x, Rows):
        v = body.vector(x)
        if shape == (-1,) and v.size == 1:
            return Rows(v)
        if len(shape) == 2 and shape[0] == -1 and shape[1] in (-1, v.size):
            return v
    raise Refusal("view / reshape is supported only as (batch, features) -> itself "
                  "(x.view(x.size(0), -1), x.view(-1, n)), between (batch,) and (batch, 1), and "
                  "between (batch, k * n) and (batch, k, n): a cell works on one row per node",
                  ValueError)


def flatten(body, args, kwargs):
    """torch.flatten / x.flatten(1) / nn.Flatten() over the dims after the batch: (batch, n)
    is itself, a stack along 1 ((batch, k, n)) its pieces side by side (`cat`); a (batch,)
    value flattened from 0 is itself."""
    a = bind(args, kwargs, ("input", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1})
    x, start, end = a["input"], a["start_dim"], a["end_dim"]
    if isinstance(x, Rows) and start in (0, -1) and end in (0, -1):
        return x
    dims = 3 if isinstance(x, Stack) else 2
    if start in (1, 1 - dims) and end in (-1, dims - 1) and not isinstance(x, Rows):
        return reshape(body, (x, -1, -1), {})
    raise Refusal("flatten is supported over the dims after the batch (x.flatten(1), "
                  "nn.Flatten()): flattening the batch dim would mix the nodes' rows",
                  ValueError)


# ---- the tables trace_ops merges ----

FUNCTIONS = {
    torch.sum: stack_aware("sum", feature_sum), torch.mean: stack_aware("mean", feature_mean),
    torch.var: feature_var, torch.std: feature_std, torch.stack: stack,
    torch.maximum: extremum("max", "max"), torch.minimum: extremum("min", "min"),
    torch.max: stack_aware("max", extremum("max", "max"), True),
    torch.min: stack_aware("min", extremum("min", "min"), True),
    torch.clamp: clamp, torch.clip: clamp, torch.clamp_min: clamp_side("min"),
    torch.clamp_max: clamp_side("max"), F.hardtanh: hardtanh, F.relu6: relu6,
    torch.amax: stack_aware("amax", feature_extreme("max", True)),
    torch.amin: stack_aware("amin", feature_extreme("min", True)),
    torch.logsumexp: logsumexp, torch.prod: feature_prod, torch.norm: norm,
    torch.linalg.vector_norm: norm, torch.var_mean: spread_mean(False),
    torch.std_mean: spread_mean(True), torch.aminmax: aminmax,
    F.normalize: normalize, torch.squeeze: squeeze, torch.unsqueeze: unsqueeze,
    torch.reshape: reshape, torch.unbind: unbind, torch.flatten: flatten,
}

METHODS = {
    "sum": FUNCTIONS[torch.sum], "mean": FUNCTIONS[torch.mean], "var": feature_var,
    "std": feature_std, "repeat": repeat,
    "maximum": extremum("max", "max"), "minimum": extremum("min", "min"),
    "max": FUNCTIONS[torch.max], "min": FUNCTIONS[torch.min],
    "clamp": clamp, "clip": clamp, "clamp_min": clamp_side("min"),
    "clamp_max": clamp_side("max"), "expand": expand, "expand_as": expand_as,
    "amax": FUNCTIONS[torch.amax], "amin": FUNCTIONS[torch.amin],
    "logsumexp": logsumexp, "prod": feature_prod, "norm": norm, "squeeze": squeeze,
    "unsqueeze": unsqueeze, "aminmax": aminmax,
    "view": reshape, "reshape": reshape, "unbind": unbind, "flatten": flatten,
}

MODULES = {
    nn.Hardtanh: lambda body, m, args, kwargs: hardtanh(
        body, (args[0], m.min_val, m.max_val, m.inplace), {}),
    nn.ReLU6: lambda body, m, args, kwargs: relu6(body, (args[0], m.inplace), {}),
    nn.Flatten: lambda body, m, args, kwargs: flatten(body, (args[0], m.start_dim, m.end_dim),
                                                      {}),
}

SUPPORTED = (
    "sum / mean / var / std / prod / max / min / amax / amin / logsumexp / norm (p=1 or 2) over "
    "the last dim (without keepdim=True a (batch,) value, usable after unsqueeze(-1)), var_mean / "
    "std_mean and aminmax of them; (batch, k, n) stacks reduced over dim 1 or -1 (keepdim too), "
    "softmax along them, + - * / with broadcasting, elementwise activations, nn.Linear and "
    "layer_norm of each row, indexed s[:, i] / s[:, :, j] / slices, transposed (transpose(1, 2), "
    "permute(0, 2, 1), mT), and the same of torch.stack(tensors) along 0 and the features; "
    "torch.stack "
    "reduced over the stacked dim with sum / mean / max / min / amax / amin, unbound or indexed "
    "along it, x.view(x.size(0), k, n) as such a stack, flattened back by x.flatten(1) / "
    "nn.Flatten(); x.repeat(1, k); F.pad over the last dim (mode \"constant\"; nn.ConstantPad1d, "
    "nn.ZeroPad1d); torch.zeros / ones / full "
    "and x.new_zeros / new_ones / new_full of shape (x.size(0), n) or (n,); x.view(x.size(0), "
    "-1); F.normalize (p=1 or 2) "
    "(size-1 values broadcast against the features, as do size-1 tensors in + - * / and "
    "x.expand / expand_as; max and min give (values, indices), and only values may be used); "
    "torch.maximum / "
    "minimum (and max / min of two tensors), clamp / clip / clamp_min / clamp_max, hardtanh, "
    "relu6")
