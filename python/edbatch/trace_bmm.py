"""Per-row products through size-1 dims, as PyTorch users write dot products and attention
pooling per row: x.unsqueeze(1) is (batch, 1, n) and x.unsqueeze(-1) is (batch, n, 1), stacks of
one tensor along 1 and along 2 (trace_values.Stack). torch.bmm / matmul / @ of a stack along 1,
(batch, k, n), by a stack along 2, (batch, n, m), gives the (batch, k, m) dot products of its
tensors with the other's; by a stack along 1, (batch, n, m), the sums of the other's n tensors
weighted by each of its rows' entries. squeeze takes a size-1 dim away again, and view /
reshape / flatten take a stack of one tensor (or of size-1 tensors) back to (batch, n).
trace_ops merges these tables over trace_reduce's, whose handlers take every other value."""
import math
import operator

import torch

from . import trace_reduce, trace_stack
from .trace_features import slice_of
from .trace_reduce import _axis, sum_of
from .trace_values import (Mask, Param, Refusal, Rows, Stack, Vec, apply, bind, describe,
                           ops)


def _features(x):
    return isinstance(x, Vec) and not isinstance(x, Mask)


def unsqueeze(body, args, kwargs):
    """x.unsqueeze(1) (or -2) of a (batch, n) value: (batch, 1, n); unsqueeze(2) (or -1):
    (batch, n, 1). A (batch,) value's unsqueeze(-1) stays trace_reduce's (batch, 1)."""
    a = bind(args, kwargs, ("input", "dim"), {})
    x, dim = a["input"], a.get("dim")
    if isinstance(x, Stack) and x.dim == 0 and isinstance(x.parts[0], Rows) and dim in (-1, 2):
        return trace_stack.unsqueeze_rows(x)  # (k, batch) -> (k, batch, 1)
    if not _features(x):
        return trace_reduce.unsqueeze(body, args, kwargs)
    if dim in (0, -3):  # (1, batch, n): a sequence of one, as nn.MultiheadAttention takes it
        return Stack([x], 0)
    dim = _axis(dim)
    if dim not in (1, 2):
        raise Refusal(f"unsqueeze({a.get('dim')!r}) of a (batch, features) value is not "
                      "supported: unsqueeze(1) gives (batch, 1, n) and unsqueeze(-1) (batch, n, "
                      "1), for products per row (torch.bmm); the batch dim stays first",
                      ValueError)
    return Stack([x], dim)


def _flat(body, s):
    """A stack that is (batch, n) with a size-1 dim added, as (batch, n): its one tensor, or its
    size-1 tensors side by side; None for any other stack."""
    if len(s.parts) == 1:
        return s.parts[0]
    if s.dim in (1, 2) and all(p.size == 1 for p in s.parts):
        return body.emit("cat", len(s.parts), list(s.parts))
    return None


def squeeze(body, args, kwargs):
    """s.squeeze(d) of a stack along 1 or 2 whose dim d has size 1: (batch, n); of a dim whose
    size is not 1, the stack itself (PyTorch's no-op)."""
    a = bind(args, kwargs, ("input", "dim"), {"dim": None})
    s = a["input"]
    if isinstance(s, Stack) and s.dim == 0 and a["dim"] in (0, -3):
        return s.parts[0] if len(s.parts) == 1 else s  # (1, batch, n) back to (batch, n)
    if not isinstance(s, Stack) or s.dim == 0:
        return trace_reduce.squeeze(body, args, kwargs)
    dim = _axis(a["dim"])
    if dim not in (1, 2):
        raise Refusal("squeeze of a stack is supported along dim 1 or 2 (or -1) only: without a "
                      "dim it would drop the batch dim too when a mini-batch has one node",
                      ValueError)
    size_one = (len(s.parts) == 1) if dim == s.dim else all(p.size == 1 for p in s.parts)
    return _flat(body, s) if size_one else s


def reshape(body, args, kwargs):
    """view / reshape of a stack of one tensor or of size-1 tensors as of its (batch, n) value;
    every other value as trace_reduce's."""
    x = args[0]
    if isinstance(x, Stack) and x.dim in (1, 2) and len(args) > 1:
        v = _flat(body, x)
        if v is not None and len(trace_reduce._shape(args[1:])) < 3:
            return trace_reduce.reshape(body, (v,) + tuple(args[1:]), kwargs)
    return trace_reduce.reshape(body, args, kwargs)


def flatten(body, args, kwargs):
    a = bind(args, kwargs, ("input", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1})
    x = a["input"]
    if isinstance(x, Stack) and x.dim == 2 and a["start_dim"] in (1, -2) and a["end_dim"] in (
            -1, 2):
        v = _flat(body, x)
        if v is not None:
            return v
    return trace_reduce.flatten(body, args, kwargs)


def unflatten(body, args, kwargs):
    """x.unflatten(-1, (k, n)) / torch.unflatten / nn.Unflatten of a (batch, k * n) value: its
    view (batch, k, n), as x.view(x.size(0), k, n) (one size may be -1)."""
    a = bind(args, kwargs, ("input", "dim", "sizes"), {})
    x, sizes = a["input"], a.get("sizes")
    if a.get("dim") not in (1, -1) or not isinstance(x, Vec) or not isinstance(
            sizes, (tuple, list)) or not all(isinstance(n, int) for n in sizes):
        raise Refusal(f"unflatten of {describe(x)} along dim {a.get('dim')!r} "
                      f"into {sizes!r}: supported for a (batch, features) value along dim -1 "
                      "into sizes (k, n)", ValueError)
    if list(sizes).count(-1) == 1:
        known = -math.prod(sizes)
        sizes = [x.size // known if n == -1 else n for n in sizes]
    return reshape(body, (x, -1, *sizes), {})


def _rows(body, s, what):
    """The k rows of a (batch, k, n) stack: its tensors along 1; a stack along 2 of size-1
    tensors is one row."""
    if isinstance(s, Stack) and s.dim == 1:
        return list(s.parts)
    if isinstance(s, Stack) and s.dim == 2 and all(p.size == 1 for p in s.parts):
        return [_flat(body, s)]
    raise Refusal(f"{what}'s left operand is {describe(s)} of shape other than (batch, k, n) "
                  "(x.unsqueeze(1), or torch.stack(tensors, 1)): per-row products take rows on "
                  "the left", ValueError)


def _product(body, x, y, what):
    """(batch, k, n) @ (batch, n, m) per row, as a stack along 1 of k (batch, m) values."""
    rows = _rows(body, x, what)
    n = rows[0].size
    if isinstance(y, Stack) and y.dim == 2:  # m columns of n: the dot products
        if any(c.size != n for c in y.parts):
            raise Refusal(f"{what} of (batch, {len(rows)}, {n}) by (batch, {y.parts[0].size}, "
                          f"{len(y.parts)}): the inner sizes differ", ValueError)

        def out(r):
            dots = [sum_of(body, apply(body, "mul", r, c)) for c in y.parts]
            return dots[0] if len(dots) == 1 else body.emit("cat", len(dots), dots)
    elif isinstance(y, Stack) and y.dim == 1:  # n rows of m: sums weighted by each row
        if len(y.parts) != n:
            raise Refusal(f"{what} of (batch, {len(rows)}, {n}) by (batch, {len(y.parts)}, "
                          f"{y.parts[0].size}): the inner sizes differ", ValueError)
        mul, add = ops().binary("mul"), ops().binary("add")

        def out(r):
            total = None
            for j, t in enumerate(y.parts):
                term = mul(body, (slice_of(body, r, j, j + 1), t), {})
                total = term if total is None else add(body, (total, term), {})
            return total
    else:
        raise Refusal(f"{what} of a stack by {describe(y)}: per-row products take a stack on "
                      "the right too (x.unsqueeze(-1), torch.stack(tensors, 1 or 2))", ValueError)
    return Stack([out(r) for r in rows], 1)


def matmul(body, args, kwargs):
    """x @ y: per row where either side is a stack, else trace_ops' product with a weight."""
    a = bind(args, kwargs, ("input", "other"), {})
    if isinstance(a["input"], Stack) and isinstance(a["other"], Param):
        return ops().matmul(body, args, kwargs)  # each row by the weight (trace_ops.linear_of)
    if isinstance(a["input"], Stack) or isinstance(a["other"], Stack):
        return _product(body, a["input"], a["other"], "matmul")
    return ops().matmul(body, args, kwargs)


def bmm(body, args, kwargs):
    a = bind(args, kwargs, ("input", "mat2"), {})
    if not isinstance(a["input"], Stack):
        raise Refusal(f"torch.bmm of {describe(a['input'])}: per-row products take (batch, k, "
                      "n) values, x.unsqueeze(1) or torch.stack(tensors, 1), on the left",
                      ValueError)
    return _product(body, a["input"], a["mat2"], "torch.bmm")


FUNCTIONS = {
    operator.matmul: matmul, torch.matmul: matmul, torch.bmm: bmm, torch.unsqueeze: unsqueeze,
    torch.squeeze: squeeze, torch.reshape: reshape, torch.flatten: flatten,
    torch.unflatten: unflatten,
}

MODULES = {torch.nn.Unflatten: lambda body, m, args, kwargs: unflatten(
    body, (args[0], m.dim, tuple(m.unflattened_size)), {})}

METHODS = {
    "matmul": matmul, "bmm": bmm, "unsqueeze": unsqueeze, "squeeze": squeeze, "view": reshape,
    "reshape": reshape, "flatten": flatten, "unflatten": unflatten,
}

SUPPORTED = ("x.unsqueeze(1) as (batch, 1, n) and x.unsqueeze(-1) as (batch, n, 1); torch.bmm "
             "/ matmul / @ per row of (batch, k, n) (unsqueeze(1), torch.stack(tensors, 1)) by "
             "(batch, n, m) (unsqueeze(-1), torch.stack(tensors, 2): dot products; "
             "torch.stack(tensors, 1): weighted sums); squeeze(1 or -1), view / reshape / "
             "flatten of the result; x.unflatten(-1, (k, n)) / nn.Unflatten as "
             "x.view(x.size(0), k, n)")
