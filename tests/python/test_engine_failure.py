"""A pass that fails inside the engine (EDBATCH_FAIL_FORWARD=N makes the Nth forward pass of every
engine made while it is set throw before its kernels run, as running out of memory or a device
error would there; EDBATCH_FAIL_BACKWARD=N the same for backward passes) raises a RuntimeError
naming it (a failure while running, as torch raises its own CUDA errors; not the ValueError of an
argument the library refuses), and loses nothing: a module's next call gives what the user's
cells give eagerly, and a decoding loop refuses to go on, naming the failure, until start()
begins a new one, whose steps give bitwise what a loop that never failed gives. A call the
decoder refuses for its arguments loses nothing either: that loop goes on."""
import pytest
import torch

import edbatch
from test_decode import UserLSTM
from test_propagate import reference_of

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_a_module_call_after_a_failed_pass_gives_the_eager_results(monkeypatch, device):
    # Sizes no other test uses: the call makes a new runner (and engine), which reads the setting.
    H = 11
    torch.manual_seed(3)
    model = edbatch.nn.Propagate(UserLSTM(H, 5), state_size=(H, H)).to(device)
    packed = edbatch.pack_trees([((1, 2), 3), 4, (5, (6, 7, 8), 9)])
    x = torch.randn(packed.num_nodes, 5, generator=torch.Generator().manual_seed(4))
    x = x.to(device).requires_grad_()
    monkeypatch.setenv("EDBATCH_FAIL_FORWARD", "1")
    with pytest.raises(RuntimeError, match=r"forward pass 1 failed: injected") as failed:
        model(packed, x)
    assert "Exception raised from" not in str(failed.value)  # the library's message alone
    monkeypatch.delenv("EDBATCH_FAIL_FORWARD")
    params = [x] + list(model.parameters())
    assert all(p.grad is None for p in params)
    ours, want = model(packed, x), reference_of(model, packed, {"x": x})
    upstream = [torch.randn_like(w) for w in want]
    grads = []
    for outputs in (ours, want):
        for p in params:
            p.grad = None
        sum((o * u).sum() for o, u in zip(outputs, upstream)).backward()
        grads.append([p.grad.clone() for p in params])
    for a, b in zip(list(ours) + grads[0], list(want) + grads[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, b.abs().max().item()))


@pytest.mark.parametrize("device", DEVICES)
def test_a_failed_backward_leaves_no_gradient_and_the_next_one_is_right(monkeypatch, device):
    H = 12  # sizes no other test uses: a new runner (and engine), which reads the setting
    torch.manual_seed(5)
    model = edbatch.nn.Propagate(UserLSTM(H, 5), state_size=(H, H)).to(device)
    packed = edbatch.pack_trees([(1, (2, 3)), ((4, 5), 6, 7)])
    x = torch.randn(packed.num_nodes, 5, generator=torch.Generator().manual_seed(6))
    x = x.to(device).requires_grad_()
    params = [x] + list(model.parameters())
    monkeypatch.setenv("EDBATCH_FAIL_BACKWARD", "1")
    h, c = model(packed, x)
    with pytest.raises(RuntimeError, match=r"backward pass 1 failed: injected"):
        (h.sum() + c.sum()).backward()
    monkeypatch.delenv("EDBATCH_FAIL_BACKWARD")
    assert all(p.grad is None for p in params)
    h, c = model(packed, x)
    (h.sum() + c.sum()).backward()
    got = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    rh, rc = reference_of(model, packed, {"x": x})
    (rh.sum() + rc.sum()).backward()
    for a, p in zip(got, params):
        b = p.grad
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, b.abs().max().item()))


def test_a_training_step_that_fails_inside_the_engine_updates_nothing(monkeypatch):
    """loss_step with lr updates the parameters after the engine's backward: one that fails
    changes none of them, and the next step is the one a fresh module takes."""
    H = 10
    packed = edbatch.pack_trees([((1, 2), 3), 4, (5, 6)])
    labels = torch.arange(packed.num_nodes) % 3
    x = torch.randn(packed.num_nodes, 5, generator=torch.Generator().manual_seed(8))

    def module():
        torch.manual_seed(9)
        return edbatch.nn.Propagate(UserLSTM(H, 5), state_size=(H, H), classes=3)

    model, fresh = module(), module()
    before = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setenv("EDBATCH_FAIL_BACKWARD", "1")
    with pytest.raises(RuntimeError, match=r"backward pass 1 failed: injected"):
        model.loss_step(packed, x=x, labels=labels, lr=0.1)
    monkeypatch.delenv("EDBATCH_FAIL_BACKWARD")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    got = model.loss_step(packed, x=x, labels=labels, lr=0.1)
    want = fresh.loss_step(packed, x=x, labels=labels, lr=0.1)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def decode(decoder, xs, state):
    decoder.start(4, state)
    return [[t.clone() for t in decoder.step(x)] for x in xs]


def decoding_case(device, seed):
    """Three steps' x and start's states of 4 rows, and a module over the user's LSTM cell."""
    E, H = 5, 7
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(4, E, generator=g).to(device) for _ in range(3)]
    state = tuple(torch.randn(4, H, generator=g).to(device) for _ in range(2))
    torch.manual_seed(seed)
    return xs, state, edbatch.nn.Propagate(UserLSTM(H, E), state_size=(H, H)).to(device)


@torch.no_grad()
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fail", [1, 2])
def test_a_step_that_fails_inside_the_engine_stops_the_loop_until_start(monkeypatch, device, fail):
    """Pass 1 is the loop's first step (start's states, from device memory on CUDA, read with it),
    pass 2 a later one."""
    xs, state, module = decoding_case(device, 6)
    E = xs[0].shape[1]
    want = decode(edbatch.nn.StepDecoder(module, input_size=E), xs, state)
    monkeypatch.setenv("EDBATCH_FAIL_FORWARD", str(fail))
    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    decoder.start(4, state)
    for x in xs[:fail - 1]:
        decoder.step(x)
    before = (decoder.instance_steps(), decoder.stats()["steps"], decoder.running.clone())
    with pytest.raises(RuntimeError, match=rf"forward pass {fail} failed: injected"):
        decoder.step(xs[fail - 1])
    # Nothing moved, and nothing goes on: the engine may have stopped half way.
    assert (decoder.instance_steps(), decoder.stats()["steps"]) == before[:2]
    assert torch.equal(decoder.running, before[2])
    refused = (r"an earlier step failed inside the engine \(.*forward pass "
               rf"{fail} failed: injected.*\); this loop cannot go on")
    with pytest.raises(RuntimeError, match=refused):
        decoder.step(xs[fail - 1])
    with pytest.raises(RuntimeError, match=refused):
        decoder.reorder([0, 1])
    # A new loop runs as if the failure never happened.
    got = decode(decoder, xs, state)
    for a, b in zip(got, want):
        for u, v in zip(a, b):
            assert torch.equal(u, v)


@torch.no_grad()
@pytest.mark.parametrize("device", DEVICES)
def test_refused_calls_leave_the_loop_as_it_was(device):
    """Calls the decoder refuses for their arguments raise before anything moves, the first
    step's too (start's states, from device memory on CUDA, still waiting): the loop goes on, and
    its steps give bitwise what the same loop without the refused calls gives."""
    xs, state, module = decoding_case(device, 12)
    E = xs[0].shape[1]

    def refuse(decoder):
        n = decoder.running.numel()
        x = xs[0][:n]
        with pytest.raises(ValueError, match="shape"):
            decoder.step(x[:n - 1])  # a row short
        with pytest.raises(ValueError, match="shape"):
            decoder.step(x[:, :E - 1])  # a feature short
        with pytest.raises(ValueError, match="must be float32 of shape .* got Long"):
            decoder.step(x.long())
        with pytest.raises(ValueError, match="not a running row"):
            decoder.reorder([0, n])
        with pytest.raises(ValueError, match="entries for"):
            decoder.stop(torch.zeros(n + 1, dtype=torch.bool))

    def loop(refusing):
        decoder = edbatch.nn.StepDecoder(module, input_size=E)
        decoder.start(4, state)
        out = []
        for step, x in enumerate(xs):
            if refusing:
                refuse(decoder)
            if step == 0:
                decoder.reorder([3, 1, 1, 0])  # start's states, still waiting, reordered
            if step == 1:
                decoder.stop(torch.tensor([False, True, False, False]))
            if refusing:
                refuse(decoder)
            out.append([t.clone() for t in decoder.step(x[:decoder.running.numel()])])
        return out, decoder.stats()["steps"]

    (want, steps), (got, refused_steps) = loop(False), loop(True)
    assert steps == refused_steps == len(xs)
    for a, b in zip(got, want):
        for u, v in zip(a, b):
            assert torch.equal(u, v)
