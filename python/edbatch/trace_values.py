"""The values a cell's trace computes with (docs/programs.md): feature vectors, the integer input,
weights and shapes, and the refusal a handler raises for what a program cannot express; with
the argument helpers the handlers of trace_ops share."""
import contextlib
import contextvars
import inspect

import torch


class Refusal(Exception):
    """A traced operation that a program cannot express; `error` is the type to raise."""

    def __init__(self, message, error=TypeError):
        super().__init__(message)
        self.error = error


class Vec:
    """A feature vector: value number `index` of the cell's body, `size` entries."""
    __slots__ = ("index", "size")

    def __init__(self, index, size):
        self.index, self.size = index, size


class Mask(Vec):
    """A comparison's result: 0 / 1 entries (PyTorch's bool tensor), usable where PyTorch uses a
    bool tensor: torch.where, ~ & |, and arithmetic (as 0 and 1)."""
    __slots__ = ()


class Ids:
    """The integer input (only an embedding may read it)."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class Param:
    """A weight tensor read by the cell: `key` names it for the program, `transposed` after .t();
    `mask`: a comparison of weights alone (self.gate > 0), read as a 0/1 float weight."""
    __slots__ = ("key", "tensor", "transposed", "mask")

    def __init__(self, key, tensor, transposed=False, mask=False):
        self.key, self.tensor, self.transposed, self.mask = key, tensor, transposed, mask


class Rows:
    """One value per row without the feature dim, PyTorch's shape (batch,): a reduction without
    keepdim=True, x[:, i], x.squeeze(-1) of a size-1 value. `vec` holds it as a size-1 feature
    value; unsqueeze(-1), x[:, None] and view(-1, 1) give that back. Anything else refuses it:
    PyTorch broadcasts (batch,) along the features, not per row."""
    __slots__ = ("vec",)

    def __init__(self, vec):
        self.vec = vec


class Stack:
    """torch.stack of feature values (batch, n) along `dim` (0, 1 or 2 of the 3-D result): along 1
    its rows, along 2 its columns. Reduced over a dim it gives a (batch, n) or (batch, k) value
    again; along 1 or 2 it also takes arithmetic and softmax (trace_stack.py)."""
    __slots__ = ("parts", "dim")

    def __init__(self, parts, dim):
        self.parts, self.dim = parts, dim


class Indices:
    """The indices of a max, min, sort, topk, kthvalue or median over the features: traced, but
    not a value a program has."""
    __slots__ = ()


class Batch:
    """x.size(0) / x.shape[0]: the number of rows, known only when the cell runs; usable in the
    shape of a new tensor (torch.zeros(x.size(0), n)) and in view / reshape."""
    __slots__ = ()


class TensorConstant(float):
    """The number a 0-d floating-point tensor made in the cell holds (torch.tensor(0.5)): a Python
    number to arithmetic, while torch.max(x, it) stays elementwise, as for the tensor."""
    __slots__ = ()


class FeatureIndex(tuple):
    """A 1-D integer tensor made in the cell from Python values (torch.tensor([2, 0, 1]),
    torch.arange(k)): feature indices, known when the cell is traced, for x[:, index] and
    index_select."""
    __slots__ = ()


class EmptyPiece:
    """A piece of no features (tensor_split past the end): traced, as PyTorch makes it, but not a
    value a program has."""
    __slots__ = ()


class Shape:
    """x.shape / x.size() of a feature value: (batch, size); only the size is known."""
    __slots__ = ("size",)

    def __init__(self, size):
        self.size = size


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def describe(v):
    names = {Vec: "a tensor", Mask: "a comparison (a bool tensor)", Ids: "the integer input",
             Param: "a weight", Shape: "a shape",
             Batch: "the batch size (x.size(0)), known only when the cell runs (usable in "
                    "torch.zeros(x.size(0), n) and x.view(x.size(0), -1))",
             Stack: "a stack of tensors (torch.stack, unsqueeze: reduce it with sum, mean, max "
                    "or min to a (batch, features) tensor)",
             Rows: "a value of shape (batch,) (a reduction without keepdim=True, x[:, i] or "
                   "squeeze(-1); unsqueeze(-1) it to use it per row)",
             Indices: "the indices of a max, min, sort, topk, kthvalue or median over the "
                      "features (only its values are supported)",
             EmptyPiece: "an empty piece (no features) of tensor_split",
             FeatureIndex: "an integer tensor made in the cell from Python values (feature "
                           "indices for x[:, index] and torch.index_select(x, -1, index); as "
                           "numbers, .float() it where it is made: torch.arange(n).float())"}
    return names.get(type(v), type(v).__name__)


def function_name(fn):
    """fn as a user writes it: F.relu, torch.tanh, operator.add."""
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__name__", repr(fn))
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return f"F.{name}"
    if module.startswith("_operator") or module == "operator":
        return f"operator.{name}"
    return f"torch.{name}" if module.startswith("torch") else f"{module}.{name}"


def input_first(fn):
    """Whether fn's first parameter is `input` (torch.tanh, nn.Linear.forward), which handlers
    read as the first argument when it is given by keyword; not torch.where(condition, ...)."""
    try:
        names = [n for n in inspect.signature(fn).parameters if n != "self"]
    except (TypeError, ValueError):  # a builtin: its docstring begins "tanh(input, *, ...)"
        doc = (getattr(fn, "__doc__", None) or "").lstrip()
        names = [doc[doc.find("(") + 1:].split(",")[0].split(")")[0].strip()] if "(" in doc else []
    return bool(names) and names[0] == "input"


def bind(args, kwargs, names, defaults):
    """Python's argument binding for a traced call: {name: value}. Positional arguments past
    `names` are refused, never dropped."""
    if len(args) > len(names):
        extra = ", ".join(repr(a) if isinstance(a, (int, float, bool, str)) or a is None
                          else type(a).__name__ for a in args[len(names):])
        raise Refusal(f"{len(args)} positional arguments, of which only {len(names)} ("
                      f"{', '.join(names)}) are supported; not {extra}")
    out = dict(defaults)
    out.update(zip(names, args))
    for k, v in kwargs.items():
        if k not in names and k not in defaults:
            raise Refusal(f"argument {k}= is not supported")
        out[k] = v
    return out


def feature_dim(dim, what):
    if dim in (1, -1):
        return
    if dim in (0, -2):
        raise Refusal(f"{what} along the batch dim (dim {dim}) is not supported: a cell sees one "
                      f"row per node, and works along the features (dim -1)", ValueError)
    raise Refusal(f"{what} along dim {dim} is not supported: values are (batch, features)",
                  ValueError)


def same_size(a, b, what):
    if a.size != b.size:
        raise Refusal(f"{what} of sizes {a.size} and {b.size}", ValueError)


_INPLACE = contextvars.ContextVar("edbatch_inplace", default=None)


def note_inplace(inplace):
    """inplace=True: the call being traced changes its input, which the tracer then rebinds to
    the result (trace_inplace.py)."""
    if inplace:
        marks = _INPLACE.get()
        if marks is None:
            raise Refusal("inplace=True is not supported here")
        marks.append(True)


@contextlib.contextmanager
def inplace_marks():
    """Within: note_inplace marks the list given; outside it refuses."""
    marks = []
    token = _INPLACE.set(marks)
    try:
        yield marks
    finally:
        _INPLACE.reset(token)


def plain(of):
    """A handler of f(input) for `of(body, input)`."""
    def handle(body, args, kwargs):
        return of(body, bind(args, kwargs, ("input",), {})["input"])
    return handle


def with_inplace(of):
    """A handler of f(input, inplace=False) for `of(body, input)`, noting inplace=True."""
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "inplace"), {"inplace": False})
        note_inplace(a["inplace"])
        return of(body, a["input"])
    return handle


def ops():
    """trace_ops, for the modules it merges (it imports them at its end, so they read it late)."""
    from . import trace_ops
    return trace_ops


def apply(body, name, *args, **fields):
    """Instruction `name` over feature vectors of one size (the first's)."""
    return body.emit(name, args[0].size, list(args), **fields)


def broadcast_pair(body, a, b, what):
    """Feature vectors a and b at one size, as PyTorch broadcasts (rows, 1) against (rows, n):
    a size-1 value is repeated (a `broadcast` instruction); other sizes must agree."""
    if a.size == 1 and b.size != 1:
        a = body.emit("broadcast", b.size, [a])
    elif b.size == 1 and a.size != 1:
        b = body.emit("broadcast", a.size, [b])
    same_size(a, b, what)
    return a, b


def vector_or_constant(body, v):
    """v's feature vector, a Python number as a size-1 constant (broadcast_pair repeats it)."""
    return body.emit("const", 1, [], value=float(v)) if is_number(v) else body.vector(v)


def operand_pair(body, x, y, what):
    """The two operands of an elementwise function that takes a Python number for either (xlogy,
    fmod, floor division), a number as a size-1 constant, broadcast to one size; two numbers are
    refused, as PyTorch takes a tensor."""
    if is_number(x) and is_number(y):
        raise Refusal(f"{what} of two Python numbers is not supported: PyTorch takes a tensor",
                      TypeError)
    return broadcast_pair(body, vector_or_constant(body, x), vector_or_constant(body, y), what)


def float32_only(dtype, what):
    """Refuses a dtype= other than float32 or none: cells compute in float32."""
    if dtype not in (None, torch.float32):
        raise Refusal(f"{what} with dtype={dtype} is not supported: cells compute in float32 "
                      "(dtype=torch.float32 or none)")


def tensor_pair(body, args, kwargs, name):
    """The two tensor arguments (input, other) of an elementwise function that PyTorch defines
    for tensors only (atan2, logaddexp, fmax), broadcast to one size; a Python number is
    refused."""
    a = bind(args, kwargs, ("input", "other"), {})
    if is_number(a["input"]) or is_number(a["other"]):
        raise Refusal(f"{name} of a Python number is not supported: PyTorch takes two tensors",
                      TypeError)
    return broadcast_pair(body, body.vector(a["input"]), body.vector(a["other"]), name)
