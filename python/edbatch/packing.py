"""Packs Python structures (nested tuples, SST lines, lattice records, DAG records) into the
tensor format of the ops (docs/pytorch.md)."""
import difflib
import heapq
import random

import torch

from . import sst as _sst, text as _text
from .checks import flag, int_tensor
from .text import index_of as _index, quote, shorten

# SST lines (sst.py) and lattice text (text.py), under their earlier names here too.
parse_sst, pack_sst, synthetic_sst = _sst.parse_sst, _sst.pack_sst, _sst.synthetic_sst
parse_lattices = _text.parse_lattices

_DEVICE_FIELDS = ("input_ids", "input_kinds", "labels")
# Fields whose host copy Packed.to() keeps: the extension reads them on the host.
_HOST_COPIES = ("input_ids", "labels")
_FIELDS = ("node_inputs", "node_types", "pred_ptr", "pred_ids", "arc_types", "arc_inputs",
           "instance_offsets", "input_ids", "input_kinds", "labels")


class Packed:
    """A mini-batch of structures as int64 tensors.

    Nodes of one instance are contiguous and topologically ordered (predecessors first).
    node_inputs[k]: row of x that node k reads, or -1.  node_types[k]: its cell type.
    pred_ptr (num_nodes + 1) and pred_ids: CSR lists of predecessors (tree children in order,
    lattice arc sources, DAG arc sources), with arc_types and arc_inputs (row of x or -1) per arc.
    instance_offsets (num_instances + 1): the node range of each instance.
    input_ids / input_kinds: per row of x, the vocabulary id and which table it comes from (the
    modules embed them to make x).  labels: per node, -1 when absent.
    """

    def __init__(self, **fields):
        for other in fields:
            if other not in _FIELDS:
                near = difflib.get_close_matches(str(other), _FIELDS, n=1)
                raise TypeError(f"Packed: unknown field {other!r}"
                                f"{f' (did you mean {near[0]!r}?)' if near else ''}: the "
                                f"fields are {', '.join(_FIELDS)}")
        for name in _FIELDS:
            setattr(self, name, int_tensor(fields.get(name), "Packed", name))
        if self.instance_offsets.numel() == 0:
            self.instance_offsets = torch.zeros(1, dtype=torch.long)

    @property
    def num_nodes(self):
        return self.node_inputs.numel()

    @property
    def num_instances(self):
        return self.instance_offsets.numel() - 1

    @property
    def roots(self):
        """The last node of each instance (a tree's root, a lattice's end)."""
        return self.instance_offsets[1:] - 1

    def structure(self):
        """(node_inputs, node_types, pred_ptr, pred_ids, arc_types, arc_inputs,
        instance_offsets): the tensors the ops read, in the order they take them."""
        return (self.node_inputs, self.node_types, self.pred_ptr, self.pred_ids, self.arc_types,
                self.arc_inputs, self.instance_offsets)

    def to(self, device):
        """The input rows and labels (input_ids, input_kinds, labels) on `device`. The structure
        tensors stay in host memory: the extension reads them on the host, and copying them back
        from a GPU on every call would wait for the GPU each time. The fields stay int64: a
        dtype is refused."""
        if isinstance(device, torch.dtype) or not isinstance(device, (str, int, torch.device)):
            raise TypeError(f"Packed.to: takes a device (\"cuda\", torch.device), got "
                            f"{device!r}: the fields are int64 ids and indices, whose dtype "
                            f"stays")
        out = Packed.__new__(Packed)
        for name in _FIELDS:
            t = getattr(self, name)
            setattr(out, name, t.to(device) if name in _DEVICE_FIELDS else t.cpu())
        out._host = {name: (getattr(out, name), getattr(out, name)._version,
                            self._host_copy(name)) for name in _HOST_COPIES}
        return out

    def kinds(self):
        """(node kinds, arc kinds) the batch uses: the largest type + 1, at least 1. Counted on
        every call on the host; on a device, kept with the batch (a training loop asks on every
        step, and a count there waits for the device) until node_types or arc_types is replaced
        or changed in place (not through .data, which PyTorch does not count as a change)."""
        key = (self.node_types._version, self.arc_types._version)
        kept = getattr(self, "_kinds", None)
        if (kept is None or kept[0] is not self.node_types or kept[1] is not self.arc_types
                or kept[2] != key or not self.node_types.is_cuda):
            def count(types, name):
                if not types.numel():
                    return 1
                low, high = torch.aminmax(types)
                if int(low) < 0:
                    raise ValueError(f"Packed.kinds: {name} holds {int(low)}; types are ints "
                                     f">= 0")
                return int(high) + 1
            kept = (self.node_types, self.arc_types, key,
                    (count(self.node_types, "node_types"), count(self.arc_types, "arc_types")))
            self._kinds = kept
        return kept[3]

    def reversed(self):
        """The same instances with every arc turned around (j -> k becomes k -> j), for a pass in
        the other direction: from a tree's root down to its leaves, as bidirectional tree models
        do. Each instance's nodes come in the opposite order, so the result is topological again.
        Returns (packed, index): index[k] is the reversed batch's node for node k here, and the
        other way round (the reversal is its own inverse), so the states of a pass over the
        reversed batch are states[index] in this batch's node order. Arcs keep their types and
        input rows; a node's incoming arcs come in the order of their sources, parallel arcs in
        their order here (so reversing a tree twice gives it back, children in order)."""
        n, offsets = self.num_nodes, self.instance_offsets
        node = torch.arange(n)
        instance = torch.repeat_interleave(torch.arange(self.num_instances),
                                           offsets[1:] - offsets[:-1])
        index = offsets[instance] + offsets[instance + 1] - 1 - node
        targets = torch.repeat_interleave(node, self.pred_ptr[1:] - self.pred_ptr[:-1])
        into, source = index[self.pred_ids], index[targets]  # each arc turned around
        # by target, then by source; parallel arcs keep their order (a stable sort)
        order = torch.sort(into * max(n, 1) + source, stable=True)[1]
        out = Packed.__new__(Packed)
        for name in _FIELDS:
            setattr(out, name, getattr(self, name))
        for name in ("node_inputs", "node_types", "labels"):
            t = getattr(self, name)
            setattr(out, name, t[index.to(t.device)])
        out.pred_ids = source[order]
        out.arc_types, out.arc_inputs = self.arc_types[order], self.arc_inputs[order]
        out.pred_ptr = torch.cat([torch.zeros(1, dtype=torch.long),
                                  torch.bincount(into, minlength=n).cumsum(0)])
        return out, index

    def host_input_ids(self):
        """input_ids in host memory (to() keeps a copy, as for the labels): user cells that
        embed ids read them on the host."""
        return self._host_copy("input_ids")

    def host_labels(self):
        """The labels in host memory: the loss heads inside the engine read them there (to()
        keeps a host copy, so a GPU batch's labels cost no wait)."""
        return self._host_copy("labels")

    def _host_copy(self, name):
        """Field `name` in host memory: the copy to() kept while the field is the tensor it was
        kept with and unchanged in place since (word dropout on a GPU's input_ids), else a copy
        now."""
        t = getattr(self, name)
        kept = getattr(self, "_host", {}).get(name)
        if kept is not None and len(kept) == 3 and kept[0] is t and t._version == kept[1]:
            return kept[2]
        return t.cpu()

    def __repr__(self):
        return (f"Packed({self.num_instances} instances, {self.num_nodes} nodes, "
                f"{self.pred_ids.numel()} arcs, {self.input_ids.numel()} input rows)")


class _Builder:
    def __init__(self):
        self.f = {name: [] for name in _FIELDS}
        self.f["pred_ptr"] = [0]
        self.f["instance_offsets"] = [0]

    def row(self, vocab_id, kind=0):
        self.f["input_ids"].append(vocab_id)
        self.f["input_kinds"].append(kind)
        return len(self.f["input_ids"]) - 1

    def node(self, input_row=-1, node_type=0, label=-1, arcs=()):
        """arcs: (global predecessor id, arc type, input row) triples. Returns the node id."""
        for pred, arc_type, row in arcs:
            self.f["pred_ids"].append(pred)
            self.f["arc_types"].append(arc_type)
            self.f["arc_inputs"].append(row)
        self.f["pred_ptr"].append(len(self.f["pred_ids"]))
        self.f["node_inputs"].append(input_row)
        self.f["node_types"].append(node_type)
        self.f["labels"].append(-1 if label is None else label)  # None: no label, as -1
        return len(self.f["node_inputs"]) - 1

    def end_instance(self, packer, name, i):
        """Closes instance i; an instance without nodes is refused here, naming it, rather than
        when a module runs the batch."""
        if len(self.f["node_inputs"]) == self.f["instance_offsets"][-1]:
            raise ValueError(f"{packer}: {name} {i} has no nodes (every instance needs at least "
                             f"one: leave empty ones out of the data set)")
        self.f["instance_offsets"].append(len(self.f["node_inputs"]))

    def build(self):
        return Packed(**self.f)


def _ids(values, packer, i, name, field, unit="node", low=0, none=True):
    """A record's list of integers (a list, NumPy array or tensor) as Python ints >= low; None
    entries stay None (no word, no label) where `none` allows them. Errors name the entry by
    its field (singular) and its unit's index."""
    if not _listlike(values):
        raise ValueError(f"{packer}: {name} {i}: its {field}s are {shorten(repr(values))}, not a "
                         f"list (one per {unit})")
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    out = []
    for k, v in enumerate(values):
        n = None if v is None else _index(v)
        if (v is None and not none) or (v is not None and (n is None or n < low)):
            raise ValueError(f"{packer}: {name} {i}: {unit} {k}'s {field} is "
                             f"{shorten(repr(v))}, not an integer >= {low}"
                             f"{' or None' if none else ''}")
        if n is not None and n >= 2**63:
            raise ValueError(f"{packer}: {name} {i}: {unit} {k}'s {field} is {n}, beyond int64")
        out.append(n)
    return out


def _listlike(values):
    """Whether `values` is a list of entries: a sequence, NumPy array or tensor (not a string)."""
    return not isinstance(values, (str, bytes)) and (hasattr(values, "tolist") or
                                                     hasattr(values, "__iter__"))


def _field(record, key, packer, name, i, form, fields=None):
    """record[key], or ValueError naming the instance and the missing key. `fields`: the
    record's fields, checked for a key one letter or so away from one ("edge" for "edges"), a
    misspelling that would otherwise be read as the field left out; other keys are the user's."""
    if not isinstance(record, dict):
        raise TypeError(f"{packer}: {name} {i} is a {type(record).__name__}, not a dict {form}")
    for other in (record if fields else ()):
        if other in fields:
            continue
        near = difflib.get_close_matches(str(other), fields, n=1, cutoff=0.8)
        if near:
            raise ValueError(f"{packer}: {name} {i} has the key {other!r}: did you mean "
                             f"{near[0]!r}? (a record is {form})")
    if key not in record:
        raise ValueError(f"{packer}: {name} {i} has no {key!r} (a record is {form})")
    return record[key]


_EDGES = '{"num_nodes": n, "edges": [(src, dst), ...], ...}'
_DAG = '{"types": [...], "inputs": [...], "arcs": [[(from, arc type), ...] per state], ...}'
_LATTICE = '{"arcs": [[(from, id), ...] per node], "tags": [...]}'


def _counts_match(packer, name, i, n, unit, lists):
    """Refuses, naming instance i, a list of `lists` ((what, values) pairs) whose length is not
    n, the instance's count of `unit`."""
    for what, values in lists:
        if len(values) != n:
            raise ValueError(f"{packer}: {name} {i} has {n} {unit} but {len(values)} {what}")


def _rows(values, where, what):
    """Edges or arcs (a list of pairs, a NumPy array or tensor of shape (n, 2 or 3)) as a list;
    None (no edges) as an empty one."""
    if values is None:
        return []
    if not _listlike(values):
        raise ValueError(f"{where}: {shorten(repr(values))} is not a list of {what}")
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _pair(row, packer, where, form):
    """An arc or edge row as a tuple of 2 (or, for edges, 3) items, else ValueError naming it."""
    if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) not in form:
        raise ValueError(f"{packer}: {where}: {shorten(repr(row))} is not "
                         f"{' or '.join(_FORMS[n] for n in form)}")
    return tuple(row)


_FORMS = {2: "a pair", 3: "a triple (src, dst, kind)"}
_LATTICE_FIELDS, _DAG_FIELDS = ("arcs", "tags"), ("types", "inputs", "arcs", "labels")
_EDGE_FIELDS = ("num_nodes", "edges", "inputs", "kinds", "labels")


def _children(t):
    """A tree node's children: a tuple's (or list's, as JSON gives them) items, a dict node's
    "children"; None for a leaf id."""
    if isinstance(t, (tuple, list)):
        return t
    if isinstance(t, dict):
        children = t.get("children", ())
        if not isinstance(children, (tuple, list)):
            raise ValueError(f"a node whose \"children\" is {children!r}, not a list")
        return tuple(children)
    return None


def _post_order(tree):
    """The subtrees of `tree` in post order, without recursion."""
    stack = [(tree, False)]
    order = []
    while stack:
        t, expanded = stack.pop()
        children = _children(t)
        if children and not expanded:
            stack.append((t, True))
            for child in reversed(children):
                stack.append((child, False))
        else:
            order.append(t)
    return order


def _tree_word(i, t):
    """The word id a tree node reads, or None."""
    if isinstance(t, (tuple, list)):
        if not t:
            raise ValueError(f"pack_trees: tree {i} has an empty {type(t).__name__}")
        return None
    if isinstance(t, dict):
        other = sorted(map(repr, set(t) - {"word", "children"}))
        if other:
            raise ValueError(f"pack_trees: tree {i} has a node with key {', '.join(other)}: "
                             f"nodes are {{\"word\": id, \"children\": [...]}}")
        word = t.get("word")
        if word is None:
            return None
    elif t is None:
        raise ValueError(f"pack_trees: tree {i} has leaf None, not a word id (a leaf without a "
                         f"word is {{\"children\": []}})")
    else:
        word = t
    if isinstance(word, str):
        raise ValueError(f"pack_trees: tree {i} has leaf {quote(word)}, a string: leaves are word "
                         "ids (an SST line is read by edbatch.pack_sst or parse_sst with a "
                         "vocabulary)")
    index = _index(word)
    if index is None or not 0 <= index < 2 ** 63:
        raise ValueError(f"pack_trees: tree {i} has leaf {word!r}, not a word id (an integer in "
                         f"[0, 2^63))")
    return index


def pack_trees(trees, labels=None, edge_inputs=None):
    """Packs trees of any arity given as nested tuples of word ids: ((1, 2), 3) has leaves 1, 2,
    3 (a tuple is an inner node with those children, in order; a list is one too, as JSON gives
    them). A word id is an int >= 0 or what stands for one (a NumPy integer, a 0-d integer
    tensor). A node may also be a dict {"word": id, "children": [...]} (a word at an inner node,
    as in dependency trees).

    Nodes are in post order; labels, when given, holds one list per tree in that order.
    edge_inputs="parent": each arc (child -> parent) reads the parent's input row (-1 when the
    parent has no word), e.g. for Child-Sum Tree-LSTM forget gates; default: no arc input.
    """
    if edge_inputs not in (None, "parent"):
        raise ValueError(f"pack_trees: edge_inputs must be None or 'parent', got {edge_inputs!r}")
    trees = list(trees)
    if labels is not None:
        labels = list(labels)
        if len(labels) != len(trees):
            raise ValueError(f"pack_trees: {len(trees)} trees but {len(labels)} label lists")
    b = _Builder()
    for i, tree in enumerate(trees):
        ids = []  # post-order position -> node id, via a stack of finished children
        stack = []
        try:
            order = _post_order(tree)
        except ValueError as e:
            raise ValueError(f"pack_trees: tree {i} has {e}") from None
        tree_labels = None if labels is None else _ids(labels[i], "pack_trees", i, "tree",
                                                       "label", low=-1)
        if tree_labels is not None:
            _counts_match("pack_trees", "tree", i, len(order), "nodes", [("labels", tree_labels)])
        for t in order:
            label = -1 if tree_labels is None else tree_labels[len(ids)]
            word = _tree_word(i, t)
            row = -1 if word is None else b.row(word)
            n = len(_children(t) or ())
            children = stack[len(stack) - n:] if n else []
            del stack[len(stack) - n:]
            arc_row = row if edge_inputs == "parent" else -1
            k = b.node(input_row=row, label=label,
                       arcs=[(c, a, arc_row) for a, c in enumerate(children)])
            ids.append(k)
            stack.append(k)
        b.end_instance("pack_trees", "tree", i)
    return b.build()


def pack_lattices(records):
    """Packs lattices: each record {"arcs": [[(from, id), ...] per node], "tags": [...]} as in
    the zoo's lattice format; an arc from node k-1 into node k is a char arc (type 0, its id from
    the char table, input kind 0), any other a word arc (type 1, kind 1)."""
    b = _Builder()
    for i, rec in enumerate(records):
        base = len(b.f["node_inputs"])
        where = f"pack_lattices: lattice {i}"
        arcs_in = _rows(_field(rec, "arcs", "pack_lattices", "lattice", i, _LATTICE,
                               _LATTICE_FIELDS), where, "arc lists (one per node)")
        tags = rec.get("tags")
        tags = [-1] * len(arcs_in) if tags is None else _ids(tags, "pack_lattices", i, "lattice",
                                                             "tag", low=-1)
        _counts_match("pack_lattices", "lattice", i, len(arcs_in), "nodes", [("tags", tags)])
        for k, arcs in enumerate(arcs_in):
            triples = []
            for arc in _rows(arcs, f"{where}: node {k}", "(from, id) arcs"):
                given = _pair(arc, "pack_lattices", f"lattice {i}: an arc into node {k}", (2,))
                j, vocab_id = _index(given[0]), _index(given[1])
                if vocab_id is None or not 0 <= vocab_id < 2**63:
                    raise ValueError(f"{where}: an arc into node {k} has no word id (an integer "
                                     f">= 0, below 2^63), it has {shorten(repr(given[1]))}")
                if j is None or not 0 <= j < k:
                    raise ValueError(f"{where}: arc into node {k} comes from node "
                                     f"{shorten(repr(given[0]))}")
                kind = 0 if j == k - 1 else 1
                triples.append((base + j, kind, b.row(vocab_id, kind)))
            b.node(label=tags[k], arcs=triples)
        b.end_instance("pack_lattices", "lattice", i)
    return b.build()


def pack_dags(records):
    """Packs DAGs: each record {"types": [...], "inputs": [...], "arcs": [[(from, arc type),
    ...] per state], "labels": [...] (optional)}; states in topological order. An input or a
    label None or -1 is none (input row -1, label -1), as in pack_edges."""
    b = _Builder()
    for i, rec in enumerate(records):
        base = len(b.f["node_inputs"])
        where = f"pack_dags: DAG {i}"
        types, inputs, arcs_in = (_field(rec, k, "pack_dags", "DAG", i, _DAG,
                                         _DAG_FIELDS if k == "types" else None)
                                  for k in ("types", "inputs", "arcs"))
        types = _ids(types, "pack_dags", i, "DAG", "type", "state", none=False)
        inputs = _ids(inputs, "pack_dags", i, "DAG", "input", "state", -1)
        labels = rec.get("labels")
        labels = ([-1] * len(types) if labels is None
                  else _ids(labels, "pack_dags", i, "DAG", "label", "state", -1))
        arcs_in = _rows(arcs_in, where, "arc lists (one per state)")
        _counts_match("pack_dags", "DAG", i, len(types), "types",
                      [("inputs", inputs), ("arc lists", arcs_in), ("labels", labels)])
        for k, (t, w, arcs) in enumerate(zip(types, inputs, arcs_in)):
            given = [_pair(arc, "pack_dags", f"DAG {i}: an arc into state {k}", (2,))
                     for arc in _rows(arcs, f"{where}: state {k}", "(from, arc type) arcs")]
            arcs = [(_index(j), _index(a)) for j, a in given]
            for (j, a), (j_given, a_given) in zip(arcs, given):
                if a is None or not 0 <= a < 2**63:
                    raise ValueError(f"{where}: an arc into state {k} has no arc type (an integer "
                                     f">= 0, below 2^63), it has {shorten(repr(a_given))}")
                if j is None or not 0 <= j < k:
                    raise ValueError(f"{where}: arc into state {k} comes from "
                                     f"{shorten(repr(j_given))}")
            b.node(input_row=-1 if w is None or w < 0 else b.row(w), node_type=t, label=labels[k],
                   arcs=[(base + j, a, -1) for j, a in arcs])
        b.end_instance("pack_dags", "DAG", i)
    return b.build()


def _edge_lists(i, inst):
    """Per node of edge-list instance i: its incoming (source, kind) pairs, in the given order."""
    n = _num_nodes(i, inst)
    preds = [[] for _ in range(n)]
    for e in _rows(inst.get("edges"), f"pack_edges: instance {i}: edges",
                   "(src, dst[, kind]) edges"):
        e = _pair(e, "pack_edges", f"instance {i}: an edge", (2, 3))
        src, dst = _index(e[0]), _index(e[1])
        for v, given in ((src, e[0]), (dst, e[1])):
            if v is None or not 0 <= v < n:
                why = "not an integer" if v is None else f"outside 0..{n - 1}"
                raise ValueError(f"pack_edges: instance {i}: edge {tuple(e)} names node "
                                 f"{given!r}, {why}")
        kind = _index(e[2]) if len(e) == 3 else 0
        if kind is None or not 0 <= kind < 2**63:
            raise ValueError(f"pack_edges: instance {i}: edge {tuple(e)} has kind {e[2]!r}, not "
                             f"an integer >= 0 (below 2^63)")
        preds[dst].append((src, kind))
    return preds


def _num_nodes(i, inst):
    n = _index(_field(inst, "num_nodes", "pack_edges", "instance", i, _EDGES, _EDGE_FIELDS))
    if n is None or n < 0:
        raise ValueError(f"pack_edges: instance {i}: num_nodes {inst['num_nodes']!r} is not an "
                         f"integer >= 0")
    return n


def _topological(i, preds):
    """Kahn's order of one instance (smallest node first among the ready ones, so an order that
    is already topological is kept); ValueError naming a node on a cycle."""
    n = len(preds)
    succs = [[] for _ in range(n)]
    waiting = [len(p) for p in preds]
    for k, p in enumerate(preds):
        for j, _ in p:
            succs[j].append(k)
    ready = [k for k in range(n) if waiting[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        j = heapq.heappop(ready)
        order.append(j)
        for k in succs[j]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    if len(order) < n:
        left = {k for k in range(n) if waiting[k] > 0}
        k, seen = min(left), set()
        while k not in seen:  # walk back through unfinished predecessors to a cycle
            seen.add(k)
            k = next(j for j, _ in preds[k] if j in left)
        raise ValueError(f"pack_edges: instance {i} has a cycle through node {k}")
    return order


def pack_edges(instances, edge_inputs=None, return_order=False):
    """Packs DAGs given as edge lists, in any node order: each instance {"num_nodes": n, "edges":
    [(src, dst) or (src, dst, kind)], "inputs": [word id per node, None or -1 for none],
    "kinds": [node kind], "labels": [...]} (all but num_nodes optional). Nodes are sorted
    topologically; a node's incoming arcs keep the order of "edges". edge_inputs="target": each
    arc reads its target node's input row. return_order: also return, per instance, the packed
    id of each node.
    """
    if edge_inputs not in (None, "target"):
        raise ValueError(f"pack_edges: edge_inputs must be None or 'target', got {edge_inputs!r}")
    flag(return_order, "pack_edges", "return_order")
    b, orders = _Builder(), []
    for i, inst in enumerate(instances):
        n = _num_nodes(i, inst)
        preds = _edge_lists(i, inst)
        base = len(b.f["node_inputs"])
        position = [0] * n
        order = _topological(i, preds)
        for pos, k in enumerate(order):
            position[k] = base + pos
        inputs, kinds, labels = (
            [default] * n if inst.get(name) is None
            else _ids(inst[name], "pack_edges", i, "instance", name[:-1], low=low,
                      none=name != "kinds")
            for name, default, low in (("inputs", None, -1), ("kinds", 0, 0), ("labels", -1, -1)))
        _counts_match("pack_edges", "instance", i, n, "nodes",
                      [("inputs", inputs), ("kinds", kinds), ("labels", labels)])
        for k in order:
            word = inputs[k]
            row = -1 if word is None or word < 0 else b.row(word)
            arc_row = row if edge_inputs == "target" else -1
            b.node(input_row=row, node_type=kinds[k], label=labels[k],
                   arcs=[(position[j], kind, arc_row) for j, kind in preds[k]])
        b.end_instance("pack_edges", "instance", i)
        orders.append(position)
    return (b.build(), orders) if return_order else b.build()


def concat_packed(parts):
    """One Packed holding the instances of several, in order."""
    b = _Builder()
    for i, p in enumerate(parts):
        if not isinstance(p, Packed):
            raise TypeError(f"concat_packed: part {i} is a {type(p).__name__}, not a Packed "
                            f"(pack instances with pack_trees and the like, or collate them)")
        node_base = len(b.f["node_inputs"])
        row_base = len(b.f["input_ids"])
        arc_base = len(b.f["pred_ids"])
        shift_rows = [r + row_base if r >= 0 else -1 for r in p.node_inputs.tolist()]
        b.f["node_inputs"] += shift_rows
        b.f["node_types"] += p.node_types.tolist()
        b.f["labels"] += p.labels.tolist()
        b.f["pred_ids"] += [j + node_base for j in p.pred_ids.tolist()]
        b.f["arc_types"] += p.arc_types.tolist()
        b.f["arc_inputs"] += [r + row_base if r >= 0 else -1 for r in p.arc_inputs.tolist()]
        b.f["pred_ptr"] += [a + arc_base for a in p.pred_ptr.tolist()[1:]]
        b.f["instance_offsets"] += [o + node_base for o in p.instance_offsets.tolist()[1:]]
        b.f["input_ids"] += p.input_ids.tolist()
        b.f["input_kinds"] += p.input_kinds.tolist()
    return b.build()


def synthetic_lattices(n, vocab_size=1000, seed=1, min_len=8, max_len=24, word_prob=0.3,
                       tags=18):
    """Seeded character lattices: a char arc into every node but the first, and word arcs
    spanning 2..4 characters with probability word_prob per node."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        length = rng.randint(min_len, max_len)
        arcs = []
        for k in range(length):
            a = [] if k == 0 else [(k - 1, rng.randrange(vocab_size))]
            for span in (2, 3, 4):
                if k - span >= 0 and rng.random() < word_prob:
                    a.append((k - span, rng.randrange(vocab_size)))
            arcs.append(a)
        records.append({"arcs": arcs, "tags": [rng.randrange(tags) for _ in range(length)]})
    return records
