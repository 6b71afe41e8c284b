"""The nn.Modules and pack helpers: SST parsing, lattice and DAG packing, module outputs equal the
op on the module's own embeddings, and a few SGD steps lower a Tree-LSTM classifier's loss."""
import pytest
import torch
import torch.utils.checkpoint

import edbatch
from edbatch.packing import parse_lattices, synthetic_sst, synthetic_lattices

import reference


def test_parse_sst_and_pack():
    vocab = {}
    tree, labels = edbatch.parse_sst("(3 (2 it) (4 (2 's) (4 good)))", vocab)
    assert tree == (0, (1, 2)) and labels == [2, 2, 4, 4, 3]
    assert vocab == {"it": 0, "'s": 1, "good": 2}
    packed = edbatch.pack_sst(["(3 (2 it) (4 (2 's) (4 good)))", "(1 bad)"], vocab)
    assert packed.num_instances == 2 and packed.num_nodes == 6
    assert packed.labels.tolist() == [2, 2, 4, 4, 3, 1]
    assert packed.pred_ptr.tolist() == [0, 0, 0, 0, 2, 4, 4]
    assert packed.pred_ids.tolist() == [1, 2, 0, 3]
    assert packed.roots.tolist() == [4, 5]
    with pytest.raises(ValueError, match="malformed line"):
        edbatch.parse_sst("(3 (2 it)", vocab)


def test_synthetic_sst_lines_parse():
    lines = synthetic_sst(20, seed=4)
    packed = edbatch.pack_sst(lines, {})
    assert packed.num_instances == 20
    assert packed.labels.min() >= 0 and packed.labels.max() <= 4


def test_lattice_text_and_packing():
    text = "1\n3\n1 2 3\n0\n1 0 7\n2 1 8 0 9\n"
    records = parse_lattices(text)
    assert records == [{"arcs": [[], [(0, 7)], [(1, 8), (0, 9)]], "tags": [1, 2, 3]}]
    assert parse_lattices("\ufeff" + text) == records  # a file's byte order mark
    for bad, message in [(text[:-2], "the text ends where an arc's word id in lattice 0"),
                         (text.replace("1 2 3", "1 x 3"), "expected lattice 0's tags, got 'x'")]:
        with pytest.raises(ValueError, match=f"parse_lattices: {message}"):
            parse_lattices(bad)
    packed = edbatch.pack_lattices(records)
    assert packed.arc_types.tolist() == [0, 0, 1]  # char, char, word
    assert packed.input_ids.tolist() == [7, 8, 9]
    assert packed.input_kinds.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="comes from node 2"):
        edbatch.pack_lattices([{"arcs": [[], [(0, 1)], [(2, 1)]]}])


def test_concat_packed_equals_packing_together():
    a, b = synthetic_lattices(2, seed=1), synthetic_lattices(3, seed=2)
    joined = edbatch.concat_packed([edbatch.pack_lattices(a), edbatch.pack_lattices(b)])
    whole = edbatch.pack_lattices(a + b)
    for name in ("node_inputs", "pred_ptr", "pred_ids", "arc_types", "arc_inputs",
                 "instance_offsets", "input_ids", "input_kinds", "labels"):
        assert torch.equal(getattr(joined, name), getattr(whole, name)), name


@pytest.mark.parametrize("make", [
    lambda: (edbatch.nn.TreeLSTM(30, 6, 5), "trees"),
    lambda: (edbatch.nn.TreeGRU(30, 5), "trees"),
    lambda: (edbatch.nn.LatticeLSTM(30, 6, 5), "lattices"),
    lambda: (edbatch.nn.LatticeGRU(30, 6, 5), "lattices"),
    lambda: (edbatch.nn.RandomDAG(30, 6, 5, num_state_types=2, num_arc_types=3), "dags"),
])
def test_modules_match_reference(make):
    torch.manual_seed(0)
    module, kind = make()
    if kind == "trees":
        packed = edbatch.pack_trees([((1, 2), 3), 4, (5, (6, 7))])
    elif kind == "lattices":
        packed = edbatch.pack_lattices(synthetic_lattices(3, vocab_size=30, seed=5))
    else:
        packed = edbatch.pack_dags([{"types": [0, 1, 1], "inputs": [3, 4, 5],
                                     "arcs": [[], [(0, 2)], [(0, 0), (1, 1)]]}])
    ours = module(packed)
    x = module.embed(packed)
    w = dict(zip(module.cell.weight_names, module.cell.weights()))
    ref = reference.CELLS[module.cell.cell](x, packed, w)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    sum(o.sum() for o in ours).backward()
    for p in module.parameters():
        assert p.grad is not None


def _grads(module, losses, retain):
    """The parameters' gradients after one backward per loss (retain: every one but the last
    with retain_graph=True), or one backward of their sum."""
    module.zero_grad()
    if retain:
        for i, loss in enumerate(losses):
            loss.backward(retain_graph=i + 1 < len(losses))
    else:
        sum(losses).backward()
    return [p.grad.clone() for p in module.parameters()]


def test_retained_graph_and_double_backward():
    """Two backwards through one forward (retain_graph=True before the second) add up as one of
    the losses' sum; without retain_graph the second is refused; create_graph=True gives the right
    first-order gradients and refuses differentiating them."""
    torch.manual_seed(2)
    module = edbatch.nn.TreeLSTM(30, 6, 5)
    packed = edbatch.pack_trees([((1, 2), 3), 4, (5, (6, 7))])
    h, _ = module(packed)
    g = torch.randn(h.shape)
    want = _grads(module, [(h * g).sum(), h.pow(2).sum()], retain=False)
    h, _ = module(packed)
    got = _grads(module, [(h * g).sum(), h.pow(2).sum()], retain=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, b.abs().max().item()))
    h, _ = module(packed)
    h.sum().backward()
    with pytest.raises(RuntimeError, match="did not keep: pass retain_graph=True"):
        h.sum().backward()
    h, _ = module(packed)
    params = list(module.parameters())
    grads = torch.autograd.grad(h.pow(2).sum(), params, create_graph=True)
    for a, b in zip(grads, _grads(module, [module(packed)[0].pow(2).sum()], retain=False)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, b.abs().max().item()))
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        sum(q.pow(2).sum() for q in grads).backward()
    # A gradient penalty whose incoming gradient needs none (h.sum()'s ones), added to another
    # loss: refused, not silently left out of the parameters' gradients.
    x = torch.randn(8, 6, requires_grad=True)
    h, _ = module(packed, x=x)
    gx, = torch.autograd.grad(h.sum(), x, create_graph=True)
    assert gx.requires_grad
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        (h.pow(2).sum() + gx.pow(2).sum()).backward()
    # The same penalty differentiated with respect to chosen tensors (autograd.grad of the
    # parameters, backward(inputs=...), a Hessian): refused too, not passed by.
    for differentiate in (lambda loss: torch.autograd.grad(loss, params),
                          lambda loss: loss.backward(inputs=params),
                          lambda loss: torch.autograd.grad(loss, x)):
        h, _ = module(packed, x=x)
        gx, = torch.autograd.grad(h.sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="cannot be differentiated again"):
            differentiate(h.pow(2).sum() + 10 * gx.pow(2).sum())
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        torch.autograd.functional.hessian(lambda v: module(packed, x=v)[0].pow(2).sum(), x)


def test_module_hooks_and_checkpoint_see_the_outputs():
    """The modules return tuples, which module hooks and torch.utils.checkpoint look into (a list
    they pass over): a full backward hook on the module and on its cell runs, with x's gradient,
    and a reentrant checkpoint of the cell gives the plain call's gradients."""
    torch.manual_seed(41)
    module = edbatch.nn.TreeLSTM(30, 6, 5)
    packed = edbatch.pack_trees([((1, 2), 3), 4, (5, (6, 7))])
    out = module(packed)
    assert isinstance(out, tuple) and len(out) == 2
    seen = []
    for m in (module, module.cell):
        m.register_full_backward_hook(lambda mod, gin, gout: seen.append(
            (type(mod).__name__, [g is not None for g in gin])))
    x = torch.randn(8, 6, requires_grad=True)
    module(packed, x)[0].sum().backward()
    assert sorted(name for name, _ in seen) == sorted([type(module).__name__,
                                                       type(module.cell).__name__])
    assert all(any(has) for _, has in seen)  # x's gradient reaches both hooks
    plain = x.grad.clone()
    x.grad = None
    h, _ = torch.utils.checkpoint.checkpoint(module.cell, x, packed, use_reentrant=True)
    h.sum().backward()
    torch.testing.assert_close(x.grad, plain)


def test_mvrnn_module_matches_reference():
    torch.manual_seed(1)
    module = edbatch.nn.MVRNN(20, 4)
    packed = edbatch.pack_trees([((1, 2), 3), 4])
    v, M = module(packed)
    assert M.shape == (packed.num_nodes, 4, 4)
    # Leaves return their own word matrix, as stored in the embedding.
    torch.testing.assert_close(M[0], module.matrices.weight[1].view(4, 4))
    vs = module.vectors(packed.input_ids)
    Ms = module.matrices(packed.input_ids).view(-1, 4, 4).transpose(1, 2).reshape(-1, 16)
    w = dict(zip(module.cell.weight_names, module.cell.weights()))
    ref = reference.mvrnn(torch.cat([vs, Ms], 1), packed, w)
    torch.testing.assert_close(v, ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(M.transpose(1, 2).reshape(-1, 16), ref[1], rtol=1e-4, atol=1e-5)


def test_training_lowers_the_loss():
    torch.manual_seed(0)
    vocab = {}
    packed = edbatch.pack_sst(synthetic_sst(40, vocab_size=50, seed=2, max_words=8), vocab)
    model = edbatch.nn.TreeLSTM(len(vocab), 16, 16)
    out = torch.nn.Linear(16, 5)
    opt = torch.optim.Adam(list(model.parameters()) + list(out.parameters()), lr=0.05)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        h, _ = model(packed)
        loss = torch.nn.functional.cross_entropy(out(h), packed.labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_x_of_the_wrong_width_is_named():
    """x whose columns are not the cell's input_size: x is named, not the first weight."""
    model = edbatch.nn.TreeLSTM(30, 6, 5, classes=3)
    packed = edbatch.pack_trees([((1, 2), 3)], [[0, 1, 2, 0, 1]])
    for call in (lambda x: model(packed, x=x), lambda x: model.loss(packed, x=x),
                 lambda x: model.loss_step(packed, x=x)):
        with pytest.raises(ValueError, match=r"x has 7 columns, the cell's input_size is 6"):
            call(torch.randn(3, 7))


def test_a_random_dag_state_without_an_input_row_is_named():
    """Every random_dag state reads an input row, a state with predecessors too."""
    model = edbatch.nn.RandomDAG(30, 6, 5, num_state_types=2, num_arc_types=1)
    packed = edbatch.pack_dags([{"types": [0, 1], "inputs": [3, None], "arcs": [[], [(0, 0)]]}])
    with pytest.raises(ValueError, match="random_dag: node 1 has no input row \\(every state "
                                         "reads one\\)"):
        model(packed)


def test_changes_in_place_between_forward_and_backward_are_refused():
    """A weight or x changed in place after the forward (an optimizer step before backward)
    makes the backward raise PyTorch's error, as eager PyTorch does for what it saves, rather
    than give gradients at the old values; a step after the backward is as usual."""
    torch.manual_seed(5)
    module = edbatch.nn.TreeLSTM(30, 6, 5)
    packed = edbatch.pack_trees([((1, 2), 3), 4, (5, (6, 7))])
    x = module.embed(packed).detach().requires_grad_()
    for change, name in ((lambda: module.cell.U_i.add_(0.5), "U_i"), (lambda: x.mul_(2), "x")):
        h, _ = module(packed, x=x)
        with torch.no_grad():
            change()
        with pytest.raises(RuntimeError, match=f"modified by an inplace operation: {name} is at"):
            h.sum().backward()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        module(packed)[0].sum().backward()
        optimizer.step()
