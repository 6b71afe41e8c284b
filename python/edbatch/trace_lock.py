"""The lock that makes cell traces take turns in a process (a trace sets torch's factories,
torch.Tensor's C methods, fx's nn.Module patches and fx.Proxy's in-place operators for the
process while it runs), and its reset in a child forked while another thread of the parent
traced."""
import contextlib
import os
import threading

import torch
import torch.fx as fx

from . import trace_inplace

FACTORIES = ("zeros", "ones", "full", "empty", "rand", "randn")  # the last two refused
# Factories of constants, run when the cell is traced; a traced device= or dtype= (x.device,
# x.dtype) is set aside first, since the constant is read on the call's device (trace_weights).
CONSTANT_FACTORIES = ("tensor", "as_tensor", "arange", "linspace", "logspace", "eye")
TRACING = threading.RLock()  # one trace at a time; read as trace_lock.TRACING (reset below)
# torch.Tensor's methods written in C, which it inherits from its C base: called unbound on a
# traced value (torch.Tensor.sigmoid(x)), their descriptors refuse anything but a tensor.
TENSOR_METHODS = tuple(name for name, v in vars(torch.Tensor.__mro__[1]).items()
                       if type(v).__name__ == "method_descriptor" and not name.startswith("_")
                       and name not in vars(torch.Tensor))
# What a trace patches for the process, as it is when no trace runs.
_UNPATCHED = ([(torch, name, getattr(torch, name)) for name in FACTORIES + CONSTANT_FACTORIES] +
              [(torch.nn.Module, name, getattr(torch.nn.Module, name))
               for name in ("__call__", "__getattr__")] +
              [(fx.Proxy, name, fx.Proxy.__dict__.get(name)) for name in trace_inplace.NAMES] +
              [(torch.Tensor, name, None) for name in TENSOR_METHODS])


@contextlib.contextmanager
def factories(thread, record):
    """While a trace runs in `thread`: factories do not dispatch on traced arguments
    (torch.zeros(x.size(0), n)), so their calls there are recorded (`record`: the tracer's
    create_proxy) rather than run; the factories of constants run then, a traced device= or
    dtype= set aside (torch.tensor([...], device=x.device)), unless a traced value remains
    (torch.arange(x.size(-1)): recorded). torch's names are the process's: one trace at a time,
    and other threads' calls run as they would."""
    def recorded(fn):
        return lambda *a, **kw: (record("call_function", fn, a, kw)
                                 if threading.get_ident() == thread else fn(*a, **kw))

    def made(fn):
        def call(*a, **kw):
            if threading.get_ident() == thread:
                kw = {k: (None if k == "device" else torch.float32)
                      if k in ("device", "dtype") and isinstance(v, fx.Proxy) else v
                      for k, v in kw.items()}
                if any(isinstance(v, fx.Proxy) for v in (*a, *kw.values())):
                    return record("call_function", fn, a, kw)
            return fn(*a, **kw)
        return call
    saved = {name: getattr(torch, name) for name in FACTORIES + CONSTANT_FACTORIES}
    try:
        for name, fn in saved.items():
            setattr(torch, name, made(fn) if name in CONSTANT_FACTORIES else recorded(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)


@contextlib.contextmanager
def unbound_methods(thread):
    """While a trace runs in `thread`: torch.Tensor holds a function of its own for each of
    TENSOR_METHODS, which calls a traced value's method there (torch.Tensor.sigmoid(x) is then
    x.sigmoid(), one instruction or a refusal naming Tensor.sigmoid) and passes every other call
    on to the C method."""
    def unbound(name, method):
        def call(self, *args, **kwargs):
            if isinstance(self, fx.Proxy) and threading.get_ident() == thread:
                return getattr(self, name)(*args, **kwargs)
            return method(self, *args, **kwargs)
        call.__name__ = call.__qualname__ = name
        call.tensor_method = name  # the trace's name for a call recorded through it
        return call
    # torch.overrides keeps a table of Tensor's methods, made at its first use: made now, it
    # holds the C methods, not the functions set here.
    torch.overrides.is_tensor_method_or_property(torch.Tensor.add)
    try:
        for name in TENSOR_METHODS:
            setattr(torch.Tensor, name, unbound(name, getattr(torch.Tensor, name)))
        yield
    finally:
        for name in TENSOR_METHODS:
            if name in vars(torch.Tensor):
                delattr(torch.Tensor, name)


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
