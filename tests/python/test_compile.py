"""Models that hold edbatch modules under torch.compile (torch 2.x; skipped on torch 1.x): the
compiled model breaks its graph at edbatch's modules and equals the model run eagerly in loss
and gradients, over mini-batches of different structures; a cell given to Propagate already
compiled runs as the cell it wraps. Dynamo's "eager" backend keeps the compile step short: it
traces the model as every backend does (the failure these tests guard against was Dynamo's
tracing of edbatch's op with fake tensors, before any code generation)."""
import copy

import pytest
import torch
from torch import nn

import edbatch

import structures

pytestmark = pytest.mark.skipif(not hasattr(torch, "compile"),
                                reason="torch.compile needs torch 2.x")

H = 6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class ChildSum(nn.Module):
    """A Child-Sum Tree-LSTM node cell: (x, summed (h, c) of the children) -> (h, c)."""

    def __init__(self):
        super().__init__()
        self.W, self.U = nn.Linear(H, 4 * H), nn.Linear(H, 4 * H, bias=False)

    def forward(self, x, message):
        h, c = message
        i, o, u, f = (self.W(x) + self.U(h)).chunk(4, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f) * c
        return torch.sigmoid(o) * torch.tanh(c), c


class UserModel(nn.Module):
    """Embedding, Propagate over user cells, a loss head in PyTorch."""

    def __init__(self, wrap=lambda cell: cell):
        super().__init__()
        self.embed = nn.Embedding(structures.VOCAB, H)
        self.tree = edbatch.nn.Propagate(wrap(ChildSum()), reduce="sum", state_size=(H, H))
        self.out = nn.Linear(H, 3)

    def forward(self, packed):
        h, _ = self.tree(packed, x=self.embed(packed.input_ids))
        return self.out(h).log_softmax(-1)[:, 0].sum()


class BuiltinModel(nn.Module):
    """The built-in Tree-LSTM's states through a PyTorch head."""

    def __init__(self):
        super().__init__()
        self.tree = edbatch.nn.TreeLSTM(structures.VOCAB, H, H)
        self.out = nn.Linear(H, 1)

    def forward(self, packed):
        h, c = self.tree(packed)
        return torch.tanh(self.out(h + c)).sum()


def batches(binary, device):
    """Mini-batches of different structures (and sizes), on `device`."""
    if binary:
        lines = ["(3 (2 1) (4 (2 5) (4 7)))", "(1 9)", "(2 (1 3) (3 (2 4) (0 6)))",
                 "(4 (3 (2 8) (2 2)) (1 11))", "(0 (1 (1 12) (2 13)) (2 (3 14) (4 15)))"]
        return [edbatch.pack_sst(lines[i:i + n], {}).to(device) for i, n in ((0, 2), (1, 4))]
    return [structures.packed("trees", seed).to(device) for seed in (3, 4)]


def same_step(eager_model, compiled, model, packed):
    """One loss and backward of each: the compiled model's equal the eager one's."""
    for m in (eager_model, model):
        m.zero_grad()
    want = eager_model(packed)
    want.backward()
    got = compiled(packed)
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make, binary", [(UserModel, False), (BuiltinModel, True)],
                         ids=["user cells", "built-in Tree-LSTM"])
def test_compiled_model_equals_eager(make, binary, device):
    torch.manual_seed(0)
    model = make().to(device)
    eager_model = copy.deepcopy(model)
    compiled = torch.compile(model, backend="eager")
    for packed in batches(binary, device) * 2:  # again: the compiled code is reused
        same_step(eager_model, compiled, model, packed)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_cell_runs_as_its_module(device):
    torch.manual_seed(0)
    model = UserModel(wrap=lambda cell: torch.compile(cell, backend="eager")).to(device)
    torch.manual_seed(0)
    eager_model = UserModel().to(device)
    assert type(model.tree.node_cells[0]) is ChildSum  # the module torch.compile wrapped
    for packed in batches(False, device):
        same_step(eager_model, model, model, packed)
