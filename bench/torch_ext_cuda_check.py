#!/usr/bin/env python3
"""The PyTorch extension on a GPU against itself on the CPU: every cell's per-node outputs and
the gradients of its inputs and weights, on the same seeded structures and weights, with the
module on cuda (which runs edbatch's CUDA backend on torch's tensors in place, on torch's current
stream) and on cpu; the same on a side stream; three optimizer steps, so the GPU reads weights
that changed between calls; three steps with each mini-batch prepared ahead (edbatch.prepare: the
call runs a graph and plan made on the worker thread, with x written into it on the device); and
an empty batch. Exits 1 on a mismatch beyond float32 tolerance,
2 when no GPU is usable.

    python3 bench/torch_ext_cuda_check.py
    # (EDBATCH_LIBRARY=path/libedbatch_torch.so if not installed)
"""
import random
import sys

import torch

import edbatch
import edbatch.packing


def structures():
    sst = edbatch.packing.synthetic_sst(40, vocab_size=300, seed=3)
    vocab = {}
    trees = edbatch.pack_sst(sst, vocab)
    lattices = edbatch.pack_lattices(edbatch.packing.synthetic_lattices(20, vocab_size=300, seed=5))
    rng = random.Random(9)
    dags = []
    for _ in range(15):
        size = rng.choice([1, 2, 5, 11, 17])
        arcs = [[(j, rng.randrange(2)) for j in rng.sample(range(k), min(k, rng.randint(1, 3)))]
                if k else [] for k in range(size)]
        dags.append({"types": [rng.randrange(3) for _ in range(size)],
                     "inputs": [rng.randrange(300) for _ in range(size)], "arcs": arcs})
    dags = edbatch.pack_dags(dags)
    return [
        ("random_dag", lambda: edbatch.nn.RandomDAG(300, 40, 36), dags),
        ("mvrnn", lambda: edbatch.nn.MVRNN(300, 12), trees),
        ("tree_lstm", lambda: edbatch.nn.TreeLSTM(300, 48, 48), trees),
        ("tree_gru", lambda: edbatch.nn.TreeGRU(300, 48), trees),
        ("lattice_lstm", lambda: edbatch.nn.LatticeLSTM(300, 48, 48), lattices),
        ("lattice_gru", lambda: edbatch.nn.LatticeGRU(300, 48, 48), lattices),
    ]


def run(make, packed, device, seed, steps=1, stream=None, prepare=False):
    """Outputs and gradients of the last of `steps` SGD steps, and the weights after them. With
    `prepare`, each step's call is prepared ahead (and must have used it)."""
    used = edbatch.prepare_stats()["used"]
    torch.manual_seed(seed)
    m = make()
    m.to(device)
    p = packed.to(device)
    # Steps of bounded size (the gradient's norm clipped to 1): the lattice GRU's unnormalised
    # arc sums give gradients of ~1e6, and unclipped steps that large make the next steps chaotic,
    # so that float32 rounding differences (a CPU run under another batching policy included)
    # would grow beyond any tolerance over three steps.
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        with torch.cuda.stream(stream) if stream is not None else _nothing():
            opt.zero_grad()
            if prepare:
                m.prepare(p)
            outs = m(p)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            loss = sum((o * torch.randn(o.shape, generator=g).to(device)).sum() for o in outs)
            loss.backward()
            grads = {n: q.grad.detach().cpu().clone() for n, q in m.named_parameters()
                     if q.grad is not None}
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
    if prepare and edbatch.prepare_stats()["used"] != used + steps:
        raise RuntimeError("a prepared mini-batch was not used")
    weights = {n: q.detach().cpu() for n, q in m.named_parameters()}
    return [o.detach().cpu() for o in outs], grads, weights


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


def error(a, b):
    """Largest difference relative to the larger of 1 and the reference's largest magnitude."""
    return (a - b).abs().max().item() / max(1.0, b.abs().max().item())


def main():
    if not torch.cuda.is_available():
        print("no GPU: nothing checked", file=sys.stderr)
        return 2
    bad = 0
    side = torch.cuda.Stream()
    for name, make, packed in structures():
        runs = (("", 1, None, False), (", side stream", 1, side, False),
                (", 3 SGD steps", 3, None, False), (", 3 SGD steps prepared ahead", 3, None, True))
        for what, steps, stream, prepare in runs:
            out_gpu, g_gpu, w_gpu = run(make, packed, "cuda", 7, steps, stream, prepare)
            out_cpu, g_cpu, w_cpu = run(make, packed, "cpu", 7, steps)
            torch.cuda.synchronize()
            out_err = max(error(a, b) for a, b in zip(out_gpu, out_cpu))
            worst = max(g_cpu, key=lambda k: error(g_gpu[k], g_cpu[k]) if k in g_gpu else 1.0)
            grad_err = error(g_gpu[worst], g_cpu[worst]) if worst in g_gpu else float("inf")
            w_err = max(error(w_gpu[k], w_cpu[k]) for k in w_cpu)
            # The GPU sums weight gradients over nodes with atomics, in another order than the
            # CPU; with the lattice GRU's unnormalised arc sums that alone moves them by ~1e-4 of
            # the largest. Later steps start from weights that differ by that much.
            tol = 1e-5 if steps == 1 else 1e-3
            ok = (g_gpu.keys() == g_cpu.keys() and out_err <= tol and grad_err <= 1e-3
                  and w_err <= 1e-3)
            print(f"{name}{what}: {packed.num_nodes} nodes, {len(g_cpu)} gradients: "
                  f"{'cuda = cpu' if ok else 'MISMATCH'} (outputs {out_err:.1e}, "
                  f"gradients {grad_err:.1e} at {worst}, weights {w_err:.1e}; relative to "
                  f"max(1, |cpu|))")
            bad += not ok
    # An empty batch: no outputs, zero gradients, on the GPU too.
    m = edbatch.nn.TreeLSTM(300, 16, 16).cuda()
    empty = edbatch.pack_sst([], {}).to("cuda")
    h, c = m(empty)
    (h.sum() + c.sum()).backward()
    torch.cuda.synchronize()
    ok = h.shape == (0, 16) and all(float(q.grad.abs().sum()) == 0 for q in m.parameters()
                                    if q.grad is not None)
    print(f"empty batch on cuda: {'ok' if ok else 'WRONG'}")
    bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
