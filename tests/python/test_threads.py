"""Python threads and fork: a cell's first call traces it with torch's factories and fx's
operators set for the process, so traces take turns and other threads' calls run as usual; a
child forked while preparations were queued or running computes as the parent would."""
import os
import threading

import pytest
import torch

import edbatch


def cell(x, m):
    return torch.tanh(x + torch.zeros(x.size(0), 4) + m)


def test_first_calls_in_threads_trace_in_turn_and_leave_torch_as_it_was():
    packed = edbatch.pack_trees([((1, 2), 3), 4])
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = edbatch.nn.Propagate(cell, state_size=4)(packed, x=x)
    results, odd = [], []
    stop = threading.Event()

    def first_calls():
        for _ in range(150):  # each a new module: each call traces
            with torch.no_grad():
                results.append(edbatch.nn.Propagate(cell, state_size=4)(packed, x=x))

    def plain_torch():  # no edbatch: factories must stay torch's
        while not stop.is_set():
            for make in (lambda: torch.zeros(3), lambda: torch.randn(2)):
                try:
                    made = make()
                    if not isinstance(made, torch.Tensor):
                        odd.append(type(made).__name__)
                except Exception as e:  # noqa: BLE001 (what the other thread's trace did)
                    odd.append(repr(e))

    watcher = threading.Thread(target=plain_torch)
    watcher.start()
    tracers = [threading.Thread(target=first_calls) for _ in range(2)]
    for t in tracers:
        t.start()
    for t in tracers:
        t.join()
    stop.set()
    watcher.join()
    assert not odd, odd[:3]
    assert len(results) == 300
    for got in results:
        assert torch.equal(got, want)
    assert isinstance(torch.zeros(3), torch.Tensor) and isinstance(torch.empty(1), torch.Tensor)


def same(a, b):
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    return torch.equal(a, b)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_with_preparations_queued_computes():
    model = edbatch.nn.TreeLSTM(vocab_size=10, input_size=8, hidden_size=16, threads=1)
    a = edbatch.pack_trees([((1, 2), 3), (4, (5, 6))])
    b = edbatch.pack_trees([(1, (2, (3, 4)))])
    with torch.no_grad():
        want = model(b)
        model.prepare(a)
        model(a)
        model.prepare(b)  # queued, perhaps running, when the fork comes
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only for the parent's numbers
        code = 1
        try:
            with torch.no_grad():
                model.prepare(b)
                code = 0 if same(model(b), want) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    with torch.no_grad():
        assert same(model(b), want)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
