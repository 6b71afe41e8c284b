#!/usr/bin/env python3
"""The PyTorch extension on a GPU against itself on the CPU: every cell's per-node outputs and
the gradients of its inputs and weights, on the same seeded structures and weights, with the
module on cuda (which runs edbatch's CUDA backend) and on cpu. Exits 1 on a mismatch beyond
float32 tolerance, 2 when no GPU is usable.

    python3 bench/torch_ext_cuda_check.py     # EDBATCH_LIBRARY=path/libedbatch_torch.so if not installed
"""
import sys

import torch

import edbatch
import edbatch.packing


def structures():
    sst = edbatch.packing.synthetic_sst(40, vocab_size=300, seed=3)
    vocab = {}
    trees = edbatch.pack_sst(sst, vocab)
    lattices = edbatch.pack_lattices(edbatch.packing.synthetic_lattices(20, vocab_size=300, seed=5))
    return [
        ("tree_lstm", lambda: edbatch.nn.TreeLSTM(300, 48, 48), trees),
        ("tree_gru", lambda: edbatch.nn.TreeGRU(300, 48), trees),
        ("lattice_lstm", lambda: edbatch.nn.LatticeLSTM(300, 48, 48), lattices),
        ("lattice_gru", lambda: edbatch.nn.LatticeGRU(300, 48, 48), lattices),
    ]


def run(make, packed, device, seed):
    torch.manual_seed(seed)
    m = make()
    m.to(device)
    p = packed.to(device)
    outs = m(p)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    g = torch.Generator().manual_seed(seed + 1)
    loss = sum((o * torch.randn(o.shape, generator=g).to(device)).sum() for o in outs)
    loss.backward()
    grads = {n: q.grad.detach().cpu() for n, q in m.named_parameters() if q.grad is not None}
    return [o.detach().cpu() for o in outs], grads


def error(a, b):
    """Largest difference relative to the larger of 1 and the reference's largest magnitude."""
    return (a - b).abs().max().item() / max(1.0, b.abs().max().item())


def main():
    if not torch.cuda.is_available():
        print("no GPU: nothing checked", file=sys.stderr)
        return 2
    bad = 0
    for name, make, packed in structures():
        out_gpu, g_gpu = run(make, packed, "cuda", 7)
        out_cpu, g_cpu = run(make, packed, "cpu", 7)
        out_err = max(error(a, b) for a, b in zip(out_gpu, out_cpu))
        worst = max(g_cpu, key=lambda k: error(g_gpu[k], g_cpu[k]) if k in g_gpu else 1.0)
        grad_err = error(g_gpu[worst], g_cpu[worst]) if worst in g_gpu else float("inf")
        # The GPU sums weight gradients over nodes with atomics, in another order than the CPU;
        # with the lattice GRU's unnormalised arc sums that alone moves them by ~1e-4 of the largest.
        ok = g_gpu.keys() == g_cpu.keys() and out_err <= 1e-5 and grad_err <= 1e-3
        print(f"{name}: {packed.num_nodes} nodes, {len(g_cpu)} gradients: "
              f"{'cuda = cpu' if ok else 'MISMATCH'} (outputs {out_err:.1e}, "
              f"gradients {grad_err:.1e} at {worst}; relative to max(1, |cpu|))")
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
