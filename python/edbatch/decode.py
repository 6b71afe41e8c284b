"""edbatch.nn.StepDecoder: a decoding loop run one step at a time on one edbatch engine, for
greedy decoding and other loops whose next input depends on the last output (docs/pytorch.md)."""
import functools
import os
import threading
import weakref

import torch

from . import checks
from ._lib import autocast_float32
from .head import check_engine_options
from .ops import _reraise


def _device_of(weights):
    return weights[0].device if weights else torch.device("cpu")


def _without_dropout(program):
    if program.has_dropout:
        raise ValueError("StepDecoder: the cell draws dropout masks (nn.Dropout in training "
                         "mode, or F.dropout(training=True)); call .eval() first")
    return program


def _as_tensor(value, fn, wants):
    """value (a tensor, list or NumPy array) as a tensor, else a TypeError saying what fn wants."""
    if value is not None and not isinstance(value, (str, bytes)):
        try:
            return torch.as_tensor(value)
        except (TypeError, RuntimeError, ValueError):
            pass
    raise TypeError(f"StepDecoder.{fn}: {wants} (a tensor, list or NumPy array), got "
                    f"{type(value).__name__}")


def _program_decoder(input_size, policy, threads, text, device):
    return torch.classes.edbatch.Decoder("program:" + text, input_size, 1, policy, threads,
                                         str(device))


_LIVE = weakref.WeakSet()  # every StepDecoder, for the fork handler below


def _after_fork_in_child():
    """A child forked while another thread of the parent was inside a decoder's call: that
    thread is not in the child, so the decoder's lock would stay taken for good. The decoder is
    unlocked and refuses further calls, naming why (its engine stopped in the middle)."""
    for d in list(_LIVE):
        if d._lock.acquire(blocking=False):
            d._lock.release()
            continue
        d._lock = threading.Lock()
        d._forked_mid_call = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class StepDecoder:
    """Runs a cell step by step over a mini-batch of sequences that stop at their own time.

    `cell`: an edbatch.nn.Propagate of user cells (a step is its node cell of kind 0 reading x
    and the previous state, through its edge cell of kind 0 when it has one), or a built-in
    lattice module (edbatch.nn.LatticeLSTM / LatticeGRU, or an edbatch.nn.Cell of lattice_lstm /
    lattice_gru: a step is the char arc cell). `input_size`: the columns of x (user cells).

    start(batch_size, state=None) begins a loop (state: the initial state as the cell returns
    it, a row per instance; None: zeros). step(x) runs one step for the running instances
    (x: a row per running instance, in the order of `running`) and returns their new state, as
    the cell returns it. stop(mask) ends the instances whose rows in the last step's output have
    mask True. reorder(index) goes on with chosen rows of the last step's output, a row named
    once or several times (beam search: each kept hypothesis continues from its parent's state).
    The engine keeps one graph from start() on: each step adds one cell call per running
    instance and runs only those calls.

    Inference only: the returned tensors carry no autograd history (decode under
    torch.no_grad(); train with the cell's whole-structure forward). Weights are read at start().
    The engine runs where the cell's parameters are when the decoder is made (the CPU or a CUDA
    device; `device` says which): move the module first. x may be on any device; the new states
    come back on x's device. On a CUDA engine a CUDA x and the new states stay on the GPU, queued
    on torch's current stream (nothing waits for them). A tuple state's components are views of
    one tensor per step (clone one to keep it alone).
    """

    def __init__(self, cell, input_size=None, policy="lb-greedy", threads=0):
        from .nn import Cell, _Inputs
        from .propagate import Propagate
        check_engine_options(policy, threads, "StepDecoder")
        if isinstance(cell, _Inputs):
            cell = cell.cell
        if isinstance(cell, Propagate):
            if input_size is None:
                raise TypeError("StepDecoder: a Propagate cell needs input_size= (x's columns)")
            input_size = checks.integer(input_size, "StepDecoder", "input_size")
            self._program_of = lambda: cell.program("x", input_size)
            # no reference to self (a cycle would keep a dropped decoder's engine until the
            # garbage collector's next pass): the device is passed in
            self._make = functools.partial(_program_decoder, input_size, policy, threads)
            program = _without_dropout(self._program_of())
            self._tuple = program.state_tuple
            self._components = len(program.doc["state"]) if isinstance(
                program.doc.get("state"), list) else 1
            self.device = _device_of(list(cell.parameters()) or program.weights())
            self._text = program.text
            self._impl = self._make(self._text, self.device)
        elif isinstance(cell, Cell):
            if cell.cell not in ("lattice_lstm", "lattice_gru"):
                raise ValueError(f"StepDecoder: the built-in cell {cell.cell!r} has no step "
                                 "(lattice_lstm and lattice_gru have)")
            if input_size is not None and checks.integer(
                    input_size, "StepDecoder", "input_size") != cell.input_size:
                raise ValueError(f"StepDecoder: input_size is {input_size}, but the built-in "
                                 f"cell's input_size is {cell.input_size} (x's columns; leave "
                                 f"input_size out for a built-in cell)")
            self._program_of = None
            self._tuple = cell.cell == "lattice_lstm"
            self._components = 2 if self._tuple else 1
            self.device = _device_of(cell.weights())
            self._impl = torch.classes.edbatch.Decoder(cell.cell, cell.input_size,
                                                       cell.hidden_size, policy, threads,
                                                       str(self.device))
        else:
            raise TypeError("StepDecoder: cell must be an edbatch.nn.Propagate or a built-in "
                            f"lattice module, got {type(cell).__name__}")
        self.module = cell
        self.running = torch.empty(0, dtype=torch.long)
        self._started = False
        self._lock = threading.Lock()
        self._forked_mid_call = False
        _LIVE.add(self)

    def start(self, batch_size, state=None):
        """Begins a loop of batch_size instances, all running, from `state` (None: zeros). A
        cell traced again since the last start (a submodule replaced, a setting or hook
        changed) runs as it is now."""
        with self._lock:  # one call at a time: the engine is not shared between threads
            self._check_fork()
            return self._start(batch_size, state)

    def step(self, x):
        """One step of every running instance: x has a row per entry of `running` (float32;
        float16 or bfloat16 inside torch.autocast, cast to float32). A step that raises leaves
        the loop as it was; after a FloatingPointError (edbatch.set_check_numerics) it goes on,
        after another error inside the engine steps are refused until start()."""
        with self._lock:  # one call at a time: the engine is not shared between threads
            self._check_fork()
            return self._step(x)

    def stop(self, mask):
        """Ends the running instances whose entries of `mask` (a bool per running row) are
        True; returns the ids of those still running."""
        with self._lock:  # one call at a time: the engine is not shared between threads
            self._check_fork()
            return self._stop(mask)

    def reorder(self, index):
        """Goes on with the rows `index` of the last step's output (positions in `running`;
        repeats allowed, rows not named end): row r of the next step continues from the state of
        row index[r], as beam search continues each hypothesis from its parent's. The instances
        are numbered afresh (`running` becomes arange(len(index)); each keeps its source's step
        count in instance_steps()). Runs nothing; returns `running`."""
        with self._lock:  # one call at a time: the engine is not shared between threads
            self._check_fork()
            return self._reorder(index)

    def _check_started(self, fn):
        if not self._started:
            raise RuntimeError(f"StepDecoder.{fn}: no loop has begun: call start(batch_size, "
                               f"state) first")

    def _check_fork(self):
        if self._forked_mid_call:
            raise RuntimeError("StepDecoder: this process was forked while another thread of its "
                               "parent was inside this decoder's start, step or stop, so its "
                               "engine is the parent's in the middle of that call: make a new "
                               "StepDecoder here")

    def __reduce__(self):
        raise TypeError("a StepDecoder cannot be pickled or copied (it holds a running engine "
                        "and its graph): pickle its module and make a StepDecoder from it where "
                        "it is needed (in each worker process)")

    def _weights(self):
        if self._program_of is not None:
            return [w.detach() for w in self._program_of().weights(self.device)]
        return [w.detach() for w in self.module.weights()]

    def __repr__(self):
        return (f"StepDecoder({type(self.module).__name__}, device={self.device}, "
                f"running={self.running.numel()}{'' if self._started else ', not started'})")

    def _start(self, batch_size, state=None):
        # The engine's graph holds a node per instance and state component (32-bit ids).
        batch_size = checks.integer(batch_size, "StepDecoder.start", "batch_size", 0,
                                    checks.MAX_SIZE // max(self._components, 1))
        if state is not None and not isinstance(state, torch.Tensor) and not (
                isinstance(state, (tuple, list)) and
                all(isinstance(s, torch.Tensor) for s in state)):
            raise TypeError(f"StepDecoder.start: state must be a tensor or a tuple of tensors "
                            f"(as the cell returns it, a row per instance), or None (zeros), "
                            f"got {type(state).__name__}")
        if self._program_of is not None:
            program = _without_dropout(self._program_of())
            if program.text != self._text:
                self._tuple = program.state_tuple
                self._text = program.text
                self._impl = self._make(self._text, self.device)
        states = []
        if state is not None:
            states = list(state) if isinstance(state, (tuple, list)) else [state]
            states = [s.detach() for s in states]
        try:
            self._impl.start(batch_size, self._weights(), states)
        except (RuntimeError, TypeError, ValueError) as e:
            _reraise(e)
        self.running = torch.arange(batch_size)
        self._started = True

    def _step(self, x):
        self._check_started("step")
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"StepDecoder.step: x must be a float32 tensor (a row per running "
                            f"instance), got {type(x).__name__}")
        try:
            out = self._impl.step(self.running, autocast_float32(x).detach())
        except (RuntimeError, TypeError, ValueError) as e:
            _reraise(e)
        return tuple(out) if self._tuple else out[0]

    def _stop(self, mask):
        self._check_started("stop")
        given = _as_tensor(mask, "stop", "mask must be a bool per running row")
        # one bool per row: shape (N,) or (N, 1), or () for a single running instance
        if given.dim() > 2 or given.dim() == 2 and given.shape[1] != 1:
            raise ValueError(f"StepDecoder.stop: mask has shape {tuple(given.shape)}; it takes "
                             f"one bool per running row")
        if given.dtype != torch.bool and given.numel() > 0:  # torch.tensor([]) is float
            raise TypeError(f"StepDecoder.stop: mask must be bool (e.g. tok == EOS), got "
                            f"{given.dtype}")
        mask = given.to(torch.bool).reshape(-1).cpu()
        if mask.numel() != self.running.numel():
            raise ValueError(f"StepDecoder.stop: {mask.numel()} entries for "
                             f"{self.running.numel()} running instances")
        self.running = self.running[~mask]
        return self.running

    def _reorder(self, index):
        self._check_started("reorder")
        given = _as_tensor(index, "reorder", "index must be integer positions of running rows")
        if given.dtype == torch.bool:
            raise TypeError("StepDecoder.reorder: index must be integer positions of running "
                            "rows, got a bool mask (stop(mask) ends the rows a mask marks)")
        if (given.dtype.is_floating_point or given.dtype.is_complex) and given.numel() > 0:
            raise TypeError(f"StepDecoder.reorder: index must be integer positions of running "
                            f"rows, got {given.dtype}")
        if given.dim() != 1:
            raise ValueError(f"StepDecoder.reorder: index has shape {tuple(given.shape)}; it "
                             f"takes one position per row of the next step")
        checks.integer(given.numel(), "StepDecoder.reorder", "len(index)", 0,
                       checks.MAX_SIZE // max(self._components, 1))
        try:  # the engine's class reads the positions, checks them and maps them to instances
            self._impl.reorder(self.running, given)
        except (RuntimeError, TypeError, ValueError) as e:
            _reraise(e)
        self.running = torch.arange(given.numel())
        return self.running

    @property
    def done(self):
        return self.running.numel() == 0

    def stats(self):
        """{"steps", "graph_nodes", "nodes", "kernels", "batches", "repeated", "copied",
        "replanned"}: steps since start(), the graph's nodes, the engine's scheduled nodes,
        kernel launches and batches summed over the steps (each step schedules and runs only the
        nodes it added), the steps planned as a repeat of the step before instead of scheduled
        and planned afresh (a step over as many running instances as the one before, after a
        reorder too; with plan reuse on, as by default: edbatch.set_plan_cache), the steps whose
        rows from the fourth on were built as copies of the second row's nodes (when the third
        row came out as such a copy), and of the repeated steps those whose operands were
        planned afresh (their rows read other states than the step before's rows did, a step
        further on: after a reorder that moved rows, or a step after a stop)."""
        return dict(zip(("steps", "graph_nodes", "nodes", "kernels", "batches", "repeated",
                         "copied", "replanned"), self._impl.stats()))

    def instance_steps(self):
        """The steps each instance ran since start(): a list, one entry per instance (after
        reorder(), each instance counts its source's steps too)."""
        return list(self._impl.instance_steps())
