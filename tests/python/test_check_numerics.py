"""edbatch.set_check_numerics: a non-finite value in a forward pass raises FloatingPointError
naming where it is, a non-finite gradient fails the backward pass, and a decoding step that
raises it leaves the loop as it was (the steps after it give what a loop without it gives)."""
import contextlib

import pytest
import torch
from torch import nn

import edbatch
from test_decode import UserLSTM

E, H = 5, 7


@contextlib.contextmanager
def checking(on=True):
    before = edbatch.set_check_numerics(on)
    try:
        yield
    finally:
        edbatch.set_check_numerics(before)


class LogCell(nn.Module):
    """h = log(W x + U sum(children's h) + b): NaN where the argument is negative."""

    def __init__(self):
        super().__init__()
        self.W = nn.Linear(E, H)
        self.U = nn.Linear(H, H, bias=False)

    def forward(self, x, h):
        return torch.log(self.W(x) + self.U(h))


def lstm_module(seed=0, classes=None):
    torch.manual_seed(seed)
    return edbatch.nn.Propagate(UserLSTM(H, E), state_size=(H, H), classes=classes)


def test_the_setting_is_off_by_default_and_returned():
    assert edbatch.set_check_numerics(False) is False
    assert edbatch.set_check_numerics(True) is False
    assert edbatch.set_check_numerics(False) is True
    with pytest.raises(TypeError, match="True or False"):
        edbatch.set_check_numerics(1)


def test_a_non_finite_input_or_value_is_named():
    packed = edbatch.pack_trees([((1, 2), 3), 4, (5, (6, 7, 8))])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(packed.num_nodes, E, generator=g)
    x[3, 2] = float("inf")
    module = lstm_module()
    module(packed, x)  # off: no check
    with checking():
        with pytest.raises(FloatingPointError, match=r"x row 3: \[Engine::forward\] non-finite "
                                                     r"value: input node \d+ holds inf at element "
                                                     r"2 of 5, before the forward"):
            module(packed, x)
        # A value the cell computes: log of a negative number, inside its block.
        torch.manual_seed(2)
        log_module = edbatch.nn.Propagate(LogCell(), state_size=H)
        named = (r"\(op log\) of block 'node cell 0 \(LogCell\)'.* holds -?nan .*computed by "
                 r"batch \d+ of \d+ of the forward pass")
        with pytest.raises(FloatingPointError, match=named):
            log_module(packed, x.abs().clamp(max=1.0) - 3.0)
        # Only node 5's cell computes a NaN: the error names that node of the structure.
        for p in log_module.parameters():
            p.data.zero_()
        log_module.node_cells[0].W.weight.data[:, 0] = 1.0  # log(x[k, 0]) in every column
        y = torch.ones(packed.num_nodes, E)
        y[packed.node_inputs[5], 0] = -1.0
        with pytest.raises(FloatingPointError, match=r"node 5 of the packed structure \(its cell\)"):
            log_module(packed, y)
        # Finite everywhere: the outputs are those of the unchecked pass.
        x[3, 2] = 0.5
        checked = module(packed, x)
    for a, b in zip(checked, module(packed, x)):
        assert torch.equal(a, b)


def test_a_non_finite_gradient_fails_the_backward_pass():
    packed = edbatch.pack_trees([((1, 2), 3), 4])
    x = torch.randn(packed.num_nodes, E, generator=torch.Generator().manual_seed(3),
                    requires_grad=True)
    module = lstm_module()
    with checking():
        h, _ = module(packed, x)
        with pytest.raises(RuntimeError, match="non-finite gradient"):
            (h.sum() * float("inf")).backward()


def steps(decoder, xs, state=None, bad=None):
    """start(4, state), then a step per x of xs; with `bad`, before the second step a step on
    `bad` that must raise FloatingPointError and leave everything as it was."""
    decoder.start(4, state)
    out = []
    for i, x in enumerate(xs):
        if bad is not None and i == 1:
            before = (decoder.instance_steps(), decoder.stats()["steps"], decoder.running.clone())
            with pytest.raises(FloatingPointError, match="non-finite value"):
                decoder.step(bad)
            assert (decoder.instance_steps(), decoder.stats()["steps"]) == before[:2]
            assert torch.equal(decoder.running, before[2])
        out.append([t.clone() for t in decoder.step(x)])
    return out


@torch.no_grad()
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("first", [False, True])
def test_a_failed_decoding_step_leaves_the_loop_as_it_was(device, first):
    """The step that meets a NaN raises and changes nothing: the steps after it give bitwise what
    a loop that never took it gives, also when it is the first step and start's states come
    from device memory with it."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(4, E, generator=g).to(device) for _ in range(3)]
    state = tuple(torch.randn(4, H, generator=g).to(device) for _ in range(2))
    bad = xs[1].clone()
    bad[2, 3] = float("nan")
    reference = edbatch.nn.StepDecoder(lstm_module().to(device), input_size=E)
    decoder = edbatch.nn.StepDecoder(lstm_module().to(device), input_size=E)
    with checking():
        if first:  # the failed step is the loop's first: start's states are read with it
            want = steps(reference, xs[1:], state)
            decoder.start(4, state)
            with pytest.raises(FloatingPointError, match="non-finite value"):
                decoder.step(bad)
            assert decoder.instance_steps() == [0, 0, 0, 0]
            got = [[t.clone() for t in decoder.step(x)] for x in xs[1:]]
        else:
            want = steps(reference, xs, state)
            got = steps(decoder, xs, state, bad=bad)
    assert decoder.instance_steps() == reference.instance_steps()
    for a, b in zip(got, want):
        for u, v in zip(a, b):
            assert torch.equal(u, v)


@torch.no_grad()
def test_after_a_failed_step_the_rows_that_diverged_can_be_stopped():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, E, generator=g)
    bad = x.clone()
    bad[1] = float("inf")
    decoder = edbatch.nn.StepDecoder(lstm_module(), input_size=E)
    reference = edbatch.nn.StepDecoder(lstm_module(), input_size=E)
    with checking():
        decoder.start(4)
        with pytest.raises(FloatingPointError):
            decoder.step(bad)
        keep = torch.tensor([True, False, True, True])
        decoder.stop(~keep)
        got = decoder.step(x[keep])
        reference.start(4)
        reference.stop(~keep)
        want = reference.step(x[keep])
    assert decoder.instance_steps() == [1, 0, 1, 1]
    for u, v in zip(got, want):
        assert torch.equal(u, v)


@torch.no_grad()
@pytest.mark.parametrize("case", ["x", "computed", "copied row", "start state"])
def test_the_error_names_the_row_to_stop(case):
    """The error names the row of the step whose value is not finite (a position in `running`),
    whether it is in x, computed by the row's cell call (rows from the fourth on are copies of
    the second's nodes), or in the state the row started from."""
    n = 6
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, E, generator=g)
    state = [torch.randn(n, H, generator=g) for _ in range(2)]
    row = {"x": 2, "computed": 1, "copied row": 4, "start state": 3}[case]
    if case == "x":
        x[row, 0] = float("nan")
    elif case == "start state":
        state[1][row, 5] = float("-inf")
    else:
        x[row] = 3e38  # finite; the cell's product overflows
    decoder = edbatch.nn.StepDecoder(lstm_module(), input_size=E)
    with checking():
        decoder.start(n, tuple(state))
        decoder.stop(torch.tensor([i == 0 for i in range(n)]))  # rows are running positions
        with pytest.raises(FloatingPointError,
                           match=rf"row {row - 1} of the step \(instance {row}\)"):
            decoder.step(x[1:])


def test_a_training_step_that_raises_updates_nothing():
    """loss_step with lr updates the parameters in place after the engine's pass: a pass that
    finds a non-finite value changes none of them, and the next step is the one a fresh module
    takes."""
    packed = edbatch.pack_trees([((1, 2), 3), 4, (5, 6)])
    labels = torch.arange(packed.num_nodes) % 3
    x = torch.randn(packed.num_nodes, E, generator=torch.Generator().manual_seed(8))
    bad = x.clone()
    bad[4, 1] = float("nan")
    module, fresh = lstm_module(classes=3), lstm_module(classes=3)
    before = [p.detach().clone() for p in module.parameters()]
    with checking():
        with pytest.raises(FloatingPointError, match="x row 4"):
            module.loss_step(packed, x=bad, labels=labels, lr=0.1)
        assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
        got = module.loss_step(packed, x=x, labels=labels, lr=0.1)
        want = fresh.loss_step(packed, x=x, labels=labels, lr=0.1)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), fresh.parameters()))
