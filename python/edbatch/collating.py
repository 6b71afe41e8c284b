"""edbatch.collate: a DataLoader's collate_fn, packing a list of instances of one kind."""
from .packing import (Packed, _Builder, _index, _post_order, concat_packed, pack_dags, pack_edges,
                      pack_lattices, pack_trees)
from .sst import LabelledTree
from .text import shorten


def _instance_kind(x, i):
    """What collate packs instance i, x, as, in words (one kind per batch)."""
    if isinstance(x, Packed):
        return "a Packed"
    if isinstance(x, dict) and ("num_nodes" in x or "edges" in x):
        return "an edge list"
    if isinstance(x, dict) and "types" in x:
        return "a DAG record"
    if isinstance(x, dict) and "arcs" in x:
        return "a lattice record"
    if isinstance(x, (str, bytes)):
        raise TypeError("collate: parse SST lines once, before the DataLoader (parse_sst needs "
                        "the vocabulary; in __getitem__, each worker process would grow a "
                        "vocabulary of its own) and give the (tree, labels) pairs it returns")
    return "a (tree, labels) pair" if _is_labelled(x, i) else "a tree"


def collate(instances):
    """One Packed from a list of instances of one kind (a DataLoader's collate_fn): Packed
    objects, edge-list dicts (pack_edges), lattice records (pack_lattices), DAG records with
    "types" (pack_dags), trees (pack_trees), or (tree, labels) pairs (_is_labelled)."""
    instances = list(instances)  # a generator is read once, here
    if not instances:
        return _Builder().build()
    kinds = [_instance_kind(x, i) for i, x in enumerate(instances)]
    for i, k in enumerate(kinds):
        if k != kinds[0]:
            raise TypeError(f"collate: instance {i} is {k} but instance 0 is {kinds[0]}: "
                            f"a batch holds instances of one kind")
    packer = {"a Packed": concat_packed, "an edge list": pack_edges, "a DAG record": pack_dags,
              "a lattice record": pack_lattices, "a tree": pack_trees}.get(kinds[0])
    if packer is not None:
        return packer(list(instances))
    return pack_trees([t for t, _ in instances], [labels for _, labels in instances])


def _is_labelled(x, i):
    """Whether collate reads instance i, x, as a (tree, labels) pair rather than a tree: a
    LabelledTree (what parse_sst returns), or a 2-tuple whose second item is a 1-D tensor or
    NumPy array, or a list that is no tree node (None or a negative label in it). A 2-tuple
    whose list is both a node of leaves and a label per node of the first item is refused."""
    if isinstance(x, LabelledTree):
        return True
    if not isinstance(x, tuple) or len(x) != 2:
        return False
    labels = x[1]
    if hasattr(labels, "tolist") and getattr(labels, "ndim", 0) == 1:
        return True
    if not isinstance(labels, list):
        return False
    ids = [_index(v) for v in labels]
    if any(k is None and v is not None for k, v in zip(ids, labels)):
        return False  # children that are not labels: a tree node
    if not labels or any(k is None or k < 0 for k in ids):
        return True
    try:
        nodes = len(_post_order(x[0]))
    except ValueError:
        return True  # no tree either way: pack_trees names what is wrong
    if nodes != len(labels):
        return False
    raise TypeError(f"collate: instance {i}, {shorten(repr(x))}, reads both as a tree (a root "
                    f"whose second child is a list of {len(labels)} leaves) and as a (tree, "
                    f"labels) pair: give the labels as a tensor or NumPy array "
                    f"(torch.tensor(labels)) or the pair as edbatch.LabelledTree(tree, labels), "
                    f"as parse_sst returns it; write a tree's list node as a tuple")
