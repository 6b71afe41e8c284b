"""Handlers for a cell's feature dim: concatenation, slices, pieces (chunk, split, tensor_split,
narrow), indexing (index lists, index_select), roll, diff, padding, new constant tensors and
sizes (docs/programs.md). trace_ops merges them into its tables."""
import torch

from . import trace_reduce
from .trace_values import (Batch, EmptyPiece, FeatureIndex, Mask, Param, Refusal, Rows, Shape,
                           Vec, bind, describe, feature_dim, is_number)
from .trace_weights import Constant


def cat(body, args, kwargs):
    a = bind(args, kwargs, ("tensors", "dim"), {"dim": 0})
    feature_dim(a["dim"], "torch.cat")
    parts = [body.vector(v) for v in a["tensors"]]
    return cat_of(body, parts)


def cat_of(body, parts):
    """cat of feature values; of comparisons only, a comparison (PyTorch's bool tensor)."""
    out = body.emit("cat", sum(p.size for p in parts), parts)
    return Mask(out.index, out.size) if all(isinstance(p, Mask) for p in parts) else out


def slice_of(body, v, begin, end):
    if begin == 0 and end == v.size:
        return v
    if not 0 <= begin < end <= v.size:
        raise Refusal(f"an empty or out-of-range slice [{begin}, {end}) of a size-{v.size} "
                      f"tensor", ValueError)
    out = body.emit("slice", end - begin, [v], begin=begin, end=end)
    return Mask(out.index, out.size) if isinstance(v, Mask) else out  # a comparison's stays one


def features_at(body, v, indices):
    """The features at `indices` (in range; repeats allowed), in that order: a `slice` per run
    of consecutive features, `cat` of them. A step slice or a flip costs a slice per feature."""
    runs = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    parts = [slice_of(body, v, b, e) for b, e in runs]
    return parts[0] if len(parts) == 1 else cat_of(body, parts)


def feature_indices(index, size, what):
    """`index` (a list or tuple of ints, or an integer tensor made in the cell) as features in
    range [0, size), negative ones counted from the end as PyTorch counts them; a list of one
    bool per feature is a mask, its True features in order."""
    items = list(index)
    if items and len(items) == size and all(isinstance(i, bool) for i in items):
        items = [i for i, keep in enumerate(items) if keep]
        if not items:
            raise Refusal(f"{what} selects no features", ValueError)
    if not items or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise Refusal(f"{what} is not supported: give a non-empty list of ints, or of one bool "
                      f"per feature ({size})", ValueError)
    bad = [i for i in items if not -size <= i < size]
    if bad:
        raise Refusal(f"{what}: index {bad[0]} is out of range for {size} features", IndexError)
    return [i % size for i in items]


def index_select(body, args, kwargs):
    """torch.index_select / x.index_select along the features, with indices known when the cell
    is traced (a list made into a tensor in the cell, torch.tensor([...]) or torch.arange)."""
    a = bind(args, kwargs, ("input", "dim", "index"), {})
    feature_dim(a["dim"], "index_select")
    index = a["index"]
    if not isinstance(index, FeatureIndex):
        raise Refusal(f"index_select with {describe(index)} as its index is not supported: the "
                      "indices must be known when the cell is traced (torch.tensor([...]) or "
                      "torch.arange made in the cell)", ValueError)
    v = body.vector(a["input"])
    return features_at(body, v, feature_indices(index, v.size, "index_select"))


def flip(body, args, kwargs):
    """torch.flip / x.flip along the features (dims (-1,) or (1,)): the features reversed."""
    a = bind(args, kwargs, ("input", "dims"), {})
    dims = a.get("dims")
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(dims) != 1 or dims[0] not in (1, -1):
        raise Refusal(f"flip along dims {dims!r} is not supported: only along the features "
                      "(dims=(-1,)); flipping the batch dim would swap the nodes' rows",
                      ValueError)
    v = body.vector(a["input"])
    return features_at(body, v, range(v.size - 1, -1, -1))


def fliplr(body, args, kwargs):
    """torch.fliplr / x.fliplr: dim 1, the features of a (batch, features) value, reversed."""
    return flip(body, (args[0], (1,)), {})


def roll(body, args, kwargs):
    """torch.roll / x.roll along the features (dims=-1 or 1): the last `shifts` features first,
    a `cat` of two slices (a shift by a multiple of the size is the value itself)."""
    a = bind(args, kwargs, ("input", "shifts", "dims"), {"dims": None})
    shifts, dims = a["shifts"], a["dims"]
    shifts = shifts[0] if isinstance(shifts, (tuple, list)) and len(shifts) == 1 else shifts
    dims = dims[0] if isinstance(dims, (tuple, list)) and len(dims) == 1 else dims
    if dims is None:
        raise Refusal("roll without dims rolls the flattened batch, mixing the nodes' rows: "
                      "give dims=-1", ValueError)
    if not isinstance(shifts, int) or isinstance(shifts, bool):
        raise Refusal(f"roll by shifts={shifts!r} is not supported: one int along dims=-1",
                      ValueError)
    feature_dim(dims, "roll")
    v = body.vector(a["input"])
    k = shifts % v.size
    if k == 0:
        return v
    return body.emit("cat", v.size, [slice_of(body, v, v.size - k, v.size),
                                     slice_of(body, v, 0, v.size - k)])


def diff(body, args, kwargs):
    """torch.diff / x.diff along the features: x[:, 1:] - x[:, :-1], n times, of prepend, x and
    append side by side (each (batch, k), or a weight vector)."""
    a = bind(args, kwargs, ("input", "n", "dim", "prepend", "append"),
             {"n": 1, "dim": -1, "prepend": None, "append": None})
    feature_dim(a["dim"], "diff")
    n = a["n"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise Refusal(f"diff with n={n!r} is not supported: an int of at least 0", ValueError)
    parts = [body.vector(p) for p in (a["prepend"], a["input"], a["append"]) if p is not None]
    v = parts[0] if len(parts) == 1 else body.emit("cat", sum(p.size for p in parts), parts)
    if n >= v.size:
        raise Refusal(f"diff with n={n} of {v.size} features leaves none (PyTorch's is an "
                      f"empty tensor)", ValueError)
    for _ in range(n):
        v = body.emit("sub", v.size - 1, [slice_of(body, v, 1, v.size),
                                          slice_of(body, v, 0, v.size - 1)])
    return v


def pad(body, args, kwargs):
    """F.pad over the last dim in mode "constant": constants either side (`cat`); a negative
    amount cuts features off (`slice`), as in PyTorch."""
    a = bind(args, kwargs, ("input", "pad", "mode", "value"), {"mode": "constant", "value": None})
    amounts, value = a["pad"], 0.0 if a["value"] is None else a["value"]
    if a["mode"] != "constant":
        raise Refusal(f"F.pad with mode={a['mode']!r} is not supported: only \"constant\"",
                      ValueError)
    if (not isinstance(amounts, (tuple, list)) or len(amounts) not in (2, 4)
            or not all(isinstance(p, int) for p in amounts) or any(amounts[2:])):
        raise Refusal("F.pad is supported over the last dim: pad=(left, right) of ints (the "
                      "rows are the nodes, so (left, right, 0, 0) at most)", ValueError)
    if not is_number(value):
        raise Refusal("F.pad's value must be a Python number")
    v, (left, right) = body.vector(a["input"]), amounts[:2]
    begin, end = max(0, -left), v.size - max(0, -right)
    if end <= begin:
        raise Refusal(f"F.pad with pad=({left}, {right}) cuts away all {v.size} features",
                      ValueError)
    if (begin, end) != (0, v.size):
        v = body.emit("slice", end - begin, [v], begin=begin, end=end)
    parts = [v]
    if left > 0:
        parts.insert(0, body.emit("const", left, [], value=float(value)))
    if right > 0:
        parts.append(body.emit("const", right, [], value=float(value)))
    return v if len(parts) == 1 else body.emit("cat", sum(p.size for p in parts), parts)


def new_tensor(fill):
    """torch.zeros / ones / full(shape, value) and x.new_zeros / new_ones / new_full: a constant,
    for shapes (batch, n), (n,) and (1, n) (each row the same, as PyTorch broadcasts them) or
    (batch,); a fixed matrix for (k, n)."""
    def handle(body, args, kwargs):
        method = bool(args) and isinstance(args[0], Vec)  # x.new_zeros(...)
        args, kwargs, value = args[1:] if method else args, dict(kwargs), fill
        if fill is None:  # full / new_full: (size, fill_value)
            a = bind(args, {k: kwargs.pop(k) for k in ("size", "fill_value") if k in kwargs},
                     ("size", "fill_value"), {})
            args, value = (a["size"],), a["fill_value"]
        elif "size" in kwargs:
            args = (kwargs.pop("size"),)
        shape = trace_reduce._shape(args)
        for k in ("dtype", "layout", "pin_memory", "memory_format", "out"):
            if kwargs.get(k) not in (None, torch.float32, torch.strided, False):
                raise Refusal(f"a new tensor with {k}={kwargs[k]} is not supported")
        if kwargs.get("requires_grad"):
            raise Refusal("a new tensor with requires_grad=True is not supported: make a "
                          "parameter of it (nn.Parameter)")
        if not is_number(value):
            raise Refusal("a new tensor's fill value must be a Python number")
        if shape == (-1,):
            return Rows(body.emit("const", 1, [], value=float(value)))
        if len(shape) in (1, 2) and shape[:-1] in ((), (-1,), (1,)) and isinstance(
                shape[-1], int) and shape[-1] > 0:
            return body.emit("const", shape[-1], [], value=float(value))
        if len(shape) == 2 and all(isinstance(n, int) and n > 0 for n in shape):
            # (k, n), such as torch.ones(k, n) / n: a fixed matrix, as made in the cell
            t = torch.tensor([[float(value)] * shape[1]] * shape[0])  # torch.full is traced
            return Param((f"torch.full({shape}, {float(value)})", Constant(t)), t)
        raise Refusal(f"a new tensor of shape {shape} (with -1 for the batch): (batch, n), (n,), "
                      f"(1, n), (k, n) or (batch,) are supported", ValueError)
    return handle


def pieces(body, v, sizes):
    out, begin = [], 0
    for s in sizes:
        out.append(slice_of(body, v, begin, begin + s))
        begin += s
    return tuple(out)


def chunk(body, args, kwargs):
    a = bind(args, kwargs, ("input", "chunks", "dim"), {"dim": 0})
    feature_dim(a["dim"], "chunk")
    v = body.vector(a["input"])
    step = -(-v.size // a["chunks"])  # torch.chunk: ceil(size / chunks) each, the last smaller
    return pieces(body, v, [min(step, v.size - b) for b in range(0, v.size, step)])


def split(body, args, kwargs):
    a = bind(args, kwargs, ("tensor", "split_size_or_sections", "dim"),
             {"dim": 0, "split_size": None})
    feature_dim(a["dim"], "split")
    v = body.vector(a["tensor"])
    sizes = a.get("split_size_or_sections", a["split_size"])
    if isinstance(sizes, int):
        sizes = [min(sizes, v.size - b) for b in range(0, v.size, sizes)]
    elif sum(sizes) != v.size:
        raise Refusal(f"split sizes {list(sizes)} do not add up to {v.size}", ValueError)
    return pieces(body, v, sizes)


def tensor_split(body, args, kwargs):
    """torch.tensor_split / x.tensor_split along the features: n sections (the first size % n
    one feature longer), or the pieces between given indices, read as slices are."""
    a = bind(args, kwargs, ("input", "indices_or_sections", "dim"),
             {"dim": 0, "sections": None, "indices": None, "tensor_indices_or_sections": None})
    feature_dim(a["dim"], "tensor_split")
    v = body.vector(a["input"])
    how = next((a[k] for k in ("indices_or_sections", "sections", "indices",
                               "tensor_indices_or_sections") if a.get(k) is not None), None)
    if isinstance(how, int) and not isinstance(how, bool) and how > 0:
        q, r = divmod(v.size, how)
        ends = [(q + 1) * i if i <= r else q * i + r for i in range(1, how)]
    elif isinstance(how, (list, tuple, FeatureIndex)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in how):
        ends = [min(max(i + v.size if i < 0 else i, 0), v.size) for i in how]
    else:
        raise Refusal(f"tensor_split by {how!r} is not supported: a number of sections or a "
                      "list of indices", ValueError)
    bounds = [0] + ends + [v.size]
    # An empty piece (PyTorch's x[:, b:e] with e <= b) is refused where it is used.
    return tuple(slice_of(body, v, b, e) if e > b else EmptyPiece()
                 for b, e in zip(bounds, bounds[1:]))


def narrow(body, args, kwargs):
    a = bind(args, kwargs, ("input", "dim", "start", "length"), {})
    feature_dim(a["dim"], "narrow")
    v = body.vector(a["input"])
    start = a["start"] + v.size if a["start"] < 0 else a["start"]
    return slice_of(body, v, start, start + a["length"])


def _index_text(i):
    if isinstance(i, slice):
        return ":".join("" if e is None else str(e) for e in (i.start, i.stop)) + (
            "" if i.step is None else f":{i.step}")
    return "..." if i is Ellipsis else repr(i)


def getitem(body, args, kwargs):
    v, index = args
    if isinstance(v, (tuple, list)):
        return v[index]
    if isinstance(v, trace_reduce.Stack):
        return trace_reduce.stack_item(body, v, index)
    if isinstance(v, Rows):
        if index in ((slice(None), None), (Ellipsis, None)):
            return v.vec  # x[:, None]
        raise Refusal("a (batch,) value can only be indexed as x[:, None] (back to (batch, 1))",
                      ValueError)
    if isinstance(v, Shape):
        if index in (1, -1):
            return v.size
        if index in (0, -2):
            return Batch()
        if isinstance(index, slice):  # x.shape[-1:] (layer_norm's normalized_shape), [:-1]
            return (Batch(), v.size)[index]
        raise Refusal(f"shape[{index!r}] of a (batch, features) value", ValueError)
    if not isinstance(v, Vec):
        raise Refusal(f"indexing {describe(v)} is not supported")
    if not isinstance(index, tuple):
        index = (index,)
    if not isinstance(v, Mask):  # a size-1 dim for products per row (trace_bmm.py)
        if index in ((Ellipsis, None), (slice(None), slice(None), None)):
            return trace_reduce.Stack([v], 2)  # x[..., None], x[:, :, None]: (batch, n, 1)
        if index in ((slice(None), None), (slice(None), None, slice(None))):
            return trace_reduce.Stack([v], 1)  # x[:, None], x[:, None, :]: (batch, 1, n)
    if index[:1] == (Ellipsis,) and len(index) in (2, 3):
        index = (slice(None),) + index[1:]
    if index == (Ellipsis,) or index == (slice(None),):
        return v
    if index[0] != slice(None):
        raise Refusal("indexing along the batch dim is not supported: slice the features with "
                      "x[:, a:b] or x[..., a:b]", ValueError)
    s = index[1] if len(index) > 1 else None
    if len(index) == 3 and index[2] is None and isinstance(s, int) and not isinstance(s, bool):
        if not -v.size <= s < v.size:
            raise Refusal(f"x[:, {s}, None]: {s} is out of range for {v.size} features",
                          ValueError)
        return slice_of(body, v, s % v.size, s % v.size + 1)  # the feature as a (batch, 1)
    if len(index) != 2:
        raise Refusal(f"x[{', '.join(map(_index_text, index))}] is not supported: values are "
                      "(batch, features); index the features with x[:, i], x[:, i, None] or "
                      "x[:, a:b]", ValueError)
    if isinstance(s, int) and not isinstance(s, bool) and -v.size <= s < v.size:
        return Rows(slice_of(body, v, s % v.size, s % v.size + 1))  # x[:, i]: shape (batch,)
    if isinstance(s, (list, tuple, FeatureIndex)):  # x[:, [2, 0, 1]]: those features, in order
        return features_at(body, v, feature_indices(s, v.size, f"x[:, {_index_text(s)}]"))
    if not isinstance(s, slice):
        raise Refusal(f"x[:, {s!r}] is not supported: index the features with an int in range, "
                      f"a slice such as x[:, a:b] or a list of ints", ValueError)
    begin, end, step = s.indices(v.size)
    if step != 1:  # PyTorch refuses a negative step itself
        if not range(begin, end, step):
            raise Refusal(f"x[:, {_index_text(s)}] selects no features of {v.size}", ValueError)
        return features_at(body, v, range(begin, end, step))
    return slice_of(body, v, begin, end)


def size(body, args, kwargs):
    v = args[0]
    if not isinstance(v, Vec):
        raise Refusal(f"the size of {describe(v)} is not supported")
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return Shape(v.size) if dim is None else getitem(body, (Shape(v.size), dim), {})


def dims(body, args, kwargs):
    """x.dim() / x.ndim: 2 for a (batch, features) value, 1 for a (batch,) one."""
    v = args[0]
    if isinstance(v, Rows):
        return 1
    if not isinstance(v, Vec):
        raise Refusal(f"the number of dims of {describe(v)} is not supported")
    return 2
