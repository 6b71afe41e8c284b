"""The options' checks shared by edbatch.nn.Cell and edbatch.nn.Propagate: the loss head inside
the engine (docs/pytorch.md, "The loss inside the engine"), the batching policy and threads."""

import torch

from . import checks, ops


def check_engine_options(policy, threads, owner):
    """Raises ValueError for a policy or thread count the engine would refuse at the first
    forward (a policy file, fsm:FILE, is read then: it may be written after the module)."""
    names = ops.policies()
    if not isinstance(policy, str) or not (policy in names or
                                           (policy.startswith("fsm:") and len(policy) > 4)):
        raise ValueError(f"{owner}: policy must be one of {', '.join(names)} or fsm:FILE (a "
                         f"policy file learned on this module's types, such as the cache entry "
                         f"policy='auto' writes), got {policy!r}")
    if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= 1024:
        raise ValueError(f"{owner}: threads must be an int from 0 (torch.get_num_threads()) to "
                         f"1024, got {threads!r}")


def refuse_replica(module, owner):
    """Raises RuntimeError in a replica of nn.DataParallel, which cannot split a packed batch (it
    scatters tensors, lists and dicts, and hands every replica the whole of other objects)."""
    if getattr(module, "_is_replica", False):
        raise RuntimeError(f"{owner} runs under nn.DataParallel, which hands each replica the "
                           f"whole packed batch (it splits only tensors, lists and dicts), so "
                           f"every GPU would run all of it: use DistributedDataParallel, one "
                           f"process per GPU, each packing its own share (docs/pytorch.md, "
                           f"\"Distributed training\")")


def check_head(classes, reduction, owner):
    """Raises TypeError / ValueError for a loss head option that makes no sense."""
    if classes is not None:
        try:
            checks.integer(classes, owner, "classes")
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e} (or None: no loss head)") from None
    if reduction not in ("sum", "mean"):
        raise ValueError(f"{owner}: reduction must be 'sum' or 'mean', got {reduction!r}")


def labels_of(labels, packed, owner):
    """The labels of a loss call: packed's (its host copy) when None, else a tensor (the op
    checks its dtype and length, naming both)."""
    ops.check_packed(packed, owner)
    if labels is None:
        return packed.host_labels()
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"{owner}: labels must be an int64 tensor (a label per node, -1 for "
                        f"none), got {type(labels).__name__}")
    return labels


def head_weights(module, owner):
    """[weight, bias] of module.head, the loss head inside the engine."""
    if module.head is None:
        raise ValueError(f"{owner}.loss needs a loss head: make the module with classes=C")
    return [module.head.weight, module.head.bias]
