"""Every cell's forward outputs and gradients equal the pure-PyTorch reference on seeded random
structures (single-node instances and empty batches included); bad inputs raise clear errors."""
import os
import random
import re
import subprocess
import sys

import pytest
import torch

import edbatch
from edbatch.packing import synthetic_lattices

import reference

H, D = 7, 5  # awkward sizes: not multiples of the vector width


def random_tree(rng, leaves):
    if leaves == 1:
        return rng.randrange(50)
    cut = rng.randint(1, leaves - 1)
    return (random_tree(rng, cut), random_tree(rng, leaves - cut))


def random_dags(rng, n, state_types, arc_types):
    records = []
    for _ in range(n):
        size = rng.choice([1, 2, 5, 11])
        arcs = [[(j, rng.randrange(arc_types)) for j in rng.sample(range(k), min(k, rng.randint(1, 3)))]
                if k else [] for k in range(size)]
        records.append({"types": [rng.randrange(state_types) for _ in range(size)],
                        "inputs": [rng.randrange(50) for _ in range(size)], "arcs": arcs})
    return records


def structures(cell, seed, empty=False):
    """(packed, input size, node types, arc types) for a cell."""
    rng = random.Random(seed)
    n = 0 if empty else 6
    if cell in ("tree_lstm", "tree_gru", "mvrnn"):
        # Leaves 1 (a single-node instance), 2, 3, 7, ...
        packed = edbatch.pack_trees([random_tree(rng, l) for l in [1, 2, 3, 7, 1, 13][:n]])
        input_size = {"tree_lstm": D, "tree_gru": H, "mvrnn": H + H * H}[cell]
        return packed, input_size, 1, 1
    if cell.startswith("lattice"):
        records = synthetic_lattices(n, vocab_size=50, seed=seed, min_len=1, max_len=9,
                                     word_prob=0.5)
        return edbatch.pack_lattices(records), D, 1, 2
    return edbatch.pack_dags(random_dags(rng, n, 3, 2)), D, 3, 2


def weights_for(cell, input_size, node_types, arc_types, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = edbatch.weight_shapes(cell, H, input_size, node_types, arc_types)
    return {name: (0.5 * torch.randn(shape, generator=g)).requires_grad_() for name, shape in shapes}


def run_both(cell, seed, empty=False, **options):
    packed, input_size, node_types, arc_types = structures(cell, seed, empty)
    w = weights_for(cell, input_size, node_types, arc_types, seed)
    rows = packed.input_ids.numel()
    x = torch.randn(rows, input_size, generator=torch.Generator().manual_seed(seed + 1))
    x.requires_grad_()
    ours = edbatch.run_cell(cell, x, packed, list(w.values()), H, node_types, arc_types,
                            **options)
    ref = reference.CELLS[cell](x, packed, w)
    return packed, x, w, ours, ref


def grads(outputs, upstream, x, w):
    for p in [x, *w.values()]:
        p.grad = None
    sum((o * g).sum() for o, g in zip(outputs, upstream)).backward()
    return [x.grad.clone()] + [p.grad.clone() for p in w.values()]


# Gradients against the reference in float64, within this share of the gradient's scale. The
# MV-RNN multiplies per-node matrices along every path of a tree, so float32 rounding grows with
# its depth: about 4e-5 of the scale here, and 2.6e-5 for the float32 reference itself.
GRAD_TOL = {"mvrnn": 1e-4}


@pytest.mark.parametrize("cell", list(reference.CELLS))
@pytest.mark.parametrize("seed", [1, 2])
def test_forward_and_gradients_equal_reference(cell, seed):
    packed, x, w, ours, ref = run_both(cell, seed)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.shape[0] == packed.num_nodes
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    g = torch.Generator().manual_seed(seed + 3)
    upstream = [torch.randn(o.shape, generator=g) for o in ours]
    got = grads(ours, upstream, x, w)
    x64 = x.detach().double().requires_grad_()
    w64 = {k: v.detach().double().requires_grad_() for k, v in w.items()}
    want = grads(reference.CELLS[cell](x64, packed, w64), [u.double() for u in upstream], x64,
                 w64)
    names = ["x"] + list(w)
    for name, a, b in zip(names, got, want):
        # float32 sums of many terms: the absolute tolerance follows the gradient's scale.
        atol = GRAD_TOL.get(cell, 1e-5) * max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=atol,
                                   msg=f"gradient of {name}")


@pytest.mark.parametrize("cell", list(reference.CELLS))
def test_empty_batch(cell):
    packed, x, w, ours, _ = run_both(cell, 3, empty=True)
    assert packed.num_instances == 0
    for o in ours:
        assert o.shape[0] == 0
    sum(o.sum() for o in ours).backward()
    for p in w.values():
        assert p.grad is None or torch.count_nonzero(p.grad) == 0


@pytest.mark.parametrize("options", [{"policy": "none"}, {"policy": "depth"},
                                     {"policy": "agenda", "threads": 2}])
def test_policies_and_threads_agree(options):
    _, _, _, base, _ = run_both("tree_lstm", 4)
    _, _, _, other, _ = run_both("tree_lstm", 4, **options)
    for a, b in zip(base, other):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_finite_differences_tree_lstm():
    """Central differences of the float32 op (step 1e-2) against its analytic gradient."""
    packed, x, w, ours, _ = run_both("tree_lstm", 5)
    g = torch.Generator().manual_seed(11)
    upstream = [torch.randn(o.shape, generator=g) for o in ours]
    analytic = grads(ours, upstream, x, w)
    params = [x, *w.values()]
    rng = random.Random(0)

    def loss():
        with torch.no_grad():
            out = edbatch.run_cell("tree_lstm", x, packed, list(w.values()), H)
            return sum((o.double() * g.double()).sum() for o, g in zip(out, upstream)).item()

    eps = 1e-2
    for i, p in enumerate(params):
        for _ in range(3):
            idx = tuple(rng.randrange(s) for s in p.shape)
            with torch.no_grad():
                old = p[idx].item()
                p[idx] = old + eps
                up = loss()
                p[idx] = old - eps
                down = loss()
                p[idx] = old
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - analytic[i][idx].item()) < 2e-3 + 2e-2 * abs(numeric), (i, idx)


def test_gradcheck_float64_reference_agrees():
    """The reference's gradients pass torch.autograd.gradcheck in float64 on a small tree, so the
    comparison above checks against verified gradients."""
    packed = edbatch.pack_trees([((1, 2), 3)])
    w = {n: torch.randn(s, dtype=torch.float64, requires_grad=True)
         for n, s in edbatch.weight_shapes("tree_lstm", 3, 2)}
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    names = list(w)

    def f(x, *ws):
        return reference.tree_lstm(x, packed, dict(zip(names, ws)))[0]

    assert torch.autograd.gradcheck(f, (x, *w.values()))


def test_no_grad_and_inference():
    packed, x, w, ours, _ = run_both("lattice_lstm", 6)
    with torch.no_grad():
        a = edbatch.run_cell("lattice_lstm", x, packed, list(w.values()), H, 1, 2)
    with torch.inference_mode():
        b = edbatch.run_cell("lattice_lstm", x, packed, list(w.values()), H, 1, 2)
    for o, p, q in zip(ours, a, b):
        assert not p.requires_grad
        torch.testing.assert_close(o.detach(), p)
        torch.testing.assert_close(p, q)


# ---- bad inputs ----

def tree_call(**change):
    packed = edbatch.pack_trees([((1, 2), 3), 4])
    for k, v in change.items():
        setattr(packed, k, v)
    w = [torch.randn(s) for _, s in edbatch.weight_shapes("tree_lstm", H, D)]
    return packed, w


def test_wrong_dtypes():
    packed, w = tree_call()
    with pytest.raises(TypeError, match="x must be float32"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D, dtype=torch.float64), packed, w, H)
    packed, w = tree_call(pred_ids=torch.tensor([0, 1, 2, 3], dtype=torch.int32))
    with pytest.raises(TypeError, match="pred_ids must be int64"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D), packed, w, H)
    packed, w = tree_call()
    w[3] = w[3].double()
    with pytest.raises(TypeError, match="weight b_i must be float32"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D), packed, w, H)


def test_mismatched_weight_shapes():
    packed, w = tree_call()
    w[6] = torch.randn(H, H)
    with pytest.raises(ValueError, match=r"weight U_i has shape \(7, 7\), expected \(7, 14\)"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D), packed, w, H)
    with pytest.raises(ValueError, match="takes 12 weights"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D), packed, w[:-1], H)


def test_wrong_devices():
    packed, w = tree_call()
    moved = packed.to("meta")
    # Structure tensors stay on the host (the extension reads them there); rows and labels move.
    assert moved.node_inputs.device.type == "cpu" and moved.pred_ids.device.type == "cpu"
    assert moved.input_ids.device.type == "meta" and moved.labels.device.type == "meta"
    moved.node_inputs = moved.node_inputs.to("meta")
    with pytest.raises(ValueError, match="packed.node_inputs is on meta"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D), moved, w, H)


def test_inconsistent_structures():
    x = torch.randn(4, D)
    packed, w = tree_call(pred_ids=torch.tensor([0, 1, 2, 5]))  # a child after its parent
    with pytest.raises(ValueError, match="predecessors must come before it"):
        edbatch.run_cell("tree_lstm", x, packed, w, H)
    packed, w = tree_call(pred_ptr=torch.tensor([0, 0, 0, 2, 0, 4, 4]))
    with pytest.raises(ValueError, match="pred_ptr decreases at node 3"):
        edbatch.run_cell("tree_lstm", x, packed, w, H)
    packed, w = tree_call(instance_offsets=torch.tensor([0, 5, 4]))
    with pytest.raises(ValueError, match="instance 1 has no nodes"):
        edbatch.run_cell("tree_lstm", x, packed, w, H)
    packed, w = tree_call(node_inputs=torch.tensor([0, 1, -1, 2, -1, 9]))
    with pytest.raises(ValueError, match="node_types has 6 entries, expected|reads input row 9"):
        edbatch.run_cell("tree_lstm", x, packed, w, H)
    packed, w = tree_call()
    with pytest.raises(ValueError, match=r"reads input row 3 \(of x or ids\), outside"):
        edbatch.run_cell("tree_lstm", x[:3], packed, w, H)
    # A node with one child is not a binary tree node.
    packed = edbatch.pack_trees([((1,), 2)])
    with pytest.raises(ValueError, match="node 1 has 1 children"):
        edbatch.run_cell("tree_lstm", torch.randn(2, D), packed, w, H)
    with pytest.raises(ValueError, match="unknown cell 'tree_rnn'"):
        edbatch.weight_shapes("tree_rnn", H, D)


def test_unknown_policy():
    packed, w = tree_call()
    with pytest.raises(ValueError, match=r"\[make_policy\] unknown policy 'fastest'"):
        edbatch.run_cell("tree_lstm", torch.randn(4, D), packed, w, H, policy="fastest")


def test_the_op_itself_explains_bad_inputs():
    """The op checks everything on its own (the Python wrapper only explains its failures)."""
    packed, w = tree_call()
    x = torch.randn(4, D)
    op = torch.ops.edbatch.run_cell

    def call(x=x, structure=packed.structure(), weights=w):
        return op("tree_lstm", x, *structure, weights, H, 1, 1, "lb-greedy", 1)

    bad_shape = list(w)
    bad_shape[6] = torch.randn(H, H)
    cases = [
        (dict(x=x.double()), "x must be float32, got Double"),
        # x's columns are the cell's input size, so the weights no longer fit.
        (dict(x=torch.randn(4, D + 1)), r"weight W_i has shape \[7, 5\], expected \[7, 6\]"),
        (dict(weights=bad_shape), r"weight U_i has shape \[7, 7\], expected \[7, 14\]"),
        (dict(weights=w[:-1]), "12 weights expected, got 11"),
        (dict(weights=[t.double() if i == 3 else t for i, t in enumerate(w)]),
         "weight b_i must be float32, got Double"),
        (dict(structure=packed.structure()[:3] + (packed.pred_ids.int(),) +
              packed.structure()[4:]), "pred_ids must be int64, got Int"),
        (dict(structure=(packed.node_inputs.view(2, 3),) + packed.structure()[1:]),
         r"node_inputs must be 1-D, got shape \[2, 3\]"),
        (dict(structure=packed.structure()[:1] + (packed.node_types[:-1],) +
              packed.structure()[2:]), "node_types has 5 entries, expected 6"),
    ]
    for change, message in cases:
        # A wrong dtype is a TypeError, as in torch; other refusals ValueErrors.
        error = TypeError if re.search("must be (float32|int64)", message) else ValueError
        with pytest.raises(error, match=message):
            call(**change)


def test_pred_ptr_passing_the_arcs_is_refused_before_any_arc_is_read():
    # pred_ptr rises past the number of arcs and comes back down: refused before reading
    # pred_ids past its end (the fuzzer's heap overflow read).
    x = torch.randn(4, D)
    packed, w = tree_call(pred_ptr=torch.tensor([0, 0, 0, 9, 2, 4, 4]))
    with pytest.raises(ValueError, match="pred_ptr\\[3\\] = 9 passes the number of arcs 4"):
        edbatch.run_cell("tree_lstm", x, packed, w, H)


def test_library_messages_keep_their_lines():
    """A library error's lines after its first (what did not match) stay in the error, of the
    class the op raised (ValueError for what it refuses, RuntimeError for a failure while
    running); libtorch's backtrace goes; errors from elsewhere are raised as they are."""
    lines = "[FsmPolicy] does not match; types it lacks:\n  block:a\n  sum(2*->2)"
    backtrace = "\nException raised from check at fsm.cpp:1 (most recent call first):\n#0"
    for kind in (ValueError, RuntimeError, TypeError):
        with pytest.raises(kind) as info:
            edbatch.ops._reraise(kind(lines + backtrace))
        assert type(info.value) is kind and str(info.value) == lines
    with pytest.raises(RuntimeError, match="not ours"):
        edbatch.ops._reraise(RuntimeError("not ours"))


def test_out_of_memory_is_a_memory_error(tmp_path):
    """Memory the engine cannot have is a MemoryError naming what could not grow (it was a
    ValueError); torch's own allocator failing inside the op stays torch's RuntimeError."""
    script = tmp_path / "oom.py"
    script.write_text(
        "import resource, sys, torch, edbatch\n"
        "vocab = {}\n"
        "tree = '(2 (2 a) (2 b))'\n"
        "packed = edbatch.pack_sst([tree] * 4000, vocab)\n"
        "model = edbatch.nn.TreeLSTM(vocab_size=len(vocab), input_size=512, hidden_size=512)\n"
        "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1])\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
        "resource.setrlimit(resource.RLIMIT_AS, ((vm + int(sys.argv[1])) * 1024, hard))\n"
        "try:\n"
        "    model(packed)\n"
        "except BaseException as e:\n"
        "    print(type(e).__name__, e)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    out = {}
    for room in (200 * 1024, 8 * 1024):  # KiB: the arena fails first, then torch's own output
        r = subprocess.run([sys.executable, str(script), str(room)], capture_output=True,
                           text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        out[room] = r.stdout
    assert out[200 * 1024].startswith(
        "MemoryError [cpu] out of memory: a mini-batch's values, adjoints or scratch could not "
        "grow from 0.0 to "), out
    assert out[8 * 1024].startswith("RuntimeError "), out
    # The mapping by message, as the op gives it:
    with pytest.raises(MemoryError, match="could not grow"):
        edbatch.ops._reraise(RuntimeError("[cpu] out of memory: x could not grow\nException raised"
                                          " from f at a.cpp:1"))
    cuda_oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    with pytest.raises(cuda_oom, match="cudaMallocAsync"):
        edbatch.ops._reraise(RuntimeError("[cuda] cudaMallocAsync(&p, n, s): out of memory (b.cpp:2)"))
    with pytest.raises(RuntimeError, match="enforce fail"):
        edbatch.ops._reraise(RuntimeError("[enforce fail at alloc_cpu.cpp:75] err == 0. "
                                          "DefaultCPUAllocator: can't allocate memory"))
