"""User cells on CUDA: edbatch.nn.Propagate with CUDA tensors gives the outputs and gradients it
gives on the CPU (test_propagate.py checks the CPU against the user's cells run node by node),
for every supported operation, the structures, reductions and initial states, and dropout under
the same seed. Skipped without a GPU."""
import copy

import pytest
import torch

import edbatch

import cells
import structures

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

D = 5


def run(model, packed, x, seed, device):
    """Outputs and gradients (of every parameter and of x) on `device`, returned on the CPU."""
    m = copy.deepcopy(model).to(device)
    xd = x.detach().to(device).requires_grad_()
    torch.manual_seed(seed)
    out = m(packed.to(device), x=xd)
    out = list(out) if isinstance(out, tuple) else [out]
    g = torch.Generator().manual_seed(seed + 7)
    upstream = [torch.randn(o.shape, generator=g).to(device) for o in out]
    total = sum((o * u).sum() for o, u in zip(out, upstream))
    if torch.is_tensor(total) and total.requires_grad:
        total.backward()
    grads = {n: p.grad.cpu() for n, p in m.named_parameters() if p.grad is not None}
    if xd.grad is not None:
        grads["x"] = xd.grad.cpu()
    return [o.detach().cpu() for o in out], grads


def scale(t):
    return max(1.0, t.abs().max().item()) if t.numel() else 1.0


def assert_cuda_equals_cpu(model, packed, seed=0):
    x = torch.randn(packed.input_ids.numel(), D, generator=torch.Generator().manual_seed(seed))
    cpu_out, cpu_grads = run(model, packed, x, seed, "cpu")
    gpu_out, gpu_grads = run(model, packed, x, seed, "cuda")
    for a, b in zip(gpu_out, cpu_out):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4 * scale(b))
    assert gpu_grads.keys() == cpu_grads.keys()
    for name, b in cpu_grads.items():
        torch.testing.assert_close(gpu_grads[name], b, rtol=2e-4, atol=2e-4 * scale(b),
                                   msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.parametrize("op", list(cells.OPS))
def test_each_operation_on_cuda(op):
    torch.manual_seed(1)
    model = edbatch.nn.Propagate(cells.OpCell(op, 7, D), state_size=7)
    assert_cuda_equals_cpu(model, structures.packed("trees", 1), seed=1)


@pytest.mark.parametrize("kind", ["trees", "lattices", "dags", "empty"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_structures_and_reduce_on_cuda(kind, reduce):
    torch.manual_seed(4)
    model = edbatch.nn.Propagate(cells.LSTMCell(7, D), cells.GateEdge(7, D), reduce=reduce,
                                 state_size=(7, 7))
    assert_cuda_equals_cpu(model, structures.packed(kind, 4, edge_inputs="parent"), seed=4)


@pytest.mark.parametrize("kind", ["trees", "dags"])
def test_attention_on_cuda(kind):
    torch.manual_seed(17)
    model = edbatch.nn.Propagate(cells.AttentionNode(7, D), cells.AttentionEdge(7, D),
                                 reduce="softmax", state_size=(7, 7), message_size=(1, 7, 7))
    assert_cuda_equals_cpu(model, structures.packed(kind, 17, edge_inputs="parent"), seed=17)


@pytest.mark.parametrize("size", [13, 129])
def test_learned_initial_state_and_sizes_on_cuda(size):
    torch.manual_seed(5)
    model = edbatch.nn.Propagate(cells.LSTMCell(size, D), state_size=(size, size),
                                 initial="learned")
    with torch.no_grad():
        for p in model.initial:
            p.normal_()
    assert_cuda_equals_cpu(model, structures.packed("lattices", 5), seed=5)


def test_dropout_on_cuda_uses_the_cpu_masks():
    torch.manual_seed(6)
    model = edbatch.nn.Propagate(cells.LSTMCell(13, D, dropout=0.3), cells.GateEdge(13, D, 0.3),
                                 state_size=(13, 13)).train()
    assert_cuda_equals_cpu(model, structures.packed("trees", 6, edge_inputs="parent"), seed=6)


@pytest.mark.parametrize("kind", ["trees", "lattices"])
def test_cells_embedding_ids_on_cuda(kind):
    """Cells that embed their ids, where nodes and arcs without an input row (-1) embed zeros
    (the tables' zero columns live in the device's parameter mirror too)."""
    torch.manual_seed(9)
    embed = torch.nn.Embedding(structures.VOCAB, D)
    model = edbatch.nn.Propagate(cells.EmbedFirst(embed, cells.LSTMCell(7, D)),
                                 cells.EmbedFirst(embed, cells.GateEdge(7, D), edge=True),
                                 state_size=(7, 7))
    packed = structures.packed(kind, 9, edge_inputs="parent")
    got = {}
    for device in ("cpu", "cuda"):
        m = copy.deepcopy(model).to(device)
        out = m(packed.to(device), ids=packed.input_ids.to(device))
        g = torch.Generator().manual_seed(10)
        total = sum((o * torch.randn(o.shape, generator=g).to(device)).sum() for o in out)
        total.backward()
        got[device] = [o.detach().cpu() for o in out] + [p.grad.cpu() for p in m.parameters()]
    for a, b in zip(got["cuda"], got["cpu"]):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4 * scale(b))


@pytest.mark.parametrize("depth", [1, 3])
def test_prefetching_on_cuda(depth):
    """A training loop prefetching one or three mini-batches ahead on the GPU (with three, two
    workers encode forward passes on their runners' streams side by side): every step's outputs
    and gradients equal those of the CPU module taking the same steps, and every mini-batch after
    the first was served prepared."""
    torch.manual_seed(11)
    model = edbatch.nn.Propagate(cells.LSTMCell(9, D), cells.GateEdge(9, D), state_size=(9, 9))
    batches = [structures.packed("trees", s, edge_inputs="parent") for s in range(50, 56)]
    xs = [torch.randn(b.input_ids.numel(), D) for b in batches]
    got = {}
    for device in ("cpu", "cuda"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        moved = [b.to(device) for b in batches]
        with torch.no_grad():  # prepare() takes x's size and device from the last forward
            m(moved[0], x=xs[0].to(device))
        before = edbatch.prepare_stats()["used"]
        steps = []
        for i, packed in enumerate(edbatch.prefetch(m, moved, depth=depth)):
            opt.zero_grad()
            h, c = m(packed, x=xs[i].to(device))
            (h.sum() + 2 * c.sum()).backward()
            steps.append([h.detach().cpu()] + [p.grad.cpu() for p in m.parameters()])
            opt.step()
        assert edbatch.prepare_stats()["used"] - before == len(batches) - 1
        got[device] = steps
    for step_cuda, step_cpu in zip(got["cuda"], got["cpu"]):
        for a, b in zip(step_cuda, step_cpu):
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4 * scale(b))


class WideCat(torch.nn.Module):
    """torch.cat of 21 pieces and x.repeat(1, 70): concatenations of concatenations of 8, the
    most a CUDA concat reads (they failed on CUDA before)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, 7)

    def forward(self, x, m):
        c = self.lin(x)
        wide = torch.cat([c[:, i % 7:i % 7 + 1] * (1 + i) for i in range(20)] + [m], -1)
        return torch.tanh(wide[:, 12:19] * 0.1 + m[:, :1].repeat(1, 70)[:, 60:67])


def test_long_concatenations_on_cuda():
    torch.manual_seed(4)
    model = edbatch.nn.Propagate(WideCat(), state_size=7)
    assert_cuda_equals_cpu(model, structures.packed("lattices", 4), seed=4)
