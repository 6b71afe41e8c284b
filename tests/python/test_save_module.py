"""Whole modules pickled (torch.save(model), multiprocessing) after they ran: a module with
user cells drops its traced programs and traces them again when loaded; the loaded module gives
the same outputs. (state_dict, the usual way, holds parameters only and is covered elsewhere.)"""
import io
import inspect
import pickle

import pytest
import torch
from torch import nn

import edbatch

import structures

H = 5


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.W, self.U = nn.Linear(H, 2 * H), nn.Linear(H, 2 * H, bias=False)

    def forward(self, x, message):
        a, b = (self.W(x) + self.U(message)).chunk(2, -1)
        return torch.sigmoid(a) * torch.tanh(b)


def load(buffer):
    if "weights_only" in inspect.signature(torch.load).parameters:
        return torch.load(buffer, weights_only=False)  # a whole module, not only tensors
    return torch.load(buffer)


def saved(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return load(buffer)


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_user_cell_module_saved_after_running(how):
    torch.manual_seed(0)
    module = edbatch.nn.Propagate(Cell(), state_size=H, classes=3)
    packed = structures.packed("trees", 2)
    x = torch.randn(packed.input_ids.numel(), H)
    want = module(packed, x=x)
    want_loss = module.loss(packed, x=x)
    copy = saved(module) if how == "torch.save" else pickle.loads(pickle.dumps(module))
    assert copy is not module and not copy._programs
    torch.testing.assert_close(copy(packed, x=x), want, rtol=0, atol=0)
    torch.testing.assert_close(copy.loss(packed, x=x), want_loss, rtol=0, atol=0)
    assert len(module._programs) == 1  # the original keeps its programs


def test_builtin_module_saved_after_running():
    torch.manual_seed(0)
    module = edbatch.nn.TreeLSTM(structures.VOCAB, H, H)
    packed = edbatch.pack_sst(["(3 (2 1) (4 (2 5) (4 7)))", "(1 9)"], {})
    want = module(packed)
    got = saved(module)(packed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
