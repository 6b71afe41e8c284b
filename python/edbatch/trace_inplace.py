"""In-place operators refused while a cell is traced: fx's proxies have none on torch 1.13, so
Python turns `a += b` into `a = a + b`, which other names for `a` would not see, as they would
in PyTorch."""
import contextlib
import threading

import torch.fx as fx

from .trace_values import Refusal

_INPLACE = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
            "pow": "**", "matmul": "@", "and": "&", "or": "|", "xor": "^"}
NAMES = [f"__i{name}__" for name in _INPLACE]  # the methods set on fx.Proxy


@contextlib.contextmanager
def refused(note_where):
    """Within: fx.Proxy's in-place operators raise a Refusal, after note_where(tracer body)
    points the error at the user's line; fx.Proxy is as it was after, whatever happens."""
    tracing = threading.get_ident()

    def refusal(symbol):
        def refuse(proxy, other):
            if threading.get_ident() != tracing:  # another thread's fx trace: as without
                return NotImplemented
            note_where(proxy.tracer.body)
            raise Refusal(f"the in-place operator {symbol}= is not supported: write "
                          f"a = a {symbol} b")
        return refuse

    names = NAMES
    saved = {name: fx.Proxy.__dict__.get(name) for name in names}
    try:
        for name, symbol in zip(names, _INPLACE.values()):
            setattr(fx.Proxy, name, refusal(symbol))
        yield
    finally:
        for name, fn in saved.items():
            if fn is None:
                delattr(fx.Proxy, name)
            else:
                setattr(fx.Proxy, name, fn)
