"""Sorting along the features of a cell program (docs/programs.md): torch.sort, topk, kthvalue
and median (values; indices are traced but cannot be used), in their torch. and method forms.
A bitonic network of compare-exchanges, each stage one vectorised compare-exchange of the pairs
it orders: the lower of a pair is a where a <= b or b is NaN, else b, so NaN sorts as the
largest, as in PyTorch; a value's gradient goes to the entry it came from. A stage whose pairs
lie far apart gathers them with slices; one whose pairs are close (many short runs to gather)
instead sets each entry beside its partner, read from two rotations of the vector, and keeps
the entry or takes the partner's by constant masks of the index bits: about 28 instructions a
stage, whatever the distance. A size that is no power of two is padded with NaN, which sorts
last ascending and first descending and is cut off. trace_ops merges these tables into its
own."""
from collections import namedtuple

import torch

from .trace_reduce import kept
from .trace_select import _isnan, _not, where_of
from .trace_values import Indices, Refusal, apply, bind, feature_dim

ValuesIndices = namedtuple("ValuesIndices", "values indices")


def _gather(body, picks):
    """A vector of the entries picks[p] = (vector, index), as slices of runs of consecutive
    entries of one vector, concatenated."""
    parts, start = [], 0
    while start < len(picks):
        src, first = picks[start]
        end = start + 1
        while end < len(picks) and picks[end] == (src, first + end - start):
            end += 1
        n = end - start
        parts.append(src if n == src.size else
                     body.emit("slice", n, [src], begin=first, end=first + n))
        start = end
    return parts[0] if len(parts) == 1 else body.emit("cat", len(picks), parts)


def _pick(body, x, m, y, not_m):
    """x where the 0/1 mask m is 1, else y (not_m: 1 - m, made once for several picks)."""
    return apply(body, "add", apply(body, "keep", x, m), apply(body, "keep", y, not_m))


def _exchange(body, a, b):
    """(lower, higher) of the pairs (a[i], b[i]): a is the lower where a <= b or b is NaN (a NaN
    a is never lower than a number); equal infinities go either way, as values they are equal."""
    first = apply(body, "max", apply(body, "step", apply(body, "sub", b, a), alpha=1.0),
                  _isnan(body, b))
    second = _not(body, first)
    return _pick(body, a, first, b, second), _pick(body, b, first, a, second)


def _bit_mask(body, masks, m, size):
    """1 at the entries i of a size-vector with bit m of i set, else 0 (made once per m)."""
    if m not in masks:
        v = body.emit("cat", 2 * m, [body.emit("const", m, [], value=0.0),
                                     body.emit("const", m, [], value=1.0)])
        while v.size < size:
            v = body.emit("cat", 2 * v.size, [v, v])
        masks[m] = v
    return masks[m]


def _rotated(body, v, shift):
    """v[(i + shift) mod n] at entry i."""
    s = shift % v.size
    return body.emit("cat", v.size, [body.emit("slice", v.size - s, [v], begin=s, end=v.size),
                                     body.emit("slice", s, [v], begin=0, end=s)])


def _exchange_in_place(body, masks, v, j, k, descending):
    """One stage on the whole vector: entry i with bit j clear pairs with i + j. Each entry
    takes its partner P from a rotation; the pair's first (lower index) and second are x and P
    or P and x by bit j; c = first <= second or second is NaN; an entry keeps itself where c
    agrees with its block's direction (ascending where bit k of i is clear, for k < size)."""
    size = v.size
    high = _bit_mask(body, masks, j, size)
    low = _not(body, high)
    # where bit j is clear, the partner is i + j and the entry the pair's first
    partner = _pick(body, _rotated(body, v, j), low, _rotated(body, v, -j), high)
    second = _pick(body, partner, low, v, high)
    # second - first: (P - x) at the first, (x - P) at the second
    sign = apply(body, "scale", high, alpha=-2.0, beta=1.0)
    gap = apply(body, "mul", apply(body, "sub", partner, v), sign)
    c = apply(body, "max", apply(body, "step", gap, alpha=1.0), _isnan(body, second))
    if k < size:  # keep where c == ascending: c xor bit k (or its complement descending)
        b = _bit_mask(body, masks, k, size)
        both, total = apply(body, "mul", c, b), apply(body, "add", c, b)
        keep = (apply(body, "sub", apply(body, "scale", both, alpha=2.0, beta=1.0), total)
                if descending else
                apply(body, "sub", total, apply(body, "scale", both, alpha=2.0, beta=0.0)))
    else:
        keep = _not(body, c) if descending else c
    return _pick(body, v, keep, partner, _not(body, keep))


def sorted_of(body, v, descending):
    """v's entries in order (NaN as the largest), a vector of v's size."""
    n = v.size
    size = 1
    while size < n:
        size *= 2
    if size > n:
        v = body.emit("cat", size, [v, body.emit("const", size - n, [], value=float("nan"))])
    k, masks = 2, {}
    while k <= size:
        j = k // 2
        while j >= 1:
            if size >= 16 and size // j >= 8:  # many short runs: in place (about 28 vs 2n/j + 17)
                v = _exchange_in_place(body, masks, v, j, k, descending)
                j //= 2
                continue
            lows = [i for i in range(size) if not i & j]
            a = _gather(body, [(v, i) for i in lows])
            b = _gather(body, [(v, i | j) for i in lows])
            lo, hi = _exchange(body, a, b)
            picks = [None] * size
            for q, i in enumerate(lows):
                ascending = (not i & k) != descending  # all one way at k = size
                picks[i], picks[i | j] = ((lo, q), (hi, q)) if ascending else ((hi, q), (lo, q))
            v = _gather(body, picks)
            j //= 2
        k *= 2
    if size == n:
        return v
    begin = size - n if descending else 0
    return body.emit("slice", n, [v], begin=begin, end=begin + n)


def _entry(body, v, i):
    return body.emit("slice", 1, [v], begin=i, end=i + 1)


def _check_dim(dim, what):
    if isinstance(dim, (tuple, list)) or dim is None:
        raise Refusal(f"{what} is supported along the features (dim=-1) only", ValueError)
    feature_dim(dim, what)


def _input_and_k(body, a, what):
    """The feature vector and k of topk / kthvalue, k checked against its size."""
    _check_dim(a["dim"], what)
    v = body.vector(a["input"])
    k = a["k"]
    if not isinstance(k, int) or isinstance(k, bool) or not 0 < k <= v.size:
        raise Refusal(f"{what} of k = {k!r} from {v.size} features: k must be an integer from 1 "
                      f"to {v.size}", ValueError)
    return v, k


def sort(body, args, kwargs):
    """torch.sort(x, dim=-1, descending=False, stable=False): the values; ties keep either
    order, which only their gradients' entries could tell apart."""
    a = bind(args, kwargs, ("input", "dim", "descending", "stable"),
             {"dim": -1, "descending": False, "stable": False})
    _check_dim(a["dim"], "sort")
    return ValuesIndices(sorted_of(body, body.vector(a["input"]), bool(a["descending"])),
                         Indices())


def topk(body, args, kwargs):
    """torch.topk(x, k, dim=-1, largest=True, sorted=True): the k largest (smallest) in order."""
    a = bind(args, kwargs, ("input", "k", "dim", "largest", "sorted"),
             {"dim": -1, "largest": True, "sorted": True})
    v, k = _input_and_k(body, a, "topk")
    s = sorted_of(body, v, bool(a["largest"]))
    return ValuesIndices(s if k == v.size else body.emit("slice", k, [s], begin=0, end=k),
                         Indices())


def kthvalue(body, args, kwargs):
    """torch.kthvalue(x, k, dim=-1, keepdim=False): the k-th smallest (NaN as the largest)."""
    a = bind(args, kwargs, ("input", "k", "dim", "keepdim"), {"dim": -1, "keepdim": False})
    v, k = _input_and_k(body, a, "kthvalue")
    return ValuesIndices(kept(_entry(body, sorted_of(body, v, False), k - 1), a), Indices())


def median(body, args, kwargs):
    """torch.median(x, dim=-1, keepdim=False): the lower of the two middle entries, NaN where the
    row holds a NaN (as PyTorch's; its gradient then reaches no entry, where PyTorch's goes to
    the NaN)."""
    a = bind(args, kwargs, ("input", "dim", "keepdim"), {"dim": None, "keepdim": False})
    if a["dim"] is None:
        raise Refusal("median over every element is not supported: take it over the features "
                      "with median(-1), one value per row", ValueError)
    _check_dim(a["dim"], "median")
    v = body.vector(a["input"])
    s = sorted_of(body, v, False)
    middle = _entry(body, s, (v.size - 1) // 2)
    # NaN sorts last: the row holds one where the largest entry is NaN
    value = where_of(body, _isnan(body, _entry(body, s, v.size - 1)), float("nan"), middle)
    return ValuesIndices(kept(value, a), Indices())


def msort(body, args, kwargs):
    raise Refusal("torch.msort sorts along dim 0, the nodes of the batch: sort the features "
                  "with torch.sort(x, -1)", ValueError)


FUNCTIONS = {torch.sort: sort, torch.topk: topk, torch.kthvalue: kthvalue,
             torch.median: median, torch.msort: msort}
METHODS = {"sort": sort, "topk": topk, "kthvalue": kthvalue, "median": median, "msort": msort}

SUPPORTED = ("torch.sort, topk, kthvalue and median along the last dim (torch. and method forms; "
             "their values: indices cannot be used)")
