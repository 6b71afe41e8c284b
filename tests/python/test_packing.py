"""Packing for user cells: trees of any arity (and single nodes), arcs reading the parent's row,
DAG edge lists in any order (sorted; cycles and bad nodes refused), collate for DataLoader, and
Packed pickles."""
import pickle
import random

import numpy as np
import pytest
import torch

import edbatch

import structures


def preds(p, k):
    return p.pred_ids[p.pred_ptr[k]:p.pred_ptr[k + 1]].tolist()


def test_trees_of_any_arity():
    tree = ((1,), (2, 3, 4, 5, 6, 7), 8)  # arities 1, 6, 0, 3
    p = edbatch.pack_trees([tree, 9])
    assert p.num_nodes == 12 and p.num_instances == 2
    assert preds(p, 1) == [0]                         # the unary node
    assert preds(p, 8) == [2, 3, 4, 5, 6, 7]          # six children, in order
    assert preds(p, 10) == [1, 8, 9] and preds(p, 11) == []  # the root; a single-node tree
    assert p.arc_types[p.pred_ptr[8]:p.pred_ptr[9]].tolist() == [0, 1, 2, 3, 4, 5]
    assert p.node_inputs.tolist() == [0, -1, 1, 2, 3, 4, 5, 6, -1, 7, -1, 8]
    with pytest.raises(ValueError, match="empty tuple"):
        edbatch.pack_trees([(1, ())])


def test_trees_from_json_and_array_ids():
    """Lists are inner nodes as tuples are (JSON gives lists); NumPy integers and 0-d integer
    tensors are word ids; strings, bools, floats and negative ids are refused by name."""
    numpy = pytest.importorskip("numpy")
    want = edbatch.pack_trees([((1, 2), 3, (4,))])
    for tree in ([[1, 2], 3, [4]], ((numpy.int64(1), 2), torch.tensor(3), [numpy.int32(4)])):
        got = edbatch.pack_trees([tree])
        for name in ("node_inputs", "pred_ptr", "pred_ids", "arc_types", "input_ids"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    for leaf, message in (("the", "a string: leaves are word ids"), (True, "not a word id"),
                          (2.0, "not a word id"), (-1, "not a word id"),
                          (torch.tensor(1.0), "not a word id")):
        with pytest.raises(ValueError, match=message):
            edbatch.pack_trees([(1, leaf)])
    with pytest.raises(ValueError, match="empty list"):
        edbatch.pack_trees([[1, []]])


def test_edge_inputs_parent_and_words_at_inner_nodes():
    tree = {"word": 5, "children": [1, {"word": 6, "children": [2]}]}
    p = edbatch.pack_trees([tree, (3, 4)], edge_inputs="parent")
    # Nodes: 1, 2, {6}, {5}, 3, 4, (3 4); rows in creation order.
    assert p.input_ids.tolist() == [1, 2, 6, 5, 3, 4]
    assert p.node_inputs.tolist() == [0, 1, 2, 3, 4, 5, -1]
    assert p.arc_inputs.tolist() == [2, 3, 3, -1, -1]  # each arc reads its parent's row
    assert edbatch.pack_trees([tree]).arc_inputs.tolist() == [-1, -1, -1]


def test_pack_edges_sorts_topologically():
    inst = {"num_nodes": 4, "edges": [(3, 0), (2, 3, 1), (2, 0, 2), (1, 2)],
            "inputs": [10, 11, None, 13], "kinds": [1, 0, 0, 1], "labels": [0, 1, 2, 3]}
    p, order = edbatch.pack_edges([{"num_nodes": 1}, inst], return_order=True)
    assert order == [[0], [4, 1, 2, 3]]  # packed ids of given nodes 0..3
    assert p.labels.tolist() == [-1, 1, 2, 3, 0]           # given nodes 1, 2, 3, 0
    assert p.node_types.tolist() == [0, 0, 0, 1, 1]
    assert preds(p, 4) == [3, 2]                            # node 0: from 3 then 2, as given
    assert p.arc_types[p.pred_ptr[4]:].tolist() == [0, 2]
    assert p.node_inputs.tolist() == [-1, 0, -1, 1, 2]      # node 2 has no input
    assert p.input_ids.tolist() == [11, 13, 10]


def test_pack_edges_refuses_cycles_and_bad_nodes():
    with pytest.raises(ValueError, match="instance 1 has a cycle through node [123]"):
        edbatch.pack_edges([{"num_nodes": 2, "edges": [(0, 1)]},
                            {"num_nodes": 4, "edges": [(0, 1), (1, 2), (2, 3), (3, 1)]}])
    with pytest.raises(ValueError, match="cycle through node 0"):
        edbatch.pack_edges([{"num_nodes": 1, "edges": [(0, 0)]}])
    with pytest.raises(ValueError, match=r"instance 0: edge \(0, 3\) names node 3, outside 0..2"):
        edbatch.pack_edges([{"num_nodes": 3, "edges": [(0, 3)]}])
    with pytest.raises(ValueError, match="names node -1"):
        edbatch.pack_edges([{"num_nodes": 3, "edges": [(-1, 2)]}])
    with pytest.raises(ValueError, match=r"names node 1.0, not an integer"):
        edbatch.pack_edges([{"num_nodes": 3, "edges": [(0, 2), (1.0, 2)]}])
    with pytest.raises(ValueError, match="3 nodes but 2 kinds"):
        edbatch.pack_edges([{"num_nodes": 3, "kinds": [0, 1]}])


def _same_packed(a, b):
    for name in ("node_inputs", "node_types", "pred_ptr", "pred_ids", "arc_types", "arc_inputs",
                 "input_ids", "input_kinds", "labels", "instance_offsets"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_records_may_hold_arrays_and_tensors():
    """Edge lists, DAG and lattice records may hold NumPy arrays and tensors (as data pipelines
    keep them) where lists of ints are expected; the same Packed comes out. Non-integers are
    refused by name."""
    numpy = pytest.importorskip("numpy")
    edges = {"num_nodes": 4, "edges": [(2, 0, 1), (0, 1, 0), (3, 1, 2)], "inputs": [5, None, 6, 7],
             "kinds": [1, 0, 1, 0], "labels": [0, 1, -1, 2]}
    as_arrays = {"num_nodes": numpy.int64(4),
                 "edges": torch.tensor([(2, 0, 1), (0, 1, 0), (3, 1, 2)]),
                 "inputs": [5, None, numpy.int64(6), 7], "kinds": numpy.array([1, 0, 1, 0]),
                 "labels": torch.tensor([0, 1, -1, 2])}
    _same_packed(edbatch.pack_edges([as_arrays], edge_inputs="target"),
                 edbatch.pack_edges([edges], edge_inputs="target"))
    dag = {"types": [0, 1, 1], "inputs": [3, 4, 5], "arcs": [[], [(0, 2)], [(0, 0), (1, 1)]]}
    dag_arrays = {"types": numpy.array([0, 1, 1]), "inputs": torch.tensor([3, 4, 5]),
                  "arcs": [numpy.zeros((0, 2), dtype=int), numpy.array([(0, 2)]),
                           torch.tensor([(0, 0), (1, 1)])]}
    _same_packed(edbatch.pack_dags([dag_arrays]), edbatch.pack_dags([dag]))
    lattices = edbatch.packing.synthetic_lattices(2, vocab_size=10, seed=4)
    arrays = [{"tags": numpy.array(r["tags"]), "arcs": [numpy.array(a) for a in r["arcs"]]}
              for r in lattices]
    _same_packed(edbatch.pack_lattices(arrays), edbatch.pack_lattices(lattices))
    with pytest.raises(ValueError, match=r"edge \(0, 1, 0.5\) has kind 0.5"):
        edbatch.pack_edges([{"num_nodes": 2, "edges": [(0, 1, 0.5)]}])
    with pytest.raises(ValueError, match="instance 0: node 0's input is 1.5, not an integer >= "
                                         "-1 or None"):
        edbatch.pack_edges([{"num_nodes": 1, "inputs": [1.5]}])
    with pytest.raises(ValueError, match="num_nodes 2.0 is not an integer"):
        edbatch.pack_edges([{"num_nodes": 2.0}])
    with pytest.raises(ValueError, match="has no word id"):
        edbatch.pack_lattices([{"arcs": [[], [(0, 1.0)]]}])


@pytest.mark.parametrize("kind", ["trees", "lattices", "dags", "empty"])
def test_reversed_turns_every_arc_around(kind):
    p = structures.packed(kind, 21, edge_inputs="parent")
    r, index = p.reversed()
    arcs = {(int(index[k]), int(index[p.pred_ids[a]]), int(p.arc_types[a]), int(p.arc_inputs[a]))
            for k in range(p.num_nodes) for a in range(p.pred_ptr[k], p.pred_ptr[k + 1])}
    turned = {(int(r.pred_ids[a]), k, int(r.arc_types[a]), int(r.arc_inputs[a]))
              for k in range(r.num_nodes) for a in range(r.pred_ptr[k], r.pred_ptr[k + 1])}
    assert turned == arcs and r.pred_ids.numel() == p.pred_ids.numel()
    assert torch.equal(index[index], torch.arange(p.num_nodes))
    assert torch.equal(r.instance_offsets, p.instance_offsets)
    for i in range(r.num_instances):  # topological again, within each instance
        lo, hi = int(r.instance_offsets[i]), int(r.instance_offsets[i + 1])
        for k in range(lo, hi):
            assert all(lo <= j < k for j in preds(r, k))
    for name in ("node_inputs", "node_types", "labels"):
        assert torch.equal(getattr(r, name)[index], getattr(p, name)), name
    if kind == "trees":  # children in order: reversing twice gives the tree back
        rr, _ = r.reversed()
        for name in ("pred_ptr", "pred_ids", "arc_types", "arc_inputs", "node_inputs"):
            assert torch.equal(getattr(rr, name), getattr(p, name)), name


def test_random_dags_keep_their_edges():
    rng = random.Random(3)
    insts = [structures.random_dag(rng, n, 2, 3) for n in (1, 5, 20)]
    p, orders = edbatch.pack_edges(insts, return_order=True)
    for inst, order in zip(insts, orders):
        got = set()
        for k in range(p.num_nodes):
            for a in range(p.pred_ptr[k], p.pred_ptr[k + 1]):
                got.add((p.pred_ids[a].item(), k, p.arc_types[a].item()))
        for s, d, kind in inst["edges"]:
            assert (order[s], order[d], kind) in got
            assert order[s] < order[d]


def test_collate_and_pickle():
    trees = [((1, 2), 3), 4]
    assert torch.equal(edbatch.collate(trees).pred_ids, edbatch.pack_trees(trees).pred_ids)
    labelled = [edbatch.LabelledTree(((1, 2), 3), [0, 1, 2, 3, 4]),
                edbatch.parse_sst("(2 a)", {"<pad>": 0, "<unk>": 1, "a": 4})]
    assert edbatch.collate(labelled).labels.tolist() == [0, 1, 2, 3, 4, 2]
    assert edbatch.collate([{"num_nodes": 2, "edges": [(1, 0)]}]).pred_ids.tolist() == [0]
    lattice = {"arcs": [[], [(0, 7)]], "tags": [1, 2]}
    assert edbatch.collate([lattice]).input_ids.tolist() == [7]
    parts = [edbatch.pack_trees([t]) for t in trees]
    assert torch.equal(edbatch.collate(parts).pred_ptr, edbatch.pack_trees(trees).pred_ptr)
    empty = edbatch.collate([])
    assert empty.num_instances == 0 and empty.pred_ptr.tolist() == [0]
    with pytest.raises(TypeError, match="parse SST lines"):
        edbatch.collate(["(1 a)"])
    p = pickle.loads(pickle.dumps(edbatch.collate(labelled)))
    assert torch.equal(p.labels, edbatch.collate(labelled).labels) and p.num_nodes == 6


def test_dataloader_workers():
    data = [structures.random_tree(random.Random(i), 9) for i in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=edbatch.collate,
                                         num_workers=2)
    batches = list(loader)
    assert len(batches) == 2
    assert torch.equal(batches[0].pred_ids, edbatch.pack_trees(data[:4]).pred_ids)


def test_kinds_follow_the_type_tensors():
    p = edbatch.pack_trees([((1, 2, 3), 4), 5])  # arcs of child positions 0, 1, 2
    assert p.kinds() == (1, 3)
    assert p.kinds() == (1, 3)  # kept: asked again without changes
    p.node_types[2] = 4  # changed in place
    assert p.kinds() == (5, 3)
    p.arc_types = torch.zeros_like(p.arc_types)  # replaced
    assert p.kinds() == (5, 1)
    empty = edbatch.collate([])
    assert empty.kinds() == (1, 1)
    q = pickle.loads(pickle.dumps(p))
    assert q.kinds() == (5, 1)
    q.node_types.zero_()
    assert q.kinds() == (1, 1) and p.kinds() == (5, 1)
    q.node_types.data[3] = 2  # through .data, which does not count as a change on the host
    assert q.kinds() == (3, 1)


def test_empty_instances_mixed_batches_and_malformed_lines_are_refused_by_name():
    with pytest.raises(ValueError, match="pack_edges: instance 1 has no nodes"):
        edbatch.pack_edges([{"num_nodes": 2, "edges": [(0, 1)]}, {"num_nodes": 0}])
    with pytest.raises(ValueError, match="pack_lattices: lattice 0 has no nodes"):
        edbatch.pack_lattices([{"arcs": [], "tags": []}])
    with pytest.raises(ValueError, match="pack_dags: DAG 0 has no nodes"):
        edbatch.pack_dags([{"types": [], "inputs": [], "arcs": []}])
    with pytest.raises(TypeError, match="instance 2 is a lattice record but instance 0 is an "
                                        "edge list"):
        edbatch.collate([{"num_nodes": 1}, {"num_nodes": 1}, {"arcs": [[]], "tags": [0]}])
    with pytest.raises(TypeError, match=r"instance 1 is a tree but instance 0 is a \(tree, "
                                        r"labels\) pair"):
        edbatch.collate([(((1, 2), 3), torch.tensor([0, 1, 2, 3, 4])), 4])
    for line, why in [("(3 (2 a)", "ends where .* should be \\(unbalanced parentheses"),
                      ("(3 (2 a)))", "text after the tree at token 7"),
                      ("(x a)", "integer label at token 1, got 'x'"),
                      ("(3 )", "neither a word nor children"),
                      ("(3 a b)", "'\\)' after the word 'a', got 'b'"),
                      ("(3 (2 a) b)", "'\\)' or '\\(' at token 6, got 'b'"),
                      ("(3 (", "ends where a label should be"),
                      ("(3 (2 a) (", "ends where a label should be")]:
        with pytest.raises(ValueError, match=f"parse_sst: malformed line .*{why}"):
            edbatch.parse_sst(line, {})
    for label in ("1_0", "\uff12"):  # what int() would take, SST would not
        with pytest.raises(ValueError, match="integer label at token 1"):
            edbatch.parse_sst(f"({label} a)", {})
    assert edbatch.parse_sst("(3 (2 a) (1 (0 b) (4 c)))", {}) == ((0, (1, 2)), [2, 0, 4, 1, 3])
    # A file's first line read with its byte order mark.
    assert edbatch.parse_sst("\ufeff(3 (2 a) (1 (0 b) (4 c)))", {}) == ((0, (1, 2)), [2, 0, 4, 1, 3])


def test_tree_inputs_that_would_be_read_wrong_are_refused_by_name():
    """A dict node with a misspelt key (its subtree would be lost), None for a leaf, children
    that are not a list, an id past int64; a fixed SST vocabulary reads unknown words as unk; a
    vocabulary whose next id is taken; lattice text that does not match its counts."""
    for tree, why in [({"word": 1, "child": [2, 3]}, "a node with key 'child'"),
                      ({"w": 3}, "a node with key 'w'"),
                      ((1, None), "leaf None, not a word id"),
                      ({"word": 1, "children": 5}, "a node whose \"children\" is 5"),
                      ((2 ** 63, 1), "leaf 9223372036854775808, not a word id")]:
        with pytest.raises(ValueError, match=f"pack_trees: tree 1 has {why}"):
            edbatch.pack_trees([(1, 2), tree])
    assert edbatch.pack_trees([{"word": 1, "children": [2, {"children": []}]}]).num_nodes == 3
    vocab = {"good": 0, "film": 1}
    p = edbatch.pack_sst(["(3 (2 good) (2 film))", "", "(1 (1 awful) (2 film))"], vocab,
                         add=False, unk=7)
    assert p.input_ids.tolist() == [0, 1, 7, 1] and vocab == {"good": 0, "film": 1}
    with pytest.raises(ValueError, match="pack_sst: line 3: parse_sst: malformed line"):
        edbatch.pack_sst(["(3 (2 good) (2 film))", "", "(1 (1 awful)"], vocab)
    with pytest.raises(ValueError, match=r"vocab's ids must be 0..1, but they are not"):
        edbatch.pack_sst(["(1 (1 awful) (2 film))"], {"<pad>": 0, "<unk>": 2})
    text = "1\n2\n1 2\n0\n1 0 7\n"
    assert len(edbatch.packing.parse_lattices(text)) == 1
    for bad, why in [(text + "2\n1 1\n0\n", "text after the 1 lattices the first line "
                                             "announces: '2'"),
                     (text.replace("1 0 7", "-1 0 7"), "arc count of state 1 \\(an integer >= "
                                                       "0\\), got '-1'"),
                     (text.replace("1\n2\n", "1\n-2\n", 1), "length \\(an integer >= 0\\)")]:
        with pytest.raises(ValueError, match=f"parse_lattices: .*{why}"):
            edbatch.packing.parse_lattices(bad)


def test_labels_inputs_and_kinds_that_do_not_fit_are_refused_by_name():
    tree = (1, (2, 3))  # 5 nodes
    for labels, why in [([[0, 1]], "tree 0 has 5 nodes but 2 labels"),
                        ([[0, 1, 2, 3, 4, 5]], "tree 0 has 5 nodes but 6 labels"),
                        ([[0] * 5, [1] * 5], "1 trees but 2 label lists"),
                        ([[0, 1, "pos", 3, 4]], "tree 0: node 2's label is 'pos', not an "
                                                "integer >= -1 or None"),
                        ([[0, 1, 2.5, 3, 4]], "tree 0: node 2's label is 2.5, not an integer"),
                        ([[0, 1, -2, 3, 4]], "tree 0: node 2's label is -2, not an integer")]:
        with pytest.raises(ValueError, match=f"pack_trees: {why}"):
            edbatch.pack_trees([tree], labels)
    with pytest.raises(ValueError, match="pack_dags: DAG 0 has 3 types but 2 inputs"):
        edbatch.pack_dags([{"types": [0, 1, 1], "inputs": [1, 2], "arcs": [[], [(0, 0)], []]}])
    with pytest.raises(ValueError, match="pack_dags: DAG 0 has 2 types but 1 arc lists"):
        edbatch.pack_dags([{"types": [0, 1], "inputs": [1, 2], "arcs": [[]]}])
    with pytest.raises(ValueError, match="pack_dags: DAG 0 has 2 types but 3 labels"):
        edbatch.pack_dags([{"types": [0, 1], "inputs": [1, 2], "arcs": [[], []],
                            "labels": [0, 1, 2]}])
    for pack in (lambda: edbatch.pack_dags([{"types": [0, None], "inputs": [1, 2],
                                             "arcs": [[], []]}]),
                 lambda: edbatch.pack_edges([{"num_nodes": 2, "edges": [(0, 1)],
                                              "kinds": [None, 1]}])):
        with pytest.raises(ValueError, match="0: (state 1's type|node 0's kind) is None, not "
                                             "an integer >= 0$"):
            pack()
    # None is "no label" (-1) everywhere, and "no input" (row -1) in DAG records as in edge lists.
    assert edbatch.pack_trees([tree], [[None, 1, 2, 3, None]]).labels.tolist() == [-1, 1, 2, 3, -1]
    p = edbatch.pack_dags([{"types": [0, 1], "inputs": [7, None], "arcs": [[], [(0, 0)]],
                            "labels": [None, 3]}])
    assert p.labels.tolist() == [-1, 3] and p.node_inputs.tolist() == [0, -1]
    assert p.input_ids.tolist() == [7]
    p = edbatch.pack_edges([{"num_nodes": 2, "edges": [(0, 1)], "labels": [None, 1]}])
    assert p.labels.tolist() == [-1, 1]


def test_sst_lines_of_any_depth_parse_and_pack():
    """A left-branching line 20,000 nodes deep (a long document binarised), far past Python's
    recursion limit: parsed, labelled in post order and packed as a chain."""
    depth = 20000
    line = "(1 " * depth + "(2 w)" + " (0 v))" * depth
    tree, labels = edbatch.parse_sst(line, {})
    assert labels[:3] == [2, 0, 1] and len(labels) == 2 * depth + 1
    assert labels.count(1) == depth and labels[-1] == 1
    packed = edbatch.pack_trees([tree], [labels])
    assert packed.num_nodes == 2 * depth + 1
    assert packed.labels.tolist() == labels
    inner = (packed.pred_ptr[1:] - packed.pred_ptr[:-1] == 2).nonzero().flatten()
    assert inner.numel() == depth


def test_collate_refuses_an_instance_that_reads_both_as_a_tree_and_as_a_pair():
    """A 2-tuple whose second item is a list of word ids as long as the first item's nodes is a
    tree (the list a node of leaves) and a (tree, labels) pair alike: refused, naming the
    instance and how to say which. Other forms are read as what they can only be."""
    tree = ((1, 2), [3, 4, 5])  # a tree of 8 nodes, or 3 nodes labelled 3, 4, 5
    with pytest.raises(TypeError, match=r"collate: instance 1, \(\(1, 2\), \[3, 4, 5\]\), reads "
                                        r"both as a tree .* and as a \(tree, labels\) pair: give "
                                        r"the labels as a tensor"):
        edbatch.collate([((1, 2), (3, 4, 5)), tree])
    for t in (((1, 2), (3, 4, 5)), [(1, 2), [3, 4, 5]], ((1, 2), [3, 4]), ((1, 2), [3, [4, 5]]),
              ((1, 2), [{"word": 3}, 4, 5])):  # trees only
        got, want = edbatch.collate([t]), edbatch.pack_trees([t])
        assert got.num_nodes == want.num_nodes and torch.equal(got.pred_ids, want.pred_ids)
        assert got.labels.tolist() == [-1] * want.num_nodes
    for labels, want in ((torch.tensor([3, 4, 5]), [3, 4, 5]), (np.array([3, 4, 5]), [3, 4, 5]),
                         ([None, 4, -1], [-1, 4, -1]),
                         (edbatch.LabelledTree((1, 2), [3, 4, 5]), [3, 4, 5])):  # pairs only
        pair = labels if isinstance(labels, tuple) else ((1, 2), labels)
        got = edbatch.collate([pair])
        assert got.num_nodes == 3 and got.labels.tolist() == want
    pair = edbatch.parse_sst("(3 (2 it) (4 (2 's) (4 good)))", {})
    assert isinstance(pair, edbatch.LabelledTree) and pair == ((0, (1, 2)), [2, 2, 4, 4, 3])
    assert edbatch.collate([pair]).labels.tolist() == [2, 2, 4, 4, 3]


def test_packer_errors_name_the_missing_key_the_field_and_the_node():
    for pack, error, why in [
            (lambda: edbatch.pack_edges([{"edges": [(0, 1)]}]), ValueError,
             "pack_edges: instance 0 has no 'num_nodes' (a record is {\"num_nodes\": n"),
            (lambda: edbatch.collate([{"edges": [(0, 1)]}]), ValueError,
             "pack_edges: instance 0 has no 'num_nodes'"),
            (lambda: edbatch.pack_dags([{"types": [0], "inputs": [1]}]), ValueError,
             "pack_dags: DAG 0 has no 'arcs' (a record is {\"types\""),
            (lambda: edbatch.pack_lattices([{"tags": [0]}]), ValueError,
             "pack_lattices: lattice 0 has no 'arcs'"),
            (lambda: edbatch.pack_dags([[0, 1]]), TypeError, "pack_dags: DAG 0 is a list, not a "
                                                             "dict {\"types\""),
            (lambda: edbatch.pack_edges([{"num_nodes": 2, "inputs": [1, -5]}]), ValueError,
             "pack_edges: instance 0: node 1's input is -5, not an integer >= -1 or None"),
            (lambda: edbatch.pack_edges([{"num_nodes": 2, "labels": [1, "x"]}]), ValueError,
             "pack_edges: instance 0: node 1's label is 'x', not an integer >= -1 or None"),
            (lambda: edbatch.pack_dags([{"types": [0, -1], "inputs": [1, 2], "arcs": [[], []]}]),
             ValueError, "pack_dags: DAG 0: state 1's type is -1, not an integer >= 0"),
            (lambda: edbatch.pack_dags([{"types": [0, 1], "inputs": [1, 2.5], "arcs": [[], []]}]),
             ValueError, "pack_dags: DAG 0: state 1's input is 2.5, not an integer >= -1"),
            (lambda: edbatch.pack_lattices([{"arcs": [[]], "tags": ["B"]}]), ValueError,
             "pack_lattices: lattice 0: node 0's tag is 'B', not an integer >= -1")]:
        with pytest.raises(error) as info:
            pack()
        assert why in str(info.value), (why, str(info.value))


def test_no_input_is_none_or_minus_one_in_dag_records_and_edge_lists():
    for inputs in ([7, None, 8], [7, -1, 8]):
        dags = edbatch.pack_dags([{"types": [0, 0, 0], "inputs": inputs,
                                   "arcs": [[], [(0, 0)], [(1, 0)]]}])
        edges = edbatch.pack_edges([{"num_nodes": 3, "edges": [(0, 1), (1, 2)],
                                     "inputs": inputs}])
        for p in (dags, edges):
            assert p.node_inputs.tolist() == [0, -1, 1] and p.input_ids.tolist() == [7, 8]


def test_text_readers_split_words_at_ascii_whitespace_and_refuse_other_inputs():
    """Words end at ASCII whitespace only, as the C++ readers' do (U+3000 and U+00A0 belong to
    words); one str or bytes where lines are expected is refused; errors quote a long line's
    start only."""
    vocab = {}
    tree, labels = edbatch.parse_sst("(3\t(2 x\u3000)\v(2\fy\u00a0z))\r", vocab)
    assert tree == (0, 1) and labels == [2, 2, 3] and vocab == {"x\u3000": 0, "y\u00a0z": 1}
    assert edbatch.pack_sst(["(2 a)", " \t\r\n"], {}).num_instances == 1
    with pytest.raises(ValueError, match="pack_sst: line 2: parse_sst: malformed line"):
        edbatch.pack_sst(["(2 a)", "\u3000"], {})  # not blank for the C++ readers either
    assert edbatch.parse_sst("\ufeff(2 a)", {}) == (0, [2])  # a file's byte order mark
    with pytest.raises(ValueError, match=r"the number of lattices .*got '1\\u30001'"):
        edbatch.packing.parse_lattices("1\u30001 0 0")
    for call, why in [(lambda: edbatch.pack_sst("(2 a)\n(1 b)", {}),
                       "pack_sst: lines must be a list of lines, got one str: pass its lines "
                       "(text.splitlines()"),
                      (lambda: edbatch.pack_sst(b"(2 a)", {}), "got one bytes"),
                      (lambda: edbatch.pack_sst([b"(2 a)"], {}),
                       "pack_sst: line 1 is bytes, not a str: decode it first"),
                      (lambda: edbatch.parse_sst(b"(2 a)", {}),
                       "parse_sst: the line is bytes, not a str: decode it first"),
                      (lambda: edbatch.packing.parse_lattices(b"1 1 0 0"),
                       "parse_lattices: the text is bytes, not a str")]:
        with pytest.raises(TypeError) as info:
            call()
        assert why in str(info.value), (why, str(info.value))
    long = "(2 " + "x" * 10 ** 6 + " y)"
    for call in (lambda: edbatch.parse_sst(long, {}), lambda: edbatch.pack_sst([long], {}),
                 lambda: edbatch.pack_trees(["x" * 10 ** 6]),
                 lambda: edbatch.packing.parse_lattices("x" * 10 ** 6)):
        with pytest.raises(ValueError) as info:
            call()
        assert len(str(info.value)) < 600 and "... (" in str(info.value), str(info.value)[:600]


def test_malformed_records_are_refused_by_instance_and_field():
    def refused(pack, why):
        with pytest.raises(ValueError) as info:
            pack()
        assert why in str(info.value), (why, str(info.value))

    # A field's name misspelt would read as the field left out (no arcs, kinds 0, labels -1).
    refused(lambda: edbatch.pack_edges([{"num_nodes": 3, "edge": [(0, 1), (1, 2)]}]),
            "pack_edges: instance 0 has the key 'edge': did you mean 'edges'?")
    refused(lambda: edbatch.pack_edges([{"num_nodes": 2, "kind": [0, 1]}]),
            "has the key 'kind': did you mean 'kinds'?")
    refused(lambda: edbatch.pack_dags([{"types": [0], "inputs": [1], "arcs": [[]],
                                        "label": [2]}]),
            "pack_dags: DAG 0 has the key 'label': did you mean 'labels'?")
    refused(lambda: edbatch.collate([{"arcs": [[]], "tag": [1]}]),
            "pack_lattices: lattice 0 has the key 'tag': did you mean 'tags'?")
    # Keys of the user's own are left alone; "edges": None is no edges.
    p = edbatch.pack_edges([{"num_nodes": 2, "edges": None, "sentence": "a b"}])
    assert p.pred_ids.numel() == 0 and p.num_nodes == 2
    refused(lambda: edbatch.pack_edges([{"num_nodes": 3, "edges": [0, 1]}]),
            "pack_edges: instance 0: an edge: 0 is not a pair or a triple")
    refused(lambda: edbatch.pack_lattices([{"arcs": [[], [(0, 2, 1)]]}]),
            "pack_lattices: lattice 0: an arc into node 1: (0, 2, 1) is not a pair")
    refused(lambda: edbatch.pack_dags([{"types": [0, 0], "inputs": [1, 1],
                                        "arcs": [[], [("0", 0)]]}]),
            "pack_dags: DAG 0: arc into state 1 comes from '0'")
    refused(lambda: edbatch.pack_edges([{"num_nodes": 1, "inputs": [2**63]}]),
            "pack_edges: instance 0: node 0's input is 9223372036854775808, beyond int64")
    refused(lambda: edbatch.pack_trees([1, 2], labels=[[0], None]),
            "pack_trees: tree 1: its labels are None, not a list")


def test_sst_errors_name_the_line_and_vocabularies_stay_one_to_one():
    with pytest.raises(ValueError, match="pack_sst: line 3: .* label -4 at token 7"):
        edbatch.pack_sst(["(2 a)", "", "(3 (2 a) (-4 a))"], {})
    with pytest.raises(ValueError, match="pack_sst: line 2: .* label 99999999999999999999"):
        edbatch.pack_sst(["", "(99999999999999999999 a)"], {})
    with pytest.raises(ValueError, match="pack_sst: unk must be a word id"):
        edbatch.pack_sst(["(2 a)"], {}, add=False, unk=-1)
    # A new word's id len(vocab) is taken already: refused, not shared.
    vocab = {"<pad>": 0, "<unk>": 2}
    with pytest.raises(ValueError, match="parse_sst: words are added with the next id") as info:
        edbatch.parse_sst("(2 (1 x) (3 y))", vocab)
    assert type(info.value) is ValueError
    assert vocab == {"<pad>": 0, "<unk>": 2}
    # Growing a vocabulary line by line keeps one id per word.
    vocab = {}
    for line in ["(2 (1 x) (3 y))", "(1 (2 y) (2 z))", "(0 w)"]:
        edbatch.parse_sst(line, vocab)
    assert sorted(vocab.values()) == list(range(4))


def test_collate_reads_a_generator_and_reversal_keeps_parallel_arcs_in_order():
    trees = [((1, 2), 3), (4, 5)]
    assert edbatch.collate(t for t in trees).num_instances == 2
    assert edbatch.collate(map(lambda t: t, trees)).num_nodes == 8
    p = edbatch.pack_edges([{"num_nodes": 2, "edges": [(0, 1, k) for k in range(20)]}])
    r, _ = p.reversed()
    assert r.arc_types.tolist() == list(range(20))
    rr, _ = r.reversed()
    assert torch.equal(rr.arc_types, p.arc_types) and torch.equal(rr.pred_ids, p.pred_ids)
