"""PyTorch baselines of edbatch's tree_lstm and lattice_lstm (the math of docs/models.md).

Each model comes in two implementations with the same parameters:
  * eager: node by node, one small matrix-vector product per gate group and node or arc;
  * batched: by dependency level over a whole mini-batch, with the gate GEMMs fused through
    concatenated weights, index gathers of the children's states and index_add for fan-in.
Both return per-instance losses (the sum over the instance's nodes of -log softmax(W_out h)[label]).

Also here: readers for edbatch's SST-tree and lattice text files (word ids by first appearance,
folded modulo the vocabulary size, as edbatch numbers them) and a small safetensors reader and
writer, so the models use the weights `edbatch run --save-weights` wrote.
Works with torch 1.13 and 2.x; needs nothing but torch.
"""

import json
import re
import struct

import torch

# ---------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length N, N bytes of JSON, then raw little-endian data.

_DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "I64": (torch.int64, 8),
           "I32": (torch.int32, 4)}


def read_safetensors(path):
    """All tensors of a safetensors file as {name: CPU tensor}; raises ValueError when malformed."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: truncated safetensors file ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header of {n} bytes but only {len(blob) - 8} bytes follow")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")
        dtype, size = _DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = list(entry["shape"])
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * size or end > len(data):
            raise ValueError(f"{path}: tensor {name} of shape {shape} has bad data_offsets "
                             f"[{begin}, {end}]")
        raw = bytearray(data[begin:end])  # a copy that the tensor owns
        t = torch.frombuffer(raw, dtype=dtype) if count else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape).clone()
    return out


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (float32, int32, int64 or float64) in safetensors format."""
    names = {dtype: key for key, (dtype, _) in _DTYPES.items()}
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        if t.dtype not in names:
            raise ValueError(f"write_safetensors: tensor {name} has unsupported dtype {t.dtype}")
        raw = t.numpy().tobytes() if _has_numpy() else _tensor_bytes(t)
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def _has_numpy():
    try:
        import numpy  # noqa: F401
        return True
    except ImportError:
        return False


def _tensor_bytes(t):
    # Without numpy: the bytes through a uint8 view (little-endian hosts only).
    return bytes(t.view(torch.uint8).reshape(-1).tolist())


# ---------------------------------------------------------------------------------------------
# Data: the text formats edbatch reads (docs/models.md).

_TOKEN = re.compile(r"\(|\)|[^\s()]+", re.ASCII)  # ASCII blanks, as edbatch: SST has 8\u00a01/2
_BLANKS = re.compile(r"\s+", re.ASCII)


class Tree:
    """A binary tree in post-order: children before parents, the root last."""
    __slots__ = ("left", "right", "word", "label", "level")

    def __init__(self):
        self.left, self.right, self.word, self.label = [], [], [], []
        self.level = []  # 0 for leaves, 1 + the higher child's level for inner nodes

    def __len__(self):
        return len(self.label)


def read_trees(path, vocab=256, words=None):
    """SST bracketed trees, one per line; word ids by first appearance (continuing `words`, a
    dict of a file read before, when given), folded modulo vocab (0: not folded)."""
    words, trees = {} if words is None else words, []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            tree, stack, expect_label = Tree(), [], False
            for m in _TOKEN.finditer(line):
                tok, col = m.group(0), m.start() + 1
                where = f"{path}:{line_no}:{col}"
                if expect_label:
                    if tok not in ("0", "1", "2", "3", "4"):
                        raise ValueError(f"{where}: expected a label 0-4, found '{tok}'")
                    stack[-1]["label"] = int(tok)
                    expect_label = False
                elif tok == "(":
                    if stack and (stack[-1]["word"] is not None or len(stack[-1]["kids"]) == 2):
                        raise ValueError(f"{where}: a node with a word or two children")
                    stack.append({"label": None, "word": None, "kids": []})
                    expect_label = True
                elif tok == ")":
                    if not stack:
                        raise ValueError(f"{where}: unbalanced ')'")
                    node = stack.pop()
                    if node["word"] is not None:
                        tree.left.append(-1)
                        tree.right.append(-1)
                        tree.word.append(node["word"])
                        tree.level.append(0)
                    elif len(node["kids"]) == 2:
                        a, b = node["kids"]
                        tree.left.append(a)
                        tree.right.append(b)
                        tree.word.append(0)
                        tree.level.append(1 + max(tree.level[a], tree.level[b]))
                    else:
                        raise ValueError(f"{where}: a node needs a word or two children")
                    tree.label.append(node["label"])
                    if stack:
                        stack[-1]["kids"].append(len(tree) - 1)
                else:
                    if not stack or stack[-1]["kids"] or stack[-1]["word"] is not None:
                        raise ValueError(f"{where}: unexpected word '{tok}'")
                    wid = words.setdefault(tok, len(words))
                    stack[-1]["word"] = wid % vocab if vocab else wid
            if stack or expect_label or not len(tree):
                raise ValueError(f"{path}:{line_no}: unbalanced or empty tree")
            trees.append(tree)
    if not trees:
        raise ValueError(f"{path}: no trees")
    return trees


class Lattice:
    """Node k has arcs (src[a], ids[a]) for a in arcs_into[k]; a char arc if src = k-1."""
    __slots__ = ("tags", "src", "dst", "ids", "kind", "level")

    def __init__(self):
        self.tags, self.src, self.dst, self.ids, self.kind = [], [], [], [], []
        self.level = []  # per node: 0 without arcs, else 1 + the highest source level

    def __len__(self):
        return len(self.tags)


def read_lattices(path, vocab=256):
    """The lattice text format: count; per lattice L, L tags, L arc lines; ids folded mod vocab."""
    with open(path, encoding="utf-8") as f:
        lines = [(i, [t for t in _BLANKS.split(ln) if t]) for i, ln in enumerate(f, 1)]
    pos = 0

    def next_line(blank_ok):
        nonlocal pos
        while pos < len(lines):
            i, v = lines[pos]
            pos += 1
            if v or blank_ok:
                return i, v
        raise ValueError(f"{path}: truncated input")

    _, head = next_line(False)
    count = int(head[0])
    out = []
    for _ in range(count):
        i, v = next_line(False)
        n = int(v[0])
        lat = Lattice()
        i, v = next_line(True)
        if len(v) != n:
            raise ValueError(f"{path}:{i}: expected {n} tags, found {len(v)}")
        lat.tags = [int(t) for t in v]
        for k in range(n):
            i, v = next_line(True)
            nums = [int(x) for x in v]
            if not nums or len(nums) != 1 + 2 * nums[0]:
                raise ValueError(f"{path}:{i}: malformed arc line of node {k}")
            level = 0
            for a in range(nums[0]):
                j, wid = nums[1 + 2 * a], nums[2 + 2 * a]
                if j >= k:
                    raise ValueError(f"{path}:{i}: arc into node {k} from node {j}")
                lat.src.append(j)
                lat.dst.append(k)
                lat.ids.append(wid % vocab if vocab else wid)
                lat.kind.append(0 if j + 1 == k else 1)
                level = max(level, lat.level[j] + 1)
            lat.level.append(level)
        out.append(lat)
    return out


# ---------------------------------------------------------------------------------------------
# Models.

def _require(weights, name, shape):
    if name not in weights:
        raise ValueError(f"weights: missing tensor '{name}'")
    t = weights[name]
    if list(t.shape) != list(shape):
        raise ValueError(f"weights: tensor '{name}' has shape {list(t.shape)}, expected {shape}")
    return t


def sgd_update(params, lr, drop_grads=False):
    """p -= lr * grad for every parameter with a gradient, as one multi-tensor add. Gradients
    are then zeroed in place so their buffers are reused, or with `drop_grads` set to None
    (PyTorch's zero_grad default), so that the next backward hands over fresh gradient tensors
    instead of adding into zeroed ones."""
    with torch.no_grad():
        params = [p for p in params if p.grad is not None]
        grads = [p.grad for p in params]
        if not params:
            return
        torch._foreach_add_(params, grads, alpha=-lr)
        if drop_grads:
            for p in params:
                p.grad = None
        else:
            torch._foreach_zero_(grads)


class _Model:
    """Parameters on a device, the per-mini-batch metadata upload, and the loss head.

    The parameters are the fused tensors the batched code multiplies with (gate weights
    concatenated along the output dimension, transposed for row-major GEMMs), made once from
    edbatch's separately named tensors; the eager code uses views of the same tensors."""

    def __init__(self, device, requires_grad):
        self.device = torch.device(device)
        self.params = {}
        self._requires_grad = requires_grad
        self._arange = torch.empty(0, dtype=torch.int64, device=self.device)
        self._pinned = torch.empty(0, dtype=torch.int64)

    def _param(self, name, tensor):
        p = tensor.detach().to(self.device, torch.float32).contiguous().clone()
        p.requires_grad_(self._requires_grad)
        self.params[name] = p
        return p

    def sgd_step(self, lr, drop_grads=False):
        sgd_update(self.params.values(), lr, drop_grads)

    def upload(self, host):
        """One host-to-device copy of a mini-batch's packed int64 metadata (pinned staging,
        reused across mini-batches; the caller syncs on the loss before the next upload)."""
        if self.device.type == "cpu":
            return host
        n = host.numel()
        if self._pinned.numel() < n:
            self._pinned = torch.empty(max(n, 2 * self._pinned.numel()),
                                       dtype=torch.int64).pin_memory()
        self._pinned[:n].copy_(host)
        return self._pinned[:n].to(self.device, non_blocking=True)

    def rows(self, n):
        """arange(n) on the device, cached."""
        if self._arange.numel() < n:
            self._arange = torch.arange(max(n, 2 * self._arange.numel()), device=self.device)
        return self._arange[:n]

    def _loss_head(self, h, labels, inst, batch):
        """Per-instance sums of -log softmax(W_out h)[label] over all nodes (rows of h)."""
        logp = torch.log_softmax(torch.mm(h, self.W_outT), 1)
        nll = -logp.gather(1, labels.unsqueeze(1)).squeeze(1)
        return torch.zeros(batch, device=self.device).index_add(0, inst, nll)

    def _node_loss(self, h, label):
        return -torch.log_softmax(torch.mv(self.W_out, h), 0)[label]


class TreeLstm(_Model):
    """tree_lstm: leaf and inner cells (separate forget gates, shared b_f), loss at every node."""
    sparse_embedding = False  # True: E's gradient is sparse (rows of the mini-batch's words)

    def __init__(self, weights, device="cpu", requires_grad=False):
        super().__init__(device, requires_grad)
        E = weights.get("E")
        if E is None or E.dim() != 2:
            raise ValueError("weights: missing lookup tensor 'E' [vocab, hidden]")
        H = self.H = E.shape[1]
        r = lambda n, s: _require(weights, n, s)  # noqa: E731
        U_iou = torch.cat([r(n, [H, 2 * H]) for n in ("U_i", "U_o", "U_u")], 0)  # [3H, 2H]
        p = self._param
        self.E = p("E", E)
        # Leaf gates i, o, u in one GEMM: e @ W_leafT, W_leafT of [H, 3H].
        self.W_leafT = p("W_leafT", torch.cat([r(n, [H, H]) for n in ("W_i", "W_o", "W_u")], 0).t())
        self.b_iou = p("b_iou", torch.cat([r(n, [H]) for n in ("b_i", "b_o", "b_u")], 0))
        # Inner gates as one batched GEMM over (left, right): [h_l; h_r] (2, n, H) times
        # [[U_iou_left^T | U_f1^T], [U_iou_right^T | U_f2^T]] (2, H, 4H).
        self.U_pair = p("U_pair", torch.stack([
            torch.cat([U_iou[:, :H].t(), r("U_f1", [H, H]).t()], 1),
            torch.cat([U_iou[:, H:].t(), r("U_f2", [H, H]).t()], 1)]))
        self.b_f = p("b_f", r("b_f", [H]))
        self.W_outT = p("W_outT", r("W_out", [5, H]).t())
        self.W_out = self.W_outT.t()

    # ---- node by node ----

    def _gates(self, g, c_sum):
        H = self.H
        i, o = torch.sigmoid(g[:H]), torch.sigmoid(g[H:2 * H])
        c = i * torch.tanh(g[2 * H:3 * H])
        if c_sum is not None:
            c = c + c_sum
        return o * torch.tanh(c), c

    def eager_losses(self, trees):
        H, W_leaf, U_l, U_r = self.H, self.W_leafT.t(), self.U_pair[0].t(), self.U_pair[1].t()
        out = []
        for t in trees:
            hs, cs, losses = [None] * len(t), [None] * len(t), []
            for k in range(len(t)):
                if t.left[k] < 0:
                    h, c = self._gates(torch.addmv(self.b_iou, W_leaf, self.E[t.word[k]]), None)
                else:
                    a, b = t.left[k], t.right[k]
                    r0, r1 = torch.mv(U_l, hs[a]), torch.mv(U_r, hs[b])  # [iou | f] per child
                    f1 = torch.sigmoid(r0[3 * H:] + self.b_f)
                    f2 = torch.sigmoid(r1[3 * H:] + self.b_f)
                    h, c = self._gates(r0[:3 * H] + r1[:3 * H] + self.b_iou,
                                       f1 * cs[a] + f2 * cs[b])
                hs[k], cs[k] = h, c
                losses.append(self._node_loss(h, t.label[k]))
            out.append(torch.stack(losses).sum())
        return torch.stack(out)

    # ---- batched by dependency level ----

    @staticmethod
    def plan(trees):
        """Host-side schedule of a mini-batch: nodes sorted by level (leaves first), so each
        level is a contiguous block of rows. Returns (packed int64 metadata, level sizes)."""
        sizes = [len(t) for t in trees]
        n = sum(sizes)
        lv = torch.tensor([x for t in trees for x in t.level], dtype=torch.int64)
        off = torch.repeat_interleave(torch.tensor([0] + sizes[:-1]).cumsum(0),
                                      torch.tensor(sizes))
        left = torch.tensor([x for t in trees for x in t.left], dtype=torch.int64) + off
        right = torch.tensor([x for t in trees for x in t.right], dtype=torch.int64) + off
        word = torch.tensor([x for t in trees for x in t.word], dtype=torch.int64)
        label = torch.tensor([x for t in trees for x in t.label], dtype=torch.int64)
        inst = torch.repeat_interleave(torch.arange(len(trees)), torch.tensor(sizes))
        lv_sorted, perm = torch.sort(lv, stable=True)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(n)
        counts = torch.bincount(lv_sorted)
        n0 = int(counts[0])
        # Children of the inner nodes, level by level: [lefts of the level; rights of the level].
        inner = perm[n0:]
        starts = counts.cumsum(0) - counts
        lvl_i = lv_sorted[n0:]
        start_i, count_i = starts[lvl_i], counts[lvl_i]
        pos = torch.arange(n0, n) - start_i
        base = 2 * (start_i - n0)
        lr = torch.empty(2 * (n - n0), dtype=torch.int64)
        lr[base + pos] = inv[left[inner]]
        lr[base + count_i + pos] = inv[right[inner]]
        packed = torch.cat([word[perm[:n0]], lr, label[perm], inst[perm]])
        return packed, counts.tolist()

    def batched_losses(self, trees, plan=None, states=False):
        """Per-instance losses; with states, (h of every node, its label, its instance) instead,
        rows in level order (an instance's root is its last row)."""
        packed, counts = plan if plan is not None else self.plan(trees)
        meta = self.upload(packed)
        H, n0, n = self.H, counts[0], sum(counts)
        words = meta[:n0]
        lr = meta[n0:n0 + 2 * (n - n0)]
        labels = meta[2 * n - n0:3 * n - n0]
        inst = meta[3 * n - n0:]
        # Leaves: one gather and one GEMM; the state rows S = [h | c] start with them.
        e = (torch.nn.functional.embedding(words, self.E, sparse=True) if self.sparse_embedding
             else self.E.index_select(0, words))
        g = torch.addmm(self.b_iou, e, self.W_leafT)
        # split/chunk rather than slices: a slice's backward scatters into a zero tensor of the
        # whole input, split's is one concatenation.
        g_io, g_u = g.split([2 * H, H], 1)
        i, o = torch.sigmoid(g_io).chunk(2, 1)
        c = i * torch.tanh(g_u)
        h = o * torch.tanh(c)
        S = torch.cat([torch.cat([h, c], 1),
                       torch.zeros(n - n0, 2 * H, device=self.device)], 0)
        start, at = n0, 0
        for m in counts[1:]:
            h_kids, c_kids = S.index_select(0, lr[at:at + 2 * m]).view(2, m, 2 * H).split(H, 2)
            r_iou, r_f = torch.bmm(h_kids, self.U_pair).split([3 * H, H], 2)  # (2, m, 4H)
            g_io, g_u = (r_iou.sum(0) + self.b_iou).split([2 * H, H], 1)
            f = torch.sigmoid(r_f + self.b_f)  # (f1; f2)
            i, o = torch.sigmoid(g_io).chunk(2, 1)
            c = i * torch.tanh(g_u) + (f * c_kids).sum(0)
            h = o * torch.tanh(c)
            # index_add_ rather than a slice copy: its backward passes the gradient through
            # instead of cloning the whole state gradient at every level.
            S = S.index_add_(0, self.rows(start + m)[start:], torch.cat([h, c], 1))
            start += m
            at += 2 * m
        h = S.split(H, 1)[0]
        return (h, labels, inst) if states else self._loss_head(h, labels, inst, len(trees))


class LatticeLstm(_Model):
    """lattice_lstm: char arcs (from k-1) and word arcs with their own tables and weights, the
    arc cell, sums of h' and c' over arcs, learned (h0, c0) for nodes without arcs."""

    TYPES = ("char", "word")

    def __init__(self, weights, device="cpu", requires_grad=False):
        super().__init__(device, requires_grad)
        E = weights.get("char.E")
        if E is None or E.dim() != 2:
            raise ValueError("weights: missing lookup tensor 'char.E' [vocab, hidden]")
        V, H = E.shape
        self.H = H
        W_out = weights.get("W_out")
        if W_out is None or W_out.dim() != 2 or W_out.shape[1] != H:
            raise ValueError(f"weights: expected 'W_out' of shape [classes, {H}]")
        self.classes = W_out.shape[0]
        p = self._param
        self.E, self.UT, self.WT, self.b = [], [], [], []
        for t in self.TYPES:
            r = lambda n, s: _require(weights, f"{t}.{n}", s)  # noqa: E731
            # Gates f, i, o, c~ side by side (the sigmoids first): x @ UT and h @ WT are [*, 4H].
            self.E.append(p(f"{t}.E", r("E", [V, H])))
            self.UT.append(p(f"{t}.UT", torch.cat([r(f"U_{g}", [H, H]) for g in "fioc"], 0).t()))
            self.WT.append(p(f"{t}.WT", torch.cat([r(f"W_{g}", [H, H]) for g in "fioc"], 0).t()))
            self.b.append(p(f"{t}.b", torch.cat([r(f"b_{g}", [H]) for g in "fioc"], 0)))
        self.hc0 = p("hc0", torch.cat([_require(weights, "h0", [H]),
                                       _require(weights, "c0", [H])]))
        self.W_outT = p("W_outT", W_out.t())
        self.W_out = self.W_outT.t()

    # ---- node by node ----

    def _arc_eager(self, t, x, h, c):
        H = self.H
        g = torch.addmv(torch.addmv(self.b[t], self.UT[t].t(), x), self.WT[t].t(), h)
        f, i, o = torch.sigmoid(g[:3 * H]).chunk(3)
        ct = torch.tanh(g[3 * H:])
        c2 = i * ct + f * c
        return o * torch.tanh(c2), c2

    def eager_losses(self, lattices):
        H = self.H
        h0, c0 = self.hc0[:H], self.hc0[H:]
        out = []
        for lat in lattices:
            n = len(lat)
            hs, cs, losses = [None] * n, [None] * n, []
            arcs = [[] for _ in range(n)]
            for a, k in enumerate(lat.dst):
                arcs[k].append(a)
            for k in range(n):
                if not arcs[k]:
                    h, c = h0, c0
                else:
                    h = c = None
                    for a in arcs[k]:
                        j, t = lat.src[a], lat.kind[a]
                        h2, c2 = self._arc_eager(t, self.E[t][lat.ids[a]], hs[j], cs[j])
                        h = h2 if h is None else h + h2
                        c = c2 if c is None else c + c2
                hs[k], cs[k] = h, c
                losses.append(self._node_loss(h, lat.tags[k]))
            out.append(torch.stack(losses).sum())
        return torch.stack(out)

    # ---- batched by dependency level ----

    @staticmethod
    def plan(lattices):
        """Nodes sorted by level (nodes without arcs first); arcs sorted by type then level for
        the input projections (one GEMM per type for the whole mini-batch) and by level then
        type for the recurrence. Returns (packed int64 metadata, sizes)."""
        sizes = [len(x) for x in lattices]
        n = sum(sizes)
        lv = torch.tensor([v for x in lattices for v in x.level], dtype=torch.int64)
        noff = torch.tensor([0] + sizes[:-1]).cumsum(0)
        aoff = torch.repeat_interleave(noff, torch.tensor([len(x.src) for x in lattices]))
        src = torch.tensor([v for x in lattices for v in x.src], dtype=torch.int64) + aoff
        dst = torch.tensor([v for x in lattices for v in x.dst], dtype=torch.int64) + aoff
        ids = torch.tensor([v for x in lattices for v in x.ids], dtype=torch.int64)
        kind = torch.tensor([v for x in lattices for v in x.kind], dtype=torch.int64)
        tags = torch.tensor([v for x in lattices for v in x.tags], dtype=torch.int64)
        inst = torch.repeat_interleave(torch.arange(len(lattices)), torch.tensor(sizes))
        lv_sorted, perm = torch.sort(lv, stable=True)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(n)
        counts = torch.bincount(lv_sorted)
        levels = counts.numel()
        alv = lv[dst]
        _, perm_t = torch.sort(kind * levels + alv, stable=True)  # type-major
        _, perm_l = torch.sort(alv * 2 + kind, stable=True)  # level-major
        inv_t = torch.empty_like(perm_t)
        inv_t[perm_t] = torch.arange(perm_t.numel())
        per_type = torch.bincount(kind, minlength=2).tolist()
        per_level_type = torch.bincount(alv * 2 + kind, minlength=2 * levels).view(levels, 2)
        # Level l reads the states of levels lo[l] .. l-1 (a window: word arcs span a few
        # characters); source rows are relative to the window, destinations to level l.
        src_l, alv_l = src[perm_l], alv[perm_l]
        slv = lv[src]
        by_source = torch.sort(alv * levels + slv).values  # per level, its lowest source first
        arcs_per_level = torch.bincount(alv, minlength=levels)
        first = (arcs_per_level.cumsum(0) - arcs_per_level).clamp(max=max(slv.numel() - 1, 0))
        lo = torch.where(arcs_per_level > 0, by_source[first] % levels if slv.numel() else
                         arcs_per_level, torch.zeros_like(arcs_per_level))
        row0 = counts.cumsum(0) - counts
        src_w = inv[src_l] - row0[lo[alv_l]]
        dst_w = inv[dst[perm_l]] - row0[alv_l]
        packed = torch.cat([ids[perm_t], inv_t[perm_l], src_w, dst_w, tags[perm], inst[perm]])
        return packed, (counts.tolist(), per_type, per_level_type.tolist(), lo.tolist())

    def batched_losses(self, lattices, plan=None):
        packed, (counts, per_type, per_level_type, lo) = (plan if plan is not None
                                                          else self.plan(lattices))
        meta = self.upload(packed)
        H, n = self.H, sum(counts)
        A = sum(per_type)
        ids_t, q, src, dst = meta[:A], meta[A:2 * A], meta[2 * A:3 * A], meta[3 * A:4 * A]
        tags, inst = meta[4 * A:4 * A + n], meta[4 * A + n:]
        # Input projections U x + b of every arc: one gather and one GEMM per type for the
        # whole mini-batch (they do not depend on the recurrence), then into level-major order.
        proj, at = [], 0
        for t, count in enumerate(per_type):
            if count:
                x = self.E[t].index_select(0, ids_t[at:at + count])
                proj.append(torch.addmm(self.b[t], x, self.UT[t]))
            at += count
        # The states [h | c] level by level; one tensor per level so that the gradient of a
        # gather covers its window of levels, not every node of the mini-batch.
        states = [self.hc0.expand(counts[0], 2 * H)]
        if proj:
            # One split into the (level, type) groups: slicing per level instead would make
            # autograd scatter each slice's gradient into a zero tensor of the full size.
            proj = (proj[0] if len(proj) == 1 else torch.cat(proj, 0)).index_select(0, q)
            groups = proj.split([k for level in per_level_type for k in level])
        at = 0
        for level in range(1, len(per_level_type)):
            n_char, n_word = per_level_type[level]
            k = n_char + n_word
            window = states[lo[level]] if lo[level] == level - 1 else torch.cat(
                states[lo[level]:level], 0)
            h_src, c_src = window.index_select(0, src[at:at + k]).split(H, 1)
            h_char, h_word = h_src.split([n_char, n_word])
            parts = []
            if n_char:
                parts.append(torch.addmm(groups[2 * level], h_char, self.WT[0]))
            if n_word:
                parts.append(torch.addmm(groups[2 * level + 1], h_word, self.WT[1]))
            g = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
            g_fio, g_c = g.split([3 * H, H], 1)
            f, i, o = torch.sigmoid(g_fio).chunk(3, 1)
            c = i * torch.tanh(g_c) + f * c_src
            h = o * torch.tanh(c)
            # Fan-in: the sum over each node's arcs.
            states.append(torch.zeros(counts[level], 2 * H, device=self.device).index_add_(
                0, dst[at:at + k], torch.cat([h, c], 1)))
            at += k
        return self._loss_head(torch.cat(states, 0).split(H, 1)[0], tags, inst, len(lattices))


MODELS = {"tree_lstm": (TreeLstm, read_trees), "lattice_lstm": (LatticeLstm, read_lattices)}
