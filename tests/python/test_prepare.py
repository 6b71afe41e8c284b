"""Preparing mini-batches ahead (edbatch.prepare / prefetch): a call that finds its structure
prepared gives exactly the outputs and gradients of a call that builds everything itself, calls
that do not match (another structure, a structure changed in place, other options) are not
served a stale plan, and a bad structure fails at the call as it would unprepared."""
import os
import subprocess
import sys

import pytest
import torch

import edbatch

import reference
from test_ops import H, structures, weights_for


def step(cell, packed, x, w, node_types, arc_types, **options):
    """Outputs and the gradients of x and every weight for fixed upstream gradients."""
    x = x.detach().clone().requires_grad_()
    w = {k: v.detach().clone().requires_grad_() for k, v in w.items()}
    outputs = edbatch.run_cell(cell, x, packed, list(w.values()), H, node_types, arc_types,
                               threads=1, **options)
    g = torch.Generator().manual_seed(7)
    sum((o * torch.randn(o.shape, generator=g)).sum() for o in outputs).backward()
    return [o.detach() for o in outputs] + [x.grad] + [p.grad for p in w.values()]


def assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert torch.equal(u, v)


def counts():
    return edbatch.prepare_stats()


def case(cell, seed):
    packed, input_size, node_types, arc_types = structures(cell, seed)
    w = weights_for(cell, input_size, node_types, arc_types, seed)
    x = torch.randn(packed.input_ids.numel(), input_size,
                    generator=torch.Generator().manual_seed(seed + 1))
    return packed, input_size, node_types, arc_types, w, x


@pytest.mark.parametrize("cell", list(reference.CELLS))
def test_prepared_call_equals_unprepared(cell):
    packed, input_size, nt, at, w, x = case(cell, 11)
    want = step(cell, packed, x, w, nt, at)
    before = counts()
    edbatch.prepare(cell, packed, input_size, H, num_node_types=nt, num_arc_types=at, threads=1)
    got = step(cell, packed, x, w, nt, at)
    assert counts()["used"] == before["used"] + 1
    assert_same(got, want)
    # The same structure with other rows of x: the prepared graph takes the call's x.
    x2 = torch.randn(x.shape, generator=torch.Generator().manual_seed(12))
    want2 = step(cell, packed, x2, w, nt, at)
    edbatch.prepare(cell, packed, input_size, H, num_node_types=nt, num_arc_types=at, threads=1)
    assert_same(step(cell, packed, x2, w, nt, at), want2)
    assert counts()["used"] == before["used"] + 2


def test_other_structures_and_options_are_not_served_the_prepared_plan():
    cell = "tree_lstm"
    a, input_size, nt, at, w, x = case(cell, 21)
    b = structures(cell, 22)[0]
    xb = torch.randn(b.input_ids.numel(), input_size)
    want_b = step(cell, b, xb, w, nt, at)
    before = counts()
    edbatch.prepare(cell, a, input_size, H, threads=1)
    assert_same(step(cell, b, xb, w, nt, at), want_b)  # another structure: built anew
    assert_same(step(cell, a, x, w, nt, at, policy="depth"), step(cell, a, x, w, nt, at,
                                                                     policy="depth"))
    assert counts()["used"] == before["used"]
    # The structure changed in place after prepare: the children of the last root swap, which
    # changes the result (separate forget-gate weights per child).
    root = a.instance_offsets[-1].item() - 1
    lo, hi = a.pred_ptr[root].item(), a.pred_ptr[root + 1].item()
    assert hi - lo == 2
    a.pred_ids[lo:hi] = a.pred_ids[lo:hi].flip(0).clone()
    swapped_want = step(cell, a, x, w, nt, at)
    a.pred_ids[lo:hi] = a.pred_ids[lo:hi].flip(0).clone()
    original = step(cell, a, x, w, nt, at)
    assert not torch.equal(swapped_want[0], original[0])
    edbatch.prepare(cell, a, input_size, H, threads=1)
    a.pred_ids[lo:hi] = a.pred_ids[lo:hi].flip(0).clone()
    used = counts()["used"]
    assert_same(step(cell, a, x, w, nt, at), swapped_want)
    assert counts()["used"] == used


def test_bad_structure_fails_at_the_call():
    packed = edbatch.pack_trees([((1, 2), 3), 4])
    packed.pred_ids = torch.tensor([0, 1, 2, 5])  # a child after its parent
    weights = [torch.randn(s) for _, s in edbatch.weight_shapes("tree_lstm", H, 5)]
    before = counts()
    edbatch.prepare("tree_lstm", packed, 5, H)  # returns at once; the worker finds the error
    with pytest.raises(ValueError, match="predecessors must come before it"):
        edbatch.run_cell("tree_lstm", torch.randn(4, 5), packed, weights, H)
    assert counts()["failed"] == before["failed"] + 1
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        edbatch.prepare("tree_lstm", packed, 5, H, policy="fastest")
    with pytest.raises(ValueError, match="unknown cell 'tree_rnn'"):
        edbatch.prepare("tree_rnn", packed, 5, H)
    with pytest.raises(ValueError, match="number of x rows must not be negative, got -1"):
        edbatch.prepare("tree_lstm", packed, 5, H, num_x=-1)
    bad = edbatch.pack_trees([((1, 2), 3), 4])
    bad.pred_ids = bad.pred_ids.int()
    with pytest.raises(TypeError, match="pred_ids must be int64, got Int"):
        edbatch.prepare("tree_lstm", bad, 5, H)


def test_more_prepared_than_kept():
    cell = "tree_lstm"
    cases = [case(cell, 30 + i) for i in range(10)]
    wants = [step(cell, p, x, w, nt, at) for p, _, nt, at, w, x in cases]
    before = counts()
    for p, input_size, *_ in cases:
        edbatch.prepare(cell, p, input_size, H, threads=1)
    after = counts()
    # 9 wait at most: the oldest go, first any left from before, then 1 of these.
    assert after["waiting"] == 9
    # A second worker starts when a preparation waits while the first is busy, never a third.
    assert 1 <= after["workers"] <= 2
    assert after["dropped"] == before["dropped"] + before["waiting"] + 1
    for (p, _, nt, at, w, x), want in zip(cases, wants):
        assert_same(step(cell, p, x, w, nt, at), want)
    assert counts()["used"] == before["used"] + 9


@pytest.mark.parametrize("depth", [1, 2, 3, 8])
def test_prefetch_with_a_module(depth):
    """Prefetching 1, 2, 3 or 8 ahead (two workers preparing side by side): the same outputs,
    and every mini-batch after the first served prepared."""
    torch.manual_seed(0)
    model = edbatch.nn.TreeLSTM(50, 5, H, threads=1)
    packs = [structures("tree_lstm", 40 + i)[0] for i in range(12 if depth == 8 else 4)]
    with torch.no_grad():
        want = [model(p)[0] for p in packs]
    before = counts()
    seen = []
    for p in edbatch.prefetch(model, packs, depth=depth):
        h, c = model(p)
        (h.sum() + c.sum()).backward()
        seen.append(h.detach())
    assert len(seen) == len(packs)
    for a, b in zip(seen, want):
        assert torch.equal(a, b)
    assert counts()["used"] == before["used"] + len(packs) - 1  # every one after the first
    assert list(edbatch.prefetch(model, [])) == []


def test_prefetch_order_and_depth():
    """prefetch prepares `depth` mini-batches ahead of the one it yields, each once, in order."""
    log = []

    class Recorder:
        def prepare(self, packed):
            log.append(("prepare", packed))

    for depth, want in [(1, "p1 s0 p2 s1 p3 s2 s3"), (2, "p1 p2 s0 p3 s1 s2 s3"),
                        (8, "p1 p2 p3 s0 s1 s2 s3")]:
        log.clear()
        for b in edbatch.prefetch(Recorder(), range(4), depth=depth):
            log.append(("step", b))
        assert " ".join(f"{k[0]}{b}" for k, b in log) == want
    for bad in (0, 9, 1.5, True, "2"):
        with pytest.raises(ValueError, match="depth must be an integer from 1 to 8"):
            list(edbatch.prefetch(Recorder(), range(3), depth=bad))


def _run_fresh(code, **env_vars):
    """Runs `code` in a new Python process (a runner pool of its own) with `env_vars` set;
    returns its completed process, checked to have succeeded."""
    env = dict(os.environ, **env_vars)
    if env.get("EDBATCH_LIBRARY"):  # the checkout's package, as conftest.py uses
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "..",
                                                          "python"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_host_profile_is_printed_at_exit():
    """EDBATCH_TORCH_PROFILE=1: the adapter's host time by phase, printed when the process ends."""
    code = ("import torch, edbatch; m = edbatch.nn.TreeLSTM(50, 5, 7, threads=1); "
            "p = edbatch.pack_trees([((1, 2), 3), 4]); m.prepare(p); h, c = m(p); "
            "(h.sum() + c.sum()).backward()")
    done = _run_fresh(code, EDBATCH_TORCH_PROFILE="1")
    line = [l for l in done.stderr.splitlines() if l.startswith("edbatch adapter host time")]
    assert len(line) == 1, done.stderr
    for phase in ("check", "weights", "graph build"):
        assert f" {phase} " in line[0]
    assert line[0].endswith(" 1 calls")


def test_a_second_worker_starts_only_while_the_first_is_busy():
    """In a fresh process: preparations each taken before the next is asked for keep one worker;
    three asked back to back, each of about 9,500 nodes, start a second; never a third."""
    code = ("import random, edbatch\n"
            "def tree(rng, n):\n"
            "    return rng.randrange(50) if n == 1 else (tree(rng, n // 2), tree(rng, n - n // 2))\n"
            "rng = random.Random(5)\n"
            "m = edbatch.nn.TreeLSTM(50, 5, 7, threads=1)\n"
            "small = [edbatch.pack_trees([tree(rng, 5), tree(rng, 3)]) for _ in range(3)]\n"
            "for p in small:\n"
            "    m.prepare(p); m(p)\n"
            "print(edbatch.prepare_stats()['workers'])\n"
            "big = [edbatch.pack_trees([tree(rng, 40) for _ in range(120)]) for _ in range(3)]\n"
            "for p in big:\n"
            "    m.prepare(p)\n"
            "for p in big:\n"
            "    m(p)\n"
            "s = edbatch.prepare_stats()\n"
            "print(s['workers'], s['used'], s['prepared'])\n")
    assert _run_fresh(code).stdout.split("\n")[:2] == ["1", "2 6 6"]


def _user_step(model, packed, x):
    x = x.detach().clone().requires_grad_()
    for p in model.parameters():
        p.grad = None
    h, c = model(packed, x=x)
    g = torch.Generator().manual_seed(3)
    ((h * torch.randn(h.shape, generator=g)).sum() + (c * torch.randn(c.shape, generator=g)).sum()
     ).backward()
    return [h.detach(), c.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


def test_propagate_prepare_equals_unprepared():
    """User cells: Propagate.prepare (what edbatch.prefetch calls) serves the next forward with
    that structure, bitwise as an unprepared call; dropout while training is not prepared."""
    if not edbatch.propagate.has_propagate_op():
        pytest.skip("the loaded extension has no propagate op")
    import cells
    import structures as user_structures
    torch.manual_seed(21)
    model = edbatch.nn.Propagate(cells.LSTMCell(9, 5), cells.GateEdge(9, 5), state_size=(9, 9),
                                 threads=1)
    packed = user_structures.packed("trees", 21, edge_inputs="parent")
    x = torch.randn(packed.input_ids.numel(), 5, generator=torch.Generator().manual_seed(22))
    model.prepare(packed)  # not run yet, no input size: nothing to prepare
    before = counts()
    want = _user_step(model, packed, x)
    assert counts()["used"] == before["used"]
    model.prepare(packed)
    got = _user_step(model, packed, x)
    assert counts()["used"] == before["used"] + 1
    assert_same(got, want)
    # Another structure is not served the prepared plan.
    other = user_structures.packed("trees", 23, edge_inputs="parent")
    model.prepare(other)
    assert_same(_user_step(model, packed, x), want)
    assert counts()["used"] == before["used"] + 1
    # Dropout while training: masks are per call, nothing is prepared.
    drop = edbatch.nn.Propagate(cells.LSTMCell(9, 5, dropout=0.3), state_size=(9, 9)).train()
    drop(packed, x=x)
    prepared = counts()["prepared"]
    drop.prepare(packed)
    assert counts()["prepared"] == prepared


def test_propagate_prepare_with_ids():
    """Cells that embed ids prepare for the next mini-batch's ids (packed's, from its host
    copy): the forward with those ids is served the prepared graph, bitwise as unprepared; one
    with other ids (same structure) is not."""
    if not edbatch.propagate.has_propagate_op():
        pytest.skip("the loaded extension has no propagate op")
    import cells
    import structures as user_structures
    torch.manual_seed(5)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, 0, vocab=user_structures.VOCAB),
                                 state_size=7, threads=1)
    packed = user_structures.packed("dags", 31)

    def run(ids):
        for p in model.parameters():
            p.grad = None
        h = model(packed, ids=ids)
        (h * torch.randn(h.shape, generator=torch.Generator().manual_seed(4))).sum().backward()
        return [h.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = run(packed.input_ids)
    assert len(want) > 2  # the states, the embedding's gradient and more
    before = counts()
    model.prepare(packed)  # the last forward took ids: prepares for packed.input_ids
    assert counts()["prepared"] == before["prepared"] + 1
    assert_same(run(packed.input_ids), want)
    assert counts()["used"] == before["used"] + 1
    # Other ids with the same structure: the prepared graph is not used.
    other = (packed.input_ids + 1) % user_structures.VOCAB
    want_other = run(other)
    model.prepare(packed)
    assert_same(run(other), want_other)
    assert counts()["used"] == before["used"] + 1
    # ids given to prepare; a packed batch moved with to() runs on its host copy of the ids.
    moved = packed.to("cpu")
    model.prepare(moved, ids=other)
    assert_same(run(other), want_other)
    assert counts()["used"] == before["used"] + 2
    assert moved.host_input_ids() is not None and torch.equal(moved.host_input_ids(),
                                                              packed.input_ids)


@pytest.mark.parametrize("depth", [1, 2])
def test_prefetching_reuses_runners(depth):
    """A training loop that prefetches over a few mini-batches (one or two ahead) reaches a
    steady set of runners (each an engine, on a GPU with its own stream and arenas): none is
    made after the first round; the outputs are those of calls not prepared."""
    if not edbatch.propagate.has_propagate_op():
        pytest.skip("the loaded extension has no propagate op")
    import cells
    import structures as user_structures
    torch.manual_seed(8)
    model = edbatch.nn.Propagate(cells.LSTMCell(9, 5), cells.GateEdge(9, 5), state_size=(9, 9),
                                 threads=1)
    batches = [user_structures.packed("trees", s, edge_inputs="parent") for s in (41, 42, 43)]
    xs = [torch.randn(b.input_ids.numel(), 5) for b in batches]
    with torch.no_grad():
        want = [model(packed, x=x)[0] for packed, x in zip(batches, xs)]
    made = []
    for _ in range(3):
        for i, packed in enumerate(edbatch.prefetch(model, batches, depth=depth)):
            h, c = model(packed, x=xs[i])
            assert torch.equal(h, want[i])
            (h.sum() + c.sum()).backward()
        made.append(counts()["runners"])
    assert made[1] == made[2] and made[0] >= 1


def built_in_cell():
    model = edbatch.nn.TreeLSTM(50, 5, H, threads=1)
    p = structures("tree_lstm", 77)[0]
    return model, lambda: model(p)


def user_cell():
    import cells
    import structures as user_structures
    model = edbatch.nn.Propagate(cells.LSTMCell(9, 5), cells.GateEdge(9, 5), state_size=(9, 9),
                                 threads=1)
    p = user_structures.packed("trees", 44, edge_inputs="parent")
    x = torch.randn(p.input_ids.numel(), 5)
    return model, lambda: model(p, x=x)


@pytest.mark.parametrize("make", [built_in_cell, user_cell], ids=["built-in", "user"])
def test_plan_cache_budget(make):
    """A structure seen twice before runs on a reused plan (counted by plan_cache_stats) with
    bitwise the same outputs and gradients; set_plan_cache(0) makes new engines plan every call,
    built-in and user cells alike."""
    torch.manual_seed(0)
    model, call = make()
    previous = edbatch.set_plan_cache(64)
    try:
        results = {}
        for budget in (64, 0):
            edbatch.set_plan_cache(budget)
            assert edbatch.plan_cache_stats()["budget_mb"] == budget
            before = edbatch.plan_cache_stats()["plans_reused"]
            steps = []
            for _ in range(4):
                model.zero_grad()
                h, c = call()
                (h.sum() + 2 * c.sum()).backward()
                steps.append((h.detach(), [w.grad.clone() for w in model.parameters()]))
            results[budget] = (steps, edbatch.plan_cache_stats()["plans_reused"] - before)
        assert results[64][1] >= 2  # the third and fourth calls
        assert results[0][1] == 0
        ref_h, ref_grads = results[0][0][0]
        for steps, _ in results.values():
            for h, grads in steps:
                assert torch.equal(h, ref_h)
                assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    finally:
        edbatch.set_plan_cache(previous)
    for bad in (-1, float("nan"), 1e13):
        with pytest.raises(ValueError, match="budget must be from 0 to 2"):
            edbatch.set_plan_cache(bad)


def test_preparing_what_is_not_packed_is_refused():
    """A DataLoader without collate_fn=edbatch.collate hands lists: named, not an AttributeError."""
    model = edbatch.nn.TreeLSTM(50, 5, H, threads=1)
    for call in (lambda: model.prepare([(1, 2)]), lambda: list(edbatch.prefetch(model, [[1], [2]])),
                 lambda: edbatch.prepare("tree_lstm", [(1, 2)], 5, H)):
        with pytest.raises(TypeError, match="expected a packed batch .* got list"):
            call()


def test_idle_runners_are_let_go_beyond_their_bound():
    """Outputs kept for backward hold a runner each; given back when they go, at most 4 per
    configuration (16 in all) stay idle and the rest are let go, so a second round of kept
    outputs makes runners again instead of memory growing with the most ever in flight."""
    cell = "tree_lstm"
    packed, input_size, node_types, arc_types, w, x = case(cell, 60)
    w = {k: v.detach().clone().requires_grad_() for k, v in w.items()}

    def call():
        return edbatch.run_cell(cell, x, packed, list(w.values()), H, node_types, arc_types,
                                threads=1)

    kept = [call() for _ in range(12)]
    made = counts()["runners"]
    del kept
    assert counts()["idle"] <= 16
    kept = [call() for _ in range(12)]
    assert counts()["runners"] >= made + 8  # 12 in flight, at most 4 of them kept idle
    want = step(cell, packed, x, w, node_types, arc_types)
    del kept
    assert_same(step(cell, packed, x, w, node_types, arc_types), want)
    assert counts()["idle"] <= 16
