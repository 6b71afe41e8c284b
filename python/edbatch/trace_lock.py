"""The lock that makes cell traces take turns in a process (a trace sets torch's factories,
fx's nn.Module patches and fx.Proxy's in-place operators for the process while it runs), and
its reset in a child forked while another thread of the parent traced."""
import os
import threading

import torch
import torch.fx as fx

from . import trace_inplace

FACTORIES = ("zeros", "ones", "full", "empty", "rand", "randn")  # the last three refused
TRACING = threading.RLock()  # one trace at a time; read as trace_lock.TRACING (reset below)
# What a trace patches for the process, as it is when no trace runs.
_UNPATCHED = ([(torch, name, getattr(torch, name)) for name in FACTORIES] +
              [(torch.nn.Module, name, getattr(torch.nn.Module, name))
               for name in ("__call__", "__getattr__")] +
              [(fx.Proxy, name, fx.Proxy.__dict__.get(name)) for name in trace_inplace.NAMES])


def _after_fork_in_child():
    """A child forked while another thread traced: that thread is not in the child, so its lock
    and patches would stay forever (the child's first trace would wait for good). They are undone
    here; the trace in progress belonged to the parent."""
    global TRACING
    if TRACING.acquire(blocking=False):
        TRACING.release()
        return
    TRACING = threading.RLock()
    for owner, name, value in _UNPATCHED:
        if value is not None:
            setattr(owner, name, value)
        elif name in owner.__dict__:  # fx.Proxy has no in-place operators of its own
            delattr(owner, name)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
