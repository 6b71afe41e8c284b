"""Arithmetic, activations, softmax and reductions of 3-D values (batch, k, n), as PyTorch users
write attention over a few tensors of a node:

    s = torch.stack([h1, h2, h3], 1)              # (batch, 3, n)
    scores = (q.unsqueeze(1) * s).sum(-1)          # (batch, 3)
    w = torch.softmax(scores, -1)
    pooled = (w.unsqueeze(-1) * s).sum(1)          # (batch, n)

A 3-D value is a trace_values.Stack along 1 (its k rows, each (batch, n)) or along 2 (its n
columns, each (batch, k)); x.unsqueeze(1) is one row and x.unsqueeze(-1) one column
(trace_bmm.py). An operation works on the tensors the stack holds where it can: elementwise ones
on each, a softmax or reduction along the dim the tensors lie along on each, one across the
stacked dim elementwise across them. Otherwise the other form is made from one-feature slices
(docs/programs.md). A stack along 0, (k, batch, n) as torch.stack(tensors) gives it, takes the
same operations along 0 and the features; its reductions over the features are (k, batch)
values, a stack along 0 of (batch,) values (trace_values.Rows), which take arithmetic, softmax
and sums along 0 and unsqueeze(-1) back. trace_ops and trace_reduce call these for stacks."""
from .trace_features import slice_of
from .trace_values import Param, Refusal, Rows, Stack, Vec, apply, bind, describe, is_number, ops


def _shape(s):
    """(k, n) of a stack along 1 or 2 as a (batch, k, n) value."""
    if s.dim == 1:
        return len(s.parts), s.parts[0].size
    return s.parts[0].size, len(s.parts)


def _transposed(body, s):
    """The stack in the other form: rows as columns or columns as rows. Line i of the new form is
    feature i of each old line, side by side (one line of size-1 features: its `cat`)."""
    size = s.parts[0].size
    lines = []
    for i in range(size):
        bits = [slice_of(body, p, i, i + 1) for p in s.parts]
        lines.append(bits[0] if len(bits) == 1 else body.emit("cat", len(bits), bits))
    return Stack(lines, 3 - s.dim)


def in_form(body, s, dim):
    """s as a stack along `dim` (1: rows; 2: columns)."""
    if s.dim == dim:
        return s
    if s.dim not in (1, 2):
        raise Refusal(f"{describe(s)} along dim {s.dim}: 3-D arithmetic is supported for stacks "
                      "along 1 or 2, (batch, k, n)", ValueError)
    return _transposed(body, s)


def each_part(handler):
    """An elementwise handler of one tensor (tanh, exp, x ** 2, ...) applied to each tensor of a
    stack, which keeps its form."""
    def handle(body, args, kwargs):
        if not args or not isinstance(args[0], Stack):
            return handler(body, args, kwargs)
        s = args[0]
        if any(isinstance(v, Stack) for v in list(args[1:]) + list(kwargs.values())):
            raise Refusal("an elementwise function of two stacks is supported for + - * / only",
                          ValueError)
        out = [_rewrap(handler(body, (_vec(p),) + tuple(args[1:]), kwargs), p) for p in s.parts]
        if not all(isinstance(v, (Vec, Rows)) for v in out):
            raise Refusal(f"a function of {describe(s)} that does not give tensors", ValueError)
        return Stack(out, s.dim)
    return handle


def _vec(p):
    """A stack's tensor as a feature value (a (batch,) one as its size-1 value)."""
    return p.vec if isinstance(p, Rows) else p


def _rewrap(v, like):
    return Rows(v) if isinstance(like, Rows) and isinstance(v, Vec) else v


def _flat_rows(s):
    """Whether s is a stack along 0 of (batch,) values: a (k, batch) value."""
    return s.dim == 0 and isinstance(s.parts[0], Rows)


def each_part_of_module(handler):
    """each_part for the handlers of modules (body, module, args, kwargs)."""
    def handle(body, m, args, kwargs):
        return each_part(lambda b, a, k: handler(b, m, a, k))(body, args, kwargs)
    return handle


def _operand(body, v, what):
    if isinstance(v, Stack) or is_number(v):
        return v
    if isinstance(v, Param) and v.tensor.dim() <= 1:
        return body.vector(v)  # a vector weight: along the last dim, as PyTorch broadcasts it
    if isinstance(v, Vec):
        raise Refusal(f"{what} of a (batch, k, n) stack and a (batch, n) tensor: PyTorch would "
                      "line the tensor's batch dim up with the stack's k; x.unsqueeze(1) makes it "
                      "(batch, 1, n)", ValueError)
    raise Refusal(f"{what} of a stack and {describe(v)}", ValueError)


def binary(body, name, x, y):
    """x (op) y where a side is a stack: the tensors of both, pair by pair, in the form of the
    side with more of them (a stack of one tensor, or a number, pairs with each; sizes broadcast
    as PyTorch's, 1 against n); a vector weight pairs with each row (along the last dim)."""
    what = f"{name} of tensors"
    if any(isinstance(v, Stack) and v.dim == 0 for v in (x, y)):
        return _binary_first(body, name, x, y, what)
    x, y = _operand(body, x, what), _operand(body, y, what)
    stacks = [v for v in (x, y) if isinstance(v, Stack)]
    dim = max(stacks, key=lambda s: len(s.parts)).dim
    if any(isinstance(v, Vec) for v in (x, y)):
        dim = 1  # a vector weight lies along the rows
    parts = {side: in_form(body, v, dim).parts if isinstance(v, Stack) else [v]
             for side, v in (("x", x), ("y", y))}
    pairs = _pairs(parts["x"], parts["y"])
    if pairs is None:
        kx, nx = _shape(x) if isinstance(x, Stack) else (1, 1)
        ky, ny = _shape(y) if isinstance(y, Stack) else (1, 1)
        raise Refusal(f"{what} of (batch, {kx}, {nx}) and (batch, {ky}, {ny}): the sizes do not "
                      "broadcast", ValueError)
    handler = ops().binary(name)
    return Stack([handler(body, pair, {}) for pair in pairs], dim)


def _pairs(px, py):
    """The tensors of two sides paired as PyTorch broadcasts them (a side of one pairs with
    each of the other's); None where the counts do not broadcast."""
    count = max(len(px), len(py))
    if len(px) not in (1, count) or len(py) not in (1, count):
        return None
    return [(px[min(i, len(px) - 1)], py[min(i, len(py) - 1)]) for i in range(count)]


def _binary_first(body, name, x, y, what):
    """x (op) y with a stack along 0 on a side: (k, batch, n) against a stack along 0, a
    (batch, n) tensor, a vector weight or a number (PyTorch lines them up from the last dim);
    (k, batch) against one of those or a (batch,) value."""
    def parts(v):
        if isinstance(v, Stack):
            if v.dim != 0:
                raise Refusal(f"{what} of a stack along 0 and one along {v.dim}: stack both "
                              "along the same dim", ValueError)
            return list(v.parts)
        if isinstance(v, Param) and v.tensor.dim() <= 1:
            return [body.vector(v)]
        if isinstance(v, (Vec, Rows)) or is_number(v):
            return [v]
        raise Refusal(f"{what} of a stack and {describe(v)}", ValueError)
    px, py = parts(x), parts(y)
    pairs = _pairs(px, py)
    if pairs is None:
        raise Refusal(f"{what} of stacks of {len(px)} and {len(py)} tensors along 0: the sizes "
                      "do not broadcast", ValueError)
    handler = ops().binary(name)
    out = []
    for a, b in pairs:
        rows = [isinstance(v, Rows) for v in (a, b) if not is_number(v)]
        if any(rows) and not all(rows):
            raise Refusal(f"{what} of a (k, batch) value and a (k, batch, n) stack or (batch, n) "
                          "tensor: PyTorch would line the batch dim up with n; unsqueeze(-1) "
                          "the (k, batch) value first", ValueError)
        v = handler(body, (_vec(a), _vec(b)), {})
        out.append(Rows(v) if rows and all(rows) else v)
    return Stack(out, 0)


def _stack_dims(s, dim, what):
    """A dim of s as 0, 1 or 2 counted as in PyTorch: a (k, batch) value has two."""
    ndim = 2 if _flat_rows(s) else 3
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        raise Refusal(f"{what} of a {ndim}-D stack along dim {dim!r}", ValueError)
    dim %= ndim
    batch = 1 if s.dim == 0 else 0
    if dim == batch:
        raise Refusal(f"{what} of a stack along {s.dim} along dim {batch}, its batch dim: a cell "
                      f"sees one row per node; along the stacked dim or the features (-1)",
                      ValueError)
    return dim


def softmax(body, name, s, dim):
    """softmax / log_softmax of a stack along dim 1 or 2 (-1): of each tensor lying along that
    dim, or elementwise across the tensors when it is the stacked dim: exp(x - m) over its sum,
    m their maximum."""
    from .trace_reduce import _across
    dim = _stack_dims(s, dim, name)
    if dim != s.dim:
        return Stack([body.emit(name, p.size, [p]) for p in s.parts], s.dim)
    vecs = [_vec(p) for p in s.parts]
    m = _across(body, "max", Stack(vecs, s.dim))
    shifted = [apply(body, "sub", p, m) for p in vecs]
    exps = [apply(body, "exp", d) for d in shifted]
    total = _across(body, "sum", Stack(exps, s.dim))
    if name == "softmax":
        out = [apply(body, "div", e, total) for e in exps]
    else:
        log_total = apply(body, "log", total)
        out = [apply(body, "sub", d, log_total) for d in shifted]
    return Stack([_rewrap(v, p) for v, p in zip(out, s.parts)], s.dim)


def _line_reduction(body, name, v):
    from .trace_reduce import _largest, sum_of
    if name in ("sum", "mean"):
        return sum_of(body, v, 1.0 / v.size if name == "mean" else 1.0)
    return _largest(body, v, "max" if name in ("max", "amax") else "min")


def reduce(body, name, s, dim, keepdim):
    """A reduction of a stack along a dim (0, 1 or 2 as _stack_dims gives it): across its tensors
    when dim is the stacked one (trace_reduce's _across), else of each tensor, their results side
    by side: (batch, k) from (batch, k, n) along 2, (k, batch) from (k, batch, n). keepdim=True
    keeps the dim as size 1."""
    if dim == s.dim:
        from .trace_reduce import _across
        v = _across(body, name, Stack([_vec(p) for p in s.parts], s.dim))
        if _flat_rows(s):
            return Stack([v], 0) if keepdim else Rows(v)
        return Stack([v], s.dim) if keepdim else v
    sums = [_line_reduction(body, name, p) for p in s.parts]
    if s.dim == 0:  # over the features of (k, batch, n): (k, batch), or (k, batch, 1)
        return Stack(sums if keepdim else [Rows(v) for v in sums], 0)
    v = sums[0] if len(sums) == 1 else body.emit("cat", len(sums), sums)
    return Stack([v], dim) if keepdim else v


def each_row(handler, dim_arg=None):
    """A handler of a function along the last dim (layer_norm; normalize with dim=-1, its
    `dim_arg` at position 2) applied to each row of a stack (a stack along 2 is made rows)."""
    def handle(body, args, kwargs):
        if not args or not isinstance(args[0], Stack):
            return handler(body, args, kwargs)
        args, kwargs = list(args), dict(kwargs)
        if dim_arg is not None:
            name, position, default = dim_arg
            dim = args[position] if len(args) > position else kwargs.get(name, default)
            if dim not in (-1, 2):
                raise Refusal(f"this function of a (batch, k, n) stack is supported along its "
                              f"last dim (dim=-1), got dim={dim!r}", ValueError)
            if len(args) > position:
                args[position] = -1
            else:
                kwargs[name] = -1
        rows, dim = feature_rows(body, args[0])
        return Stack([handler(body, (r, *args[1:]), kwargs) for r in rows], dim)
    return handle


def feature_rows(body, s):
    """The (batch, n) tensors of a stack that lie along its last dim, and the stack's dim they
    are stacked along: a stack along 0's own, else its rows."""
    if s.dim == 0:
        if isinstance(s.parts[0], Rows):
            raise Refusal("a function along the last dim of a (k, batch) value: its last dim is "
                          "the batch", ValueError)
        return list(s.parts), 0
    return in_form(body, s, 1).parts, 1


def each_row_of_module(handler):
    def handle(body, m, args, kwargs):
        return each_row(lambda b, a, k: handler(b, m, a, k))(body, args, kwargs)
    return handle


def item(body, s, i1, i2):
    """s[:, i1, i2] of a stack along 1 or 2 where one of i1, i2 is a full slice: an int takes
    one line of that dim away ((batch, n) or (batch, k)), a slice keeps a range of lines (a
    step as one-feature slices)."""
    from .trace_features import features_at
    full = slice(None)
    if (i1 == full) == (i2 == full):
        return None
    dim, index = (1, i1) if i2 == full else (2, i2)
    if dim == s.dim:  # lines of the stack itself
        size = len(s.parts)
        if isinstance(index, slice):
            return Stack(s.parts[index], s.dim) if s.parts[index] else None
        return s.parts[index] if -size <= index < size else None
    size = s.parts[0].size  # features of each tensor
    if isinstance(index, slice):
        begin, end, step = index.indices(size)
        picked = range(begin, end, step)
        if not picked:
            return None
        return Stack([features_at(body, p, picked) for p in s.parts], s.dim)
    if not -size <= index < size:
        return None
    bits = [slice_of(body, p, index % size, index % size + 1) for p in s.parts]
    return bits[0] if len(bits) == 1 else body.emit("cat", len(bits), bits)


def transposed(s):
    """A (batch, k, n) stack as (batch, n, k): its rows as columns, or columns as rows (free)."""
    if s.dim not in (1, 2):
        raise Refusal(f"transposing {describe(s)} along dim {s.dim}: supported for stacks along 1 "
                      "or 2, (batch, k, n), swapping dims 1 and 2", ValueError)
    return Stack(s.parts, 3 - s.dim)


def transpose(body, args, kwargs):
    """s.transpose(1, 2) / torch.transpose / s.swapaxes of a stack; anything else is refused."""
    a = bind(args, kwargs, ("input", "dim0", "dim1"), {})
    s = a["input"]
    dims = {d % 3 for d in (a.get("dim0"), a.get("dim1")) if isinstance(d, int)}
    if not isinstance(s, Stack) or dims != {1, 2}:
        raise Refusal(f"transpose of {describe(s)} over dims ({a.get('dim0')!r}, "
                      f"{a.get('dim1')!r}) is not supported: a (batch, k, n) stack's dims 1 and "
                      "2 (a weight: .t())", ValueError)
    return transposed(s)


def permute(body, args, kwargs):
    """s.permute(0, 2, 1) of a stack: its transpose; (0, 1, 2) itself."""
    s, dims = args[0], args[1:]
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    dims = tuple(kwargs.get("dims", dims))
    if isinstance(s, Stack) and dims in ((0, 2, 1), (0, -1, -2)):
        return transposed(s)
    if isinstance(s, Stack) and dims in ((0, 1, 2), (0, -2, -1)):
        return s
    raise Refusal(f"permute{dims} of {describe(s)} is not supported: the batch dim stays first "
                  "(a (batch, k, n) stack: permute(0, 2, 1))", ValueError)


def movedim(body, args, kwargs):
    """torch.movedim / moveaxis of a (batch, k, n) stack between dims 1 and 2: its transpose; a
    dim moved onto itself leaves the value as it is."""
    a = bind(args, kwargs, ("input", "source", "destination"), {})
    v, source, destination = a["input"], a.get("source"), a.get("destination")
    one = (lambda d: d[0] if isinstance(d, (tuple, list)) and len(d) == 1 else d)
    source, destination = one(source), one(destination)
    rank = 3 if isinstance(v, Stack) else 2
    if isinstance(source, int) and isinstance(destination, int):
        if source % rank == destination % rank:
            return v
        if isinstance(v, Stack) and {source % 3, destination % 3} == {1, 2}:
            return transposed(v)
    raise Refusal(f"movedim of {describe(v)} from {source!r} to {destination!r} is not "
                  "supported: the batch dim stays first (a (batch, k, n) stack: movedim(1, 2))",
                  ValueError)


def einsum(body, equation, specs, out, operands):
    """torch.einsum of per-node tensors and (batch, k, n) stacks with at most two subscripts
    besides the batch's: each operand laid out over two dims (the result's subscripts first,
    then the summed ones; size 1 where it has none), their product with broadcasting, summed over
    the subscripts the result drops."""
    def refuse(what):
        raise Refusal(f"torch.einsum {equation!r} of stacks is not supported: {what}", ValueError)
    batch = specs[0][0]
    if any(spec[0] != batch for spec in specs) or not out.startswith(batch):
        refuse("every operand and the result need the batch subscript first")
    if any(len(set(spec)) != len(spec) for spec in specs + [out]):
        refuse("a subscript twice in one operand (a diagonal)")
    labels = list(out[1:])
    for spec in specs:
        labels += [c for c in spec[1:] if c not in labels]
    if len(labels) > 2:
        refuse("at most two subscripts besides the batch's")
    if len(labels) < 2:
        refuse("two subscripts besides the batch's")
    product = None
    for spec, v in zip(specs, operands):
        if isinstance(v, Stack) and len(spec) == 3:
            t = v if list(spec[1:]) == labels else transposed(v)
        elif isinstance(v, Vec) and len(spec) == 2:
            t = Stack([v], 2 if spec[1] == labels[0] else 1)  # (batch, k, 1) or (batch, 1, n)
        else:
            refuse(f"{describe(v)} with subscripts {spec!r} (per-node tensors have two, stacks "
                   "three; weights are not supported here)")
        product = t if product is None else binary(body, "mul", product, t)
    if len(out) == 3:
        return product
    summed = reduce(body, "sum", product, 2, False)
    if len(out) == 2:
        return summed
    from .trace_reduce import sum_of
    return Rows(sum_of(body, summed))



def unsqueeze_rows(s):
    """unsqueeze(-1) of a (k, batch) value: (k, batch, 1)."""
    return Stack([p.vec for p in s.parts], 0)
