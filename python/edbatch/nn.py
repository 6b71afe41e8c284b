"""nn.Modules over the edbatch ops. Parameters are ordinary nn.Parameters (optimizers, DDP and
state_dict work as usual); the structure-dependent forward and backward run in edbatch."""
import math

import torch

from ._lib import eager
from .head import check_engine_options, check_head, head_weights, labels_of, refuse_replica
from . import checks
from .ops import check_packed, check_sizes, prepare, run_cell, weight_shapes
from .step import apply_gradients
from .propagate import Propagate
from .decode import StepDecoder

__all__ = ["Cell", "TreeLSTM", "TreeGRU", "LatticeLSTM", "LatticeGRU", "RandomDAG", "MVRNN",
           "Propagate", "StepDecoder"]

# The options of every built-in module (TreeLSTM, ..., MVRNN); the cell's own sizes and type
# counts are the modules' named arguments.
_OPTIONS = ("policy", "threads", "classes", "reduction")


class Cell(torch.nn.Module):
    """One edbatch cell over packed structures: forward(x, packed) returns its per-node outputs.

    x holds the input rows that packed.node_inputs / packed.arc_inputs point at. With classes=C
    the module has a loss head (self.head, an nn.Linear(hidden_size, C)) and loss(x, packed)
    runs it inside the engine: the cross-entropy of every labelled node's first output, summed or
    averaged (reduction) over the labelled nodes (docs/pytorch.md, "The loss inside the engine").
    """

    def __init__(self, cell, input_size, hidden_size, num_node_types=1, num_arc_types=1,
                 policy="lb-greedy", threads=0, classes=None, reduction="sum"):
        super().__init__()
        owner = f"edbatch.nn.Cell({cell!r})"
        cell, hidden_size, input_size, num_node_types, num_arc_types = check_sizes(
            owner, cell, hidden_size, input_size, num_node_types, num_arc_types)
        check_head(classes, reduction, owner)
        check_engine_options(policy, threads, owner)
        self.reduction = reduction
        self.cell, self.input_size, self.hidden_size = cell, input_size, hidden_size
        self.num_node_types, self.num_arc_types = num_node_types, num_arc_types
        self.policy, self.threads = policy, threads
        self.weight_names = []
        for name, shape in weight_shapes(cell, hidden_size, input_size, num_node_types,
                                         num_arc_types):
            weight = torch.nn.Parameter(torch.empty(shape, dtype=torch.float32))
            self.register_parameter(name, weight)
            self.weight_names.append(name)
        self.head = None if classes is None else torch.nn.Linear(hidden_size, classes,
                                                                     dtype=torch.float32)
        self.reset_parameters()

    def reset_parameters(self):
        """Draws the cell's weights from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) and resets
        the loss head (nn.Linear's own initialisation)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for name in self.weight_names:
            torch.nn.init.uniform_(getattr(self, name), -bound, bound)
        if self.head is not None:
            self.head.reset_parameters()

    def weights(self):
        """The cell's weights, in the order of edbatch.weight_shapes() (the loss head's are
        not among them)."""
        refuse_replica(self, f"edbatch.nn.Cell({self.cell!r})")
        return [getattr(self, name) for name in self.weight_names]

    def _x(self, x):
        """x, refused by name when its columns are not the cell's input_size (the op would
        blame the first weight that does not fit it)."""
        if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] != self.input_size:
            raise ValueError(f"edbatch.nn.Cell({self.cell!r}): x has {x.shape[1]} columns, the "
                             f"cell's input_size is {self.input_size}")
        return x

    @eager
    def forward(self, x, packed):
        """The cell over every node of `packed`: a tuple of per-node outputs ((h, c) for the
        LSTM cells, (h,) otherwise), each num_nodes x hidden_size in packed order. x: float32
        rows (input_size columns) that packed.node_inputs / arc_inputs point at."""
        return run_cell(self.cell, self._x(x), packed, self.weights(), self.hidden_size,
                        self.num_node_types, self.num_arc_types, self.policy, self.threads)

    @eager
    def loss(self, x, packed, labels=None):
        """The loss head's cross-entropy over the nodes of `packed` (a 0-d tensor), computed
        inside the engine. labels: int64 per node, -1 for none (default packed's, read from its
        host copy)."""
        owner = type(self).__name__
        labels = labels_of(labels, packed, owner)
        return run_cell(self.cell, self._x(x), packed, self.weights() + head_weights(self, owner),
                        self.hidden_size, self.num_node_types, self.num_arc_types, self.policy,
                        self.threads, labels, self.reduction)[0]

    @eager
    def loss_step(self, x, packed, labels=None, lr=None):
        """loss(x, packed, labels) and its backward in one call of the engine, recording no
        autograd graph; returns the loss (a 0-d tensor without history). The weights' and the
        head's gradients go into their .grad, or with lr update them in place (p -= lr * grad,
        plain SGD); x's gradient goes back through autograd (edbatch.apply_gradients)."""
        loss, grad_x = self._step(x, packed, labels, lr)
        apply_gradients([x], [grad_x])
        return loss

    @eager
    def _step(self, x, packed, labels, lr):
        """The step's loss and x's gradient, the weights' gradients handed on."""
        owner = type(self).__name__
        labels = labels_of(labels, packed, owner)
        weights = self.weights() + head_weights(self, owner)
        out = run_cell(self.cell, self._x(x), packed, weights, self.hidden_size,
                       self.num_node_types, self.num_arc_types, self.policy, self.threads, labels,
                       self.reduction, step=True, lr=lr)
        apply_gradients(weights, out[2:], lr)
        return out[0], out[1]

    def prepare(self, packed, num_x=None):
        """Starts the host work of a later forward(x, packed) (x of num_x rows; default
        packed.input_ids' length) on a worker thread: edbatch.prepare for this cell's options,
        on the device of its parameters. A cell with a loss head prepares loss(x, packed) with
        packed's labels instead."""
        device = self.weights()[0].device if self.weight_names else torch.device("cpu")
        head = {} if self.head is None else {"loss": self.reduction,
                                             "classes": self.head.out_features}
        prepare(self.cell, packed, self.input_size, self.hidden_size, device, num_x,
                self.num_node_types, self.num_arc_types, self.policy, self.threads, **head)

    def extra_repr(self):
        text = f"{self.cell}, input_size={self.input_size}, hidden_size={self.hidden_size}"
        for name in ("num_node_types", "num_arc_types"):
            if getattr(self, name) != 1:
                text += f", {name}={getattr(self, name)}"
        text += f", policy={self.policy!r}"
        if self.threads:
            text += f", threads={self.threads}"
        if self.head is not None:
            text += f", classes={self.head.out_features}, reduction={self.reduction!r}"
        return text


class _Inputs(torch.nn.Module):
    """A built-in cell whose input rows it computes from packed.input_ids (`embed`): the loss
    head, loss, loss_step and prepare of every built-in module."""

    @property
    def head(self):
        """The loss head (an nn.Linear) of a module made with classes=C, else None."""
        return self.cell.head

    def loss(self, packed, labels=None, x=None):
        """The loss head's cross-entropy over every labelled node (Cell.loss), inside the
        engine; labels default to packed's, x to the embeddings."""
        labels = labels_of(labels, packed, type(self).__name__)
        return self.cell.loss(self.embed(packed) if x is None else x, packed, labels)

    def loss_step(self, packed, labels=None, lr=None, x=None):
        """loss(packed, labels, x) and its backward in one call of the engine, recording no
        autograd graph (Cell.loss_step); returns the loss. With lr the whole step is an SGD
        update in place (p -= lr * grad) of the cell, the head and the embeddings (the rows the
        batch reads, as index_add); without, every gradient goes into .grad as loss.backward()
        would put it."""
        labels = labels_of(labels, packed, type(self).__name__)
        if x is not None or lr is None:
            return self.cell.loss_step(self.embed(packed) if x is None else x, packed, labels, lr)
        with torch.no_grad():
            x = self.embed(packed)
        loss, grad_x = self.cell._step(x, packed, labels, lr)
        with torch.no_grad():
            self._update_tables(packed, grad_x, lr)
        return loss

    def prepare(self, packed):
        """Starts the host work of a later forward(packed) on a worker thread (Cell.prepare)."""
        check_packed(packed, f"{type(self).__name__}.prepare")
        self.cell.prepare(packed)


class _Embedded(_Inputs):
    """A cell whose input rows are embeddings of packed.input_ids (one table per input kind)."""

    def __init__(self, cell, vocab_size, input_size, hidden_size, options, kinds=1,
                 num_node_types=1, num_arc_types=1):
        super().__init__()
        owner = type(self).__name__
        _check_options(owner, options)
        check_head(options.get("classes"), options.get("reduction", "sum"), owner)
        vocab_size, hidden_size, input_size = checks.sizes(
            owner, vocab_size=vocab_size, hidden_size=hidden_size, input_size=input_size)
        self.embeddings = torch.nn.ModuleList(
            torch.nn.Embedding(vocab_size, input_size, dtype=torch.float32) for _ in range(kinds))
        self.cell = Cell(cell, input_size, hidden_size, num_node_types, num_arc_types, **options)

    def embed(self, packed):
        """The input rows x of `packed`: the embeddings of packed.input_ids, each from the
        table of its input kind (packed.input_kinds); forward(packed) runs the cell on them."""
        check_packed(packed, type(self).__name__)
        for i, table in enumerate(self.embeddings):
            if table.weight.dtype != torch.float32:
                raise TypeError(f"{type(self).__name__}: weight embeddings.{i}.weight must be "
                                f"float32, got {table.weight.dtype} (the engine computes in "
                                f"float32; for mixed precision keep the module in float32 and "
                                f"run it inside torch.autocast)")
        tables = [(f"embeddings.{i}", t) for i, t in enumerate(self.embeddings)]
        if packed.input_ids.is_cuda:  # an index out of range would stop the device: checked here
            _check_ids(self, packed, tables)
        try:
            if len(self.embeddings) == 1:
                return self.embeddings[0](packed.input_ids)
            x = self.embeddings[0](packed.input_ids)
            for kind in range(1, len(self.embeddings)):
                mask = (packed.input_kinds == kind).unsqueeze(1)
                x = torch.where(mask, self.embeddings[kind](packed.input_ids), x)
            return x
        except (IndexError, RuntimeError):
            _check_ids(self, packed, tables)
            raise

    def forward(self, packed, x=None):
        """Per-node outputs; x overrides the embeddings (rows as packed.input_ids)."""
        return self.cell(self.embed(packed) if x is None else x, packed)

    def _update_tables(self, packed, grad_x, lr):
        """SGD on the rows of the tables the batch read, from the gradient of its x rows."""
        for kind, table in enumerate(self.embeddings):
            if not table.weight.requires_grad:
                continue
            rows = grad_x
            if len(self.embeddings) > 1:
                rows = rows * (packed.input_kinds == kind).unsqueeze(1)
            if table.padding_idx is not None:
                rows = rows * (packed.input_ids != table.padding_idx).unsqueeze(1)
            table.weight.index_add_(0, packed.input_ids, rows, alpha=-lr)


def _check_options(owner, options):
    """Refuses, naming them, options a built-in module does not take (TypeError, as Python
    refuses an unexpected keyword argument)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"{owner}: unexpected option{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(unknown)} (the options of the built-in modules are "
                        f"{', '.join(_OPTIONS)})")


def _check_ids(module, packed, tables):
    """Raises ValueError naming the first input id of `packed` that is outside its table's
    vocabulary (tables: (name, nn.Embedding) per input kind; one table: every row's)."""
    ids = packed.host_input_ids()
    kinds = packed.input_kinds.cpu() if len(tables) > 1 else None
    for kind, (name, table) in enumerate(tables):
        rows = ids if kinds is None else ids[kinds == kind]
        bad = ((rows < 0) | (rows >= table.num_embeddings)).nonzero()
        if bad.numel():
            row = int(bad[0, 0]) if kinds is None else int((kinds == kind).nonzero()[bad[0, 0]])
            raise ValueError(f"{type(module).__name__}: input id {int(ids[row])} (input row "
                             f"{row}) is outside the vocabulary of {name}, of "
                             f"{table.num_embeddings} ids (0..{table.num_embeddings - 1})")


class TreeLSTM(_Embedded):
    """Binary Tree-LSTM (Tai et al.; the zoo's tree_lstm): forward(packed) -> (h, c)."""

    def __init__(self, vocab_size, input_size, hidden_size, **options):
        super().__init__("tree_lstm", vocab_size, input_size, hidden_size, options)


class TreeGRU(_Embedded):
    """Binary Tree-GRU (the zoo's tree_gru; input_size must equal hidden_size): -> (h,)."""

    def __init__(self, vocab_size, hidden_size, **options):
        super().__init__("tree_gru", vocab_size, hidden_size, hidden_size, options)


class LatticeLSTM(_Embedded):
    """Lattice LSTM with char and word arc cells (the zoo's lattice_lstm): -> (h, c)."""

    def __init__(self, vocab_size, input_size, hidden_size, **options):
        super().__init__("lattice_lstm", vocab_size, input_size, hidden_size, options, kinds=2,
                         num_arc_types=2)


class LatticeGRU(_Embedded):
    """Lattice GRU with char and word arc cells (the zoo's lattice_gru): -> (h,)."""

    def __init__(self, vocab_size, input_size, hidden_size, **options):
        super().__init__("lattice_gru", vocab_size, input_size, hidden_size, options, kinds=2,
                         num_arc_types=2)


class RandomDAG(_Embedded):
    """The random-DAG state cell (the zoo's random_dag): -> (h,)."""

    def __init__(self, vocab_size, input_size, hidden_size, num_state_types=3,
                 num_arc_types=2, **options):
        checks.sizes("RandomDAG", num_state_types=num_state_types, num_arc_types=num_arc_types)
        super().__init__("random_dag", vocab_size, input_size, hidden_size, options,
                         num_node_types=num_state_types, num_arc_types=num_arc_types)


class MVRNN(_Inputs):
    """Matrix-vector RNN (Socher et al. 2012; the zoo's mvrnn) over binary trees: every word has a
    vector and an H x H matrix (initialised to the identity plus noise). forward(packed) ->
    (v, M): v num_nodes x H, M num_nodes x H x H. With classes=C the loss head reads v."""

    def __init__(self, vocab_size, hidden_size, **options):
        super().__init__()
        _check_options("MVRNN", options)
        check_head(options.get("classes"), options.get("reduction", "sum"), "MVRNN")
        vocab_size, hidden_size = checks.sizes("MVRNN", vocab_size=vocab_size,
                                               hidden_size=hidden_size)
        if hidden_size + hidden_size * hidden_size > checks.MAX_SIZE:
            raise ValueError(f"MVRNN: hidden_size {hidden_size} makes input rows of hidden + "
                             f"hidden^2 = {hidden_size + hidden_size * hidden_size} floats, more "
                             f"than the engine takes ({checks.MAX_SIZE})")
        H = self.hidden_size = hidden_size
        self.vectors = torch.nn.Embedding(vocab_size, H, dtype=torch.float32)
        self.matrices = torch.nn.Embedding(vocab_size, H * H, dtype=torch.float32)
        with torch.no_grad():
            self.matrices.weight.mul_(0.01).add_(torch.eye(H).reshape(1, -1))
        self.cell = Cell("mvrnn", H + H * H, H, **options)

    def embed(self, packed):
        """The input rows [v; vec M], M column-major as the op reads each leaf's matrix."""
        check_packed(packed, "MVRNN")
        H = self.hidden_size
        tables = [("vectors", self.vectors), ("matrices", self.matrices)]
        if packed.input_ids.is_cuda:  # an index out of range would stop the device: checked here
            _check_ids(self, packed, tables[:1])
            _check_ids(self, packed, tables[1:])
        try:
            M = self.matrices(packed.input_ids).view(-1, H, H)
            v = self.vectors(packed.input_ids)
        except (IndexError, RuntimeError):
            _check_ids(self, packed, tables[:1])
            _check_ids(self, packed, tables[1:])
            raise
        return torch.cat([v, M.transpose(1, 2).reshape(-1, H * H)], 1)

    def forward(self, packed, x=None):
        """(v, M) per node; x overrides the input rows (as embed(packed) makes them)."""
        H = self.hidden_size
        v, m = self.cell(self.embed(packed) if x is None else x, packed)
        return v, m.view(-1, H, H).transpose(1, 2)

    def _update_tables(self, packed, grad_x, lr):
        H, ids = self.hidden_size, packed.input_ids
        if self.vectors.weight.requires_grad:
            self.vectors.weight.index_add_(0, ids, grad_x[:, :H], alpha=-lr)
        if self.matrices.weight.requires_grad:
            rows = grad_x[:, H:].reshape(-1, H, H).transpose(1, 2).reshape(-1, H * H)
            self.matrices.weight.index_add_(0, ids, rows, alpha=-lr)
