"""The loss head inside the engine (classes= on the modules; run_cell's and propagate's loss): the
loss and the gradients of x, every cell weight and the head equal the cross-entropy of the same
head over an independent node-by-node reference of the cell (reference.py for the built-in cells,
the user's own cells for edbatch.nn.Propagate), summed or averaged over the labelled nodes, with
unlabelled nodes (-1) skipped; empty batches and batches without labels give 0; bad labels and
options are refused with messages; a prepared loss call gives bitwise the unprepared result and
is not served to other labels; on a GPU, cuda equals cpu."""
import copy
import random

import pytest
import torch
import torch.nn.functional as F

import edbatch

import cells
import reference
import structures
from test_ops import H, structures as cell_structures, weights_for

C = 5  # classes


def random_labels(n, seed, unlabelled=0.3):
    rng = random.Random(seed)
    return torch.tensor([-1 if rng.random() < unlabelled else rng.randrange(C) for _ in range(n)],
                        dtype=torch.long)


def head_loss(h, head_w, head_b, labels, reduction):
    """PyTorch's cross-entropy of the head over the labelled nodes (the reference's head)."""
    keep = labels >= 0
    if not bool(keep.any()):
        return (h.sum() * 0 + head_w.sum() * 0 + head_b.sum() * 0)
    return F.cross_entropy(F.linear(h[keep], head_w, head_b), labels[keep], reduction=reduction)


def close(a, b, what, tol=2e-4):
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a - b).abs().max()) if b.numel() else 0.0
    assert err <= tol * scale, f"{what}: max difference {err} (scale {scale})"


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("cell", list(reference.CELLS))
def test_builtin_loss_equals_reference(cell, reduction):
    packed, input_size, nt, at = cell_structures(cell, 5)
    w = weights_for(cell, input_size, nt, at, 5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(packed.input_ids.numel(), input_size, generator=g).requires_grad_()
    head_w = (0.5 * torch.randn(C, H, generator=g)).requires_grad_()
    head_b = (0.5 * torch.randn(C, generator=g)).requires_grad_()
    labels = random_labels(packed.num_nodes, 7)
    params = [x, *w.values(), head_w, head_b]

    ours = edbatch.run_cell(cell, x, packed, list(w.values()) + [head_w, head_b], H, nt, at,
                            threads=1, labels=labels, loss=reduction)
    assert len(ours) == 1 and ours[0].dim() == 0
    got = torch.autograd.grad(ours[0], params)
    h = reference.CELLS[cell](x, packed, w)[0]
    ref = head_loss(h, head_w, head_b, labels, reduction)
    want = torch.autograd.grad(ref, params)
    close(ours[0].detach(), ref.detach(), "loss")
    for name, a, b in zip(["x", *w, "head.weight", "head.bias"], got, want):
        close(a, b, f"{cell} gradient of {name}")


@pytest.mark.parametrize("kind", ["trees", "lattices", "dags"])
def test_propagate_loss_equals_users_cells(kind):
    torch.manual_seed(3)
    size, D = 6, 5
    packed = structures.packed(kind, 4)
    model = edbatch.nn.Propagate(cells.LSTMCell(size, D), reduce="mean", state_size=(size, size),
                                 classes=C, reduction="mean", threads=1)
    x = torch.randn(packed.input_ids.numel(), D, generator=torch.Generator().manual_seed(8))
    x.requires_grad_()
    labels = random_labels(packed.num_nodes, 9)
    params = [x, *model.parameters()]
    loss = model.loss(packed, x=x, labels=labels)
    got = torch.autograd.grad(loss, params)
    h, _ = reference.propagate_reference(list(model.node_cells), None, packed, x=x,
                                         state_size=model.state_size, reduce="mean")
    ref = head_loss(h, model.head.weight, model.head.bias, labels, "mean")
    # Lattice nodes read no x row: the reference leaves x out of its graph.
    want = [torch.zeros_like(p) if g is None else g
            for p, g in zip(params, torch.autograd.grad(ref, params, allow_unused=True))]
    close(loss.detach(), ref.detach(), "loss")
    names = ["x"] + [n for n, _ in model.named_parameters()]
    for name, a, b in zip(names, got, want):
        close(a, b, f"gradient of {name}")


def tree_module(classes=C, **options):
    torch.manual_seed(1)
    return edbatch.nn.TreeLSTM(structures.VOCAB, 6, 7, classes=classes, threads=1, **options)


def sst_batch(n=6, seed=2):
    lines = edbatch.packing.synthetic_sst(n, vocab_size=structures.VOCAB, seed=seed)
    return edbatch.pack_sst(lines, {f"w{i}": i for i in range(structures.VOCAB)})


def test_module_loss_equals_pytorch_head_over_its_outputs():
    m = tree_module()
    packed = sst_batch()
    assert (packed.labels >= 0).all()
    loss = m.loss(packed)  # packed's own labels
    got = torch.autograd.grad(loss, list(m.parameters()))
    h = m(packed)[0]
    ref = F.cross_entropy(m.head(h), packed.labels, reduction="sum")
    want = torch.autograd.grad(ref, list(m.parameters()))
    close(loss.detach(), ref.detach(), "loss")
    for (name, _), a, b in zip(m.named_parameters(), got, want):
        close(a, b, f"gradient of {name}")
    assert "cell.head.weight" in m.state_dict()


@pytest.mark.parametrize("trees", [40, 80])
def test_loss_over_many_labelled_nodes(trees):
    """Over a thousand and more labelled nodes (the engine sums their losses in chunks): the
    loss and the gradients equal PyTorch's head over the module's outputs."""
    m = tree_module()
    packed = sst_batch(trees, seed=4)
    labels = random_labels(packed.num_nodes, 11, unlabelled=0.1)
    assert int((labels >= 0).sum()) > 32 * 32 // (2 if trees == 40 else 1)
    for reduction in ("sum", "mean"):
        m.cell.reduction = reduction
        loss = m.loss(packed, labels=labels)
        got = torch.autograd.grad(loss, list(m.parameters()))
        h = m(packed)[0]
        ref = head_loss(h, m.head.weight, m.head.bias, labels, reduction)
        want = torch.autograd.grad(ref, list(m.parameters()))
        close(loss.detach(), ref.detach(), f"{reduction} loss")
        for (name, _), a, b in zip(m.named_parameters(), got, want):
            close(a, b, f"{reduction} gradient of {name}")


def test_no_labels_and_empty_batch_give_zero():
    m = tree_module()
    for packed, labels in ((sst_batch(), None), (edbatch.pack_sst([], {}), None)):
        if packed.num_nodes:
            labels = torch.full((packed.num_nodes,), -1, dtype=torch.long)
        loss = m.loss(packed, labels=labels)
        assert float(loss) == 0.0
        grads = torch.autograd.grad(loss, list(m.parameters()), allow_unused=True)
        assert all(g is None or not g.any() for g in grads)


def test_refusals_name_what_is_wrong():
    m = tree_module()
    packed = sst_batch()
    bad = packed.labels.clone()
    bad[4] = C
    with pytest.raises(ValueError, match=rf"node 4 has label {C}, outside \[-1, {C}\)"):
        m.loss(packed, labels=bad)
    with pytest.raises(ValueError, match="labels has 3 entries"):
        m.loss(packed, labels=packed.labels[:3])
    with pytest.raises(ValueError, match="needs a loss head: make the module with classes"):
        edbatch.nn.TreeLSTM(structures.VOCAB, 6, 7).loss(packed)
    with pytest.raises(TypeError, match=f"{type(m).__name__}: labels must be an int64 tensor"):
        m.loss(packed, labels=[1, 2])
    with pytest.raises(TypeError, match="labels must be int64, got Int"):
        m.loss(packed, labels=packed.labels.int())
    with pytest.raises(ValueError, match="reduction must be 'sum' or 'mean'"):
        tree_module(reduction="max")
    with pytest.raises(ValueError, match="classes must be a positive int"):
        tree_module(classes=0)
    with pytest.raises(ValueError, match="needs a loss head"):
        edbatch.nn.Propagate(cells.LSTMCell(6, 5), state_size=(6, 6)).loss(packed)


def test_prepared_loss_equals_unprepared_and_follows_labels():
    m = tree_module()
    packed = sst_batch()

    def step(labels=None):
        loss = m.loss(packed, labels=labels)
        return [loss.detach()] + list(torch.autograd.grad(loss, list(m.parameters())))

    want = step()
    used = edbatch.prepare_stats()["used"]
    m.prepare(packed)
    got = step()
    assert edbatch.prepare_stats()["used"] == used + 1
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # Prepared with packed's labels, called with others: not served, and right.
    other = random_labels(packed.num_nodes, 12)
    fresh = step(other)
    m.prepare(packed)
    assert all(torch.equal(a, b) for a, b in zip(step(other), fresh))
    assert edbatch.prepare_stats()["used"] == used + 1


def test_packed_to_keeps_host_labels():
    packed = sst_batch()
    moved = packed.to("cpu")
    assert torch.equal(moved.host_labels(), packed.labels)
    moved.labels = torch.zeros_like(moved.labels)  # replaced: the kept copy is not used
    assert not moved.host_labels().any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_host_copies_follow_changes_in_place_on_the_gpu():
    """Labels and ids changed in place on the GPU (word dropout) after to(): the host copies
    the loss head and the cells' embeddings read follow."""
    moved = sst_batch().to("cuda")
    assert moved.host_labels()[0] != -1
    moved.labels[0] = -1
    moved.input_ids[1] = 3
    assert moved.host_labels()[0] == -1 and moved.host_input_ids()[1] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("prepared", [False, True])
def test_cuda_equals_cpu(prepared):
    torch.manual_seed(4)
    size, D = 6, 5
    packed = structures.packed("lattices", 6)
    labels = random_labels(packed.num_nodes, 2)
    packed.labels = labels
    user = edbatch.nn.Propagate(cells.LSTMCell(size, D), state_size=(size, size), classes=C)
    x = torch.randn(packed.input_ids.numel(), D)
    for model, inputs in ((tree_module(), {}), (user, {"x": x})):
        batch = sst_batch() if not inputs else packed
        results = []
        for device in ("cpu", "cuda"):
            m = copy.deepcopy(model).to(device)
            b = batch.to(device)
            args = {k: v.to(device) for k, v in inputs.items()}
            if prepared:
                m.prepare(b, **({"input_size": D} if args else {}))
            loss = m.loss(b, **args)
            grads = torch.autograd.grad(loss, list(m.parameters()))
            results.append([loss.detach().cpu()] + [g.cpu() for g in grads])
        for a, b in zip(*results):
            close(b, a, "cuda against cpu", tol=1e-4)
