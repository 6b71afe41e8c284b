"""The op wrapper: checks arguments (raising ValueError/TypeError with clear messages) and calls
torch.ops.edbatch.run_cell, which has autograd."""
import functools

import torch

from . import _lib


def cells():
    """Names of the cells the op runs."""
    _lib.load()
    return list(torch.ops.edbatch.cells())


@functools.lru_cache(maxsize=64)
def weight_shapes(cell, hidden_size, input_size, num_node_types=1, num_arc_types=1):
    """[(name, shape)] of the weights run_cell takes for this cell, in order (row-major, torch's
    (out, in) convention: W x is W @ x)."""
    _lib.load()
    try:
        names, rows, cols = torch.ops.edbatch.weight_shapes(cell, hidden_size, input_size,
                                                            num_node_types, num_arc_types)
    except RuntimeError as e:
        message = _message(e)
        if message is None:
            raise
        raise ValueError(message) from None
    return [(n, (r,) if c == 0 else (r, c)) for n, r, c in zip(names, rows, cols)]


def _message(error):
    """The library's own message ("[function] what"), without libtorch's backtrace; None when
    the error did not come from edbatch."""
    text = str(error).split("\nException raised from")[0].strip()
    for line in text.split("\n"):
        if line.startswith("["):
            return line.strip()
    return None


def run_cell(cell, x, packed, weights, hidden_size, num_node_types=1, num_arc_types=1,
             policy="lb-greedy", threads=0):
    """Runs `cell` over every node of `packed` and returns its per-node outputs ([h, c] for the
    LSTM cells, [h] otherwise), each num_nodes x hidden_size, differentiable in x and weights.

    x: float32 (rows x input size), the rows node_inputs / arc_inputs point at.  weights: in the
    order of weight_shapes().  threads 0: torch.get_num_threads().
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"edbatch.run_cell: x must be a tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"edbatch.run_cell: x must be float32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"edbatch.run_cell: x must be 2-D (rows x input size), got shape "
                         f"{tuple(x.shape)}")
    names = ("node_inputs", "node_types", "pred_ptr", "pred_ids", "arc_types", "arc_inputs",
             "instance_offsets")
    structure = packed.structure()
    for name, t in zip(names, structure):
        if t.dtype != torch.long:
            raise TypeError(f"edbatch.run_cell: packed.{name} must be int64, got {t.dtype}")
        if t.device != x.device and t.device.type != "cpu":
            raise ValueError(f"edbatch.run_cell: packed.{name} is on {t.device} but x is on "
                             f"{x.device} (use packed.to(device))")
    expected = weight_shapes(cell, hidden_size, x.shape[1], num_node_types, num_arc_types)
    if len(weights) != len(expected):
        raise ValueError(f"edbatch.run_cell: {cell} takes {len(expected)} weights "
                         f"({', '.join(n for n, _ in expected)}), got {len(weights)}")
    for w, (name, shape) in zip(weights, expected):
        if w.dtype != torch.float32:
            raise TypeError(f"edbatch.run_cell: weight {name} must be float32, got {w.dtype}")
        if tuple(w.shape) != shape:
            raise ValueError(f"edbatch.run_cell: weight {name} has shape {tuple(w.shape)}, "
                             f"expected {shape} (hidden {hidden_size}, input {x.shape[1]})")
        if w.device != x.device:
            raise ValueError(f"edbatch.run_cell: weight {name} is on {w.device} but x is on "
                             f"{x.device}")
    try:
        return list(torch.ops.edbatch.run_cell(cell, x, *structure, list(weights), hidden_size,
                                               num_node_types, num_arc_types, policy, threads))
    except RuntimeError as e:
        message = _message(e)
        if message is None:
            raise
        raise ValueError(message) from None
