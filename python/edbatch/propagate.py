"""edbatch.nn.Propagate: user cells (nn.Modules or functions of PyTorch ops) run batched over
trees, lattices and DAGs by the extension's op `edbatch::propagate` (docs/pytorch.md)."""
import torch

from . import checks
from ._lib import autocast_float32, eager, has_op
from .head import check_engine_options, check_head, head_weights, labels_of, refuse_replica
from .ops import _reraise, as_device, check_packed, check_structure
from .saved import check_unchanged
from .step import apply_gradients, in_place_updates, without_updated
from .trace import FunctionCell, as_cells, sizes_of, trace_program
from .trace_dropout import dropout_mask as _dropout_mask


def has_propagate_op():
    """Whether the loaded extension registers torch.ops.edbatch.propagate."""
    return has_op("propagate")


def run_program(program, x, ids, packed, weights, seed, policy, threads, labels=None, loss=None,
                step=False, lr=None):
    """Runs a traced Program over `packed` with the op: one tensor per state component (with a
    loss head, weights end with its weight and bias and the op returns [loss]; step=True runs
    its backward too and returns [loss, x's gradient, each weight's gradient], with lr None for
    the weights it updated in place (edbatch.run_cell))."""
    if not has_propagate_op():
        raise RuntimeError("edbatch.nn.Propagate: the loaded extension has no "
                           "torch.ops.edbatch.propagate; rebuild it from a version with user "
                           "cells (docs/pytorch.md)")
    try:
        if not step:
            return list(torch.ops.edbatch.propagate(program.text, x, ids, *packed.structure(),
                                                    weights, seed, policy, threads, labels,
                                                    loss or ""))
        updated = in_place_updates(weights, lr, "Propagate.loss_step")
        extra = (float(lr), updated) if updated else ()
        out = torch.ops.edbatch.propagate_step(program.text, x, ids, *packed.structure(), weights,
                                               seed, policy, threads, labels, loss, *extra)
        return out[:2] + without_updated(out[2:], updated)
    except (RuntimeError, TypeError, ValueError) as e:
        _reraise(e)


class Propagate(torch.nn.Module):
    """Runs user cells over every node of a packed mini-batch, in topological order:

        message of arc j -> k:  edge_cell[arc kind](state_j, x_arc)   (the state when no edge cell)
        reduced message of k:   reduce over k's incoming arcs ("sum", "mean", "max"); a node
                                without arcs gets zeros, or learned vectors (initial="learned")
                                "softmax": attention; messages (score, value, ...) with a
                                size-1 score reduce to (log-sum-exp of the scores, each value
                                summed with the scores' softmax as weights, ...)
        state_k:                node_cell[node kind](x_k, reduced message)

    Cells are nn.Modules or functions of the PyTorch operations of docs/pytorch.md; a list or a
    dict {kind: cell} gives one per kind. state_size: an int (the state is one tensor) or a
    tuple (a tuple of tensors). message_size: the edge cells' message sizes when they differ
    from state_size (needed for initial="learned" only). forward(packed, x=None, ids=None)
    returns every node's state (one row per node, in packed order).

    classes=C adds a loss head (self.head, an nn.Linear from the state's first component to C
    classes): loss(packed, x=None, ids=None, labels=None) runs it inside the engine and returns
    the cross-entropy over every labelled node, summed or averaged (reduction);
    loss_step(..., lr=None) runs it and its backward in one call, without autograd.
    """

    def __init__(self, node_cell, edge_cell=None, reduce="sum", state_size=None,
                 initial="zeros", message_size=None, policy="lb-greedy", threads=0,
                 classes=None, reduction="sum"):
        super().__init__()
        check_head(classes, reduction, "Propagate")
        check_engine_options(policy, threads, "Propagate")
        _settings(state_size, message_size, reduce, initial)
        for what, size in (("state_size", state_size), ("message_size", message_size)):
            for s in sizes_of(size, what)[0] if size is not None else ():
                checks.integer(s, "Propagate", what)  # within the engine's 32-bit sizes
        for role, cells in (("node_cell", node_cell), ("edge_cell", edge_cell)):
            _check_kinds(role, cells)
        self.node_cells = torch.nn.ModuleList(as_cells(node_cell, "node"))
        self.edge_cells = torch.nn.ModuleList(as_cells(edge_cell, "edge"))
        # A single cell (not a list or dict) serves every node / arc kind of the data.
        self._every_kind = (_single(node_cell), _single(edge_cell) and edge_cell is not None)
        if not len(self.node_cells):
            raise ValueError("Propagate needs at least one node cell")
        self.state_size, self.message_size = state_size, message_size
        self.reduce, self.initial_kind = reduce, initial
        self.reduction = reduction
        self.head = (None if classes is None else
                     torch.nn.Linear(sizes_of(state_size, "state_size")[0][0], classes,
                                     dtype=torch.float32))
        self.policy, self.threads = policy, threads
        self.initial = torch.nn.ParameterList()
        if initial == "learned":
            sizes = sizes_of(state_size if message_size is None else message_size,
                             "message_size")[0]
            self.initial.extend(torch.nn.Parameter(torch.zeros(s, dtype=torch.float32))
                                for s in sizes)
        self._programs, self.last_seed = {}, 0
        self._last_input = None  # (input kind, size, device) of the last forward, for prepare

    def program(self, input_kind="x", input_size=0, node_kinds=1, arc_kinds=1):
        """The traced Program for this input kind and size in the current training mode (a
        single cell given for a role is listed for node_kinds / arc_kinds kinds)."""
        refuse_replica(self, "Propagate")
        node_kinds = node_kinds if self._every_kind[0] else 0
        arc_kinds = arc_kinds if self._every_kind[1] else 0
        key = (input_kind, input_size, self.training, node_kinds, arc_kinds)
        settings = _settings(self.state_size, self.message_size, self.reduce, self.initial_kind)
        if key in self._programs and not self._programs[key].current(self, settings):
            self._programs.clear()  # a setting, a submodule or a hook changed: trace again
        if key not in self._programs:
            if self.initial_kind == "learned" and not len(self.initial):
                raise ValueError("Propagate: initial='learned' needs the learned initial "
                                 "message that the module makes with it: make the module with "
                                 "initial='learned' rather than setting initial_kind")
            # read through the list on every call, as the cells' weights are: a parameter
            # replaced there (or overridden by functional_call) is the one used
            initial = [(f"initial.{i}", p, lambda m=self.initial, i=i: m[i])
                       for i, p in enumerate(self.initial)]
            nodes = list(self.node_cells) * (node_kinds or 1)
            edges = list(self.edge_cells) * (arc_kinds or 1)
            self._programs[key] = trace_program(
                nodes, edges or None,
                state_size=self.state_size, input_kind=input_kind, input_size=input_size,
                reduce=self.reduce, initial=self.initial_kind, initial_weights=initial,
                message_size=self.message_size).bind(self, settings, _owners(nodes + edges))
        return self._programs[key]

    def __getstate__(self):
        """Pickled (torch.save of the whole module, copy.deepcopy) without the traced programs,
        which hold the tracer's closures: they are traced again on first use."""
        state = self.__dict__.copy()
        state["_programs"] = {}
        return state

    def retrace(self):
        """Drops the traced programs, after changing a cell's code (a replaced submodule, a
        changed setting of one, such as nn.Dropout's p, or of this module, such as reduce, and
        a hook added or removed are found by the next call itself, which traces again)."""
        self._programs.clear()

    @eager
    def forward(self, packed, x=None, ids=None):
        """Every node's state, one row per node in packed order: a tensor, or a tuple of them
        for a tuple state_size. x: float32 input rows (packed.node_inputs / arc_inputs point
        at them); ids: int64 ids per input row, for cells that embed them; neither: cells
        without inputs."""
        outputs, program, _ = self._run(packed, x, ids)
        return tuple(outputs) if program.state_tuple else outputs[0]

    @eager
    def loss(self, packed, x=None, ids=None, labels=None):
        """The loss head's cross-entropy over every labelled node of `packed` (a 0-d tensor),
        inside the engine. labels: int64 per node, -1 for none (default packed's, read from its
        host copy)."""
        head = head_weights(self, "Propagate")
        labels = labels_of(labels, packed, "Propagate")
        return self._run(packed, x, ids, head, labels)[0][0]

    @eager
    def loss_step(self, packed, x=None, ids=None, labels=None, lr=None):
        """loss(packed, x, ids, labels) and its backward in one call of the engine, recording no
        autograd graph; returns the loss (a 0-d tensor without history). The gradients go where
        loss.backward() would send them: into .grad of the cells' and the head's parameters, and
        back through autograd into whatever made x. With lr, the module's parameters are
        updated in place instead (p -= lr * grad, plain SGD; their .grad is left as it is);
        x's gradient still goes back through autograd (embed inside the cells, ids=, to keep
        the whole step in the engine). Not for DistributedDataParallel, whose gradient hooks
        run in autograd's backward: call loss() and backward() there."""
        head = head_weights(self, "Propagate")
        labels = labels_of(labels, packed, "Propagate")
        outputs, _, weights = self._run(packed, x, ids, head, labels, step=True, lr=lr)
        apply_gradients(weights, outputs[2:], lr)
        if x is not None:
            apply_gradients([x], [outputs[1]])
        return outputs[0]

    def _run(self, packed, x, ids, head=(), labels=None, step=False, lr=None):
        check_packed(packed, "Propagate")
        kind, size, x, ids = self._inputs(x, ids)
        program = self.program(kind, size, *packed.kinds())
        weights = program.weights(x.device if kind == "x" else ids.device if kind == "ids"
                                  else _device_of(self))
        if kind != "x":  # no float input: x has a row (of no columns) per input row
            rows = ids.numel() if kind == "ids" else packed.input_ids.numel()
            device = ids.device if kind == "ids" else (weights[0].device if weights else "cpu")
            x = torch.empty(rows, 0, device=device, dtype=torch.float32)
        self._last_input = (kind, size, x.device)
        if kind == "ids" and ids is packed.input_ids:
            ids = packed.host_input_ids()  # the op reads ids on the host: no copy back
        seed = 0
        if program.has_dropout:  # nn.Dropout in training mode, or F.dropout(training=True)
            seed = int(torch.randint(0, 2 ** 62, ()).item())
        self.last_seed = seed  # the dropout masks' seed (edbatch.dropout_mask rebuilds them)
        extra = (labels, self.reduction) if head else ()  # the loss head's arguments
        if step:
            extra += (True, lr)
        weights = list(weights) + list(head)
        try:
            outputs = run_program(program, x, ids, packed, weights, seed, self.policy,
                                  self.threads, *extra)
        except (RuntimeError, ValueError, TypeError):
            _check_weights(program, weights, x.device, kind)  # named as the module has them
            check_structure(packed.structure(), "Propagate")
            raise
        if not step:  # autograd runs the backward: x and the weights must be unchanged then
            check_unchanged(outputs, x, weights, lambda: ["x"] + [
                w["name"] for w in program.doc["weights"]] + ["head.weight", "head.bias"],
                "Propagate")
        return outputs, program, weights

    def prepare(self, packed, input_size=None, num_x=None, device=None, ids=None):
        """Starts the host work of a later forward(packed, x=...) on a worker thread: checking
        the structure, building its graph, scheduling and memory planning, as the built-in
        cells' prepare() does (edbatch.prefetch calls it for the next mini-batch). x will have
        num_x rows (default: packed.input_ids' length) of input_size floats on `device`
        (defaults: those of the last forward). Returns at once; the forward with that structure
        and x then only runs the plan, one with anything else works as usual.

        Cells that embed ids (the last forward took ids=, or ids is given here) prepare
        forward(packed, ids=...) for those ids (default: packed's input_ids, from the host copy
        packed.to() keeps); a forward with other ids is not served the prepared graph.

        Not prepared (a no-op): cells that draw dropout masks (in training mode, or
        F.dropout(training=True)), whose graphs depend on the call's masks; a module that has
        not run yet and is given no input_size or ids. A module with a loss head prepares
        loss(packed, x=...) with packed's labels instead.
        """
        check_packed(packed, "Propagate.prepare")
        last = self._last_input
        if ids is not None:
            kind = "ids"
        elif input_size is not None:
            kind = "x"
        else:
            kind = last[0] if last is not None else None
        if kind == "ids":
            ids = packed.host_input_ids() if ids is None else self._inputs(None, ids)[3]
            input_size, num_x = 0, ids.numel()
        elif kind == "x":
            input_size = last[1] if input_size is None else checks.int64(
                input_size, "Propagate.prepare", "input_size")
            num_x = packed.input_ids.numel() if num_x is None else checks.int64(
                num_x, "Propagate.prepare", "num_x")
        else:
            return
        if device is None:
            device = last[2] if last is not None else "cpu"
        device = as_device(device, "Propagate.prepare")
        program = self.program(kind, input_size, *packed.kinds())
        if program.has_dropout:
            return
        try:
            head = (None, "", 0) if self.head is None else (
                packed.host_labels(), self.reduction, self.head.out_features)
            torch.ops.edbatch.propagate_prepare(program.text, device,
                                                input_size, num_x, *packed.structure(),
                                                self.policy, self.threads, *head,
                                                ids=ids if kind == "ids" else None)
        except (AttributeError, RuntimeError, TypeError, ValueError) as e:
            if isinstance(e, AttributeError):
                return  # an extension without propagate_prepare: nothing to prepare with
            _reraise(e)

    @staticmethod
    def _inputs(x, ids):
        """(input kind, input size, x, ids) as the op takes them."""
        if x is not None and ids is not None:
            raise ValueError("Propagate: give x (float rows) or ids (int64 per row), not both")
        if x is not None:
            x = autocast_float32(x)
            if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 2:
                raise TypeError(f"Propagate: x must be a float32 tensor, 2-D (rows x input size), "
                                f"got {_describe(x)} (float16 and bfloat16 are taken inside "
                                f"torch.autocast only)")
            return "x", x.shape[1], x, torch.empty(0, dtype=torch.long, device=x.device)
        if ids is not None:
            if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 1:
                raise TypeError(f"Propagate: ids must be an int64 tensor (one id per row), got "
                                f"{_describe(ids)}")
            return "ids", 0, torch.empty(0, 0, device=ids.device, dtype=torch.float32), ids
        return "none", 0, torch.empty(0, 0, dtype=torch.float32), torch.empty(0, dtype=torch.long)

    def extra_repr(self):
        text = f"state_size={self.state_size}"
        if self.message_size is not None:
            text += f", message_size={self.message_size}"
        text += (f", reduce={self.reduce!r}, initial={self.initial_kind!r}, "
                 f"policy={self.policy!r}")
        if self.threads:
            text += f", threads={self.threads}"
        if self.head is not None:
            text += f", classes={self.head.out_features}, reduction={self.reduction!r}"
        return text


def dropout_mask(seed, index, site, size, p):
    """The kept entries (a bool tensor of `size`) of one dropout invocation of a call whose seed
    was `seed` (Propagate.last_seed): index is the node number (node cells) or num_nodes + the
    arc number (edge cells), site the dropout's number in the program (docs/programs.md); p the
    dropout probability, from 0 to below 1."""
    owner = "edbatch.dropout_mask"
    seed = checks.int64(seed, owner, "seed")
    index = checks.integer(index, owner, "index", 0, 2**32 - 1)
    site = checks.integer(site, owner, "site", 0, 2**32 - 1)
    size = checks.integer(size, owner, "size", 0)
    p = checks.number(p, owner, "p")
    if not 0 <= p < 1:
        raise ValueError(f"{owner}: p must be from 0 to below 1 (the probability of dropping an "
                         f"entry), got {p!r}")
    return _dropout_mask(seed, index, site, size, p)


def _check_kinds(role, cells):
    """Refuses a dict of cells whose keys are not kinds (ints >= 0, or their digits)."""
    if not isinstance(cells, (dict, torch.nn.ModuleDict)):
        return
    for key in cells.keys():
        if not (isinstance(key, int) and not isinstance(key, bool) and key >= 0 or
                isinstance(key, str) and key.isdigit() and key.isascii()):
            raise ValueError(f"Propagate: {role} is a dict of cells by kind, whose keys must be "
                             f"the kinds 0..n-1 (ints), got the key {key!r}")


def _owners(cells):
    """The modules whose bound methods are among the cells (Propagate(self.cell)), each once."""
    found = []
    for c in cells:
        owner = getattr(getattr(c, "fn", None), "__self__", None) if isinstance(
            c, FunctionCell) else None
        if isinstance(owner, torch.nn.Module) and all(owner is not f for f in found):
            found.append(owner)
    return found


def _settings(state_size, message_size, reduce, initial):
    """The settings the traced programs read, checked (at construction and on every call: a
    change traces the programs again)."""
    if state_size is None:
        raise TypeError("Propagate needs state_size= (an int, or a tuple for a tuple state)")
    if reduce not in ("sum", "mean", "max", "softmax"):
        raise ValueError(f"Propagate: reduce must be 'sum', 'mean', 'max' or 'softmax', got "
                         f"{reduce!r}")
    if initial not in ("zeros", "learned"):
        raise ValueError(f"Propagate: initial must be 'zeros' or 'learned', got {initial!r}")
    return (sizes_of(state_size, "state_size"), reduce, initial,
            None if message_size is None else sizes_of(message_size, "message_size"))


def _device_of(module):
    """The device of a module's first parameter (the host where it has none)."""
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def _check_weights(program, weights, device, kind):
    """Raises TypeError / ValueError for the first weight of another dtype or device than the
    engine takes, by its name in the module (the op names it as the program numbers it)."""
    names = [w["name"] for w in program.doc["weights"]] + ["head.weight", "head.bias"]
    for name, w in zip(names, weights):
        if w.dtype != torch.float32:
            raise TypeError(f"Propagate: weight {name} must be float32, got {w.dtype} (the "
                            f"engine computes in float32: .float() the module; for mixed "
                            f"precision keep it in float32 and run it inside "
                            f"torch.autocast)") from None
        if w.device != device:
            where = {"x": "x is", "ids": "ids are"}.get(kind, f"weight {names[0]} is")
            raise ValueError(f"Propagate: weight {name} is on {w.device} but {where} on "
                             f"{device} (move the module with .to(device))") from None


def _single(cells):
    return not isinstance(cells, (list, tuple, dict, torch.nn.ModuleList, torch.nn.ModuleDict))


def _describe(t):
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} of shape {tuple(t.shape)}"
    return type(t).__name__
