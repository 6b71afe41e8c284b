"""In-place operations in a cell: operators (`a += b`), methods (`a.add_(b)`, `a.relu_()`),
functions (`torch.relu_(a)`) and `inplace=True` (`nn.ReLU(inplace=True)`, `F.dropout(...,
inplace=True)`). The trace computes each out of place, then points the changed value's node at
the result: every later read of it, under any name, sees the change, and what was computed from
it before keeps the old value, as in PyTorch.

A change PyTorch would make visible where the trace cannot follow it is refused: to the cell's
inputs (the caller's tensors), to weights and constants, to a view or a value that has views
(the viewed tensor changes too), to a value that an operation returned as itself (`contiguous()`,
dropout in evaluation mode), and one that changes the value's shape or dtype."""
import contextlib
import operator
import threading

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from .trace_hooks import module_name
from . import trace_features
from .trace_values import (Batch, FeatureIndex, Mask, Refusal, Rows, Shape, Stack, Vec, bind,
                           describe, function_name, is_number, note_inplace, ops)

# torch.Tensor's in-place operators; it has no __imatmul__, so Python rebinds `a @= b` in PyTorch
# and in a trace alike.
_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
              "pow": "**", "and": "&", "or": "|", "xor": "^"}
NAMES = [f"__i{name}__" for name in _OPERATORS] + ["__setitem__"]  # set on fx.Proxy

# Operations whose result may share the memory of their input (PyTorch's views, and what returns
# its input as itself), by method or function name.
_VIEWS = frozenset((
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "ravel", "squeeze",
    "unsqueeze", "transpose", "t", "permute", "movedim", "moveaxis", "swapaxes", "swapdims",
    "narrow", "select", "expand", "expand_as", "broadcast_to", "broadcast_tensors", "diagonal",
    "as_strided", "unfold", "detach", "alias", "contiguous", "to", "type", "type_as", "float",
    "cpu", "cuda", "view_as_real", "real", "imag", "conj", "resolve_conj", "resolve_neg",
    "adjoint", "atleast_1d", "atleast_2d", "atleast_3d", "chunk", "split", "split_with_sizes",
    "tensor_split", "hsplit", "vsplit", "dsplit", "unbind", "meshgrid", "getitem",
    "__getitem__", "T", "mT", "H", "mH", "data", "align_to", "rename", "refine_names"))
_VIEW_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten)


def out_of_place(op, target, functions):
    """The out-of-place form of an in-place method (its name) or function (one of `functions`,
    from torch, torch.nn.functional or torch.special), or None when target is not in-place."""
    name = target if op == "call_method" else getattr(target, "__name__", "")
    if (op not in ("call_method", "call_function") or not isinstance(name, str)
            or not name.endswith("_") or name.endswith("__")
            or getattr(target, "__module__", None) in ("operator", "_operator")):  # operator.or_
        return None
    if op == "call_method":
        return name if name in METHODS else name[:-1]
    for module in (torch, F, torch.special):
        base = getattr(module, name[:-1], None)
        if base is not None and base in functions:
            return base
    return target  # refused by its own name


def _fill(body, args, kwargs):
    a = bind(args, kwargs, ("input", "value"), {})
    if not is_number(a["value"]):
        raise Refusal("fill_ with a tensor value is not supported: write "
                      "a = torch.zeros_like(a) + value", ValueError)
    return ops().like(None)(body, (a["input"], a["value"]), {})


def _copy(body, args, kwargs):
    """a.copy_(src): src broadcast to a's shape, as a value of its own."""
    a = bind(args, kwargs, ("input", "src", "non_blocking"), {"non_blocking": False})
    zeros = ops().like(0.0)(body, (a["input"],), {})
    return ops().FUNCTIONS[operator.add](body, (zeros, a["src"]), {})


def setitem(body, args, kwargs):
    """x[key] = value (fx.Proxy.__setitem__ while a cell is traced): along the features, x with
    the features key names taken from value (a number, a tensor of as many features or of one,
    a (batch,) value for x[:, i]); x[mask] = number is masked_fill. x then names the result."""
    x, key, value = args
    note_inplace(True)
    if isinstance(key, Mask):
        if not is_number(value):
            raise Refusal("x[mask] = value takes a Python number (torch.where(mask, y, x) takes "
                          "tensors)", ValueError)
        return ops().METHODS["masked_fill"](body, (x, key, value), {})
    if not isinstance(x, Vec) or isinstance(x, Mask):
        raise Refusal(f"assigning into {describe(x)} (x[...] = v) is not supported")
    positions, single = _positions(key, x.size)
    if is_number(value):
        source = None
    elif isinstance(value, Rows) and single:
        source = value.vec
    elif single:
        raise Refusal("x[:, i] = v takes a Python number or a (batch,) value (x[:, j], a "
                      "reduction without keepdim=True): PyTorch refuses a (batch, 1) one",
                      ValueError)
    else:
        source = body.vector(value)
        if source.size not in (1, len(positions)):
            raise Refusal(f"x[...] = v: a value of {source.size} features for "
                          f"{len(positions)} positions", ValueError)
    return _assign(body, x, positions, source, value)


def _assign(body, x, positions, source, number):
    """x with the features at `positions` taken from source in order (one feature of source: all
    of them; None: the number), as slices of both and their cat."""
    taken = {}
    for i, p in enumerate(positions):  # a repeated position takes its last value
        taken[p] = i if source is not None and source.size > 1 else 0
    runs = []  # [tensor or None (the number), first index, length]
    for j in range(x.size):
        tensor, index = (source, taken[j]) if j in taken else (x, j)
        last = runs[-1] if runs else None
        if last and last[0] is tensor and (tensor is None or tensor.size == 1 and tensor is not x
                                           or last[1] + last[2] == index):
            last[2] += 1
        else:
            runs.append([tensor, index, 1])
    parts = [_run(body, tensor, index, length, number) for tensor, index, length in runs]
    return parts[0] if len(parts) == 1 else body.emit("cat", x.size, parts)


def _run(body, tensor, index, length, number):
    if tensor is None:
        return body.emit("const", length, [], value=float(number))
    if tensor.size == 1 and length > 1:  # one feature, broadcast
        return ops().METHODS["expand"](body, (tensor, -1, length), {})
    return trace_features.slice_of(body, tensor, index, index + length)


def _positions(key, size):
    """The features x[key] names (in order; repeats allowed), and whether key is x[:, i]."""
    index = key if isinstance(key, tuple) else (key,)
    if index[:1] == (Ellipsis,) and len(index) == 2:
        index = (slice(None),) + index[1:]
    if index in ((Ellipsis,), (slice(None),), (slice(None), slice(None))):
        return list(range(size)), False
    if len(index) != 2 or index[0] != slice(None):
        raise Refusal("x[...] = v is supported along the features: x[:, a:b], x[:, i], "
                      "x[:, [i, j]], x[..., a:b] or x[mask] (the batch dim is not indexed)",
                      ValueError)
    s = index[1]
    if isinstance(s, int) and not isinstance(s, bool):
        if not -size <= s < size:
            raise Refusal(f"x[:, {s}] = v: {s} is out of range for {size} features", IndexError)
        return [s % size], True
    if isinstance(s, (list, tuple, FeatureIndex)):
        return trace_features.feature_indices(s, size, "x[:, index] = v"), False
    if isinstance(s, slice):
        positions = list(range(*s.indices(size)))
        if not positions:
            raise Refusal(f"x[:, {s.start}:{s.stop}] = v names no features of {size}",
                          ValueError)
        return positions, False
    raise Refusal(f"x[:, {s!r}] = v is not supported: index the features with an int, a slice "
                  "or a list of ints", ValueError)


def _requires_grad(body, args, kwargs):
    """x.requires_grad_(): every value a cell computes requires grad already; False is refused,
    as PyTorch refuses it for anything but a leaf."""
    a = bind(args, kwargs, ("input", "requires_grad"), {"requires_grad": True})
    if not a["requires_grad"]:
        raise Refusal("requires_grad_(False) of a value the cell computes (PyTorch changes only a "
                      "leaf's flag): x.detach() stops its gradient", ValueError)
    return a["input"]


# In-place methods without an out-of-place form of the name (Tensor.zero, Tensor.fill and
# Tensor.copy are no methods), by their own names; functions likewise.
METHODS = {"zero_": lambda body, args, kwargs: ops().like(0.0)(body, args[:1], {}),
           "fill_": _fill, "copy_": _copy, "requires_grad_": _requires_grad}
FUNCTIONS = {torch.zero_: METHODS["zero_"], torch.fill_: _fill, operator.setitem: setitem}


def _as(table, key):
    """trace_ops' handler of key in table (FUNCTIONS or METHODS), read when called."""
    return lambda body, args, kwargs: getattr(ops(), table)[key](body, args, kwargs)


# Tensors made to be filled in place: PyTorch leaves their values unset, the trace makes them 0.
FUNCTIONS.update({torch.empty: _as("FUNCTIONS", torch.zeros),
                  torch.empty_like: _as("FUNCTIONS", torch.zeros_like)})
METHODS["new_empty"] = _as("METHODS", "new_zeros")
SUPPORTED = ("in-place forms of the above (a += b, a.add_(b), torch.relu_(a), inplace=True), "
             "zero_, fill_, copy_, requires_grad_() and assignment along the features "
             "(x[:, a:b] = v, x[:, i] = v, x[mask] = number), on tensors the cell computes and "
             "their views along the features (not on its inputs or weights); torch.empty / "
             "empty_like / new_empty (as zeros)")


def check_call(tracer, node):
    """Refuses the in-place call `node` where its change could not be followed (check)."""
    check(tracer, changed_input(node), called(tracer, node))


def rebind_call(tracer, node):
    """The changed input of the in-place call `node` rebound to its result (rebind)."""
    return rebind(tracer, changed_input(node), node, called(tracer, node))


def called(tracer, node):
    """What an in-place call is, for errors: Tensor.add_, torch.relu_, nn.ReLU with inplace=True."""
    name = _name(tracer, node)
    if node.op == "call_module":
        return f"{name} with inplace=True"
    if node.target is operator.setitem:
        return "x[...] = v"
    if node.op == "call_function" and not name.endswith("_"):
        return f"{name}(..., inplace=True)"
    return name


def changed_input(node):
    """The node an in-place call changes: its first argument."""
    if node.args:
        return node.args[0]
    return node.kwargs.get("input", node.kwargs.get("self"))


def rebind(tracer, changed, result, what):
    """Points `changed` (the fx node an in-place operation `what` changes) at the value of node
    `result`, which it drops; a proxy of `changed`, which the operation returns."""
    values = tracer.values
    new = values.pop(result)
    view = check(tracer, changed, what)
    old = values[changed]
    if _shape(new) != _shape(old):
        raise Refusal(f"{what} would change the shape or dtype of the value it changes (PyTorch "
                      f"refuses it): {_describe(old)} into {_describe(new)}", ValueError)
    if view is not None:  # the viewed value changes at the view's features too
        base, positions = view
        part = new.vec if isinstance(new, Rows) else new
        values[base] = _assign(tracer.body, values[base], positions, part, None)
    values[changed] = new
    return tracer.proxy(changed)


def check(tracer, changed, what, allowed=None):
    """Refuses an in-place change of fx node `changed` that PyTorch would make visible where the
    trace cannot follow it (through `allowed`: (view node, its positions), a view of `changed`
    along its features being changed, whose change the trace writes into changed too). Returns
    (base node, positions) when changed is itself such a view, else None."""
    values = tracer.values
    if not isinstance(changed, fx.Node):
        raise Refusal(f"{what} changes {changed!r}, which is not a tensor the cell computes")
    if _source(changed).op == "placeholder":
        raise Refusal(f"{what} changes an input of the cell, which PyTorch would change for the "
                      f"caller too: compute a new value instead (h = h + m, not h += m)")
    old = values.get(changed)
    if changed.op == "get_attr" or _shape(old) is None:
        raise Refusal(f"{what} changes a weight, a constant or a Python value: only tensors the "
                      "cell computes may be changed in place")
    view = None
    if _is_view(tracer, changed):
        if _split_of(tracer, changed) is not None:
            raise Refusal(f"{what} changes a view ({_name(tracer, changed)}) that PyTorch does "
                          "not let change in place where gradients are computed (the pieces of "
                          "chunk, split and unbind): compute a new value (i = i.sigmoid())")
        view = _feature_view(tracer, changed)
        if view is None:
            raise Refusal(f"{what} changes a view ({_name(tracer, changed)}), whose change "
                          "PyTorch would make in the tensor it views too: change a value of "
                          "its own, or compute a new one (views along the features, x[:, a:b], "
                          "x[:, i] and narrow, may be changed)")
        _check_base(tracer, changed, *view, what)
    for user in changed.users:
        if user in values and _is_view(tracer, user) and alive(tracer, user) and (
                allowed is None or _overlaps(tracer, user, *allowed)):
            if allowed is not None:
                raise Refusal(f"{what} changes a view of a value whose other view "
                              f"({_name(tracer, user)}) shares its features, which PyTorch "
                              "would change too: compute a new value")
            raise Refusal(f"{what} changes a value that has a view ({_name(tracer, user)}), "
                          "which PyTorch would change too: take the view after the change, or "
                          "compute a new value")
    for node, value in values.items():
        if value is old and node is not changed and alive(tracer, node):
            raise Refusal(f"{what} changes a tensor that {_name(tracer, node)} and "
                          f"{_name(tracer, changed)} both give (one returns its input as itself, "
                          "as dropout in evaluation mode does), so PyTorch would change both: "
                          "compute a new value")
    return view


def _source(node):
    """The node a chain of getitems starts from (a tuple input's item: the input)."""
    while node.op == "call_function" and node.target is operator.getitem:
        if not isinstance(node.args[0], fx.Node):
            break
        node = node.args[0]
    return node


def alive(tracer, node):
    """Whether the cell may still read node: a proxy of it is referenced (a name, a list, a
    closure), or of a view of it, or it is not the tracer's. A view nothing refers to any more
    can see no change."""
    refs = tracer.proxies.get(node)
    if refs is None or any(ref() is not None for ref in refs):
        return True
    return any(alive(tracer, user) for user in node.users  # chunk's pieces, a view's views
               if user in tracer.values and (_is_view(tracer, user) or isinstance(
                   tracer.values.get(node), tuple)))


def _check_base(tracer, view, base, positions, what):
    """Refuses a change of `view` (at `positions` of node `base`) that would reach what the
    trace cannot follow: the base's own checks, and other views of it overlapping these
    features."""
    if _is_view(tracer, base):
        raise Refusal(f"{what} changes a view of a view ({_name(tracer, view)} of "
                      f"{_name(tracer, base)}): change the value itself, or a view of it")
    check(tracer, base, what, allowed=(view, positions))


def _overlaps(tracer, user, allowed, positions):
    """Whether view `user` of a value shares features with `positions` (those of view `allowed`,
    itself excluded); views not along the features count as sharing."""
    if user is allowed:
        return False
    if isinstance(tracer.values.get(user), tuple):  # chunk, split: the pieces
        return any(_overlaps(tracer, piece, allowed, positions) for piece in user.users
                   if piece in tracer.values and alive(tracer, piece))
    view = _feature_view(tracer, user)
    return view is None or bool(set(view[1]) & set(positions))


def _feature_view(tracer, node):
    """(base node, positions) when node is a view of a (batch, n) value the trace computes along
    its features (x[:, a:b], x[:, i], a step slice, narrow; a piece of chunk, split,
    tensor_split or unbind, which only other views are checked against), else None."""
    values = tracer.values
    source = node.args[0] if node.args else None
    if not isinstance(source, fx.Node):
        return None
    args = fx.node.map_arg(node.args, values.get)
    if node.op == "call_function" and node.target is operator.getitem:
        if _split_of(tracer, node) is not None:
            return _piece(tracer, source, args[1])
        if type(values.get(source)) is not Vec:  # (a comparison's view: refused as a view)
            return None
        try:
            return source, _positions(args[1], values[source].size)[0]
        except Refusal:
            return None
    if _op_name(node) == "narrow" and type(values.get(source)) is Vec and len(args) == 4 and \
            args[1] in (1, -1) and all(isinstance(a, int) for a in args[2:]):
        start = args[2] % values[source].size
        return source, list(range(start, start + args[3]))
    return None


_SPLITS = ("chunk", "split", "split_with_sizes", "tensor_split", "unbind")


def _piece(tracer, split, index):
    """(base, positions) of item `index` of a split of a (batch, n) value along its features."""
    values = tracer.values
    base = split.args[0] if split.args else None
    if (_op_name(split) not in _SPLITS or not isinstance(base, fx.Node)
            or not isinstance(values.get(base), Vec)):
        return None
    widths = [p.size if isinstance(p, Vec) else 1 if isinstance(p, Rows) else 0
              for p in values[split]]
    begin = sum(widths[:index])
    return base, list(range(begin, begin + widths[index]))


def _split_of(tracer, node):
    """The node whose tuple (chunk, split, an LSTM cell's (h, c), a tuple input) getitem `node`
    takes an item of, else None."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    source = node.args[0]
    return source if isinstance(source, fx.Node) and isinstance(tracer.values.get(source),
                                                                 tuple) else None


def _op_name(node):
    """A method's name, or a function's."""
    return node.target if node.op == "call_method" else getattr(node.target, "__name__", "")


def _advanced(tracer, node):
    """Whether getitem `node` indexes with a list, an index tensor or a mask (a copy in
    PyTorch, not a view)."""
    key = fx.node.map_arg(node.args[1], tracer.values.get)
    key = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (list, FeatureIndex, Mask)) or isinstance(k, tuple) for k in key)


def _is_view(tracer, node):
    if node.op == "call_module":
        return isinstance(tracer.root.get_submodule(node.target), _VIEW_MODULES)
    if node.op not in ("call_method", "call_function"):
        return False
    if node.target is operator.getitem:  # an item of a tuple from a non-view op is its own
        source = _split_of(tracer, node)
        if source is not None:
            return source.op == "placeholder" or _is_view(tracer, source)
        return not _advanced(tracer, node)
    if node.target is getattr:
        return node.args[1] in _VIEWS
    return _op_name(node) in _VIEWS


def _name(tracer, node):
    if node.op == "call_module":
        return module_name(tracer.root.get_submodule(node.target))
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.target is operator.getitem:
        source = _split_of(tracer, node)
        if source is not None:
            return f"a piece of {_name(tracer, source)}"
        return "an index or a slice x[...]"
    if node.target is getattr:
        return f"Tensor.{node.args[1]}"
    return function_name(node.target)


def _shape(v):
    if isinstance(v, Vec):
        return ("bool" if isinstance(v, Mask) else "float", v.size)
    if isinstance(v, Rows):
        return ("rows", v.vec.size)
    if isinstance(v, Stack):
        return ("stack", v.dim, tuple(_shape(p) for p in v.parts))
    return None


def _describe(v):
    kind = _shape(v)
    if kind[0] == "stack":
        return f"a stack of {len(v.parts)} along dim {v.dim}"
    if kind[0] == "rows":
        return "a value of shape (batch,)"
    return f"a (batch, {kind[1]}) {'bool' if kind[0] == 'bool' else 'float'} tensor"


@contextlib.contextmanager
def operators(tracing, note_where):
    """Within: fx.Proxy's in-place operators change the value in the trace (rebind) on thread
    `tracing`, after note_where(tracer body) points errors at the user's line; fx.Proxy is as it
    was after, whatever happens."""
    def in_place(name, symbol):
        binary = getattr(operator, name + "_" if name in ("and", "or") else name)

        def change(proxy, other):
            if threading.get_ident() != tracing:  # another thread's fx trace: as without
                return NotImplemented
            tracer, what = proxy.tracer, f"the in-place operator {symbol}="
            note_where(tracer.body)
            if isinstance(tracer.values.get(proxy.node), (Batch, Shape)):
                return NotImplemented  # a size (a Python int in PyTorch): Python rebinds the name
            check(tracer, proxy.node, what)
            result = binary(proxy, other)
            if not isinstance(result, fx.Proxy):
                return result
            return rebind(tracer, proxy.node, result.node, what)
        return change

    original = fx.Proxy.__dict__.get("__setitem__")

    def assign(proxy, key, value):
        if threading.get_ident() != tracing:  # another thread's fx trace: as without
            if original is None:
                raise TypeError(f"'{type(proxy).__name__}' object does not support item "
                                "assignment")
            return original(proxy, key, value)
        tracer = proxy.tracer
        note_where(tracer.body)
        check(tracer, proxy.node, "x[...] = v")
        tracer.create_proxy("call_function", operator.setitem, (proxy, key, value), {})

    saved = {name: fx.Proxy.__dict__.get(name) for name in NAMES}
    try:
        for name, symbol in _OPERATORS.items():
            setattr(fx.Proxy, f"__i{name}__", in_place(name, symbol))
        fx.Proxy.__setitem__ = assign
        yield
    finally:
        for name, fn in saved.items():
            if fn is None:
                delattr(fx.Proxy, name)
            else:
                setattr(fx.Proxy, name, fn)
