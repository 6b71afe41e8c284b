"""A traced program (docs/programs.md) as the op takes it: the document, its JSON text, the
weights it reads, and whether the cells it was traced from still hold what the trace read."""
import json
import math
import operator
import types

import torch

from .trace_hooks import HOOKS, global_hook_state


def _finite(v):
    """The document with its infinite and NaN numbers as "inf", "-inf" and "nan" (JSON has no
    such numbers; docs/programs.md)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _finite(e) for k, e in v.items()}
    if isinstance(v, list):
        return [_finite(e) for e in v]
    return v


class Program:
    """A traced program: `doc` (docs/programs.md), `text` (its JSON), and `weights()` (the op's
    weight tensors, in order). `cell_sites[c]` is the dropout site of cell c's first dropout."""

    def __init__(self, doc, weights, state_tuple, message_tuple):
        self.doc, self.text = doc, json.dumps(_finite(doc), separators=(",", ":"),
                                              allow_nan=False)
        self._weights, self.state_tuple, self.message_tuple = weights, state_tuple, message_tuple
        self._settings = []  # bind(): what current() compares, per submodule
        self._root = None  # bind(): the root's settings and the global hooks
        self._owners = []  # bind(): the owners of bound-method cells and their tensors
        self.cell_sites, site = [], 0
        for cell in doc["cells"]:
            self.cell_sites.append(site)
            site += sum(ins["op"] == "dropout" for ins in cell["body"])
        self.has_dropout = site > 0

    def weights(self, device=None):
        """The tensors the op reads now, the cells' constants (tensors made in a cell from
        Python values) on `device`."""
        return self._weights.tensors(device)

    def bind(self, root, settings=(), owners=()):
        """Notes every submodule of `root` (the Propagate), where it is, its settings and hooks,
        and `settings` (what the trace read from root itself), for current(). `owners`: the
        modules whose bound methods are cells (Propagate(self.cell)): their submodules noted as
        root's are, and their training flag, hooks and which parameters they hold; modules found
        elsewhere (a function cell's closure) are left out."""
        self._settings = []
        for top in (root, *owners):
            for parent in top.modules():
                for name, m in parent._modules.items():
                    if m is not None:
                        self._settings.append(_noted(parent, name, m))
        # An owner itself: its training flag and hooks (its other attributes, a step counter
        # say, would trace again at every call; they are not checked, as a closure is not).
        self._settings += [_noted(None, None, m, settings=False) for m in owners]
        self._owners = [(m, _identities(m)) for m in owners]
        self._root = settings, global_hook_state(), _tensors(root)
        return self

    def current(self, root, settings=()):
        """Whether the traced constants still hold: every submodule is where bind() found it (a
        submodule replaced since, cell.lin = nn.Linear(...), has other weights, perhaps of other
        shapes) with the same training flag, plain settings (nn.Dropout's p, LeakyReLU's slope,
        a cell's own temperature, self.cfg.scale of an object it holds: the trace reads them as
        constants), hooks (forward hooks are traced, others refused) and parameters and buffers
        (which are None and their shapes: a bias given to a Linear made without one needs a new
        trace), and `settings` and the global module hooks are as they were."""
        try:
            return self._root == (settings, global_hook_state(), _tensors(root)) and all(
                (parent is None or parent._modules.get(name) is m) and get(m.__dict__) == values
                and (not held or _held(m, held) == held_values) and _tensors(m) == tensors
                for parent, name, m, get, values, held, held_values, tensors in self._settings
            ) and all(_identities(m) == ids for m, ids in self._owners)
        except KeyError:  # a setting deleted
            return False


def _noted(parent, name, m, settings=True):
    """What current() compares for module m, parent's submodule `name` (parent None: m is not
    placed, an owner of a bound-method cell): the training flag and the hook dicts at least
    (get() gives a tuple), its plain settings and the objects of settings it holds (unless
    `settings` is False), and its tensors' shapes."""
    plain = _plain_keys(m) if settings else ["training"]
    get = operator.itemgetter(*plain, *(h for h in HOOKS if h in m.__dict__))
    held = _object_keys(m) if settings else ()
    return parent, name, m, get, _copy(get(m.__dict__)), held, _held(m, held), _tensors(m)


def _identities(module):
    """Which tensors a module holds as its own parameters and buffers: a bound-method cell reads
    its owner's (self.W) as the objects the trace saw, so one replaced needs a new trace."""
    return tuple((k, id(v)) for d in (module._parameters, module._buffers) for k, v in d.items())


def _tensors(module):
    """A module's own parameters and buffers by name: None or the shape."""
    return tuple((k, None if v is None else tuple(v.shape))
                 for d in (module._parameters, module._buffers) for k, v in d.items())


def _copy(values):
    """Values as bind() keeps them: the hook dicts copied."""
    return tuple(dict(v) if isinstance(v, dict) else v for v in values)


def _plain_keys(module):
    """The names of a module's training flag and its attributes of plain values (numbers,
    strings, None, tuples of them)."""
    return [k for k, v in module.__dict__.items() if k[0] != "_" and _plain(v)]


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, tuple) and all(_plain(e) for e in v)


def _object_keys(module):
    """The names of a module's attributes that hold objects of plain settings (a SimpleNamespace,
    a dataclass or another instance with a __dict__: self.cfg), not tensors, modules, functions,
    classes or Python modules."""
    return tuple(k for k, v in module.__dict__.items()
                 if k[0] != "_" and not _plain(v) and not callable(v)
                 and not isinstance(v, (torch.Tensor, types.ModuleType))
                 and isinstance(getattr(v, "__dict__", None), dict))


def _held(module, keys):
    """The plain settings of the objects a module holds under `keys`."""
    out = []
    for k in keys:
        d = getattr(module.__dict__[k], "__dict__", None)
        out.append(tuple((a, v) for a, v in d.items() if _plain(v)) if isinstance(d, dict)
                   else ("object", id(module.__dict__[k])))  # replaced by another kind of value
    return out
