"""Argument checks shared by the public functions and modules: sizes and counts as the engine
takes them, flags and numbers, each refused with TypeError (not of the kind expected) or
ValueError (out of range) whose message names the function and the argument."""
import math

import torch

from .text import index_of

# The engine holds sizes, type counts and node ids in 32 bits and computes products of them
# (2 * hidden_size rows, hidden + hidden^2 inputs): sizes and counts stay below 2^31.
MAX_SIZE = 2**31 - 1


def integer(value, owner, name, low=1, high=MAX_SIZE):
    """value as an int from low to high (an int, a NumPy integer or a 0-d integer tensor; not a
    bool, a float or a str), else TypeError / ValueError naming owner and name."""
    n = index_of(value)
    expected = ("a positive int" if low == 1 else "an int >= 0" if low == 0 else
                "an int" if low <= -2**63 else f"an int from {low}")
    expected += f" (at most {high})" if high < 2**63 - 1 else ""
    if n is None:
        raise TypeError(f"{owner}: {name} must be {expected}, got {_describe(value)}")
    if not low <= n <= high:
        raise ValueError(f"{owner}: {name} must be {expected}, got {n}")
    return n


def int64(value, owner, name):
    """value as an int of int64's range, else TypeError / ValueError naming it (the op checks
    the range it takes)."""
    return integer(value, owner, name, -2**63, 2**63 - 1)


def sizes(owner, low=1, **named):
    """The integers `named` (name=value), each checked by integer(), in order."""
    return [integer(v, owner, k, low) for k, v in named.items()]


def flag(value, owner, name):
    """value when it is a bool, else TypeError (a string such as "no" is not read as true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be True or False, got {_describe(value)}")
    return value


def number(value, owner, name):
    """value as a finite float (an int, a float or what converts to one; not a bool or a str),
    else TypeError or ValueError naming it."""
    x = None
    if not isinstance(value, (bool, str, bytes)) and hasattr(value, "__float__"):
        try:
            x = float(value)
        except (TypeError, ValueError, RuntimeError):
            pass
    if x is None:
        raise TypeError(f"{owner}: {name} must be a number, got {_describe(value)}")
    if not math.isfinite(x):
        raise ValueError(f"{owner}: {name} must be a finite number, got {value!r}")
    return x


def text(value, owner, name):
    """value when it is a str, else TypeError naming it."""
    if not isinstance(value, str):
        raise TypeError(f"{owner}: {name} must be a str, got {_describe(value)}")
    return value


def int_tensor(value, owner, name):
    """value as an int64 tensor: a tensor of integers (kept as it is), or a list or NumPy array
    of ints (None: empty); floats and bools are refused with TypeError, not truncated."""
    if value is None:
        return torch.empty(0, dtype=torch.long)
    t = value
    if not isinstance(value, torch.Tensor):
        try:
            t = torch.tensor(value)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{owner}: {name} must be a list of ints or an integer tensor, got "
                            f"{_describe(value)}: {e}") from None
    if t.numel() and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise TypeError(f"{owner}: {name} must hold ints (ids and indices, not truncated), got "
                        f"{_describe(value) if t is not value else 'a tensor'} of {t.dtype}")
    return value if t is value else t.to(torch.long)


def _describe(value):
    """value for an error: its repr (shortened) and its type."""
    r = repr(value)
    kind = type(value).__name__
    return f"{r if len(r) <= 60 else r[:60] + '...'} (a{'n' if kind[0] in 'aeiou' else ''} {kind})"
