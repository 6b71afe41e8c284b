"""Modules made and run while torch's default dtype is float64 (scientific code, gradcheck-style
suites) compute in float32 as under the usual default: their own parameters are float32, and the
inputs they make for cells without a float x are float32. Layouts other than dense are refused by
name, not with the engine's data-pointer error."""
import pytest
import torch
from torch import nn

import edbatch
from edbatch import nn as enn

H, D, V = 5, 3, 11


class NoInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x, m):
        return torch.tanh(self.lin(m) + 1.0)


class EmbedInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.lin = nn.Linear(D + H, H)

    def forward(self, ids, m):
        return torch.tanh(self.lin(torch.cat([self.emb(ids), m], -1)))


def batch():
    return edbatch.pack_trees([((1, 2), (3, (4, 5, 6))), 7, (8, 9)])


@pytest.fixture
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def reference_tree(step, packed):
    """Eager node-by-node run over packed trees: step(input row, summed children) per node."""
    p = packed
    state = [None] * p.num_nodes
    for k in range(p.num_nodes):
        preds = p.pred_ids[p.pred_ptr[k]:p.pred_ptr[k + 1]].tolist()
        m = sum((state[j] for j in preds), torch.zeros(1, H, dtype=torch.float64))
        state[k] = step(int(p.node_inputs[k]), m)
    return torch.cat(state)


@pytest.mark.parametrize("kind", ["none", "ids"])
def test_cells_without_float_input_under_a_float64_default(float64_default, kind):
    torch.manual_seed(3)
    cell = (NoInput() if kind == "none" else EmbedInside()).float()
    prop = enn.Propagate(cell, state_size=H)
    packed = batch()
    assert all(p.dtype == torch.float32 for p in prop.parameters())
    out = prop(packed) if kind == "none" else prop(packed, ids=packed.input_ids)
    assert out.dtype == torch.float32
    out.sum().backward()
    grads = [p.grad.clone() for p in cell.parameters()]
    ref_cell = (NoInput() if kind == "none" else EmbedInside()).double()
    ref_cell.load_state_dict({k: v.double() for k, v in cell.state_dict().items()})
    ids = packed.input_ids

    def step(row, m):  # row -1 (an inner node) embeds to zeros, as documented
        if kind == "none":
            return ref_cell(None, m)
        e = ref_cell.emb(ids[row:row + 1]) if row >= 0 else torch.zeros(1, D, dtype=torch.float64)
        return torch.tanh(ref_cell.lin(torch.cat([e, m], -1)))

    ref = reference_tree(step, packed)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    ref.sum().backward()
    for g, p in zip(grads, ref_cell.parameters()):
        torch.testing.assert_close(g.double(), p.grad, rtol=1e-4, atol=1e-6)


def test_built_in_modules_made_under_a_float64_default_are_float32(float64_default):
    module = enn.TreeLSTM(V, D, H, classes=3)
    assert all(p.dtype == torch.float32 for p in module.parameters())
    prop = enn.Propagate(NoInput().float(), state_size=H, initial="learned", classes=2)
    assert all(p.dtype == torch.float32 for p in prop.parameters())
    packed = edbatch.pack_trees([((1, 2), (3, (4, 5))), 7, (8, 9)])  # binary, as tree_lstm's
    assert module(packed)[0].dtype == torch.float32
    assert prop(packed).dtype == torch.float32


@pytest.mark.parametrize("module", ["propagate", "tree_lstm"])
def test_a_sparse_x_is_refused_by_name(module):
    packed = batch()
    x = torch.randn(packed.input_ids.numel(), D)
    if module == "propagate":
        m = enn.Propagate(lambda x, m: torch.tanh(x.sum(-1, keepdim=True) + m), state_size=H)
    else:
        m = edbatch.nn.Cell("tree_lstm", D, H)
        packed = edbatch.pack_trees([((1, 2), (3, (4, 5))), 7, (8, 9)])
        x = torch.randn(packed.input_ids.numel(), D)
    with pytest.raises(TypeError, match="x must be a dense tensor, got layout Sparse"):
        m(packed, x.to_sparse()) if module == "propagate" else m(x.to_sparse(), packed)


def test_sparse_ids_are_refused_by_name():
    packed = batch()
    prop = enn.Propagate(EmbedInside(), state_size=H)
    with pytest.raises(TypeError, match="ids must be a dense tensor, got layout Sparse"):
        prop(packed, ids=packed.input_ids.to_sparse())
