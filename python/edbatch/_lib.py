"""Loads the compiled extension that registers torch.ops.edbatch.*."""
import functools
import glob
import os

import torch

_loaded = None


def load():
    """Loads the extension once: $EDBATCH_LIBRARY (a CMake build) or the one `pip install` built."""
    global _loaded
    if _loaded is not None:
        return _loaded
    path = os.environ.get("EDBATCH_LIBRARY")
    if path and not os.path.isfile(path):
        raise ImportError(f"edbatch: EDBATCH_LIBRARY is {path!r}, which is not a file: set it to "
                          f"a CMake build's libedbatch_torch.so, or unset it to use the "
                          f"extension `pip install` built")
    if not path:
        here = os.path.dirname(os.path.abspath(__file__))
        found = sorted(glob.glob(os.path.join(here, "_edbatch*.so")))
        if not found:
            raise ImportError(
                "edbatch: the compiled extension was not found; install the package with "
                "`pip install --no-build-isolation .` or set EDBATCH_LIBRARY to a CMake build's "
                "libedbatch_torch.so (docs/pytorch.md)")
        path = found[0]
    if _registered():
        # The ops are this process's already (the package reloaded, or imported again under
        # another name): loading a copy would register them twice, which aborts the process.
        _loaded = path
        return path
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(f"edbatch: {path!r} could not be loaded: {e}") from None
    if not _registered():
        raise ImportError(f"edbatch: {path!r} is not edbatch's PyTorch extension (it registers "
                          f"no torch.ops.edbatch.*): EDBATCH_LIBRARY names a CMake build's "
                          f"libedbatch_torch.so") from None
    _loaded = path
    return path


def eager(fn):
    """fn, kept out of torch.compile's graphs (torch 2.x): the extension's ops have no fake
    kernels and read packed structures on the host, so a compiled model breaks its graph where
    it calls fn and runs fn as it is (its autograd included). Without torch.compiler, fn.
    Under torch.jit.trace, which would record one structure's operations as the model, it
    refuses."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.jit.is_tracing():
            raise RuntimeError(f"edbatch: {fn.__qualname__} cannot be recorded by torch.jit.trace "
                               f"(TorchScript would freeze one mini-batch's structure): run the "
                               f"model eagerly, or under torch.compile (docs/pytorch.md)")
        return fn(*args, **kwargs)

    try:
        from torch.compiler import disable
    except ImportError:
        try:
            from torch._dynamo import disable  # torch 2.0
        except ImportError:
            return run
    wrapped = disable(run)
    if getattr(wrapped, "__doc__", None) != fn.__doc__:  # help() shows fn's own text
        try:
            wrapped.__doc__, wrapped.__wrapped__ = fn.__doc__, fn
        except AttributeError:
            pass
    return wrapped


def autocast_float32(x):
    """x as float32 inside an autocast region that made it float16 or bfloat16 (the engine
    computes in float32, as autocast runs its float32 ops: the result is float32 and the
    gradient flows back through the cast); anything else as it is."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float16, torch.bfloat16):
        return x
    device = x.device.type
    try:
        on = torch.is_autocast_enabled(device)  # torch 2.4 and later
    except TypeError:
        on = torch.is_autocast_cpu_enabled() if device == "cpu" else torch.is_autocast_enabled()
    return x.float() if on else x


def has_op(name):
    """Whether torch.ops.edbatch.<name> is registered in this process."""
    try:
        getattr(torch.ops.edbatch, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def _registered():
    """Whether the extension's operators are registered in this process."""
    return has_op("build_info")
