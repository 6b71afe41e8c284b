"""The op wrapper: checks arguments (raising ValueError/TypeError with clear messages) and calls
torch.ops.edbatch.run_cell, which has autograd."""
import collections
import functools
import itertools

import torch

from . import _lib, checks
from .saved import check_unchanged
from .step import in_place_updates, without_updated


def cells():
    """Names of the cells the op runs."""
    _lib.load()
    return list(torch.ops.edbatch.cells())


@functools.lru_cache(maxsize=1)
def policies():
    """Names of the engine's scheduling policies (besides fsm:FILE, a learned policy's file)."""
    _lib.load()
    return tuple(torch.ops.edbatch.policies())


def weight_shapes(cell, hidden_size, input_size, num_node_types=1, num_arc_types=1):
    """[(name, shape)] of the weights run_cell takes for this cell, in order (row-major, torch's
    (out, in) convention: W x is W @ x). Sizes and type counts are ints from 1 to 2^31 - 1."""
    return list(_weight_shapes(*check_sizes("edbatch.weight_shapes", cell, hidden_size,
                                            input_size, num_node_types, num_arc_types)))


def check_sizes(owner, cell, hidden_size, input_size, num_node_types=1, num_arc_types=1):
    """(cell, hidden_size, input_size, num_node_types, num_arc_types), the sizes as ints from 1
    to 2^31 - 1 (the engine holds them in 32 bits), else TypeError / ValueError naming them."""
    checks.text(cell, owner, "cell")
    hidden, inputs, node_types, arc_types = checks.sizes(
        owner, hidden_size=hidden_size, input_size=input_size, num_node_types=num_node_types,
        num_arc_types=num_arc_types)
    if cell == "mvrnn" and inputs != hidden + hidden * hidden:
        raise ValueError(f"{owner}: mvrnn's input_size must be hidden + hidden^2 = "
                         f"{hidden + hidden * hidden} (a leaf's v and M), got {inputs}")
    return cell, hidden, inputs, node_types, arc_types


@functools.lru_cache(maxsize=64)
def _weight_shapes(cell, hidden_size, input_size, num_node_types, num_arc_types):
    """weight_shapes() of checked arguments (ints), as a tuple."""
    _lib.load()
    try:
        names, rows, cols = torch.ops.edbatch.weight_shapes(cell, hidden_size, input_size,
                                                            num_node_types, num_arc_types)
    except (RuntimeError, TypeError, ValueError) as e:
        _reraise(e)
    return tuple((n, (r,) if c == 0 else (r, c)) for n, r, c in zip(names, rows, cols))


def _reraise(error):
    """Raises the library's own message without libtorch's backtrace, in the class torch uses for
    the same kind of error: a bad argument as a ValueError (a TypeError for a wrong dtype); a
    failure while running as a RuntimeError (a device error, a pass that failed), but memory that
    could not be had as a MemoryError on the CPU and torch.cuda.OutOfMemoryError on the GPU, as
    PyTorch's callers catch it, and a non-finite value found by set_check_numerics as a
    FloatingPointError. Any other error as it is."""
    message = _message(error)
    if message is None:
        raise error
    if isinstance(error, (TypeError, ValueError)):
        raise type(error)(message) from None
    if "out of memory" in message:
        cuda_oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
        raise (cuda_oom if message.startswith("[cuda]") else MemoryError)(message) from None
    if message.endswith("(EngineOptions::check_numerics)"):
        raise FloatingPointError(message.replace("(EngineOptions::check_numerics)",
                                                 "(edbatch.set_check_numerics)")) from None
    raise RuntimeError(message) from None


def _message(error):
    """The library's own message ("[function] what"), without libtorch's backtrace; None when
    the error did not come from edbatch."""
    lines = str(error).split("\nException raised from")[0].strip().split("\n")
    for i, line in enumerate(lines):
        # With the lines after it (a list of what did not match); c10's own "[enforce fail at
        # ...]" (torch's allocator inside the op) is not the library's.
        if line.startswith("[") and not line.startswith("[enforce fail"):
            return "\n".join(lines[i:]).strip()
    return None


@_lib.eager
def run_cell(cell, x, packed, weights, hidden_size, num_node_types=1, num_arc_types=1,
             policy="lb-greedy", threads=0, labels=None, loss=None, step=False, lr=None):
    """Runs `cell` over every node of `packed` and returns its per-node outputs ((h, c) for the
    LSTM cells, (h,) otherwise), each num_nodes x hidden_size, differentiable in x and weights.
    A tuple: module backward hooks and torch.utils.checkpoint look into tuples, not lists.

    x: float32 (rows x input size), the rows node_inputs / arc_inputs point at (float16 or
    bfloat16 from an autocast region: cast to float32).  weights: in the order of
    weight_shapes().  threads 0: torch.get_num_threads().

    loss "sum" or "mean": a classification loss head runs inside the engine instead, and the call
    returns (loss,): the cross-entropy of softmax(W h + b) against `labels` (int64, one per node,
    -1 for none) summed or averaged over the labelled nodes, where W (classes x hidden_size) and
    b (classes) follow the cell's weights in `weights`. Labels are read on the host: pass a CPU
    tensor (Packed.host_labels()) to spare a wait on the GPU.

    step=True (with a loss): the loss's backward runs in the same call, with no autograd graph,
    and the call returns (loss, x's gradient, each weight's gradient) (edbatch.apply_gradients
    hands them on as loss.backward() would). With lr too, the weights that are leaves requiring
    grad (float32, contiguous, in host memory, each listed once) are updated in place inside the
    call, plain SGD (w -= lr * grad; a lookup table at the rows the call read), and their
    gradients are returned as None; apply_gradients(weights, grads, lr) then updates the others.
    """
    weights = _check_options(cell, weights, hidden_size, num_node_types, num_arc_types, policy,
                             threads, labels, loss, step)
    op = torch.ops.edbatch.run_cell_step if step else torch.ops.edbatch.run_cell
    x = _lib.autocast_float32(x)
    structure = packed.structure() if hasattr(packed, "structure") else None
    updated = in_place_updates(weights, lr, "edbatch.run_cell") if step else []
    extra = (float(lr), updated) if updated else ()
    if isinstance(x, torch.Tensor) and structure is not None:
        # The op checks the tensors itself; the checks below only run to explain a failure
        # (they cost about as much as the op's own host work on small mini-batches).
        try:
            out = op(cell, x, *structure, weights, hidden_size, num_node_types, num_arc_types,
                     policy, threads, labels, loss or "", *extra)
            out = tuple(out[:2]) + tuple(without_updated(out[2:], updated)) if step else tuple(out)
        except (RuntimeError, TypeError, ValueError) as e:
            error = e
        else:
            if not step:  # autograd runs the backward: x and the weights must be unchanged then
                check_unchanged(out, x, weights, lambda: ["x"] + [
                    n for n, _ in weight_shapes(cell, hidden_size, x.shape[1], num_node_types,
                                                num_arc_types)] + ["head weight", "head bias"],
                    "edbatch.run_cell")
            return out
    else:
        error = None
    _check_arguments(cell, x, structure, weights, hidden_size, num_node_types, num_arc_types,
                     loss)
    if error is None:
        check_packed(packed, "edbatch.run_cell")
    _reraise(error)


def _check_options(cell, weights, hidden_size, num_node_types, num_arc_types, policy, threads,
                   labels, loss, step):
    """run_cell's arguments other than x and packed, checked before the op (a few isinstance
    calls): TypeError / ValueError naming the first bad one. Returns the weights as a list."""
    owner = "edbatch.run_cell"
    checks.text(cell, owner, "cell")
    checks.sizes(owner, hidden_size=hidden_size, num_node_types=num_node_types,
                 num_arc_types=num_arc_types)
    checks.text(policy, owner, "policy")
    checks.int64(threads, owner, "threads")
    if loss is not None and (not isinstance(loss, str) or loss not in ("sum", "mean")):
        raise ValueError(f"{owner}: loss must be 'sum' or 'mean' (a loss head), or None, got "
                         f"{loss!r}")
    checks.flag(step, owner, "step")
    if step and loss is None:
        raise ValueError(f"{owner}: step=True needs a loss head (loss='sum' or 'mean')")
    if labels is not None:
        if loss is None:
            raise ValueError(f"{owner}: labels are read by a loss head only: give loss='sum' or "
                             f"'mean' (and the head's weight and bias after the cell's weights)")
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"{owner}: labels must be an int64 tensor (a label per node, -1 for "
                            f"none), got {type(labels).__name__}")
    if weights is None or isinstance(weights, (torch.Tensor, str)) or not hasattr(
            weights, "__iter__"):
        raise TypeError(f"{owner}: weights must be a list of tensors (in the order of "
                        f"weight_shapes()), got {type(weights).__name__}")
    weights = list(weights)
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{owner}: weights[{i}] must be a tensor, got {type(w).__name__}")
    return weights


def check_packed(packed, owner):
    """Raises TypeError unless `packed` is a packed batch (edbatch.Packed)."""
    if not (hasattr(packed, "structure") and hasattr(packed, "kinds")):
        raise TypeError(f"{owner}: expected a packed batch (edbatch.Packed: from pack_sst, "
                        f"pack_trees, pack_lattices, pack_dags, pack_edges or collate), got "
                        f"{type(packed).__name__}")


def prepare(cell, packed, input_size, hidden_size, device="cpu", num_x=None, num_node_types=1,
            num_arc_types=1, policy="lb-greedy", threads=0, loss=None, classes=0):
    """Starts the structure-only host work of a later run_cell call on `packed` (checking it,
    building its graph, scheduling and memory planning) on a worker thread, and returns at once.

    The run_cell call whose structure equals `packed`'s, with the same cell, sizes, options and
    device, and x of `num_x` rows (default: packed.input_ids' length), then only runs the plan.
    Typically the next mini-batch is prepared while this one trains (see prefetch()). A call that
    matches no prepared structure works as usual; an error in the structure is raised by the
    run_cell call. Up to 9 prepared structures wait; preparing more drops the oldest.
    With loss ("sum" or "mean") and classes, the prepared call is run_cell's loss head over
    packed's labels (Packed.host_labels()).
    """
    _lib.load()
    owner = "edbatch.prepare"
    check_packed(packed, owner)
    cell, hidden_size, input_size, num_node_types, num_arc_types = check_sizes(
        owner, cell, hidden_size, input_size, num_node_types, num_arc_types)
    device = as_device(device, owner)
    if num_x is None:
        num_x = packed.input_ids.numel()
    num_x = checks.int64(num_x, owner, "num_x")  # its range: the op's check
    checks.text(policy, owner, "policy")
    checks.int64(threads, owner, "threads")
    if loss is not None and (not isinstance(loss, str) or loss not in ("sum", "mean")):
        raise ValueError(f"{owner}: loss must be 'sum' or 'mean' (a loss head), or None, got "
                         f"{loss!r}")
    classes = checks.integer(classes, owner, "classes", 1 if loss else 0)
    try:
        torch.ops.edbatch.prepare(cell, device, input_size, num_x,
                                  *packed.structure(), hidden_size, num_node_types, num_arc_types,
                                  policy, threads, *_head_labels(packed, loss), loss or "",
                                  classes)
    except (RuntimeError, TypeError, ValueError) as e:
        _reraise(e)


def prepare_stats():
    """Counts of prepare() over the process: {"prepared", "used" (by a matching call), "failed"
    (a bad structure; its call raised), "dropped" (more than 9 waited), "runners" (made for
    calls and preparations: each holds an engine, on a GPU with its own stream and arenas, so
    a count that keeps growing means calls pay for new ones), "waiting" (now), "workers" (threads
    preparing: a second starts when a preparation waits while the first is busy), "idle"
    (runners kept for later calls: at most 4 per configuration and 16 in all, so those that
    outputs kept for backward held come back and are let go)}."""
    _lib.load()
    return dict(zip(("prepared", "used", "failed", "dropped", "runners", "waiting", "workers",
                     "idle"), torch.ops.edbatch.prepare_counts()))


def set_plan_cache(megabytes):
    """Sets the plan cache budget (MiB) of the engines made from now on, and returns the one before
    (64 by default). A packed batch whose structure was planned twice before (an evaluation set
    every epoch, a fixed structure over new values) runs on the kept schedule and memory plan with
    bitwise the same results; 0 turns reuse off. Engines already made keep their budget: set it
    before the first call. Budgets apply per engine (per module configuration and device)."""
    _lib.load()
    if isinstance(megabytes, (bool, str, bytes)) or not hasattr(megabytes, "__float__"):
        raise TypeError(f"set_plan_cache: the budget must be a number of MiB from 0 to 2**30, "
                        f"got {megabytes!r} (a {type(megabytes).__name__})")
    if not 0 <= megabytes <= 1 << 30:  # NaN too
        raise ValueError(f"set_plan_cache: the budget must be from 0 to 2**30 MiB, got "
                         f"{megabytes!r}")
    return torch.ops.edbatch.set_plan_cache(int(megabytes * (1 << 20))) / (1 << 20)


def set_check_numerics(on=True):
    """Checks every value of every edbatch forward pass, and every gradient of every backward
    pass, from the next call on (modules, run_cell, and each StepDecoder from its next start()),
    and raises FloatingPointError at the first one that is not finite (NaN or infinite), naming
    its op, the batch that computed it and the node: a debugging aid that costs a pass over the
    values (and on a GPU a copy of them to the host). Off by default; returns the setting
    before. A decoding step that raises it leaves the loop as it was (docs/pytorch.md)."""
    _lib.load()
    if not isinstance(on, bool):
        raise TypeError(f"set_check_numerics: on must be True or False, got {on!r}")
    return torch.ops.edbatch.set_check_numerics(on)


def plan_cache_stats():
    """{"budget_mb": the budget of new engines, "plans_reused": forward passes of the process
    that ran on a reused plan}."""
    _lib.load()
    budget, reused = torch.ops.edbatch.plan_cache_info()
    return {"budget_mb": budget / (1 << 20), "plans_reused": reused}


def prefetch(module, batches, depth=1):
    """Yields the packed mini-batches of `batches` (an iterable), each after starting
    module.prepare() on the `depth` after it (default 1: the next), so that their host work
    overlaps this one's step:

        for packed in edbatch.prefetch(model, loader):
            loss = loss_fn(model(packed.to(device)), packed)
            ...

    A depth of 2 helps when preparing one mini-batch takes longer than a step (large
    mini-batches on a GPU): two worker threads then prepare the next two side by side. depth is 1
    to 8 (the engine keeps up to 9 preparations: the window and the one the step takes).
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= 8:
        raise ValueError(f"edbatch.prefetch: depth must be an integer from 1 to 8, got {depth!r}")
    if not callable(getattr(module, "prepare", None)):
        raise TypeError(f"edbatch.prefetch: module must have a prepare(packed) method (an "
                        f"edbatch.nn module or a Propagate), got {type(module).__name__}")
    if not hasattr(batches, "__iter__"):
        raise TypeError(f"edbatch.prefetch: batches must be an iterable of packed batches, got "
                        f"{type(batches).__name__}")
    return _prefetched(module, iter(batches), depth)


def _prefetched(module, it, depth):
    """prefetch()'s generator, of checked arguments."""
    window = collections.deque(itertools.islice(it, depth))  # the current one, then prepared
    for packed in itertools.islice(window, 1, None):
        module.prepare(packed)
    while window:
        current = window.popleft()
        for packed in itertools.islice(it, 1):
            module.prepare(packed)
            window.append(packed)
        yield current


def as_device(device, owner):
    """device (a str such as "cpu" or "cuda:0", or a torch.device) as the str the ops take, else
    TypeError / ValueError naming it."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{owner}: device must be a str (\"cpu\", \"cuda:0\") or a "
                        f"torch.device, got {type(device).__name__}")
    try:
        return str(torch.device(device))
    except RuntimeError as e:
        raise ValueError(f"{owner}: device {device!r} is not a device: {e}") from None


def _head_labels(packed, loss):
    """(labels,) for a call with a loss head, else (None,)."""
    return (packed.host_labels() if loss else None,)


def _check_arguments(cell, x, structure, weights, hidden_size, num_node_types, num_arc_types,
                     loss=None):
    """Raises TypeError / ValueError naming the first bad argument of run_cell."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"edbatch.run_cell: x must be a tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"edbatch.run_cell: x must be float32, got {x.dtype} (float16 and "
                        f"bfloat16 are taken inside torch.autocast only)")
    if x.dim() != 2:
        raise ValueError(f"edbatch.run_cell: x must be 2-D (rows x input size), got shape "
                         f"{tuple(x.shape)}")
    if structure is None:
        return
    check_structure(structure, "edbatch.run_cell", x.device)
    expected = weight_shapes(cell, hidden_size, x.shape[1], num_node_types, num_arc_types)
    cell_weights = weights if loss is None else weights[:-2]  # the op names the head's faults
    if loss is not None and len(weights) < len(expected) + 2:
        raise ValueError(f"edbatch.run_cell: loss={loss!r} needs the loss head's weight (classes "
                         f"x hidden_size) and bias (classes) after {cell}'s {len(expected)} "
                         f"weights ({', '.join(n for n, _ in expected)}): {len(expected) + 2} "
                         f"in all, got {len(weights)}")
    if len(cell_weights) != len(expected):
        raise ValueError(f"edbatch.run_cell: {cell} takes {len(expected)} weights "
                         f"({', '.join(n for n, _ in expected)}), got {len(cell_weights)}")
    for w, (name, shape) in zip(cell_weights, expected):
        if w.dtype != torch.float32:
            raise TypeError(f"edbatch.run_cell: weight {name} must be float32, got {w.dtype}")
        if tuple(w.shape) != shape:
            raise ValueError(f"edbatch.run_cell: weight {name} has shape {tuple(w.shape)}, "
                             f"expected {shape} (hidden {hidden_size}, input {x.shape[1]})")
        if w.device != x.device:
            raise ValueError(f"edbatch.run_cell: weight {name} is on {w.device} but x is on "
                             f"{x.device}")


def check_structure(structure, owner, device=None):
    """Raises TypeError / ValueError naming the first field of packed.structure() that is not
    an int64 tensor (in host memory or on `device`), and a node_inputs whose length alone
    disagrees with the node count that node_types, pred_ptr and instance_offsets agree on (the
    op, counting from node_inputs, would blame node_types)."""
    names = ("node_inputs", "node_types", "pred_ptr", "pred_ids", "arc_types", "arc_inputs",
             "instance_offsets")
    for name, t in zip(names, structure):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{owner}: packed.{name} must be an int64 tensor, got "
                            f"{type(t).__name__}")
        if t.dtype != torch.long:
            raise TypeError(f"{owner}: packed.{name} must be int64, got {t.dtype}")
        if device is not None and t.device != device and t.device.type != "cpu":
            raise ValueError(f"{owner}: packed.{name} is on {t.device} but x is on {device} "
                             f"(use packed.to(device))")
    node_inputs, node_types, pred_ptr = structure[0], structure[1], structure[2]
    offsets = structure[6]
    n = node_types.numel()
    if (node_inputs.numel() != n and pred_ptr.numel() == n + 1 and offsets.numel() > 0
            and int(offsets[-1]) == n):
        raise ValueError(f"{owner}: packed.node_inputs has {node_inputs.numel()} entries, but "
                         f"node_types, pred_ptr and instance_offsets hold {n} nodes (one input "
                         f"row, or -1, per node)")
