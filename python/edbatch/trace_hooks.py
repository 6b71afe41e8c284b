"""Module hooks in cells. Forward hooks of the user's own modules run while a cell is traced, so
the program has them; hooks of the modules the tracer translates itself, and backward hooks of
any module, cannot run in a program and are refused. A program notes the hooks, so that one
traced before a hook was added or removed is traced again (programs.py)."""
import torch

from .trace_values import Refusal

_GLOBAL = torch.nn.modules.module
# A module's hook dicts, keyed by handle (the last one from torch 2.0; the dicts of hooks with
# kwargs and of always-called hooks list handles of the first two).
HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")


_GLOBAL_HOOKS = [vars(_GLOBAL)["_global" + h] for h in HOOKS if "_global" + h in vars(_GLOBAL)]


def global_hook_state():
    """The handles of the global module hooks (register_module_forward_hook...)."""
    return [tuple(d) for d in _GLOBAL_HOOKS]


def refuse_backward_hooks(module, path):
    """Refuses a module with backward hooks, or any module while global ones exist: the cells
    run as one traced program over every node, so no backward hook could run per node. path:
    the module's path under the cell ("" for the cell itself, None when not known)."""
    found = _backward_kinds(module.__dict__, "")
    found += _backward_kinds(vars(_GLOBAL), "_global")
    if found:
        what = {None: "a module", "": "the cell"}.get(path, f"submodule {path}")
        what += f" ({module_name(module)})"
        raise Refusal(f"{what} has {' and '.join(found)}: a cell runs as one traced program "
                      "over every node, not module by module, so backward hooks "
                      "cannot run per node; hook the parameters (Tensor.register_hook) or the "
                      "Propagate module (its hooks run) instead")


def _backward_kinds(where, prefix):
    glob = "a global module " if prefix else "a "
    register = "register_module_" if prefix else "register_"
    found = []
    if where.get(prefix + "_backward_hooks"):
        if where.get(prefix + "_is_full_backward_hook"):
            found.append(f"{glob}full backward hook ({register}full_backward_hook)")
        else:
            found.append(f"{glob}backward hook ({register}backward_hook)")
    if where.get(prefix + "_backward_pre_hooks"):
        found.append(f"{glob}full backward pre-hook ({register}full_backward_pre_hook)")
    return found


def refuse_hooks(module):
    """A module the tracer translates itself (nn.Linear...) is not called, so its hooks, and the
    global module hooks, would not run: refused. (A user module is called while tracing, so its
    own forward hooks are traced with it.)"""
    found = [h[1:] for h in HOOKS if getattr(module, h, None)]
    if found:
        raise Refusal(f"{module_name(module)} has {' and '.join(found)}, which cells do not run "
                      "(nn.utils.weight_norm and pruning work through them): remove them, compute "
                      "the weight with nn.utils.parametrize (parametrizations.weight_norm), or "
                      "compute it in the cell from parameters")
    found = [h[1:] for h in HOOKS if getattr(_GLOBAL, "_global" + h, None)]
    if found:
        names = " and ".join(f"global {h} (nn.modules.module.register_module_{h[:-1]})"
                             for h in found)
        raise Refusal(f"{names} would run for {module_name(module)} in eager PyTorch, and cells "
                      "do not run them: remove the global hooks while the cell is first called "
                      "(it is traced then), or hook the modules outside the cell")


def module_name(module):
    cls = type(module)
    return f"nn.{cls.__name__}" if cls.__module__.startswith("torch.nn") else cls.__qualname__
