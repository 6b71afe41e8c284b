"""Training steps inside the engine. The step ops (run_cell(..., step=True), Propagate.loss_step)
run a loss head's forward and backward in one call and record no autograd graph; the gradients
they return go where loss.backward() would send them, or update the parameters in place."""
import torch

from . import checks
from .trace_weights import padding_of, without_row


def apply_gradients(tensors, grads, lr=None):
    """Hands each tensor that requires grad its gradient, as loss.backward() would: a leaf (an
    nn.Parameter) accumulates it into .grad; a tensor computed from others (x = embedding(ids))
    passes it back through autograd to what it was computed from. With lr, leaves are updated in
    place instead (t -= lr * grad, plain SGD, their .grad untouched), in one multi-tensor
    operation (a sparse gradient, a lookup table's touched rows, updates those rows). A tensor
    listed twice gets the sum of its gradients. tensors and grads are lists of the same length;
    a tensor None, or one that does not require grad, is passed over, and so is a gradient None
    (no gradient for that tensor, as torch.optim passes over a parameter whose .grad is None).
    A gradient has its tensor's shape and device (of another dtype, it is cast to the tensor's,
    as autograd casts)."""
    tensors, grads = _listed(tensors, "tensors"), _listed(grads, "grads")
    if len(tensors) != len(grads):
        raise ValueError(f"apply_gradients: {len(tensors)} tensors but {len(grads)} gradients "
                         f"(one per tensor, None for none)")
    if lr is not None:
        lr = checks.number(lr, "apply_gradients", "lr")
    leaves, others = {}, []
    for i, (t, g) in enumerate(zip(tensors, grads)):
        if t is None or g is None:
            continue
        _check_pair(i, t, g)
        if not t.requires_grad:
            continue
        padding = padding_of(t)  # a table whose padding row gets no gradient: the table's own
        if padding is not None:
            t, g = padding[0], without_row(g, padding[1])
        if g.dtype != t.dtype:
            g = g.to(t.dtype)
        if t.is_leaf:
            kept = leaves.get(id(t))
            if kept is not None:  # dense + sparse, never sparse + dense (unsupported)
                g = kept[1] + g if g.is_sparse or not kept[1].is_sparse else g + kept[1]
            leaves[id(t)] = (t, g)
        else:
            others.append((t, g))
    pairs = list(leaves.values())
    with torch.no_grad():
        if lr is not None:
            dense = [(t, g) for t, g in pairs if not g.is_sparse]
            if dense:
                torch._foreach_add_([t for t, _ in dense], [g for _, g in dense], alpha=-lr)
            for t, g in pairs:  # a lookup table's touched rows (sparse COO; repeats add up)
                if g.is_sparse:
                    t.index_add_(0, g._indices()[0], g._values(), alpha=-lr)
        else:
            for t, g in pairs:
                g = g.to_dense() if g.is_sparse else g
                if t.grad is None:
                    t.grad = g
                else:
                    t.grad.add_(g)
    if others:
        torch.autograd.backward([t for t, _ in others], [g for _, g in others])


def in_place_updates(tensors, lr, owner):
    """The indices of `tensors` that a step op updates in place with lr (the SGD of
    apply_gradients, done in the engine's backward from its own gradient: none is made), [] without
    lr: leaves that require grad, float32, contiguous, in host memory, listed once, and not a
    padding table's stand-in. The others' gradients come back and apply_gradients hands them
    on."""
    if lr is None:
        return []
    checks.number(lr, owner, "lr")
    seen = {}
    for t in tensors:
        seen[id(t)] = seen.get(id(t), 0) + 1
    return [i for i, t in enumerate(tensors)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf
            and t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
            and not t.is_sparse and seen[id(t)] == 1 and padding_of(t) is None]


def without_updated(grads, updated):
    """A step op's weight gradients with None for those it updated in place."""
    if not updated:
        return grads
    grads = list(grads)
    for i in updated:
        grads[i] = None
    return grads


def _listed(values, name):
    """tensors or grads as a list, else TypeError (a single tensor is not a list of them)."""
    if isinstance(values, (torch.Tensor, str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"apply_gradients: {name} must be a list (one entry per tensor), got "
                        f"{type(values).__name__}")
    return list(values)


def _check_pair(i, t, g):
    """Refuses, naming entry i, a tensor or gradient that is not a tensor, or a gradient of
    another shape or device than its tensor."""
    for name, v in (("tensors", t), ("grads", g)):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"apply_gradients: {name}[{i}] must be a tensor (or None), got "
                            f"{type(v).__name__}")
    if g.shape != t.shape:
        raise ValueError(f"apply_gradients: grads[{i}] has shape {tuple(g.shape)}, its tensor "
                         f"{tuple(t.shape)}")
    if g.device != t.device:
        raise ValueError(f"apply_gradients: grads[{i}] is on {g.device}, its tensor on "
                         f"{t.device}")
