"""Run by the Python of an environment where edbatch was installed with pip (test_pip_install.py,
scripts/gpu_pip.sh): the package is the installed one, and its built-in tree_lstm cell equals the
pure-PyTorch reference (reference.py) in values and gradients, on the CPU and, with --cuda, on the
GPU. Prints one JSON line."""
import argparse
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # reference.py
import reference  # noqa: E402

import edbatch  # noqa: E402

H, D = 7, 5


def tree(rng, leaves):
    if leaves == 1:
        return rng.randrange(30)
    cut = rng.randint(1, leaves - 1)
    return (tree(rng, cut), tree(rng, leaves - cut))


def run(device, packed, w, x):
    """tree_lstm's [h, c] and the gradients of x and every weight, on `device`."""
    x = x.detach().to(device).requires_grad_()
    weights = [v.detach().to(device).requires_grad_() for v in w.values()]
    out = edbatch.run_cell("tree_lstm", x, packed, weights, H)
    (out[0].sum() + 2 * out[1].sum()).backward()
    return [o.detach().cpu() for o in out], [t.grad.cpu() for t in [x] + weights]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true", help="also run on the GPU")
    args = parser.parse_args()
    rng = random.Random(5)
    packed = edbatch.pack_trees([tree(rng, n) for n in (1, 3, 6, 11)])
    g = torch.Generator().manual_seed(3)
    w = {n: 0.5 * torch.randn(s, generator=g) for n, s in edbatch.weight_shapes("tree_lstm", H, D)}
    x = torch.randn(packed.input_ids.numel(), D, generator=g)

    wr = {n: v.clone().requires_grad_() for n, v in w.items()}
    xr = x.clone().requires_grad_()
    want = reference.tree_lstm(xr, packed, wr)
    (want[0].sum() + 2 * want[1].sum()).backward()
    want_grads = [xr.grad] + [v.grad for v in wr.values()]

    result = {"module": edbatch.__file__, "backends": edbatch.backends()}
    for device in ["cpu"] + (["cuda"] if args.cuda else []):
        out, grads = run(device, packed, w, x)
        for a, b in zip(out, want):
            torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-5)
        for a, b in zip(grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        result[device] = {"nodes": packed.num_nodes,
                          "max_error": max((a - b.detach()).abs().max().item()
                                           for a, b in zip(out, want))}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
