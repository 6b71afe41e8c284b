"""What the extension's ops read, checked when autograd runs their backward: an op keeps what its
backward needs, so x or a weight changed in place in between (an optimizer step before backward)
would give gradients at the old values without a word. PyTorch's own operations raise then, for
the tensors they save; these ops raise the same error for x and every weight."""
import weakref


def check_unchanged(outputs, x, weights, names, owner):
    """Makes autograd raise RuntimeError where it runs the op's backward (reached through
    `outputs`) if x or a weight was changed in place since now, as PyTorch compares a saved
    tensor's version. names(): x's and the weights' names, asked for only then."""
    nodes = {o.grad_fn for o in outputs if o.grad_fn is not None}
    if not nodes:
        return
    if getattr(x, "is_inference", lambda: False)():
        raise RuntimeError(f"{owner}: x was made under torch.inference_mode, and such tensors "
                           f"cannot be saved for backward (as in PyTorch): clone it outside "
                           f"inference mode (x.clone()), or run the module inside it too")
    # x is not kept alive for this (a view's version is its base's, which outlives the view);
    # the weights are (parameters, or what the call computed from them).
    base = x if x._base is None else x._base
    x_ref, x_version = weakref.ref(base), x._version
    versions = [w._version for w in weights]

    def check(grad_inputs, grad_outputs):
        changed = [(0, x_ref(), x_version)] + [
            (i + 1, w, v) for i, (w, v) in enumerate(zip(weights, versions))]
        for i, t, version in changed:
            if t is not None and t._version != version:
                raise RuntimeError(
                    f"{owner}: one of the variables needed for gradient computation has been "
                    f"modified by an inplace operation: {names()[i]} is at version "
                    f"{t._version}; expected version {version} instead (x and the weights "
                    f"must stay as they were from the forward to its backward: step the "
                    f"optimizer, or change them otherwise in place, after backward)")

    for node in nodes:
        node.register_hook(check)
