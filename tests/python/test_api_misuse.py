"""The public API called the way users get it wrong: every wrong argument is refused with a
TypeError or ValueError naming the function and the argument, before it reaches the engine
(where a size would wrap around 32 bits or a wrong type would surface torch's own error)."""
import inspect

import numpy as np
import pytest
import torch

import edbatch
from edbatch import nn as enn

H = 4


def tree_batch():
    return edbatch.pack_trees([((1, 2), 3), 4])  # 2 trees, 6 nodes, 4 input rows


def tree_call():
    weights = [torch.randn(s) * 0.1 for _, s in edbatch.weight_shapes("tree_lstm", H, H)]
    return tree_batch(), torch.randn(4, H), weights


def user_cell():
    return enn.Propagate(lambda x, m: torch.tanh(x + m), state_size=H).eval()


# 1. Sizes and counts: ints within the engine's 32-bit sizes, never wrapped around.

@pytest.mark.parametrize("args, error, message", [
    (("tree_lstm", 2**32 + 4, 4), ValueError, "hidden_size must be a positive int"),
    (("tree_lstm", 2**40, 4), ValueError, "hidden_size .* got 1099511627776"),
    (("random_dag", 4, 4, 2**32 + 1, 2), ValueError, "num_node_types .* got 4294967297"),
    (("random_dag", 4, 4, 1, 2**32 + 2), ValueError, "num_arc_types .* got 4294967298"),
    (("tree_lstm", 4.0, 4), TypeError, r"hidden_size must be .* got 4.0 \(a float\)"),
    (("tree_lstm", True, 4), TypeError, r"hidden_size .* got True \(a bool\)"),
    (("tree_lstm", 4, "4"), TypeError, "input_size"),
    (("tree_lstm", 4, 0), ValueError, "input_size must be a positive int"),
    ((None, 4, 4), TypeError, "cell must be a str"),
    (("mvrnn", 65536, 65536), ValueError, "mvrnn's input_size must be hidden"),
])
def test_weight_shapes_refuses_sizes_it_cannot_hold(args, error, message):
    with pytest.raises(error, match="edbatch.weight_shapes: " + message):
        edbatch.weight_shapes(*args)


def test_weight_shapes_takes_integers_that_stand_for_ints_alike():
    want = edbatch.weight_shapes("tree_lstm", H, 3)
    assert edbatch.weight_shapes("tree_lstm", np.int64(H), torch.tensor(3)) == want
    # A float is refused whether or not the same sizes as ints were asked for before.
    with pytest.raises(TypeError, match="hidden_size"):
        edbatch.weight_shapes("tree_lstm", float(H), 3)
    # The list handed back is the caller's own.
    edbatch.weight_shapes("tree_lstm", H, 3).clear()
    assert edbatch.weight_shapes("tree_lstm", H, 3) == want


@pytest.mark.parametrize("make, message", [
    (lambda: enn.TreeLSTM(10, 4, 2**32 + 4), "TreeLSTM: hidden_size"),
    (lambda: enn.TreeLSTM(10, 4, 4.0), "TreeLSTM: hidden_size"),
    (lambda: enn.TreeLSTM(10, 4, True), "TreeLSTM: hidden_size"),
    (lambda: enn.TreeLSTM(10, 0, 4), "TreeLSTM: input_size must be a positive int"),
    (lambda: enn.TreeLSTM(-1, 4, 4), "TreeLSTM: vocab_size must be a positive int"),
    (lambda: enn.TreeLSTM(4.0, 4, 4), "TreeLSTM: vocab_size"),
    (lambda: enn.TreeLSTM(10, 4, 4, classes=True), "TreeLSTM: classes must be a positive int"),
    (lambda: enn.TreeGRU(10, 2**31), "TreeGRU: hidden_size"),
    (lambda: enn.RandomDAG(10, 4, 4, num_state_types=2**32 + 1), "RandomDAG: num_state_types"),
    (lambda: enn.MVRNN(10, 50000), "MVRNN: hidden_size 50000 makes input rows"),
    (lambda: enn.Cell("tree_lstm", 4, 2**32 + 4), "Cell.*hidden_size"),
    (lambda: enn.Propagate(lambda x, m: m, state_size=2**32), "Propagate: state_size"),
])
def test_modules_refuse_sizes_they_cannot_hold(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_module_sizes_of_numpy_ints_are_ints():
    m = enn.TreeLSTM(np.int64(10), np.int32(H), np.int64(H))
    assert type(m.cell.hidden_size) is int and type(m.cell.input_size) is int
    h, c = m(tree_batch())
    assert h.shape == (6, H)


# 2. apply_gradients: a gradient per tensor.

def test_apply_gradients_refuses_lists_of_other_lengths():
    a, b = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="apply_gradients: 2 tensors but 1 gradients"):
        edbatch.apply_gradients([a, b], [torch.ones(3)])
    with pytest.raises(ValueError, match="apply_gradients: 1 tensors but 2 gradients"):
        edbatch.apply_gradients([a], [torch.ones(3), torch.ones(5)])
    assert a.grad is None and b.grad is None


def test_apply_gradients_passes_over_a_gradient_none():
    a, b = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    edbatch.apply_gradients([a, b], [None, torch.ones(2)])
    assert a.grad is None and torch.equal(b.grad, torch.ones(2))
    edbatch.apply_gradients([a, b], [None, torch.ones(2)], lr=0.5)
    assert torch.equal(a.detach(), torch.zeros(3)) and torch.equal(b.detach(), -0.5 * torch.ones(2))


@pytest.mark.parametrize("tensors, grads, lr, error, message", [
    (torch.zeros(3, requires_grad=True), torch.ones(3), None, TypeError, "tensors must be a list"),
    ([torch.zeros(3, requires_grad=True)], [np.ones(3)], None, TypeError, r"grads\[0\] must be"),
    ([1.0], [torch.ones(1)], None, TypeError, r"tensors\[0\] must be a tensor"),
    ([torch.zeros(3, requires_grad=True)], [torch.ones(4)], None, ValueError,
     r"grads\[0\] has shape"),
    ([torch.zeros(3, requires_grad=True)], [torch.ones(3)], "0.1", TypeError, "lr must be a num"),
    ([torch.zeros(3, requires_grad=True)], [torch.ones(3)], float("nan"), ValueError, "lr"),
])
def test_apply_gradients_names_what_is_wrong(tensors, grads, lr, error, message):
    with pytest.raises(error, match="apply_gradients: " + message):
        edbatch.apply_gradients(tensors, grads, lr)


# 3 and 5. run_cell, prepare, device_status: every argument checked by name.

@pytest.mark.parametrize("change, error, message", [
    (dict(cell=None), TypeError, "cell must be a str"),
    (dict(hidden_size=4.0), TypeError, "hidden_size must be a positive int"),
    (dict(hidden_size=2**32 + H), ValueError, "hidden_size"),
    (dict(num_node_types=2**32 + 1), ValueError, "num_node_types"),
    (dict(threads=None), TypeError, "threads must be an int"),
    (dict(policy=None), TypeError, "policy must be a str"),
    (dict(loss=True), ValueError, "loss must be 'sum' or 'mean'"),
    (dict(labels=torch.zeros(6, dtype=torch.long)), ValueError, "labels are read by a loss head"),
    (dict(loss="sum", labels=[0] * 6), TypeError, "labels must be an int64 tensor"),
    (dict(loss="sum", labels=np.zeros(6, np.int64)), TypeError, "labels must be an int64"),
    (dict(step=1, loss="sum"), TypeError, "step must be True or False"),
    (dict(weights=None), TypeError, "weights must be a list of tensors"),
    (dict(weights="numpy"), TypeError, r"weights\[0\] must be a tensor, got ndarray"),
    (dict(x=np.zeros((4, H), np.float32)), TypeError, "x must be a tensor"),
    (dict(node_inputs="numpy"), TypeError, "packed.node_inputs must be an int64 tensor"),
    (dict(loss="sum", labels=torch.zeros(6, dtype=torch.long)), ValueError,
     "loss='sum' needs the loss head's weight .* and bias .* after tree_lstm's 12 weights"),
])
def test_run_cell_names_every_bad_argument(change, error, message):
    packed, x, weights = tree_call()
    args = dict(cell="tree_lstm", x=x, packed=packed, weights=weights, hidden_size=H)
    args.update(change)
    if args["weights"] == "numpy":
        args["weights"] = [w.numpy() for w in weights]
    if args.pop("node_inputs", None):
        packed.node_inputs = packed.node_inputs.numpy()
    with pytest.raises(error, match="edbatch.run_cell: " + message):
        edbatch.run_cell(**args)


def test_run_cell_names_a_shortened_node_inputs():
    packed, x, weights = tree_call()
    packed.node_inputs = packed.node_inputs[:-1]
    with pytest.raises(ValueError, match="packed.node_inputs has 5 entries, but node_types"):
        edbatch.run_cell("tree_lstm", x, packed, weights, H)
    with pytest.raises(ValueError, match="Propagate: packed.node_inputs has 5 entries"):
        user_cell()(packed, x=x)


def test_run_cell_still_takes_weights_of_any_sequence():
    packed, x, weights = tree_call()
    want = edbatch.run_cell("tree_lstm", x, packed, weights, H)
    got = edbatch.run_cell("tree_lstm", x, packed, tuple(weights), np.int64(H))
    assert all(torch.equal(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("change, error, message", [
    (dict(hidden_size=4.5), TypeError, "hidden_size"),
    (dict(input_size=2**32 + H), ValueError, "input_size"),
    (dict(device=None), TypeError, "device must be a str"),
    (dict(device="gpu"), ValueError, "device 'gpu' is not a device"),
    (dict(num_x=1.5), TypeError, "num_x must be an int"),
    (dict(threads="2"), TypeError, "threads"),
    (dict(loss="avg", classes=5), ValueError, "loss must be 'sum' or 'mean'"),
    (dict(loss="sum", classes=True), TypeError, "classes"),
])
def test_prepare_names_every_bad_argument(change, error, message):
    args = dict(cell="tree_lstm", packed=tree_batch(), input_size=H, hidden_size=H)
    args.update(change)
    with pytest.raises(error, match="edbatch.prepare: " + message):
        edbatch.prepare(**args)


def test_device_status_takes_a_torch_device():
    assert edbatch.device_status(torch.device("cpu")) == edbatch.device_status("cpu") == ""
    assert edbatch.device_status(torch.device("cuda", 0)) == edbatch.device_status("cuda")
    with pytest.raises(TypeError, match="device_status: device must be a str"):
        edbatch.device_status(None)


# 4. StepDecoder.

@pytest.mark.parametrize("size, error", [("4", TypeError), (True, TypeError), (-2, ValueError),
                                         (0, ValueError), (4.0, TypeError)])
def test_step_decoder_checks_input_size(size, error):
    with pytest.raises(error, match="StepDecoder: input_size must be a positive int"):
        enn.StepDecoder(user_cell(), input_size=size)


def test_step_decoder_refuses_an_input_size_a_built_in_cell_does_not_have():
    with pytest.raises(ValueError, match="input_size is 99, but the built-in cell's input_size"):
        enn.StepDecoder(enn.LatticeLSTM(10, H, H), input_size=99)
    enn.StepDecoder(enn.LatticeLSTM(10, H, H), input_size=H)  # its own: accepted


@pytest.mark.parametrize("size, error", [(2.0, TypeError), (True, TypeError), ("2", TypeError),
                                         (-1, ValueError), (10**12, ValueError)])
def test_step_decoder_start_checks_batch_size(size, error):
    decoder = enn.StepDecoder(user_cell(), input_size=H)
    with pytest.raises(error, match="StepDecoder.start: batch_size must be an int >= 0"):
        decoder.start(size)


def test_step_decoder_checks_state_x_and_mask():
    decoder = enn.StepDecoder(user_cell(), input_size=H)
    assert "not started" in repr(decoder) and "Propagate" in repr(decoder)
    with pytest.raises(TypeError, match="StepDecoder.start: state must be a tensor"):
        decoder.start(2, np.zeros((2, H), np.float32))
    decoder.start(2)
    assert repr(decoder) == "StepDecoder(Propagate, device=cpu, running=2)"
    for x in (np.zeros((2, H), np.float32), [[0.0] * H] * 2, None):
        with pytest.raises(TypeError, match="StepDecoder.step: x must be a float32 tensor"):
            decoder.step(x)
    decoder.step(torch.zeros(2, H))
    with pytest.raises(TypeError, match="StepDecoder.stop: mask must be a bool per running row"):
        decoder.stop(None)
    with pytest.raises(ValueError, match=r"mask has shape \(1, 2\)"):
        decoder.stop(torch.tensor([[True, False]]))
    assert decoder.stop(torch.tensor([[True], [False]])).tolist() == [1]  # (N, 1): a column
    assert decoder.stop(np.array([True])).tolist() == []


# 6. Packed.

def test_packed_refuses_unknown_fields_and_non_integers():
    with pytest.raises(TypeError, match="Packed: unknown field 'node_input' .*'node_inputs'"):
        edbatch.Packed(node_input=[0], input_ids=[1], pred_ptr=[0, 0], instance_offsets=[0, 1])
    with pytest.raises(TypeError, match="Packed: node_inputs must hold ints"):
        edbatch.Packed(node_inputs=[0.5], pred_ptr=[0, 0], instance_offsets=[0, 1])
    with pytest.raises(TypeError, match="Packed: labels must hold ints"):
        edbatch.Packed(labels=torch.tensor([1.0]))
    with pytest.raises(TypeError, match="Packed: input_ids must hold ints"):
        edbatch.Packed(input_ids=np.array([True]))
    p = edbatch.Packed(node_inputs=np.array([0]), node_types=[0], pred_ptr=[0, 0],
                       instance_offsets=[0, 1], input_ids=[3])
    assert p.node_inputs.dtype == torch.long and p.pred_ids.dtype == torch.long
    assert p.kinds() == (1, 1)


def test_packed_to_refuses_a_dtype():
    packed = tree_batch()
    with pytest.raises(TypeError, match="Packed.to: takes a device .* got torch.float64"):
        packed.to(torch.float64)
    assert packed.to("cpu").input_ids.dtype == torch.long


def test_packed_kinds_refuses_negative_types():
    packed = tree_batch()
    packed.node_types = torch.tensor([0, -3, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="Packed.kinds: node_types holds -3"):
        packed.kinds()


# 7. dropout_mask.

@pytest.mark.parametrize("args, error, message", [
    ((1, 0, 0, 4, -0.5), ValueError, "p must be from 0 to below 1"),
    ((1, 0, 0, 4, 1.5), ValueError, "p must be from 0 to below 1"),
    ((1, 0, 0, 4, 1.0), ValueError, "p must be from 0 to below 1"),
    ((1, 0, 0, 4, float("nan")), ValueError, "p must be a finite number"),
    ((1, 0, 0, 4, "0.5"), TypeError, "p must be a number"),
    ((1.5, 0, 0, 4, 0.5), TypeError, "seed must be an int"),
    ((1, 0, 0, -1, 0.5), ValueError, "size must be an int >= 0"),
    ((1, 0, 0, 4.0, 0.5), TypeError, "size"),
    ((1, -1, 0, 4, 0.5), ValueError, "index"),
])
def test_dropout_mask_checks_its_arguments(args, error, message):
    with pytest.raises(error, match="edbatch.dropout_mask: " + message):
        edbatch.dropout_mask(*args)


def test_dropout_mask_of_good_arguments_is_the_engine_s():
    from edbatch.trace import dropout_mask
    assert torch.equal(edbatch.dropout_mask(5, 3, 1, 64, 0.25), dropout_mask(5, 3, 1, 64, 0.25))
    assert edbatch.dropout_mask(5, 3, 1, 0, 0.0).numel() == 0


# 8. Help, options and repr.

def test_methods_have_their_own_help():
    base = inspect.getdoc(torch.nn.Module.forward)
    for f in (enn.Propagate.forward, enn.Cell.forward, enn.Cell.weights,
              enn.Cell.reset_parameters, enn.TreeLSTM.embed, edbatch.Packed.structure):
        doc = inspect.getdoc(f)
        assert doc and doc != base, f.__qualname__
    assert enn.Cell.forward.__wrapped__ is not None


def test_built_in_modules_refuse_options_they_do_not_use():
    for options in (dict(num_node_types=2), dict(num_arc_types=3), dict(kinds=3),
                    dict(hidden=4)):
        with pytest.raises(TypeError, match=f"TreeLSTM: unexpected option {list(options)[0]}"):
            enn.TreeLSTM(10, H, H, **options)
    with pytest.raises(TypeError, match="MVRNN: unexpected option kinds"):
        enn.MVRNN(10, 2, kinds=2)
    enn.TreeLSTM(10, H, H, policy="none", threads=1, classes=3, reduction="mean")


def test_nn_exports_its_public_names_only():
    names = {}
    exec("from edbatch.nn import *", names)
    assert sorted(k for k in names if not k.startswith("__")) == sorted(enn.__all__)
    assert {"TreeLSTM", "Propagate", "StepDecoder", "Cell"} <= set(enn.__all__)


def test_extra_repr_shows_the_options_set():
    text = repr(enn.TreeLSTM(10, H, H, threads=2, classes=5, reduction="mean").cell)
    assert "threads=2" in text and "classes=5" in text and "reduction='mean'" in text
    assert "threads" not in repr(enn.TreeLSTM(10, H, H).cell)
    text = repr(enn.Propagate(lambda x, m: m, state_size=H, message_size=H, classes=3,
                              threads=1))
    assert "message_size=4" in text and "classes=3" in text and "threads=1" in text


# 9. The rest.

@pytest.mark.parametrize("value, error", [("64", TypeError), (True, TypeError),
                                          (None, TypeError), (-1, ValueError)])
def test_set_plan_cache_refuses_what_is_no_budget(value, error):
    before = edbatch.plan_cache_stats()["budget_mb"]
    with pytest.raises(error, match="set_plan_cache: the budget must be"):
        edbatch.set_plan_cache(value)
    assert edbatch.plan_cache_stats()["budget_mb"] == before


def test_packers_name_their_bad_arguments():
    with pytest.raises(TypeError, match="parse_sst: vocab must be a dict"):
        edbatch.parse_sst("(1 a)", None)
    with pytest.raises(TypeError, match="pack_sst: vocab must be a dict"):
        edbatch.pack_sst(["(1 a)"], [])
    with pytest.raises(TypeError, match="parse_sst: add must be True or False"):
        edbatch.parse_sst("(1 a)", {}, add="no")
    with pytest.raises(TypeError, match="pack_edges: return_order must be True or False"):
        edbatch.pack_edges([{"num_nodes": 1}], return_order="no")
    with pytest.raises(TypeError, match="concat_packed: part 1 is a tuple, not a Packed"):
        edbatch.concat_packed([tree_batch(), ((1, 2), 3)])


def test_prefetch_refuses_what_cannot_prepare_at_the_call():
    with pytest.raises(TypeError, match="edbatch.prefetch: module must have a prepare"):
        edbatch.prefetch(None, [tree_batch()])
    with pytest.raises(TypeError, match="edbatch.prefetch: batches must be an iterable"):
        edbatch.prefetch(enn.TreeLSTM(10, H, H), None)


def test_propagate_refuses_cells_by_keys_that_are_not_kinds():
    with pytest.raises(ValueError, match="Propagate: node_cell is a dict .* got the key 'a'"):
        enn.Propagate({"a": lambda x, m: m}, state_size=H)


def test_input_ids_beyond_the_vocabulary_are_named():
    with pytest.raises(ValueError, match=r"TreeLSTM: input id 3 \(input row 2\) is outside the "
                                         r"vocabulary of embeddings.0, of 3 ids"):
        enn.TreeLSTM(3, H, H)(tree_batch())
    with pytest.raises(ValueError, match="MVRNN: input id 4 .* outside the vocabulary of vectors"):
        enn.MVRNN(4, 2)(tree_batch())
    lattice = edbatch.pack_lattices([{"arcs": [[], [(0, 1)], [(1, 2), (0, 7)]], "tags": [0] * 3}])
    with pytest.raises(ValueError, match="LatticeLSTM: input id 7 .* of embeddings.1, of 5 ids"):
        enn.LatticeLSTM(5, H, H)(lattice)


def test_the_op_itself_refuses_sizes_past_32_bits():
    """Called directly (torch.ops.edbatch), past the Python checks: sizes above 2^31 - 1 are
    refused by the op rather than cut to their low 32 bits."""
    with pytest.raises(ValueError, match="from 1 to 2147483647, got 4294967300"):
        torch.ops.edbatch.weight_shapes("tree_lstm", 2**32 + 4, 4, 1, 1)
    assert torch.ops.edbatch.weight_shapes("tree_lstm", 4, 4, 1, 1)[0]
