"""Training steps inside the engine (loss_step on Propagate and the built-in modules,
run_cell(..., step=True), edbatch.apply_gradients): the loss and every gradient equal those of
loss() followed by backward() (itself checked against independent references in
test_loss_head.py), x's gradient reaches what made x through autograd, existing .grad
accumulates, lr= updates the parameters in place exactly as plain SGD on those gradients would
(the built-in modules' embeddings included, padding rows left alone), no autograd graph is
recorded, a prepared call is served, and a call without a loss head is refused."""
import copy

import pytest
import torch
import torch.nn.functional as F

import edbatch

import cells
import reference
import structures
from test_loss_head import C, close, random_labels, sst_batch, tree_module

pytestmark = pytest.mark.skipif(not edbatch.propagate.has_propagate_op(),
                                reason="the loaded extension has no propagate op")


def user_model(kind, dropout=0.0):
    torch.manual_seed(3)
    node = cells.LSTMCell(6, 5, dropout=dropout)
    edge = cells.GateEdge(6, 5) if kind == "lattices" else None
    embed = torch.nn.Embedding(structures.VOCAB, 5)
    prop = edbatch.nn.Propagate(node, edge, reduce="sum", state_size=(6, 6), classes=C,
                                threads=1)
    return embed, prop


def reference_grads(embed, prop, packed, labels):
    """loss() and backward(): the loss and every parameter's gradient."""
    for p in [*embed.parameters(), *prop.parameters()]:
        p.grad = None
    loss = prop.loss(packed, x=embed(packed.input_ids), labels=labels)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in [*embed.parameters(), *prop.parameters()]]


@pytest.mark.parametrize("kind", ["trees", "lattices", "dags"])
def test_propagate_step_equals_loss_backward(kind):
    embed, prop = user_model(kind)
    packed = structures.packed(kind, 11)
    labels = random_labels(packed.num_nodes, 12)
    want_loss, want = reference_grads(embed, prop, packed, labels)
    for p in [*embed.parameters(), *prop.parameters()]:
        p.grad = None
    loss = prop.loss_step(packed, x=embed(packed.input_ids), labels=labels)
    assert loss.grad_fn is None and not loss.requires_grad
    close(loss, want_loss, "loss")
    params = [*embed.parameters(), *prop.parameters()]
    names = ["embedding"] + [n for n, _ in prop.named_parameters()]
    for name, p, w in zip(names, params, want):
        assert p.grad is not None, name
        close(p.grad, w, f"gradient of {name}", tol=1e-6)
    # A second step accumulates, as a second backward() does.
    prop.loss_step(packed, x=embed(packed.input_ids), labels=labels)
    for name, p, w in zip(names, params, want):
        close(p.grad, 2 * w, f"accumulated gradient of {name}", tol=1e-6)


def test_propagate_step_with_lr_is_sgd():
    embed, prop = user_model("trees")
    packed = structures.packed("trees", 13)
    labels = random_labels(packed.num_nodes, 14)
    _, want = reference_grads(embed, prop, packed, labels)
    before = [p.detach().clone() for p in prop.parameters()]
    for p in [*embed.parameters(), *prop.parameters()]:
        p.grad = None
    lr = 0.37
    prop.loss_step(packed, x=embed(packed.input_ids), labels=labels, lr=lr)
    for (name, p), b, g in zip(prop.named_parameters(), before, want[1:]):
        assert p.grad is None, f"{name}: lr= leaves .grad alone"
        close(p.detach(), b - lr * g, f"{name} after the update", tol=1e-6)
    # x was made by the embedding: its gradient went back through autograd, not into the update.
    close(embed.weight.grad, want[0], "embedding gradient", tol=1e-6)


@pytest.mark.parametrize("kind", ["dags", "trees"])  # a tree's inner nodes embed zeros
def test_propagate_step_with_ids_updates_the_cells_embedding(kind):
    torch.manual_seed(5)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, 0, vocab=structures.VOCAB),
                                 state_size=7, classes=C, threads=1)
    packed = structures.packed(kind, 31)
    labels = random_labels(packed.num_nodes, 15)
    loss = model.loss(packed, ids=packed.input_ids, labels=labels)
    params = list(model.parameters())
    want = torch.autograd.grad(loss, params, allow_unused=True)
    before = [p.detach().clone() for p in params]
    got = model.loss_step(packed, ids=packed.input_ids, labels=labels, lr=0.5)
    close(got, loss.detach(), "loss")
    moved = 0
    for (name, p), b, g in zip(model.named_parameters(), before, want):
        g = torch.zeros_like(b) if g is None else g
        close(p.detach(), b - 0.5 * g, f"{name} after the update", tol=1e-6)
        moved += int(bool((g != 0).any()))
    assert model.node_cells[0].emb.weight.grad is None
    assert moved >= 3  # the embedding inside the cell, the cell's weights, the head
    # Without lr the gradients accumulate into .grad, the table's dense as backward's.
    for p in params:
        p.grad = None
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(b)
    model.loss_step(packed, ids=packed.input_ids, labels=labels)
    for (name, p), g in zip(model.named_parameters(), want):
        if g is not None:
            assert not p.grad.is_sparse
            close(p.grad, g, f"{name}'s gradient", tol=1e-6)


def test_step_on_an_empty_batch_after_a_full_one():
    """A cell that embeds its ids, stepped on an empty batch (its table's gradient made from the
    touched rows: none), after a batch that touched rows: a zero loss, no update."""
    torch.manual_seed(6)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, 0, vocab=structures.VOCAB),
                                 state_size=7, classes=C, threads=1)
    packed = structures.packed("dags", 32)
    model.loss_step(packed, ids=packed.input_ids, labels=random_labels(packed.num_nodes, 16))
    empty = edbatch.pack_trees([])
    before = [p.detach().clone() for p in model.parameters()]
    for lr in (None, 0.5):
        loss = model.loss_step(empty, ids=empty.input_ids, lr=lr)
        assert loss.item() == 0
    for (name, p), b in zip(model.named_parameters(), before):
        assert torch.equal(p.detach(), b), name


def test_tables_are_read_at_each_calls_ids():
    """A cell's embedding table is read at the ids of each call: after the table changes, a call
    over other ids (some seen before, some not) equals the eager cell."""
    torch.manual_seed(6)
    model = edbatch.nn.Propagate(cells.OpCell("tanh", 7, 0, vocab=structures.VOCAB),
                                 state_size=7, threads=1)
    table = model.node_cells[0].emb.weight
    first = edbatch.pack_edges([{"num_nodes": 3, "edges": [(0, 2), (1, 2)],
                                 "inputs": [1, 2, 3]}])
    model(first, ids=first.input_ids)
    with torch.no_grad():
        table.mul_(-2).add_(0.5)
    second = edbatch.pack_edges([{"num_nodes": 4, "edges": [(0, 1), (1, 2), (2, 3)],
                                  "inputs": [2, 7, 11, 30]}])
    got = model(second, ids=second.input_ids)
    want = reference.propagate_reference(list(model.node_cells), None, second,
                                         ids=second.input_ids, state_size=7)
    close(got, want, "states after the table changed", tol=1e-5)


def test_sparse_gradients_in_apply_gradients():
    """A lookup table's gradient from a step is sparse (its touched rows, repeats adding up): lr
    updates only those rows; without lr it accumulates densely, before or after a dense one."""
    t = torch.nn.Parameter(torch.zeros(5, 2))
    rows = torch.sparse_coo_tensor(torch.tensor([[3, 1, 3]]), torch.ones(3, 2), (5, 2))
    dense = torch.full((5, 2), 0.5)
    edbatch.apply_gradients([t, t], [rows, dense])
    edbatch.apply_gradients([t, t], [dense, rows])
    want = 2 * (rows.to_dense() + dense)
    assert torch.equal(t.grad, want) and not t.grad.is_sparse
    edbatch.apply_gradients([t], [rows], lr=0.5)
    assert torch.equal(t.detach(), -0.5 * rows.to_dense()) and t[0].abs().sum() == 0


def test_propagate_step_with_dropout_uses_the_calls_masks():
    embed, prop = user_model("trees", dropout=0.4)
    prop.train()
    packed = structures.packed("trees", 16)
    labels = random_labels(packed.num_nodes, 17)
    torch.manual_seed(40)
    want_loss, want = reference_grads(embed, prop, packed, labels)
    seed = prop.last_seed
    for p in [*embed.parameters(), *prop.parameters()]:
        p.grad = None
    torch.manual_seed(40)
    loss = prop.loss_step(packed, x=embed(packed.input_ids), labels=labels)
    assert prop.last_seed == seed != 0
    close(loss, want_loss, "loss")
    for p, w in zip([*embed.parameters(), *prop.parameters()], want):
        close(p.grad, w, "gradient", tol=1e-6)


@pytest.mark.parametrize("module", ["tree_lstm", "lattice_lstm", "mvrnn"])
def test_builtin_step_with_lr_updates_every_parameter(module):
    if module == "tree_lstm":
        m, packed = tree_module(), sst_batch()
    elif module == "mvrnn":  # the word matrices' rows are read transposed: updated back so
        torch.manual_seed(4)
        m, packed = edbatch.nn.MVRNN(structures.VOCAB, 4, classes=C, threads=1), sst_batch()
        ref = copy.deepcopy(m)
        v, _ = ref(packed)
        close(m.loss(packed), F.cross_entropy(ref.head(v), packed.labels, reduction="sum"),
              "MVRNN's loss head over v")
    else:
        torch.manual_seed(2)
        m = edbatch.nn.LatticeLSTM(structures.VOCAB, 6, 7, classes=C, threads=1)
        packed = structures.packed("lattices", 18)
        packed.input_kinds = torch.randint(0, 2, packed.input_ids.shape,
                                           generator=torch.Generator().manual_seed(3))
        packed.labels = random_labels(packed.num_nodes, 19)
    ref = copy.deepcopy(m)
    ref.loss(packed).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p.sub_(0.25 * p.grad)
    loss = m.loss_step(packed, lr=0.25)
    assert loss.grad_fn is None
    for (name, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert p.grad is None, name
        close(p.detach(), q.detach(), f"{name} after the update", tol=1e-6)


def test_builtin_step_accumulates_like_backward_and_skips_padding():
    m, packed = tree_module(), sst_batch()
    pad = int(packed.input_ids[0])
    m.embeddings[0].padding_idx = pad
    ref = copy.deepcopy(m)
    ref.loss(packed).backward()
    m.loss_step(packed)  # no lr: .grad, through autograd for the embedding
    for (name, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        close(p.grad, q.grad, f"gradient of {name}", tol=1e-6)
    assert not ref.embeddings[0].weight.grad[pad].any()
    # With lr, the padding row stays as it was, like plain SGD after backward().
    before = m.embeddings[0].weight.detach().clone()
    m.loss_step(packed, lr=0.5)
    assert torch.equal(m.embeddings[0].weight[pad], before[pad])
    assert not torch.equal(m.embeddings[0].weight, before)


def test_cell_step_returns_every_gradient():
    m, packed = tree_module(), sst_batch()
    x = m.embed(packed).detach().requires_grad_()
    weights = m.cell.weights() + [m.head.weight, m.head.bias]
    want = torch.autograd.grad(m.cell.loss(x, packed), [x, *weights])
    out = edbatch.run_cell("tree_lstm", x, packed, weights, 7, threads=1,
                           labels=packed.labels, loss="sum", step=True)
    assert len(out) == 2 + len(weights) and out[0].dim() == 0
    for i, (a, b) in enumerate(zip(out[1:], want)):
        close(a, b, f"gradient {i}", tol=1e-6)
    m.cell.loss_step(x, packed)  # x is a leaf: its gradient goes into x.grad
    close(x.grad, want[0], "x.grad", tol=1e-6)


def test_step_is_served_a_prepared_call():
    embed, prop = user_model("dags")
    packed = structures.packed("dags", 20)
    packed.labels = random_labels(packed.num_nodes, 21)
    x = embed(packed.input_ids)
    want = prop.loss_step(packed, x=x)
    prop.prepare(packed, input_size=5)
    used = edbatch.prepare_stats()["used"]
    got = prop.loss_step(packed, x=embed(packed.input_ids))
    assert edbatch.prepare_stats()["used"] == used + 1
    assert torch.equal(got, want)


def test_step_needs_a_loss_head():
    torch.manual_seed(1)
    prop = edbatch.nn.Propagate(cells.LSTMCell(6, 5), state_size=(6, 6))
    packed = structures.packed("trees", 22)
    with pytest.raises(ValueError, match="loss head"):
        prop.loss_step(packed, x=torch.randn(packed.input_ids.numel(), 5))
    m, batch = tree_module(), sst_batch()
    with pytest.raises(ValueError, match="loss head"):
        edbatch.run_cell("tree_lstm", m.embed(batch), batch, m.cell.weights(), 7, step=True)
    with pytest.raises(ValueError, match="loss head"):  # the op's own refusal, as torch's
        torch.ops.edbatch.run_cell_step("tree_lstm", m.embed(batch), *batch.structure(),
                                        m.cell.weights(), 7, 1, 1, "lb-greedy", 1, None, "")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_step_equals_cpu():
    embed, prop = user_model("lattices")
    packed = structures.packed("lattices", 23)
    packed.labels = random_labels(packed.num_nodes, 24)
    results = []
    for device in ("cpu", "cuda"):
        models = [copy.deepcopy(embed).to(device), copy.deepcopy(prop).to(device),
                  tree_module().to(device)]
        b = packed.to(device)
        losses = [models[1].loss_step(b, x=models[0](b.input_ids), lr=0.3),
                  models[2].loss_step(sst_batch().to(device), lr=0.3)]
        results.append([t.detach().cpu() for t in losses] +
                       [p.detach().cpu() for m in models for p in m.parameters()] +
                       [models[0].weight.grad.cpu()])
    for a, b in zip(*results):
        close(b, a, "cuda against cpu", tol=1e-4)


def test_apply_gradients_follows_backward():
    """A leaf accumulates (a tensor listed twice gets the sum), a tensor without grad is left
    alone, a computed tensor passes its gradient back through autograd, lr updates leaves."""
    a = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    frozen = torch.tensor([5.0])
    src = torch.nn.Parameter(torch.tensor([3.0]))
    made = src * 4  # d made / d src = 4
    g1, g2 = torch.tensor([0.5, 1.0]), torch.tensor([0.25, -1.0])
    edbatch.apply_gradients([a, frozen, a, made], [g1, torch.ones(1), g2, torch.tensor([2.0])])
    assert torch.equal(a.grad, g1 + g2) and frozen.grad is None
    assert torch.equal(src.grad, torch.tensor([8.0]))
    edbatch.apply_gradients([a], [g1])
    assert torch.equal(a.grad, 2 * g1 + g2)
    b = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    edbatch.apply_gradients([b, b], [g1, g2], lr=2.0)
    assert torch.equal(b.detach(), torch.tensor([1.0, 2.0]) - 2.0 * (g1 + g2)) and b.grad is None


def test_cell_step_with_lr_updates_in_place_what_it_can():
    """run_cell(step=True, lr=...): leaves in host memory are updated inside the call (their
    gradient None), the others' gradients come back for apply_gradients: a non-contiguous leaf,
    a weight computed from a leaf, a tensor listed twice, one that requires no grad. Every
    tensor ends as SGD on loss.backward()'s gradients leaves it, and the in-place writes bump
    the version counter as torch's in-place operations do."""
    m, packed = tree_module(), sst_batch()
    x = m.embed(packed).detach()
    with torch.no_grad():  # U_o = U_i: below one tensor stands for both
        m.cell.weights()[7].copy_(m.cell.weights()[6])
    values = [w.detach().clone() for w in m.cell.weights()] + [m.head.weight.detach().clone()]
    want = torch.autograd.grad(m.cell.loss(x, packed), m.cell.weights() + [m.head.weight])
    lr = 0.3
    ws = [torch.nn.Parameter(v.clone()) for v in values]
    ws[0] = torch.nn.Parameter(values[0].t().contiguous()).detach().t().requires_grad_()
    base = torch.nn.Parameter(values[1].clone())
    ws[1] = base * 1.0
    ws[7] = ws[6]  # U_i and U_o, both (7, 14): one tensor listed twice
    frozen = m.head.bias.detach().clone()
    weights = ws + [frozen]
    assert not ws[0].is_contiguous() and ws[0].is_leaf and not ws[1].is_leaf
    versions = [w._version for w in weights]
    out = edbatch.run_cell("tree_lstm", x, packed, weights, 7, threads=1, labels=packed.labels,
                           loss="sum", step=True, lr=lr)
    updated = [i for i, g in enumerate(out[2:]) if g is None]
    assert updated == [2, 3, 4, 5, 8, 9, 10, 11, 12]
    for i in updated:
        assert weights[i]._version > versions[i], f"weight {i}: version not bumped"
        close(weights[i].detach(), values[i] - lr * want[i], f"weight {i}", tol=1e-6)
    for i in (0, 1, 6, 7):
        close(out[2 + i], want[i], f"weight {i}'s gradient, returned", tol=1e-6)
    edbatch.apply_gradients(weights, out[2:], lr)
    close(ws[0].detach(), values[0] - lr * want[0], "the non-contiguous leaf", tol=1e-6)
    close(base.grad, want[1], "the computed weight's gradient, back through autograd", tol=1e-6)
    close(ws[6].detach(), values[6] - lr * (want[6] + want[7]), "the repeated tensor", tol=1e-6)
    assert torch.equal(frozen, m.head.bias.detach())


def test_step_in_place_update_is_seen_by_autograd():
    """A parameter saved for an autograd backward and then updated in place by a step: that
    backward refuses, as after any in-place update of a saved tensor in torch."""
    embed, prop = user_model("trees")
    packed = structures.packed("trees", 25)
    labels = random_labels(packed.num_nodes, 26)
    w = next(prop.parameters())
    saved = (w * w).sum()  # w is saved for this backward
    prop.loss_step(packed, x=embed(packed.input_ids).detach(), labels=labels, lr=0.1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


def test_step_op_refuses_a_bad_update_list():
    """The ops' update= names weights by index: one out of range, or one that cannot be written
    in place (not contiguous), is refused before anything runs, naming it."""
    m, batch = tree_module(), sst_batch()
    weights = m.cell.weights() + [m.head.weight, m.head.bias]
    args = ("tree_lstm", m.embed(batch).detach(), *batch.structure(), weights, 7, 1, 1,
            "lb-greedy", 1, batch.labels, "sum")
    before = [w.detach().clone() for w in weights]
    with pytest.raises(ValueError, match="weight index 99 out of range"):
        torch.ops.edbatch.run_cell_step(*args, 0.1, [99])
    bent = list(weights)
    bent[0] = torch.nn.Parameter(weights[0].detach().t().contiguous()).t()
    with pytest.raises(ValueError, match="weight 0 must be a contiguous float32"):
        torch.ops.edbatch.run_cell_step(*args[:9], bent, *args[10:], 0.1, [0])
    for w, b in zip(weights, before):
        assert torch.equal(w.detach(), b)
