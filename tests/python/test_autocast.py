"""edbatch modules inside torch.autocast: input rows that autocast made bfloat16 (or float16)
are cast to float32, as autocast runs its float32 ops, so the result equals the module given
those rows cast by hand outside autocast, in value and in the gradients of what made them;
outside autocast such rows are refused, naming autocast."""
import pytest
import torch
from torch import nn

import edbatch

import structures

H = 6


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.W, self.U = nn.Linear(H, H), nn.Linear(H, H, bias=False)

    def forward(self, x, message):
        return torch.tanh(self.W(x) + self.U(message))


def devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def run(module, project, packed, x, by_hand, device):
    """Loss and the projection's weight gradient: rows projected under autocast, then the
    module inside it (by_hand=False) or outside it on the rows cast to float32 (by_hand=True)."""
    project.zero_grad()
    with torch.autocast(device, dtype=torch.bfloat16):
        rows = project(x)
        assert rows.dtype == torch.bfloat16
        out = None if by_hand else module(packed, rows)
    if by_hand:
        out = module(packed, rows.float())
    assert out.dtype == torch.float32
    loss = (out * torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum()
    loss.backward()
    return loss.detach(), project.weight.grad.clone()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("builtin", [False, True], ids=["user cell", "built-in Tree-LSTM"])
def test_autocast_rows_equal_rows_cast_by_hand(builtin, device):
    torch.manual_seed(0)
    if builtin:
        cell = edbatch.nn.TreeLSTM(structures.VOCAB, H, H).to(device).cell
        packed = edbatch.pack_sst(["(3 (2 1) (4 (2 5) (4 7)))", "(1 9)"], {}).to(device)

        def module(p, rows):
            return cell(rows, p)[0]
    else:
        prop = edbatch.nn.Propagate(Cell(), state_size=H).to(device)
        packed = structures.packed("trees", 5).to(device)

        def module(p, rows):
            return prop(p, x=rows)
    project = nn.Linear(H, H).to(device)
    x = torch.randn(packed.input_ids.numel(), H, device=device)
    got = run(module, project, packed, x, False, device)
    want = run(module, project, packed, x, True, device)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_low_precision_rows_outside_autocast_are_refused():
    packed = structures.packed("trees", 5)
    rows = torch.randn(packed.input_ids.numel(), H).bfloat16()
    with pytest.raises(TypeError, match="x must be a float32 tensor.*inside torch.autocast"):
        edbatch.nn.Propagate(Cell(), state_size=H)(packed, x=rows)
    cell = edbatch.nn.TreeLSTM(structures.VOCAB, H, H).cell
    tree = edbatch.pack_sst(["(3 (2 1) (4 5))"], {})
    with pytest.raises(TypeError, match="x must be float32, got .*inside torch.autocast"):
        cell(torch.randn(tree.input_ids.numel(), H).half(), tree)
    # A built-in module made low precision as a whole: named by its embedding table, which
    # makes its rows.
    with pytest.raises(TypeError, match=r"TreeLSTM: weight embeddings.0.weight must be float32, "
                                        r"got torch.float16"):
        edbatch.nn.TreeLSTM(structures.VOCAB, H, H).half()(tree)


@torch.no_grad()
def test_decoding_step_under_autocast_equals_rows_cast_by_hand():
    torch.manual_seed(0)
    decoder = edbatch.nn.StepDecoder(edbatch.nn.Propagate(Cell(), state_size=H), input_size=H)
    project = nn.Linear(H, H)
    xs = [torch.randn(4, H) for _ in range(3)]

    def loop(autocast):
        decoder.start(4)
        states = []
        for x in xs:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                rows = project(x)
                if autocast:
                    states.append(decoder.step(rows))
            if not autocast:
                states.append(decoder.step(rows.float()))
        return states

    for got, want in zip(loop(True), loop(False)):
        assert got.dtype == torch.float32
        assert torch.equal(got, want)
