"""Where a refusal of a cell points: the user's frame (file and line, the line's text) and
what the cell was given (trace.py's messages)."""
import inspect
import linecache
import os

import torch

# Frames in these are not the user's (torch, this package, the standard library).
_SKIP_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, os)) + (
    os.path.dirname(__file__) + os.sep,)


def current_frames():
    """(file, line) of every frame of the stack, innermost first (this package's own first)."""
    frame = inspect.currentframe()
    while frame is not None:
        yield frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back


def user_frame(frames):
    """The innermost frame of `frames` (innermost first) in the user's code, or None."""
    for filename, line in frames:
        if not filename.startswith(_SKIP_DIRS) and not filename.startswith("<"):
            return filename, line
    return None


def format_where(frame):
    filename, line = frame
    rel = os.path.relpath(filename)
    return f"{filename if rel.startswith('..') else rel}:{line}", filename, line


def refuse(error, cell_name, where, frames=None, tail=""):
    """The message: the cell, its source location and line, why; `tail` (the list of what
    cells may contain) after the line, so the line stays next to the reason."""
    if where is None and frames is not None:
        frame = user_frame(frames)
        where = format_where(frame) if frame else None
    location, text = "", ""
    if where is not None:
        location = f" at {where[0]}"
        line = linecache.getline(where[1], where[2]).strip()
        text = f"\n    {line}" if line else ""
    return f"{cell_name}{location}: {error}{text}{tail}"


def called_with(role, first, tuple_first, second, tuple_second):
    """What the cell was given, for a refusal: a size that does not fit is often the module's
    state_size or message_size rather than the cell's code."""
    def sizes(part, as_tuple):
        if not part:
            return "None"
        each = ["an id" if kind == "ids" else f"size {size}" for kind, _, size in part]
        return f"a tuple ({', '.join(each)})" if as_tuple else each[0]

    names = ("x", "the message") if role == "node" else ("the source state", "the arc's x")
    return (f"\n(the cell was called with {names[0]}: {sizes(first, tuple_first)}, "
            f"{names[1]}: {sizes(second, tuple_second)}; these sizes come from the input and "
            f"the module's state_size and message_size)")


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_NOT_CODE = (os.path.dirname(__file__) + os.sep, _TORCH_DIR + "fx" + os.sep,
             _TORCH_DIR + "overrides.py", _TORCH_DIR + "_tensor.py")


def inside_torch_module():
    """When the operation being traced is inside torch's own module code (LSTMCell.forward
    called as a method, super().forward(x, h)): a hint to call the module instead, which edbatch
    translates; else ""."""
    for filename, _ in current_frames():
        if filename.startswith(_NOT_CODE):
            continue
        if not filename.startswith(_TORCH_DIR + os.path.join("nn", "modules")):
            return ""
        return (f" (inside torch's own {os.path.relpath(filename, _TORCH_DIR)}, reached by "
                "calling a module's forward method: call the module itself, self.cell(x, h), "
                "which edbatch translates; a subclass of nn.LSTMCell, nn.GRUCell or nn.RNNCell "
                "cannot call super().forward: hold the cell as a submodule)")
    return ""
