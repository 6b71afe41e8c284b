"""The loss head inside the engine: the options' checks shared by edbatch.nn.Cell and
edbatch.nn.Propagate (docs/pytorch.md, "The loss inside the engine")."""


def check_head(classes, reduction, owner):
    """Raises ValueError for a loss head option that makes no sense."""
    if classes is not None and (not isinstance(classes, int) or classes <= 0):
        raise ValueError(f"{owner}: classes must be a positive int (or None: no loss head), "
                         f"got {classes!r}")
    if reduction not in ("sum", "mean"):
        raise ValueError(f"{owner}: reduction must be 'sum' or 'mean', got {reduction!r}")


def head_weights(module, owner):
    """[weight, bias] of module.head, the loss head inside the engine."""
    if module.head is None:
        raise ValueError(f"{owner}.loss needs a loss head: make the module with classes=C")
    return [module.head.weight, module.head.bias]
