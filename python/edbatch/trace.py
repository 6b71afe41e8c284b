"""Traces user cells (nn.Modules or functions of PyTorch ops) with torch.fx into a cell program,
the JSON document of docs/programs.md that the extension's op `edbatch::propagate` runs.

Calling conventions (batch dim 0: every value is (rows, features)):
  node cell: cell(x, message) -> state;  edge cell: cell(state, x) -> message
where x is the input (float rows, int64 ids, or None), and state / message are a tensor or a
tuple of tensors.

Refusals: an operation a program cannot express (or Python control flow on tensor values) raises
TypeError; sizes that do not fit (wrong output sizes, mismatched operands, operations along the
batch dim) raise ValueError. Both name the cell, the operation and the user's file:line.
"""
import operator
import threading
import traceback
import weakref

import torch
import torch.fx as fx
from torch.nn.utils import parametrize

from . import (trace_dropout, trace_inplace, trace_lock, trace_ops, trace_values,
               trace_weights)
from .trace_hooks import module_name as _module_name, refuse_backward_hooks, refuse_hooks
from .programs import Program
from .trace_ops import Ids, Param, Refusal, Vec
from .trace_values import function_name
from .trace_weights import Weights, row_shaped
from .trace_where import (called_with, current_frames, format_where, inside_torch_module,
                          refuse, user_frame)

dropout_mask = trace_dropout.dropout_mask  # edbatch.dropout_mask

_REDUCES = ("sum", "mean", "max", "softmax")
_INITIALS = ("zeros", "learned")
_INPUT_KINDS = ("x", "ids", "none")
# What a trace computes per row (everything but weights): an operation reading none of these is
# a weight expression (trace_weights).
_TRACED = (Vec, Ids, trace_values.Rows, trace_values.Stack, trace_values.Indices,
           trace_values.Batch, trace_values.Shape)


class FunctionCell(torch.nn.Module):
    """A plain function as a cell module (so that fx traces into it)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, first, second):
        return self.fn(first, second)

    def extra_repr(self):
        return getattr(self.fn, "__qualname__", repr(self.fn))


def cell_class_name(cell):
    if isinstance(cell, FunctionCell):
        return getattr(cell.fn, "__name__", type(cell.fn).__name__)
    return type(cell).__name__


# ---- one cell ----

class Body:
    """The instructions of one cell as they are traced."""

    def __init__(self, weights):
        self.instructions, self.weights, self.where = [], weights, None

    def emit(self, op, size, args, **fields):
        ins = {"op": op, "size": int(size)}
        if args:
            ins["args"] = [a.index for a in args]
        ins.update(fields)
        if self.where:
            ins["where"] = self.where[0]
        self.instructions.append(ins)
        index = len(self.instructions) - 1
        return Ids(index) if op == "ids" else Vec(index, size)

    def vector(self, v):
        """v as a feature value: a vector weight becomes a `weight` instruction."""
        if isinstance(v, Vec):
            return v
        if isinstance(v, trace_ops.Batch):
            raise Refusal("the batch size (x.size(0), x.shape[0]) is known only when the cell "
                          "runs: it may shape a new tensor (torch.zeros(x.size(0), n)) or a view "
                          "(x.view(x.size(0), -1)), not enter arithmetic", ValueError)
        if isinstance(v, trace_ops.Rows):
            raise Refusal("a value of shape (batch,) (a reduction without keepdim=True, x[:, i] "
                          "or squeeze(-1)) used where a (batch, features) tensor is expected: "
                          "PyTorch would broadcast it along the features, not per row; "
                          "unsqueeze(-1) it first, or reduce with keepdim=True", ValueError)
        if isinstance(v, Param) and (v.tensor.dim() == 1 and not v.transposed
                                     or row_shaped(v)):
            return self.emit("weight", v.tensor.numel(), None, weight=self.weight(v, "vector"))
        if isinstance(v, Param) and v.tensor.dim() == 0 and not v.transposed:
            # A 0-d weight (a learned temperature) broadcasts as a size-1 vector.
            return self.vector(trace_weights.as_weight(*v.key, v.tensor))
        if isinstance(v, Param):
            raise Refusal(f"a weight of shape {tuple(v.tensor.shape)} used elementwise: only "
                          f"vector weights can be (matrices go into products)", ValueError)
        raise Refusal(f"{trace_ops.describe(v)} where a tensor is expected")

    def weight(self, param, layout):
        return self.weights.add(param, layout)

    def param_of(self, module, name):
        """A module's own parameter (nn.Linear.weight...), or None."""
        path = _user_path(self.module_paths[module])
        return trace_weights.module_tensor(module, name, self.prefix + path + name,
                                           self.parametrized)


def _user_path(path):
    """A path under the tracing wrapper as a path under the user's cell, with a trailing dot."""
    if path == "cell":
        return ""
    path = path[len("cell."):] if path.startswith("cell.") else path
    return path + "." if path else ""


def note_where(body):
    """Points body.where (what errors name) at the user's line being traced now."""
    frame = user_frame(current_frames())
    body.where = format_where(frame) if frame else None


# torch 1.13's stateless.functional_call gives a module a subclass of its class made there
_STATELESS = "torch.nn.utils.stateless"


class _Proxy(fx.Proxy):
    """fx's proxy, unpacked by the tracer's values (fx reads the caller's bytecode for it, which
    fails on some Python versions: B, D = x.size())."""

    def __iter__(self):
        return self.tracer.iter(self)

    def __getattr__(self, name):
        if name == "ndim":  # a plain int now, for `if x.ndim == 1:` (fx's Attribute stays lazy)
            return self.tracer.create_proxy("call_function", getattr, (self, name), {})
        return super().__getattr__(name)


class _Tracer(fx.Tracer):
    """fx's tracer, evaluating every node as it is created (sizes, instructions) so that chunks
    unpack, sizes are plain ints and errors point at the user's line."""

    def __init__(self, body, placeholders, prefix):
        super().__init__()
        self.record_stack_traces = True
        # Buffers as traced attributes (get_attr), as parameters are: an expression of buffers
        # alone (self.mask * 2) is then a weight expression, not a constant computed once.
        self.proxy_buffer_attributes = True
        self.body, self.placeholders, self.values = body, placeholders, {}
        self.body.prefix = prefix
        self._external = 0
        self._thread = None  # the thread tracing (trace())
        self.proxies = {}  # node -> weak references to its proxies

    def trace(self, root, *args, **kwargs):
        if any(type(m).__module__ == _STATELESS for m in root.modules()):
            raise Refusal("a cell is traced at its module's first call, which cannot be inside "
                          "torch.nn.utils.stateless.functional_call (it hides the parameters "
                          "the trace reads): call the module once before, outside it")
        self.body.module_paths = {m: p for p, m in root.named_modules()}
        self.body.parametrized, self.parametrization_of = trace_weights.parametrized(root)
        with trace_lock.TRACING:
            tracing = self._thread = threading.get_ident()
            # Autograd as a training call has it, whatever the caller's mode: a cell that turns
            # it off (torch.no_grad) is then seen (create_proxy).
            with trace_lock.factories(tracing, self.create_proxy), \
                    trace_inplace.operators(tracing, note_where), \
                    trace_lock.unbound_methods(tracing), torch.enable_grad():
                return super().trace(root, *args, **kwargs)

    def create_arg(self, a):
        if isinstance(a, tuple) and hasattr(a, "_fields"):  # a namedtuple state: its fields
            a = tuple(a)
        if type(a).__module__ == "numpy" and getattr(a, "ndim", None) == 0:
            a = a.item()  # a NumPy scalar (self.scale = np.sqrt(d)): the Python number
        if isinstance(a, torch.nn.Parameter):
            self._adopt(a)
        arg = super().create_arg(a)
        if isinstance(arg, fx.Node) and arg.op == "get_attr" and arg not in self.values:
            note_where(self.body)  # made without create_proxy
            self.values[arg] = self.attribute(arg.target)
        return arg

    def elsewhere(self):
        """Whether this call comes from another thread than the trace's: fx sets
        nn.Module.__call__ and __getattr__ for the process while it traces, and other threads'
        modules run as they would."""
        return threading.get_ident() != self._thread

    def _adopt(self, param):
        """A parameter from outside the cell (a function's closure, the module of a bound-method
        cell): one weight of its own, read by the trace as the cell's are."""
        if all(param is not p for p in self.root.parameters()):
            self.root.register_parameter(f"param{self._external}", param)
            self._external += 1

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if self.elsewhere():
            return attr_val
        if isinstance(attr_val, torch.nn.Parameter):  # traced where it is read (self.t.item())
            self._adopt(attr_val)
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def call_module(self, m, forward, args, kwargs):
        if self.elsewhere():
            return forward(*args, **kwargs)
        path = self.body.module_paths.get(m)
        path = None if path is None else _user_path(path)[:-1]
        if path:  # a submodule: errors point at the line calling it
            note_where(self.body)
        refuse_backward_hooks(m, path)
        from .nn import Cell, _Inputs
        from .propagate import Propagate
        if isinstance(m, (Propagate, Cell, _Inputs)):
            raise Refusal(f"a cell cannot call an edbatch module ({type(m).__name__}): a cell "
                          "computes one node from its rows, a module runs a whole packed batch; "
                          "run it before, outside the cell, and pass its output in x")
        if isinstance(m, torch.jit.ScriptModule):
            raise Refusal(f"a TorchScript module ({type(m).__name__}) cannot be traced into a "
                          "cell: give the nn.Module it was scripted from")
        return super().call_module(m, forward, args, kwargs)

    def path_of_module(self, mod):
        try:
            return super().path_of_module(mod)
        except NameError:  # a module from outside the cell (a function's closure)
            name = f"module{self._external}"
            self._external += 1
            self.root.add_module(name, mod)
            self.submodule_paths = None  # fx's cache, where it has one
            for sub_path, sub in mod.named_modules():  # its own submodules (a handler reads them)
                self.body.module_paths.setdefault(sub, f"{name}.{sub_path}" if sub_path else name)
            self.body.module_paths[mod] = name
            return name

    def create_proxy(self, kind, target, args, kwargs, *rest, **options):
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **options)
        self.body.where = None
        if kind != "placeholder":
            note_where(self.body)
        if not torch.is_grad_enabled():
            raise Refusal("gradients turned off inside a cell (torch.no_grad, "
                          "set_grad_enabled(False), torch.utils.checkpoint, which recomputes "
                          "without them) are not supported: every operation of a cell is "
                          "differentiated (x.detach() stops the gradient of one value); edbatch "
                          "keeps a cell's values for backward in its own memory plan")
        with trace_values.inplace_marks() as inplace:
            value = self.evaluate(proxy.node)
        self.values[proxy.node] = value
        if inplace:  # a.add_(b), torch.relu_(a), F.relu(a, inplace=True): a changes
            return trace_inplace.rebind_call(self, proxy.node)
        if isinstance(value, (int, float, bool)):
            return value
        if isinstance(value, tuple):
            parts = tuple(self.create_proxy("call_function", trace_ops.operator.getitem,
                                            (proxy, i), {}) for i in range(len(value)))
            return type(value)(*parts) if hasattr(value, "_fields") else parts  # (values, indices)
        return proxy

    def proxy(self, node):
        proxy = _Proxy(node, self)
        self.proxies.setdefault(node, []).append(weakref.ref(proxy))  # (trace_inplace.alive)
        return proxy

    def iter(self, obj):
        value = self.values.get(obj.node)
        if isinstance(value, tuple):
            return iter([obj[i] for i in range(len(value))])
        if isinstance(value, trace_values.Shape):  # B, D = x.shape: the batch size and D
            return iter([obj[0], obj[1]])
        return super().iter(obj)

    def evaluate(self, node):
        if node.op == "placeholder":
            return self.placeholders[node.target](self.body)
        if node.op == "get_attr":
            return self.attribute(node.target)
        target = trace_inplace.out_of_place(node.op, node.target, trace_ops.FUNCTIONS)
        if target is not None:  # a.add_(b): a + b, which a then names (create_proxy)
            trace_inplace.check_call(self, node)
            trace_values.note_inplace(True)
        else:
            target = node.target
        args = fx.node.map_arg(node.args, self.values.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, self.values.__getitem__)
        if trace_weights.of_weights_only(node.op, target, args, kwargs, _TRACED):
            name = (f"Tensor.{target}" if node.op == "call_method" else function_name(target))
            return trace_weights.evaluate(node.op, target, args, kwargs, name)
        if not args and "input" in kwargs and _input_first(node, self.root):  # f(input=x)
            kwargs = dict(kwargs)
            args = (kwargs.pop("input"),)
        if node.op == "call_module":
            module = self.root.get_submodule(node.target)
            if module in self.parametrization_of:  # a parametrized tensor, read directly
                return self.body.param_of(*self.parametrization_of[module])
            cls = type(module)
            if parametrize.is_parametrized(module) or cls.__module__ == _STATELESS:
                cls = cls.__mro__[1]  # parametrize's or functional_call's subclass of cls
            handler = trace_ops.MODULES.get(cls)
            if handler is None:
                raise Refusal(f"{_module_name(module)} is not supported in cells")
            refuse_hooks(module)
            return handler(self.body, module, args, kwargs)
        if node.op == "call_method":
            handler, name = trace_ops.METHODS.get(target), f"Tensor.{node.target}"
        elif getattr(node.target, "tensor_method", None) is not None:
            # A tensor made in the cell, such as torch.tensor(2) * x: its C method called with a
            # traced value, which the trace reads as that method on the constant's number.
            method = node.target.tensor_method
            handler, name = trace_ops.METHODS.get(method), f"Tensor.{method}"
        else:
            handler, name = trace_ops.FUNCTIONS.get(target), function_name(node.target)
        if handler is None:
            raise Refusal(f"{name} is not supported in cells{inside_torch_module()}")
        return handler(self.body, args, kwargs)

    def attribute(self, path):
        owner_path, _, name = path.rpartition(".")
        owner = self.root.get_submodule(owner_path) if owner_path else self.root
        key = self.body.prefix + _user_path(owner_path) + name
        constant = trace_weights.cell_constant(owner, name, key)
        if constant is not None:
            return constant
        value = trace_weights.module_tensor(owner, name, key, {})
        return owner.__dict__.get(name) if value is None else value


def _input_first(node, root):
    """Whether the call's first parameter is `input` (torch.tanh(input=x), self.lin(input=x))."""
    if node.op == "call_module":
        return trace_values.input_first(type(root.get_submodule(node.target)).forward)
    return node.op == "call_function" and trace_values.input_first(node.target)


def _wrapper(cell, role, n_first, tuple_first, n_second, tuple_second):
    """A module whose forward takes one placeholder per input slot and calls the cell with the
    user's convention (tuples rebuilt, None for a missing input)."""
    names = [f"a{i}" for i in range(n_first + n_second)]

    def group(part, as_tuple):
        if not part:
            return "None"
        return f"({', '.join(part)},)" if as_tuple else part[0]

    first = group(names[:n_first], tuple_first)
    second = group(names[n_first:], tuple_second)
    source = f"def forward(self, {', '.join(names)}):\n    return self.cell({first}, {second})\n"
    scope = {}
    exec(compile(source, "<edbatch cell>", "exec"), scope)
    wrapper = type(f"{role}_cell", (torch.nn.Module,), {"forward": scope["forward"]})()
    wrapper.cell = cell
    return wrapper


def trace_cell(cell, cell_name, role, inputs, weights, prefix):
    """Traces one cell. inputs: the cell's two arguments (first, second), each (slots,
    as_tuple) with slots a list of (kind, slot, size). Returns (instructions,
    output sizes, whether the output is a tuple)."""
    (first, tuple_first), (second, tuple_second) = inputs
    body = Body(weights)
    placeholders = {}
    for i, (kind, slot, size) in enumerate(first + second):
        placeholders[f"a{i}"] = _slot(kind, slot, size)
    root = _wrapper(cell, role, len(first), tuple_first, len(second), tuple_second)
    tracer = _Tracer(body, placeholders, prefix)
    try:
        graph = tracer.trace(root)
    except Refusal as e:
        tail = called_with(role, first, tuple_first, second, tuple_second)
        if e.error is TypeError:
            tail += f"\ncells may contain: {trace_ops.SUPPORTED} (docs/pytorch.md)"
        raise e.error(refuse(str(e), cell_name, body.where, tail=tail)) from None
    except Exception as e:  # fx's TraceError (control flow) and anything else tracing raised
        frames = [(f.filename, f.lineno) for f in reversed(traceback.extract_tb(e.__traceback__))]
        if "'len' is not supported in symbolic tracing" in str(e):
            message = ("len() of a traced tensor is not supported: x.size(0) is the batch size "
                       "(usable in torch.zeros(x.size(0), n)), x.size(-1) the features")
        elif isinstance(e, fx.proxy.TraceError):
            message = ("Python control flow on tensor values (if/while/for over a traced "
                       "tensor) cannot be traced: a cell must run the same operations for every "
                       f"node ({e.__class__.__name__}: {str(e).splitlines()[0]})")
        else:
            message = f"tracing failed: {e.__class__.__name__}: {e}"
            if (not first or not second) and "NoneType" in str(e):
                message += (" (the cell's input is None: the call was given neither x nor ids; "
                            "a cell that reads an input needs one of them)")
        raise TypeError(refuse(message, cell_name, None, frames)) from e
    return _outputs(graph, tracer, cell_name) + (body.instructions,)


def _slot(kind, slot, size):
    if kind == "ids":
        return lambda body: body.emit("ids", 1, None, slot=slot)
    return lambda body: body.emit("input", size, None, slot=slot)


def _outputs(graph, tracer, cell_name):
    output = next(n for n in graph.nodes if n.op == "output")
    result = fx.node.map_arg(output.args[0], tracer.values.__getitem__)
    as_tuple = isinstance(result, (tuple, list))
    parts = list(result) if as_tuple else [result]
    outputs = []
    for part in parts:
        if isinstance(part, Param) and part.tensor.dim() == 1:
            tracer.body.where = None
            part = tracer.body.vector(part)
        if not isinstance(part, Vec) or isinstance(part, trace_ops.Mask):
            raise TypeError(f"{cell_name} returns {trace_ops.describe(part)}; a cell returns a "
                            f"tensor or a tuple of tensors (a comparison: .float() it)")
        outputs.append(part)
    return [v.index for v in outputs], tuple(v.size for v in outputs), as_tuple


def sizes_of(size, what):
    """(sizes tuple, as_tuple) from an int (or NumPy integer) or a tuple of them."""
    def one(s):
        if isinstance(s, bool) or not hasattr(s, "__index__"):
            raise TypeError
        return operator.index(s)
    try:
        sizes, as_tuple = (one(size),), False
    except TypeError:
        try:
            sizes, as_tuple = tuple(one(s) for s in size), True
        except TypeError:
            sizes = None
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"{what} must be a positive int or a tuple of them, got {size!r}")
    return sizes, as_tuple


def as_cells(cells, role):
    """A cell, or a list / dict (kinds 0..n-1) of them, as a list of modules."""
    if cells is None:
        return []
    if isinstance(cells, dict) or isinstance(cells, torch.nn.ModuleDict):
        keys = sorted(int(k) for k in cells.keys())
        if keys != list(range(len(keys))):
            raise ValueError(f"{role} cells by kind: the keys must be the kinds 0..n-1, got "
                             f"{sorted(cells.keys())}")
        cells = [cells[k] if k in cells else cells[str(k)] for k in keys]
    elif not isinstance(cells, (list, tuple, torch.nn.ModuleList)):
        cells = [cells]
    out = []
    for c in map(_uncompiled, cells):
        if not callable(c):
            raise TypeError(f"a {role} cell must be an nn.Module or a function, got "
                            f"{type(c).__name__}")
        out.append(c if isinstance(c, torch.nn.Module) else FunctionCell(c))
    return out


def _uncompiled(cell):
    """What torch.compile wrapped, for a compiled module or function: edbatch traces the cell's
    own code (the parameters are the same)."""
    if isinstance(cell, torch.nn.Module) and type(cell).__name__ == "OptimizedModule":
        return getattr(cell, "_orig_mod", cell)
    return getattr(cell, "_torchdynamo_orig_callable", cell)


def _identity(cell):
    return id(cell.fn) if isinstance(cell, FunctionCell) else id(cell)


def _input_slots(kind, size, slot):
    return {"x": [("x", slot, size)], "ids": [("ids", slot, 0)], "none": []}[kind]


def trace_program(node_cells, edge_cells=None, *, state_size, input_kind="x", input_size=0,
                  reduce="sum", initial="zeros", initial_weights=(), message_size=None,
                  prefixes=("node_cells.", "edge_cells.")):
    """Traces the cells into a Program. node_cells / edge_cells: a cell, or a list / dict of
    cells by node / arc kind. initial_weights: (name, tensor[, read]) per message component for
    initial="learned" (read(): the tensor on each call; default the tensor given). Raises
    TypeError / ValueError naming the cell (module docstring)."""
    if input_kind not in _INPUT_KINDS or reduce not in _REDUCES or initial not in _INITIALS:
        raise ValueError(f"input kind {input_kind!r}, reduce {reduce!r}, initial {initial!r}: "
                         f"expected one of {_INPUT_KINDS}, {_REDUCES}, {_INITIALS}")
    state, state_tuple = sizes_of(state_size, "state_size")
    nodes, edges = as_cells(node_cells, "node"), as_cells(edge_cells, "edge")
    if not nodes:
        raise ValueError("Propagate needs at least one node cell")
    weights = Weights()
    edge_cells_, message, message_tuple = _trace_edges(
        edges, weights, state, state_tuple, _input_slots(input_kind, input_size, len(state)),
        prefixes[1])
    if message is None:
        message, message_tuple = state, state_tuple
    if message_size is not None and sizes_of(message_size, "message_size")[0] != message:
        source = ("the edge cells return messages" if edges else
                  "without edge cells the messages are the states (state_size), of")
        raise ValueError(f"{source} sizes {message}, but message_size is {message_size!r}")
    if reduce == "softmax" and (len(message) < 2 or message[0] != 1):
        raise ValueError(f"reduce='softmax' attends over the messages: they must be tuples "
                         f"(score, value, ...) whose first component has size 1, got sizes "
                         f"{message}")
    node_cells_ = _trace_nodes(nodes, weights, state, message, message_tuple,
                               _input_slots(input_kind, input_size, 0), prefixes[0])
    cells = [c for c in node_cells_["cells"]] + [c for c in edge_cells_["cells"]]
    offset = len(node_cells_["cells"])
    doc = {"version": 1, "input": {"kind": input_kind,
                                   "size": input_size if input_kind == "x" else 0},
           "state": list(state), "message": list(message), "reduce": reduce,
           "initial": initial,
           "initial_weights": _initial(initial, initial_weights, message, weights),
           "node_cells": node_cells_["kinds"],
           "edge_cells": [offset + c for c in edge_cells_["kinds"]],
           "weights": weights.entries, "cells": cells}
    return Program(doc, weights, state_tuple, message_tuple)


def _trace_role(cells, role, weights, inputs, prefix, check):
    """Traces each distinct cell once: {"cells": [...], "kinds": [cell index per kind]}, and
    the first cell's output (sizes, as_tuple)."""
    out, kinds, seen, first = [], [], {}, None
    for kind, cell in enumerate(cells):
        key = _identity(cell)
        if key not in seen:
            name = f"{role} cell {kind} ({cell_class_name(cell)})"
            outputs, sizes, as_tuple, body = trace_cell(cell, name, role, inputs, weights,
                                                        f"{prefix}{kind}.")
            check(name, sizes, first)
            first = first or (name, sizes, as_tuple)
            seen[key] = len(out)
            out.append({"name": name, "body": body, "outputs": outputs})
        kinds.append(seen[key])
    return {"cells": out, "kinds": kinds}, first


def _trace_edges(edges, weights, state, state_tuple, slots, prefix):
    if not edges:
        return {"cells": [], "kinds": []}, None, False

    def check(name, sizes, first):
        if first is not None and sizes != first[1]:
            raise ValueError(f"{name} returns a message of sizes {sizes}, but {first[0]} "
                             f"returns {first[1]}: every edge cell must return the same sizes")

    inputs = (([("x", i, s) for i, s in enumerate(state)], state_tuple), (slots, False))
    result, first = _trace_role(edges, "edge", weights, inputs, prefix, check)
    return result, first[1], first[2]


def _trace_nodes(nodes, weights, state, message, message_tuple, slots, prefix):
    def check(name, sizes, first):
        if sizes != state:
            also = (f" (and {first[0]} returns {first[1]}: node cells' states must not differ "
                    f"between kinds)" if first is not None and first[1] != sizes else "")
            raise ValueError(f"{name} returns a state of sizes {sizes}, but state_size is "
                             f"{state if len(state) > 1 else state[0]}{also}")

    # Slot 0 is the input even when there is none (docs/programs.md): messages from slot 1.
    inputs = ((slots, False), ([("x", 1 + i, s) for i, s in enumerate(message)], message_tuple))
    return _trace_role(nodes, "node", weights, inputs, prefix, check)[0]


def _initial(initial, initial_weights, message, weights):
    if initial == "zeros":
        return []
    if len(initial_weights) != len(message):
        raise ValueError(f"initial='learned' needs one weight per message component "
                         f"({len(message)}), got {len(initial_weights)}")
    out = []
    for i, (given, size) in enumerate(zip(initial_weights, message)):
        name, tensor = given[:2]
        read = given[2] if len(given) > 2 else (lambda t=tensor: t)
        if tuple(tensor.shape) != (size,):
            raise ValueError(f"the learned initial message component {i} ({name}) has shape "
                             f"{tuple(tensor.shape)}, but the message component has size {size} "
                             f"(pass message_size= to Propagate when edge cells change sizes)")
        try:
            out.append(weights.add(Param((name, read), tensor), "vector"))
        except Refusal as e:
            raise ValueError(str(e)) from None
    return out
