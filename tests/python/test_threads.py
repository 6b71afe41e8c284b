"""Python threads and fork: a cell's first call traces it with torch's factories, torch.Tensor's
C methods and fx's operators set for the process, so traces take turns and other threads' calls
run as usual; a child forked while preparations were queued or running computes as the parent
would."""
import os
import signal
import threading

import pytest
import torch

import edbatch


def cell(x, m):
    return torch.tanh(x + torch.zeros(x.size(0), 4) + torch.Tensor.mul(m, 1.0))


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

    def plain_torch():  # no edbatch: factories and Tensor's methods must stay torch's
        while not stop.is_set():
            for make in (lambda: torch.zeros(3), lambda: torch.randn(2),
                         lambda: torch.Tensor.mul(torch.ones(2), 2.0),
                         lambda: torch.ones(2).sigmoid()):
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
    assert "mul" not in vars(torch.Tensor)


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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_another_thread_traces_traces_its_own_cells():
    """The trace's lock and patches belong to a thread the child does not have: the child undoes
    them (a first call there waited for the lock for good)."""
    inside, release = threading.Event(), threading.Event()

    class Slow(torch.nn.Module):  # stays inside its trace until released
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, m):
            inside.set()
            release.wait(30)
            return torch.tanh(self.lin(x) + m)

    packed = edbatch.pack_trees([((1, 2), 3)])
    x = torch.randn(packed.input_ids.numel(), 4)
    cell = torch.nn.Linear(4, 4)
    with torch.no_grad():
        want = edbatch.nn.Propagate(lambda x, m: torch.tanh(cell(x) + m), state_size=4)(
            packed, x=x)
    tracing = threading.Thread(target=lambda: edbatch.nn.Propagate(Slow(), state_size=4)(
        packed, x=x))
    tracing.start()
    assert inside.wait(30)
    pid = os.fork()
    if pid == 0:  # exit code 0 only for a trace that ran and gave the parent's numbers
        code = 1
        try:
            signal.alarm(60)  # a child that waits for the lock for good is ended
            with torch.no_grad():
                got = edbatch.nn.Propagate(lambda x, m: torch.tanh(cell(x) + m),
                                           state_size=4)(packed, x=x)
            code = 0 if torch.equal(got, want) and torch.zeros.__module__ == "torch" else 2
        finally:
            os._exit(code)
    release.set()
    tracing.join()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_one_step_decoder_from_two_threads_takes_one_step_at_a_time():
    E, H = 4, 6
    lin_x, lin_h = torch.nn.Linear(E, H), torch.nn.Linear(H, H)
    prop = edbatch.nn.Propagate(lambda x, h: torch.tanh(lin_x(x) + lin_h(h)), state_size=H)
    decoder = edbatch.nn.StepDecoder(prop.eval(), input_size=E)
    errors = []

    def steps():
        try:
            with torch.no_grad():
                for _ in range(50):
                    decoder.step(torch.randn(decoder.running.numel(), E))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    with torch.no_grad():
        decoder.start(8)
    threads = [threading.Thread(target=steps) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert decoder.stats()["steps"] == 100
    assert decoder.instance_steps() == [100] * 8
