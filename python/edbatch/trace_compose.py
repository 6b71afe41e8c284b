"""Operations written with other instructions of a cell program (docs/programs.md), their
gradients following by the chain rule: lerp, addcmul, addcdiv, gelu with approximate='tanh',
selu, celu, prelu, softmin, log1p, expm1, logaddexp, hardshrink, softshrink, floor, round, ceil,
trunc, frac, xlogy, xlog1py, rms_norm (torch 2.4 on), group_norm, repeat_interleave,
cosine_similarity, pairwise_distance and bilinear, in their torch., F., method and module forms.
trace_ops merges these tables into its own."""
import math

import torch
import torch.nn.functional as F

from .trace_features import features_at, slice_of
from .trace_reduce import (clamp_of, finite_or_zero, logsumexp, norm, normalize, repeat,
                           sum_of)
from .trace_values import (Param, Refusal, Rows, apply, bind, broadcast_pair, describe,
                           feature_dim, is_number, note_inplace, operand_pair, ops, plain,
                           tensor_pair, with_inplace)
from .trace_weights import as_weight

nn = torch.nn

# PyTorch's SELU constants (torch.nn.SELU's documentation).
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _arith(body, name, x, y):
    """x (name) y with trace_ops' rules: numbers, vector weights, size-1 broadcasting."""
    return ops().binary(name)(body, (x, y), {})


def lerp(body, args, kwargs):
    """PyTorch's two forms: start + weight (end - start) where |weight| < 0.5, else
    end - (end - start) (1 - weight), so that a weight of 1 gives end exactly (one form alone
    cancels: lerp(1e8, 1, 1) would be 0). A tensor weight picks per entry, as torch.where."""
    from .trace_select import comparison, where_of  # trace_select reads this module's table
    a = bind(args, kwargs, ("input", "end", "weight"), {})
    start, end, w = a["input"], a["end"], a["weight"]
    diff = _arith(body, "sub", end, start)

    def near_start():
        return _arith(body, "add", start, _arith(body, "mul", w, diff))

    def near_end(rest):
        return _arith(body, "sub", end, _arith(body, "mul", diff, rest))

    if is_number(w):
        return near_start() if abs(w) < 0.5 else near_end(1.0 - float(w))
    small = comparison("lt")(body, (apply(body, "abs", body.vector(w)), 0.5), {})
    return where_of(body, small, near_start(), near_end(_arith(body, "sub", 1.0, w)))


def addc(name):
    """addcmul / addcdiv: input + value * (tensor1 op tensor2)."""
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "tensor1", "tensor2"), {"value": 1})
        if not is_number(a["value"]):
            raise Refusal(f"add{'cmul' if name == 'mul' else 'cdiv'} with a tensor value= is "
                          f"not supported (a Python number)")
        term = _arith(body, name, a["tensor1"], a["tensor2"])
        if a["value"] != 1:
            term = _arith(body, "mul", term, float(a["value"]))
        return _arith(body, "add", a["input"], term)
    return handle


def gelu_tanh_of(body, x):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as PyTorch's approximate='tanh'."""
    v = body.vector(x)
    cube = apply(body, "mul", apply(body, "mul", v, v), v)
    inner = apply(body, "add", v, apply(body, "scale", cube, alpha=0.044715, beta=0.0))
    t = apply(body, "tanh", apply(body, "scale", inner, alpha=math.sqrt(2.0 / math.pi), beta=0.0))
    return apply(body, "mul", apply(body, "scale", v, alpha=0.5, beta=0.0),
                 apply(body, "scale", t, alpha=1.0, beta=1.0))


def selu_of(body, x):
    """scale * elu(x, alpha) with PyTorch's constants."""
    v = body.vector(x)
    return apply(body, "scale", apply(body, "elu", v, alpha=_SELU_ALPHA), alpha=_SELU_SCALE,
                 beta=0.0)


def celu_of(body, x, alpha):
    """alpha * elu(x / alpha, 1): x above 0, alpha (exp(x / alpha) - 1) at or below it."""
    if not is_number(alpha) or alpha == 0:
        raise Refusal(f"celu with alpha={alpha!r} is not supported (a nonzero number)",
                      ValueError)
    v = body.vector(x)
    inner = apply(body, "elu", apply(body, "scale", v, alpha=1.0 / alpha, beta=0.0), alpha=1.0)
    return apply(body, "scale", inner, alpha=float(alpha), beta=0.0)


def prelu_of(body, x, weight):
    """relu(x) + weight * min(x, 0): at x == 0 the gradient is the weight, as PyTorch's (the
    min passes it there, relu does not). The weight: shape (1,) or one per feature."""
    v = body.vector(x)
    negative = clamp_of(body, v, None, 0.0, inclusive=True)
    return apply(body, "add", apply(body, "relu", v), _arith(body, "mul", weight, negative))


def log1p_of(body, x):
    """log(1 + x): 1 + x is rounded to float32 first, so near 0 the result is within about 6e-8
    of PyTorch's log1p in absolute terms, not in relative ones."""
    v = body.vector(x)
    return apply(body, "log", apply(body, "scale", v, alpha=1.0, beta=1.0))


def expm1_of(body, x):
    """exp(x) - 1, within about 6e-8 of PyTorch's expm1 in absolute terms near 0."""
    v = body.vector(x)
    return apply(body, "scale", apply(body, "exp", v), alpha=1.0, beta=-1.0)


def tan_of(body, x):
    """sin(x) / cos(x); its gradient 1 + tan(x)^2 through the quotient."""
    v = body.vector(x)
    return apply(body, "div", apply(body, "sin", v), apply(body, "cos", v))


def log_base(base):
    """log(x) / log(base) (log2, log10): within a float32 rounding of PyTorch's."""
    def of(body, x):
        return apply(body, "scale", apply(body, "log", body.vector(x)),
                     alpha=1.0 / math.log(base), beta=0.0)
    return of


def logit(body, args, kwargs):
    """log(x) - log(1 - x), x first clamped to [eps, 1 - eps] when eps is given (its gradient 0
    outside, as PyTorch's); without eps NaN outside [0, 1] and -inf, inf at 0, 1, whose
    gradients are inf, as PyTorch's 1 / (x (1 - x))."""
    a = bind(args, kwargs, ("input", "eps"), {"eps": None})
    v = body.vector(a["input"])
    if a["eps"] is not None:
        if not is_number(a["eps"]):
            raise Refusal("logit's eps must be a Python number")
        v = clamp_of(body, v, float(a["eps"]), 1.0 - float(a["eps"]))
    one_minus = apply(body, "scale", v, alpha=-1.0, beta=1.0)
    return apply(body, "sub", apply(body, "log", v), apply(body, "log", one_minus))


def sinc_of(body, x):
    """sin(pi x) / (pi x), and 1 at 0 (torch.where, so the 0 / 0 there reaches no gradient:
    PyTorch's gradient at 0 is 0 too)."""
    from .trace_select import comparison, where_of
    v = body.vector(x)
    t = apply(body, "scale", v, alpha=math.pi, beta=0.0)
    ratio = apply(body, "div", apply(body, "sin", t), t)
    return where_of(body, comparison("eq")(body, (v, 0.0), {}), 1.0, ratio)


def exp2_of(body, x):
    """2 ** x: `a ** x` for a number a (exp(x log 2))."""
    return ops().power(body, (2.0, x), {})


def logaddexp(base2):
    """log(exp(x) + exp(y)) as m + log(exp(x - m) + exp(y - m)) with m = max(x, y), or 0 where
    that is infinite (two -inf give -inf, a +inf gives +inf, as PyTorch's); the gradient is
    exp(x - result) as PyTorch's, at a tie too (m's own cancels). logaddexp2 in base 2: the same
    of x log 2 and y log 2, over log 2."""
    def handle(body, args, kwargs):
        x, y = tensor_pair(body, args, kwargs, "logaddexp2" if base2 else "logaddexp")
        if base2:
            x, y = (apply(body, "scale", v, alpha=math.log(2.0), beta=0.0) for v in (x, y))
        m = finite_or_zero(body, apply(body, "max", x, y))
        s = apply(body, "add", *(apply(body, "exp", apply(body, "sub", v, m)) for v in (x, y)))
        out = apply(body, "add", m, apply(body, "log", s))
        return apply(body, "scale", out, alpha=1.0 / math.log(2.0), beta=0.0) if base2 else out
    return handle


def _lambd(a, name):
    lambd = a["lambd"]
    if not is_number(lambd):
        raise Refusal(f"{name} with a tensor lambd is not supported (a Python number)")
    if name == "softshrink" and lambd < 0:
        raise Refusal(f"softshrink's lambd must be at least 0, got {lambd}", ValueError)
    return float(lambd)


def hardshrink(body, args, kwargs):
    """0 where -lambd <= x <= lambd, else x (NaN stays NaN), its gradient passing where x is
    kept, as PyTorch's."""
    from .trace_select import comparison, logical, where_of
    a = bind(args, kwargs, ("input", "lambd"), {"lambd": 0.5})
    lambd = _lambd(a, "hardshrink")
    v = body.vector(a["input"])
    inside = logical("and")(body, (comparison("ge")(body, (v, -lambd), {}),
                                   comparison("le")(body, (v, lambd), {})), {})
    return where_of(body, inside, 0.0, v)


def softshrink(body, args, kwargs):
    """x - lambd above lambd, x + lambd below -lambd, else 0 * x (NaN stays NaN, as in PyTorch
    2.x; 1.13 gave 0), with gradient 1 where |x| > lambd only, as PyTorch's."""
    from .trace_select import comparison, where_of
    a = bind(args, kwargs, ("input", "lambd"), {"lambd": 0.5})
    lambd = _lambd(a, "softshrink")
    v = body.vector(a["input"])
    below = where_of(body, comparison("lt")(body, (v, -lambd), {}),
                     apply(body, "scale", v, alpha=1.0, beta=lambd),
                     apply(body, "scale", v, alpha=0.0, beta=0.0))
    return where_of(body, comparison("gt")(body, (v, lambd), {}),
                    apply(body, "scale", v, alpha=1.0, beta=-lambd), below)


def floor_of(body, x):
    """The largest integer not above x: gradient 0."""
    return apply(body, "floor", body.vector(x))


def _round(body, args, kwargs):
    """The nearest integer, halves to even (decimals=0): gradient 0."""
    a = bind(args, kwargs, ("input", "decimals"), {"decimals": 0})
    if a["decimals"] != 0:
        raise Refusal(f"round with decimals={a['decimals']!r} is not supported (decimals=0: "
                      "the nearest integer)", ValueError)
    return apply(body, "round", body.vector(a["input"]))


def ceil_of(body, x):
    """-floor(-x): gradient 0."""
    v = apply(body, "scale", body.vector(x), alpha=-1.0, beta=0.0)
    return apply(body, "scale", apply(body, "floor", v), alpha=-1.0, beta=0.0)


def trunc_of(body, x):
    """ceil(x) below 0, else floor(x) (NaN included), with x's sign (trunc(-0.5) is -0, which a
    selection by masks would make 0): gradient 0."""
    from .trace_select import comparison, where_of
    v = body.vector(x)
    whole = where_of(body, comparison("lt")(body, (v, 0.0), {}), ceil_of(body, v),
                     floor_of(body, v))
    return apply(body, "copysign", whole, v)


def frac_of(body, x):
    """x - trunc(x), as PyTorch computes it: gradient 1."""
    v = body.vector(x)
    return apply(body, "sub", v, trunc_of(body, v))


def rms_norm_of(body, x, shape, weight, eps):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, as PyTorch's rms_norm (eps None:
    float32's machine epsilon)."""
    v = body.vector(x)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if shape != (v.size,):
        raise Refusal(f"rms_norm over shape {shape} of a size-{v.size} tensor: only the last dim "
                      f"is supported", ValueError)
    if weight is not None and not (isinstance(weight, Param) and weight.tensor.dim() == 1):
        raise Refusal("rms_norm's weight must be a vector weight (nn.Parameter)")
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    ms = apply(body, "scale", sum_of(body, apply(body, "mul", v, v), 1.0 / v.size), alpha=1.0,
               beta=eps)
    y = apply(body, "mul", v, body.emit("broadcast", v.size, [ops().power_of(body, ms, -0.5)]))
    return y if weight is None else apply(body, "mul", y, body.vector(weight))


def _rms_norm(body, args, kwargs):
    a = bind(args, kwargs, ("input", "normalized_shape", "weight", "eps"),
             {"weight": None, "eps": None})
    return rms_norm_of(body, a["input"], a["normalized_shape"], a["weight"], a["eps"])


def gelu(body, args, kwargs):
    """F.gelu with either approximation ('none': the `gelu` instruction)."""
    a = bind(args, kwargs, ("input", "approximate"), {"approximate": "none"})
    if a["approximate"] == "tanh":
        return gelu_tanh_of(body, a["input"])
    if a["approximate"] != "none":
        raise Refusal(f"gelu with approximate={a['approximate']!r} is not supported ('none' or "
                      f"'tanh')", ValueError)
    v = body.vector(a["input"])
    return apply(body, "gelu", v)


def _celu(body, args, kwargs):
    a = bind(args, kwargs, ("input", "alpha", "inplace"), {"alpha": 1.0, "inplace": False})
    note_inplace(a["inplace"])
    return celu_of(body, a["input"], a["alpha"])


def _prelu(body, args, kwargs):
    a = bind(args, kwargs, ("input", "weight"), {})
    return prelu_of(body, a["input"], a["weight"])


def _softmin(body, args, kwargs):
    a = ops().softmax_arguments(args, kwargs)
    v = body.vector(a["input"])
    minus = apply(body, "scale", v, alpha=-1.0, beta=0.0)
    return ops().softmax("softmax")(body, (minus,), {"dim": a["dim"], "dtype": a["dtype"]})


def cosine_similarity(body, args, kwargs):
    """Over the features, as PyTorch computes it: x1 and x2 broadcast to one size, each divided
    by its norm floored at eps (F.normalize), then the sum of their products; a (batch,) value.
    Below eps a norm's gradient is 0 (the floor takes it); PyTorch's differs there, though not at
    a zero vector, where both give F.normalize's 1 / eps."""
    a = bind(args, kwargs, ("x1", "x2", "dim", "eps"), {"dim": 1, "eps": 1e-8})
    feature_dim(a["dim"], "cosine_similarity")
    x1, x2 = broadcast_pair(body, body.vector(a["x1"]), body.vector(a["x2"]),
                            "cosine_similarity")
    u1, u2 = (normalize(body, (v,), {"dim": -1, "eps": a["eps"]}) for v in (x1, x2))
    return Rows(sum_of(body, body.emit("mul", u1.size, [u1, u2])))


def pairwise_distance(body, args, kwargs):
    """|x1 - x2 + eps| over the features (p=2 or 1), as PyTorch's norm of the shifted difference."""
    a = bind(args, kwargs, ("x1", "x2", "p", "eps", "keepdim"),
             {"p": 2.0, "eps": 1e-6, "keepdim": False})
    shifted = _arith(body, "add", _arith(body, "sub", a["x1"], a["x2"]), float(a["eps"]))
    return norm(body, (shifted, a["p"], -1, a["keepdim"]), {})


def bilinear_of(body, x1, x2, weight, bias):
    """x1 A_k x2 + b_k for each output k (weight A: (out, in1, in2)): x1 times A read as
    (out * in2, in1) rows (a weight computed from A on every call, so its gradient reaches A),
    times out copies of x2 side by side, summed per output."""
    if not isinstance(weight, Param) or weight.tensor.dim() != 3:
        raise Refusal("bilinear is supported with its (out, in1, in2) weight (an nn.Parameter "
                      f"of the cell), got {describe(weight)}")
    out, in1, in2 = weight.tensor.shape
    v1, v2 = body.vector(x1), body.vector(x2)
    if (v1.size, v2.size) != (in1, in2):
        raise Refusal(f"bilinear of sizes {v1.size} and {v2.size} with a weight for {in1} and "
                      f"{in2}", ValueError)
    label, get = weight.key

    def rows(a):
        return a.transpose(1, 2).reshape(out * in2, in1)
    w = as_weight(f"bilinear({label})", lambda: rows(get()), rows(weight.tensor))
    t = ops().linear_of(body, v1, w, None, "linear")
    p = body.emit("mul", out * in2, [t, v2 if out == 1 else
                                     body.emit("cat", out * in2, [v2] * out)])
    sums = [sum_of(body, p if out == 1 else
                   body.emit("slice", in2, [p], begin=k * in2, end=(k + 1) * in2))
            for k in range(out)]
    y = sums[0] if out == 1 else body.emit("cat", out, sums)
    return y if bias is None else _arith(body, "add", y, bias)


def _bilinear(body, args, kwargs):
    a = bind(args, kwargs, ("input1", "input2", "weight", "bias"), {"bias": None})
    return bilinear_of(body, a["input1"], a["input2"], a["weight"], a["bias"])


_selu = with_inplace(selu_of)


def tile(body, args, kwargs):
    """torch.tile(x, (k,)) / (1, k): x.repeat(1, k) (tile pads its dims with leading ones)."""
    a = bind(args, kwargs, ("input", "dims"), {})
    dims = tuple(a["dims"]) if isinstance(a["dims"], (tuple, list, torch.Size)) else (a["dims"],)
    dims = (1,) * (2 - len(dims)) + dims
    if len(dims) != 2 or dims[0] != 1:
        raise Refusal("tile is supported as torch.tile(x, (k,)) or x.tile((1, k)) (copies of the "
                      "features; the rows are the nodes)", ValueError)
    return repeat(body, (a["input"], dims), {})


def repeat_interleave(body, args, kwargs):
    """x.repeat_interleave(k, dim=-1): each feature k times in turn (k an int, or one int per
    feature), as the features at those indices."""
    a = bind(args, kwargs, ("input", "repeats", "dim"), {"dim": None, "output_size": None})
    v, k = body.vector(a["input"]), a["repeats"]
    if a["dim"] is None:
        raise Refusal("repeat_interleave without dim flattens the batch: give dim=-1", ValueError)
    feature_dim(a["dim"], "repeat_interleave")
    counts = [k] * v.size if isinstance(k, int) and not isinstance(k, bool) else k
    if not (isinstance(counts, (list, tuple)) and len(counts) == v.size and all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
            and sum(counts)):
        raise Refusal(f"repeat_interleave's repeats must be known when the cell is traced: an "
                      f"int, or {v.size} ints (one per feature) not all 0", ValueError)
    return features_at(body, v, [i for i, c in enumerate(counts) for _ in range(c)])


def group_norm_of(body, x, groups, weight, bias, eps):
    """F.group_norm of (batch, channels) rows: a layer norm of each group's slice, then the
    per-channel weight and bias (one group: layer_norm itself)."""
    v = body.vector(x)
    if not isinstance(groups, int) or groups < 1 or v.size % groups:
        raise Refusal(f"group_norm of {v.size} channels in {groups} groups: the groups must "
                      f"divide the channels (PyTorch refuses it too)", ValueError)
    layer_norm = ops().layer_norm_of
    if groups == 1:
        return layer_norm(body, v, v.size, weight, bias, eps)
    width = v.size // groups
    out = body.emit("cat", v.size, [
        layer_norm(body, slice_of(body, v, g * width, (g + 1) * width), width, None, None, eps)
        for g in range(groups)])
    if weight is not None:
        out = _arith(body, "mul", out, weight)
    return out if bias is None else _arith(body, "add", out, bias)


def _group_norm(body, args, kwargs):
    a = bind(args, kwargs, ("input", "num_groups", "weight", "bias", "eps"),
             {"weight": None, "bias": None, "eps": 1e-5})
    return group_norm_of(body, a["input"], a["num_groups"], a["weight"], a["bias"], a["eps"])


def linalg_norm(body, args, kwargs):
    """torch.linalg.norm over the features (dim=-1): the vector norm of order ord (2 or 1)."""
    a = bind(args, kwargs, ("input", "ord", "dim", "keepdim"),
             {"ord": None, "dim": None, "keepdim": False, "out": None, "dtype": None})
    if a["dim"] is None or isinstance(a["dim"], (tuple, list)) or a["dtype"] is not None:
        raise Refusal("torch.linalg.norm is supported over the features (dim=-1) only, without "
                      "dtype=: without dim it would take the whole batch's norm", ValueError)
    return norm(body, (a["input"],), {"p": 2 if a["ord"] is None else a["ord"], "dim": a["dim"],
                                      "keepdim": a["keepdim"], "out": a["out"]})


def atan2(body, args, kwargs):
    """torch.atan2(a, b): the angle of (b, a), an op of its own (its gradient at b = 0 is finite,
    where atan(a / b) would give 0 * inf)."""
    return apply(body, "atan2", *tensor_pair(body, args, kwargs, "atan2"))


def hypot(body, args, kwargs):
    """torch.hypot(a, b): sqrt(a^2 + b^2), an op of its own (the squares would overflow above
    1.8e19 in float32 and underflow below 1e-19; hypot(inf, NaN) is inf)."""
    return apply(body, "hypot", *tensor_pair(body, args, kwargs, "hypot"))


def x_log(name, shift):
    """x * log(y + shift): torch.xlogy (shift 0) and special.xlog1py (shift 1, log1p_of). 0 where
    x is 0 and y is not NaN, with PyTorch's gradients: x's is log(y + shift), but 0 where x is 0
    and y <= -shift; y's is x / (y + shift). The log is taken as 0 where x is 0 and y <= -shift
    before the product, and the product of 0 and an infinite y is replaced by 0 after it. Where
    x is 0, y's gradient is 0 (PyTorch's 0 / 0 and 0 / NaN are NaN), and at x = 0, y = inf x's
    gradient is 0 (PyTorch's inf). Either argument may be a Python number."""
    def handle(body, args, kwargs):
        from .trace_select import comparison, logical, where_of
        a = bind(args, kwargs, ("input", "other"), {})
        x, y = operand_pair(body, a["input"], a["other"], name)
        x_zero = comparison("eq")(body, (x, 0.0), {})

        def and_zero(op, value):
            return logical("and")(body, (x_zero, comparison(op)(body, (y, value), {})), {})
        log = log1p_of(body, y) if shift else apply(body, "log", y)
        log_y = where_of(body, and_zero("le", -float(shift)), 0.0, log)
        return where_of(body, and_zero("eq", math.inf), 0.0, apply(body, "mul", x, log_y))
    return handle


xlogy = x_log("xlogy", 0)


def _special(**handlers):
    """torch.special's aliases of the handlers, where this torch has them."""
    return {getattr(torch.special, name): h for name, h in handlers.items()
            if hasattr(torch.special, name)}


FUNCTIONS = {
    **({F.rms_norm: _rms_norm} if hasattr(F, "rms_norm") else {}),
    torch.repeat_interleave: repeat_interleave, F.group_norm: _group_norm,
    torch.lerp: lerp, torch.addcmul: addc("mul"), torch.addcdiv: addc("div"),
    F.gelu: gelu, F.selu: _selu, torch.selu: _selu, F.celu: _celu, torch.celu: _celu,
    F.prelu: _prelu, torch.prelu: _prelu, F.softmin: _softmin,
    torch.log1p: plain(log1p_of), torch.expm1: plain(expm1_of), torch.tan: plain(tan_of),
    torch.log2: plain(log_base(2.0)), torch.log10: plain(log_base(10.0)),
    torch.exp2: plain(exp2_of), torch.special.exp2: plain(exp2_of),
    F.cosine_similarity: cosine_similarity, torch.cosine_similarity: cosine_similarity,
    F.pairwise_distance: pairwise_distance, torch.pairwise_distance: pairwise_distance,
    F.bilinear: _bilinear, torch.bilinear: _bilinear,
    torch.logaddexp: logaddexp(False), torch.logaddexp2: logaddexp(True),
    torch.floor: plain(floor_of), torch.round: _round, torch.ceil: plain(ceil_of),
    torch.trunc: plain(trunc_of), torch.fix: plain(trunc_of),
    torch.frac: plain(frac_of),
    F.hardshrink: hardshrink, torch.hardshrink: hardshrink, F.softshrink: softshrink,
    torch.tile: tile, torch.linalg.norm: linalg_norm, torch.atan2: atan2, torch.arctan2: atan2,
    torch.hypot: hypot, torch.xlogy: xlogy, torch.logit: logit, torch.sinc: plain(sinc_of),
    **_special(log1p=plain(log1p_of), expm1=plain(expm1_of), logsumexp=logsumexp, xlogy=xlogy,
               logit=logit, sinc=plain(sinc_of), xlog1py=x_log("xlog1py", 1)),
}

METHODS = {
    "gelu": gelu, "lerp": lerp, "addcmul": addc("mul"), "addcdiv": addc("div"),
    "log1p": plain(log1p_of), "expm1": plain(expm1_of), "prelu": _prelu, "tan": plain(tan_of),
    "log2": plain(log_base(2.0)), "log10": plain(log_base(10.0)), "exp2": plain(exp2_of),
    "logaddexp": logaddexp(False), "logaddexp2": logaddexp(True), "hardshrink": hardshrink,
    "floor": plain(floor_of), "round": _round, "ceil": plain(ceil_of),
    "trunc": plain(trunc_of), "fix": plain(trunc_of),
    "frac": plain(frac_of), "tile": tile, "atan2": atan2, "arctan2": atan2, "hypot": hypot,
    "xlogy": xlogy, "logit": logit, "sinc": plain(sinc_of),
    "repeat_interleave": repeat_interleave,
}

MODULES = {
    nn.GELU: lambda body, m, args, kwargs: gelu(body, (args[0], getattr(m, "approximate",
                                                                         "none")), {}),
    nn.SELU: lambda body, m, args, kwargs: _selu(body, (args[0], m.inplace), {}),
    nn.CELU: lambda body, m, args, kwargs: _celu(body, (args[0], m.alpha, m.inplace), {}),
    nn.PReLU: lambda body, m, args, kwargs: prelu_of(body, args[0], body.param_of(m, "weight")),
    nn.Softmin: lambda body, m, args, kwargs: _softmin(body, (args[0], m.dim), {}),
    nn.Hardshrink: lambda body, m, args, kwargs: hardshrink(body, (args[0], m.lambd), {}),
    nn.Softshrink: lambda body, m, args, kwargs: softshrink(body, (args[0], m.lambd), {}),
    nn.CosineSimilarity: lambda body, m, args, kwargs: cosine_similarity(
        body, args, {**kwargs, "dim": m.dim, "eps": m.eps}),
    nn.PairwiseDistance: lambda body, m, args, kwargs: pairwise_distance(
        body, args, {**kwargs, "p": m.norm, "eps": m.eps, "keepdim": m.keepdim}),
    nn.GroupNorm: lambda body, m, args, kwargs: group_norm_of(
        body, args[0], m.num_groups, body.param_of(m, "weight"), body.param_of(m, "bias"), m.eps),
    nn.Bilinear: lambda body, m, args, kwargs: _bilinear(
        body, args, {**kwargs, "weight": body.param_of(m, "weight"),
                     "bias": body.param_of(m, "bias")}),
}
if hasattr(nn, "RMSNorm"):
    MODULES[nn.RMSNorm] = lambda body, m, args, kwargs: rms_norm_of(
        body, args[0], m.normalized_shape, body.param_of(m, "weight"), m.eps)

SUPPORTED = ("torch.lerp, addcmul, addcdiv (number value=); gelu with approximate='tanh'; selu, "
             "F.group_norm / nn.GroupNorm of (batch, channels) rows; repeat_interleave along the "
             "features (repeats known when traced); "
             "celu, prelu, softmin, log1p, expm1, tan, log2, log10, exp2, hardshrink (torch., F., "
             "method and module forms); softshrink (F. and module forms); logaddexp, logaddexp2 "
             "of two tensors; floor, round (decimals=0; halves to even), ceil, trunc / fix (their "
             "gradient 0), frac (torch. and method forms); tile (as repeat(1, k)); "
             "torch.linalg.norm over the last dim (ord 2 or 1); torch.special's log1p, expm1, "
             "logsumexp; atan2 / arctan2 and hypot of two tensors; xlogy (torch., "
             "special. and method forms; a Python number for either argument); "
             "logit (eps a number or None) and sinc (torch., special. and method forms); "
             "torch.special.xlog1py; "
             "nn.RMSNorm / F.rms_norm over the last dim (torch 2.4 and later); "
             "cosine_similarity and pairwise_distance (p=2 or 1) over the features (torch., F. and "
             "module forms; a (batch,) value, or (batch, 1) with keepdim=True); nn.Bilinear / "
             "F.bilinear")
