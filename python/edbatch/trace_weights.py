"""The weights of a traced program: the list the op receives (`Weights`), and weight expressions,
what a cell computes from its weights alone (W[:H], W.chunk(2, 1), g * v / v.norm(...),
s.exp(), (E + E.t()) / 2): PyTorch computes those on every call, outside the program, and the
program reads the result as one more weight, so their gradients reach the parameters through
autograd."""
import contextvars
import operator

import torch
import torch.fx as fx
from torch.nn.utils import parametrize

from .trace_values import FeatureIndex, Param, Refusal, TensorConstant, bind, describe


# The device Weights.tensors reads the program's constants on (through weight expressions too).
_DEVICE = contextvars.ContextVar("edbatch_constants_device", default=None)


class Constant:
    """The getter of a float32 tensor made in the cell from Python values (torch.tensor([...]),
    torch.linspace, torch.ones(k, n)): computed once when the cell is traced and read as a fixed
    weight (no gradient), on the device Weights.tensors is given (a copy kept per device)."""

    def __init__(self, value):
        self.value, self._on = value.detach(), {}

    def __call__(self):
        device = _DEVICE.get()
        if device is None or torch.device(device) == self.value.device:
            return self.value
        if device not in self._on:
            self._on[device] = self.value.to(device)
        return self._on[device]


class Weights:
    """The program's weight list: one entry per (tensor, layout), with a getter per entry that
    returns the tensor to pass to the op on every call."""

    def __init__(self):
        self.entries, self.getters, self._index = [], [], {}
        self._keys = []  # the tensors whose ids are keys, kept so that no id is reused

    def add(self, param, layout):
        key = (id(param.tensor), layout)
        if key not in self._index:
            self._keys.append(param.tensor)
            name, getter = param.key
            t = param.tensor
            if layout == "vector" and row_shaped(param):
                # A (1, n) weight broadcasts over the rows as PyTorch does: the op reads it as
                # the vector it holds (a view, so its gradient reaches the weight).
                t = t.reshape(-1)
                getter = Constant(t) if isinstance(getter, Constant) else (
                    lambda get=getter: get().reshape(-1))
            if layout == "vector" and t.dim() != 1 or layout != "vector" and t.dim() != 2:
                raise Refusal(f"weight {name} has shape {tuple(t.shape)}, unusable as a "
                              f"{'vector' if layout == 'vector' else 'matrix'}", ValueError)
            rows, cols = (t.shape[0], 0) if t.dim() == 1 else tuple(t.shape)
            self._index[key] = len(self.entries)
            self.entries.append({"name": name, "rows": rows, "cols": cols, "layout": layout})
            self.getters.append(getter)
        return self._index[key]

    def tensors(self, device=None):
        """The tensors to pass to the op now, the cells' constants on `device` (the host when
        None)."""
        token = _DEVICE.set(device)
        try:
            return [get() for get in self.getters]
        finally:
            _DEVICE.reset(token)


def row_shaped(param):
    """A weight matrix of one row as the cell reads it: (1, n), or (n, 1).t()."""
    t = param.tensor
    return t.dim() == 2 and t.shape[1 if param.transposed else 0] == 1


# ---- weight expressions ----


class _NoGradRow(torch.autograd.Function):
    """The table as it is, except that no gradient reaches its row `row`."""

    @staticmethod
    def forward(ctx, table, row):
        ctx.row = row
        return table.view_as(table)

    @staticmethod
    def backward(ctx, grad):
        return without_row(grad, ctx.row), None


def without_row(grad, row):
    """A table's gradient (dense, or sparse COO by rows as the step ops return a lookup
    table's) with row `row` left out."""
    if grad.is_sparse:
        keep = grad._indices()[0] != row
        return torch.sparse_coo_tensor(grad._indices()[:, keep], grad._values()[keep],
                                       grad.shape)
    grad = grad.clone()
    grad[row] = 0
    return grad


def padding_table(param, padding_idx):
    """An embedding table with padding_idx (nn.Embedding's): the lookup reads the table, and no
    gradient reaches the padding row (a weight of its own, made on every call; `padding_of`
    gives the table and the row back, for edbatch.apply_gradients)."""
    name, get = param.key
    t = param.tensor
    row = padding_idx + t.shape[0] if padding_idx < 0 else padding_idx
    if not 0 <= row < t.shape[0]:
        raise Refusal(f"padding_idx={padding_idx} is outside the table's {t.shape[0]} rows",
                      ValueError)

    def table():
        base = get()
        out = _NoGradRow.apply(base, row)
        out._edbatch_padding = (base, row)
        return out
    return Param((f"{name}[padding_idx={row}]", table), t.detach())


def padding_of(t):
    """(table, padding row) of a table padding_table made, else None."""
    return getattr(t, "_edbatch_padding", None)


def parametrized(root):
    """The tensors nn.utils.parametrize computes in root's modules (orthogonal, weight_norm,
    spectral_norm, a user's parametrization): {(module, name): value now}, computed before fx
    patches module attributes (the value gives the weight's shape; PyTorch computes it again on
    every call, and the program reads it as a weight), and {parametrization list: (module,
    name)}, the module a cell calls when it reads such a tensor directly (self.lin.weight)."""
    with torch.no_grad():
        values = {(m, n): getattr(m, n).detach() for m in root.modules()
                  if parametrize.is_parametrized(m) for n in m.parametrizations.keys()}
    return values, {m.parametrizations[n]: (m, n) for m, n in values}

# Kept by their handlers: a transpose is a layout of the same weight, not a copy.
_LAYOUTS = {("call_method", "t"), ("call_function", torch.t)}
# Operations that write into a tensor: on a weight they would change the parameter on every
# call, so they are left to the tracer's refusal of in-place operations.
_WRITES = {operator.setitem, operator.delitem, operator.iadd, operator.isub, operator.imul,
           operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow,
           operator.imatmul, operator.iand, operator.ior, operator.ixor}
_WRITES |= {f"__{f.__name__}__" for f in _WRITES}  # the same as methods (__setitem__...)


# What a weight gives as a Python value without reading its values (W.shape[1], W.size(0)).
_STRUCTURAL = {"size", "shape", "dim", "ndim", "ndimension", "numel", "nelement", "dtype",
               "device", "layout", "is_floating_point", "is_complex", "element_size",
               "get_device", "is_cuda", "requires_grad", "__len__", "len"}


def of_weights_only(op, target, args, kwargs, traced):
    """True when an operation reads weights and nothing else the trace computes (`traced`: the
    trace's value types other than Param), so PyTorch can compute it outside the program."""
    if (op, target) in _LAYOUTS or op not in ("call_function", "call_method"):
        return False
    name = target if op == "call_method" else getattr(target, "__name__", "")
    if (name.endswith("_") and not name.endswith("__") or name in _WRITES
            or target in _WRITES or "out" in kwargs):
        return False
    if op == "call_function" and target is getattr and args[1:] == ("T",):
        return False
    leaves = _leaves(args, kwargs)
    return (any(isinstance(v, Param) for v in leaves)
            and not any(isinstance(v, traced) for v in leaves))


def evaluate(op, target, args, kwargs, name):
    """The operation on the weights now (for shapes), and a weight whose getter computes it again
    on every call from the current parameters; tuples of tensors give a weight per item."""
    def call(fetch):
        a, k = fx.node.map_aggregate((args, kwargs),
                                     lambda v: fetch(v) if isinstance(v, Param) else v)
        return getattr(a[0], target)(*a[1:], **k) if op == "call_method" else target(*a, **k)

    def now(p):  # (a mask as the bool tensor it stands for)
        t = p.tensor.t() if p.transposed else p.tensor
        return t.bool() if p.mask else t

    def later(p):
        t = p.key[1]().t() if p.transposed else p.key[1]()
        return t.bool() if p.mask else t

    with torch.no_grad():
        try:
            value = call(now)
        except Exception as e:  # PyTorch's own error, on the user's line
            raise Refusal(f"{name} of weights failed: {type(e).__name__}: {e}", ValueError)
    params = [v for v in _leaves(args, kwargs) if isinstance(v, Param)]
    label = f"{name}({', '.join(p.key[0] for p in params)})"
    if isinstance(value, torch.Tensor):
        return as_weight(label, lambda: call(later), value)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor)
                                                          for v in value):
        return tuple(as_weight(f"{label}[{i}]", lambda i=i: call(later)[i], v)
                     for i, v in enumerate(value))
    what = (args[1] if op == "call_function" and target is getattr
            else target if op == "call_method" else getattr(target, "__name__", ""))
    if what not in _STRUCTURAL:
        raise Refusal(f"{name} of a weight gives a Python value that the trace would keep as a "
                      f"constant (the weight's value when the cell was traced, not after an "
                      f"optimizer step or load_state_dict): use the tensor itself "
                      f"(x / self.t, not x / self.t.item())", ValueError)
    return value  # a size, a dtype: a constant of the weight's shape, not of its values


def _leaves(args, kwargs):
    """The values an operation's arguments hold, through tuples, lists, dicts and slices."""
    found = []
    fx.node.map_aggregate((args, kwargs), found.append)
    return found


def as_weight(label, getter, value):
    """A weight the program reads, computed by `getter` (`value`: its value now): a bool tensor
    as a 0/1 mask, a 0-d one as a size-1 weight."""
    if value.dtype == torch.bool:  # a condition on weights: 0/1 floats, a mask where one is due
        w = as_weight(label, lambda: getter().float(), value.float())
        return Param(w.key, w.tensor, mask=True)
    if value.dim() == 0:  # broadcasts as PyTorch broadcasts a 0-d tensor: a size-1 weight
        return Param((label, lambda: getter().reshape(1)), value.reshape(1))
    return Param((label, getter), value)


def cell_constant(owner, name, key):
    """A tensor made in the cell from Python values (computed once when the cell is traced), as
    constant_of takes it; None for an attribute that is not one."""
    value = owner.__dict__.get(name)
    if not (name.startswith("_tensor_constant") and isinstance(value, torch.Tensor)):
        return None
    return constant_of(value, key)


def constant_of(value, key):
    """What a tensor made in the cell from Python values is to the program: the number a 0-d
    floating-point one holds (torch.tensor(0.5), torch.sqrt(torch.tensor(d))), as PyTorch uses it
    against a tensor of floats; a float32 one of 1 or 2 dims as a fixed weight named `key`
    (torch.tensor([0.5, 2.0]), torch.linspace(0, 1, n)); the indices a 1-D integer one holds
    (torch.tensor([2, 0, 1]), torch.arange(k)). Anything else is refused (a 0-d integer one may
    be a dim or an index; uint8 and bool ones are masks to PyTorch)."""
    if value.dim() == 0 and value.is_floating_point():
        return TensorConstant(value.item())
    if value.dim() in (1, 2) and value.dtype == torch.float32:
        return Param((key, Constant(value)), value.detach())
    if value.dim() == 1 and value.dtype in (torch.int64, torch.int32, torch.int16, torch.int8):
        return FeatureIndex(value.tolist())
    raise Refusal(f"a tensor made in the cell from Python values (torch.tensor, torch.arange, "
                  f"torch.linspace, torch.eye, ...) of shape {tuple(value.shape)} and dtype "
                  f"{value.dtype} is not supported in cells: such constants are taken as numbers "
                  "(0-d floating-point), fixed weights (float32, 1 or 2 dims) and feature "
                  "indices (1-D integer); make it once in __init__ and register it as a buffer "
                  "(register_buffer), .float() it, or use a Python number for a 0-d integer one")


def _known(values, what):
    """Refuses a traced value among `values` (nested lists too): a tensor made in the cell is
    made when the cell is traced."""
    traced = []
    fx.node.map_aggregate(values, lambda v: v if isinstance(
        v, (int, float, bool, str, type(None), torch.dtype, torch.Tensor)) else traced.append(v))
    if traced:
        raise Refusal(f"{what} of {describe(traced[0])}: a tensor made in the cell must be known "
                      "when the cell is traced (sizes from x.size(-1) are; the batch size is "
                      "not)", ValueError)


def constant_factory(fn, name):
    """torch.<name> (arange, linspace, eye, tensor, ...) called with a size the trace knows
    (torch.arange(x.size(-1))): run then, its tensor taken as constant_of takes it."""
    def handle(body, args, kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k != "device"}
        _known((args, kwargs), f"torch.{name}")
        try:
            value = fn(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError) as e:
            raise Refusal(f"torch.{name} failed: {type(e).__name__}: {e}", type(e)) from None
        return constant_of(value, f"torch.{name}")
    return handle


def new_tensor(body, args, kwargs):
    """x.new_tensor(data): data as a tensor of x's dtype (float32) unless dtype= says otherwise,
    made when the cell is traced and taken as constant_of takes it."""
    a = bind(args, kwargs, ("self", "data"),
             {"dtype": None, "device": None, "requires_grad": False, "layout": None,
              "pin_memory": False})
    if a["requires_grad"]:
        raise Refusal("x.new_tensor(..., requires_grad=True) is not supported: make a parameter "
                      "of it (nn.Parameter)")
    _known(a["data"], "x.new_tensor")
    return constant_of(torch.tensor(a["data"], dtype=a["dtype"] or torch.float32),
                       "Tensor.new_tensor")


def one_hot(body, args, kwargs):
    """F.one_hot(ids, num_classes) of the integer input: the embedding of a fixed identity table,
    so a row of num_classes floats with a 1 at the id (PyTorch's values, as int64 there; cells
    compute in float32). num_classes must be given: the ids are not known when traced."""
    from .trace_ops import embedding_of
    a = bind(args, kwargs, ("input", "num_classes"), {"num_classes": -1})
    n = a["num_classes"]
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise Refusal(f"F.one_hot with num_classes={n!r}: give the number of classes (the ids "
                      "are not known when the cell is traced)", ValueError)
    table = torch.eye(n)
    return embedding_of(body, a["input"], Param((f"one_hot({n})", Constant(table)), table), {})


def module_tensor(owner, name, key, parametrized_values):
    """The tensor a cell reads as owner.<name> (`key`: its name in errors and in the program): a
    parameter (also a plain tensor torch.func.functional_call puts in its place), a tensor a
    parametrization computes, or a floating-point or bool buffer (a fixed weight or mask, read
    from the module on every call); None when owner has no such tensor. A tensor held as a plain
    attribute is refused: it is a constant to a trace."""
    getter = (lambda m=owner, n=name: getattr(m, n))  # on every call: .to(), reassignment
    value = owner._parameters.get(name)  # not getattr: fx patches it while tracing
    if value is None:
        value = parametrized_values.get((owner, name))
    if isinstance(value, torch.Tensor):
        return Param((key, getter), value)
    value = owner._buffers.get(name)
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:  # a fixed mask: 0/1 floats, a condition where due
            return as_weight(key, getter, value)
        if not value.is_floating_point():
            raise Refusal(f"the buffer {key} holds {value.dtype}: cells read floating-point "
                          "and bool buffers only, as fixed weights and masks", ValueError)
        return Param((key, getter), value)  # a buffer's gradient is not kept
    if isinstance(owner.__dict__.get(name), torch.Tensor):
        raise Refusal(f"the tensor attribute {key} is a constant, and tensor constants are "
                      "not supported in cells: register the tensor as a buffer "
                      "(register_buffer) or make it an nn.Parameter, or compute it from one "
                      "with nn.utils.parametrize; in a function cell, an expression of a "
                      "parameter that no module holds (such as W.t()) is computed before "
                      "tracing and is such a constant")
    return None
