"""Pure-PyTorch versions of the cells' math (docs/models.md), node by node over a Packed batch:
the tests' independent reference. W x is W @ x with torch's (out, in) weights."""
import torch


def _preds(p, k):
    a0, a1 = p.pred_ptr[k].item(), p.pred_ptr[k + 1].item()
    return [(p.pred_ids[a].item(), p.arc_types[a].item(), p.arc_inputs[a].item())
            for a in range(a0, a1)]


def tree_lstm(x, p, w):
    hs, cs = [], []
    for k in range(p.num_nodes):
        ch = _preds(p, k)
        if not ch:
            e = x[p.node_inputs[k]]
            i = torch.sigmoid(w["W_i"] @ e + w["b_i"])
            o = torch.sigmoid(w["W_o"] @ e + w["b_o"])
            u = torch.tanh(w["W_u"] @ e + w["b_u"])
            c = i * u
        else:
            (l, _, _), (r, _, _) = ch
            xx = torch.cat([hs[l], hs[r]])
            i = torch.sigmoid(w["U_i"] @ xx + w["b_i"])
            o = torch.sigmoid(w["U_o"] @ xx + w["b_o"])
            u = torch.tanh(w["U_u"] @ xx + w["b_u"])
            f1 = torch.sigmoid(w["U_f1"] @ hs[l] + w["b_f"])
            f2 = torch.sigmoid(w["U_f2"] @ hs[r] + w["b_f"])
            c = i * u + f1 * cs[l] + f2 * cs[r]
        hs.append(o * torch.tanh(c))
        cs.append(c)
    return [_stack(hs, x, w), _stack(cs, x, w)]


def tree_gru(x, p, w):
    hs = []
    for k in range(p.num_nodes):
        ch = _preds(p, k)
        if not ch:
            e = x[p.node_inputs[k]]
            r = torch.sigmoid(w["U_r"] @ e + w["b_r"])
            z = torch.sigmoid(w["U_z"] @ e + w["b_z"])
            c = torch.tanh(w["U_c"] @ (r * e) + w["b_c"])
            hs.append(z * e + (1 - z) * c)
        else:
            total = 0
            for n, (j, _, _) in enumerate(ch, start=1):
                h = hs[j]
                r = torch.sigmoid(w[f"U_r{n}"] @ h + w["b_r"])
                z = torch.sigmoid(w[f"U_z{n}"] @ h + w["b_z"])
                c = torch.tanh(w[f"U_c{n}"] @ (r * h) + w["b_c"])
                total = total + z * h + (1 - z) * c
            hs.append(total / 2)
    return [_stack(hs, x, w)]


def _lattice(x, p, w, arc, lstm):
    hs, cs = [], []
    for k in range(p.num_nodes):
        arcs = _preds(p, k)
        if not arcs:
            hs.append(w["h0"])
            cs.append(w["c0"] if lstm else None)
            continue
        h_sum, c_sum = 0, 0
        for j, t, row in arcs:
            h, c = arc("char_" if t == 0 else "word_", hs[j], cs[j], x[row])
            h_sum = h_sum + h
            if lstm:
                c_sum = c_sum + c
        hs.append(h_sum)
        cs.append(c_sum if lstm else None)
    return [_stack(hs, x, w), _stack(cs, x, w)] if lstm else [_stack(hs, x, w)]


def lattice_lstm(x, p, w):
    def arc(t, h, c, e):
        gate = {g: w[t + "U_" + g] @ e + w[t + "W_" + g] @ h + w[t + "b_" + g] for g in "fcio"}
        c_new = torch.sigmoid(gate["i"]) * torch.tanh(gate["c"]) + torch.sigmoid(gate["f"]) * c
        return torch.sigmoid(gate["o"]) * torch.tanh(c_new), c_new

    return _lattice(x, p, w, arc, True)


def lattice_gru(x, p, w):
    def arc(t, h, c, e):
        r = torch.sigmoid(w[t + "U_r"] @ h + w[t + "W_r"] @ e + w[t + "b_r"])
        z = torch.sigmoid(w[t + "U_z"] @ h + w[t + "W_z"] @ e + w[t + "b_z"])
        cand = torch.tanh(w[t + "U_c"] @ (r * h) + w[t + "W_c"] @ e + w[t + "b_c"])
        return z * h + (1 - z) * cand, None

    return _lattice(x, p, w, arc, False)


def random_dag(x, p, w):
    hs = []
    for k in range(p.num_nodes):
        arcs = _preds(p, k)
        s = w["s0"] if not arcs else sum(w[f"A{a}"] @ hs[j] for j, a, _ in arcs)
        t = p.node_types[k].item()
        hs.append(torch.tanh(w[f"W{t}"] @ torch.cat([s, x[p.node_inputs[k]]]) + w[f"b{t}"]))
    return [_stack(hs, x, w)]


def mvrnn(x, p, w):
    """Rows of x are [v; vec(M)], vec column-major; the second output is vec(M) per node."""
    H = w["b_v"].shape[0]
    vs, Ms = [], []
    for k in range(p.num_nodes):
        ch = _preds(p, k)
        if not ch:
            row = x[p.node_inputs[k]]
            vs.append(row[:H])
            Ms.append(row[H:].reshape(H, H).t())
        else:
            (l, _, _), (r, _, _) = ch
            vs.append(torch.tanh(w["W_v"] @ torch.cat([Ms[r] @ vs[l], Ms[l] @ vs[r]]) + w["b_v"]))
            Ms.append(w["W_M"] @ torch.cat([Ms[l], Ms[r]]) + w["b_M"])
    if not vs:
        return [x.new_zeros((0, H)), x.new_zeros((0, H * H))]
    return [torch.stack(vs), torch.stack([M.t().reshape(-1) for M in Ms])]


def _stack(values, x, w):
    if not values:
        hidden = next(iter(w.values())).shape[0]
        return x.new_zeros((0, hidden))
    return torch.stack(values)


CELLS = {"tree_lstm": tree_lstm, "tree_gru": tree_gru, "lattice_lstm": lattice_lstm,
         "lattice_gru": lattice_gru, "random_dag": random_dag, "mvrnn": mvrnn}


# ---- user cells (edbatch.nn.Propagate), node by node in eager PyTorch ----

class _Dropout:
    """Replaces F.dropout while the reference runs: the mask of docs/programs.md for the cell
    invocation being run (index, next site), so that eager cells see the op's masks."""

    def __init__(self, seed):
        self.seed, self.index, self.site = seed, 0, 0

    def __call__(self, input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        from edbatch.trace import dropout_mask
        mask = dropout_mask(self.seed, self.index, self.site, input.shape[-1], p)
        self.site += 1
        return input * mask.to(input.dtype) / (1 - p)


def _as_list(cells):
    if isinstance(cells, dict):
        return [cells[k] for k in sorted(cells)]
    return list(cells) if isinstance(cells, (list, tuple, torch.nn.ModuleList)) else [cells]


def _pick(cells, kind):
    return cells[kind] if len(cells) > 1 else cells[0]


def _sizes(size):
    return (size,) if isinstance(size, int) else tuple(size)


def propagate_reference(node_cells, edge_cells, packed, x=None, ids=None, *, state_size,
                        message_size=None, reduce="sum", initial=None, dropout=None):
    """edbatch.nn.Propagate's math, node by node with the user's own cells (docs/programs.md,
    "Propagation"). node_cells / edge_cells: a cell or a list by kind (one cell: every kind).
    initial: None (zeros) or one tensor per message component. dropout: (seed, node sites per
    node kind, edge sites per arc kind) to use the op's masks (site: the cell's first dropout
    site in the program). Returns the state (one tensor, or a tuple when state_size is one)."""
    nodes, edges = _as_list(node_cells), _as_list(edge_cells) if edge_cells is not None else []
    state = _sizes(state_size)
    message = _sizes(message_size) if message_size is not None else state
    message_tuple = not isinstance(message_size if message_size is not None else state_size, int)
    state_tuple = not isinstance(state_size, int)
    hook = _Dropout(dropout[0]) if dropout else None
    original = torch.nn.functional.dropout
    if hook:
        torch.nn.functional.dropout = hook
    try:
        states = _run(packed, x, ids, nodes, edges, message, message_tuple, state_tuple, reduce,
                      initial, hook, dropout)
    finally:
        torch.nn.functional.dropout = original
    like = x if x is not None else torch.zeros(0)
    out = [torch.cat([s[i] for s in states]) if states else like.new_zeros((0, size))
           for i, size in enumerate(state)]
    return tuple(out) if state_tuple else out[0]


def _input(x, ids, row):
    if x is not None:
        return x[row:row + 1] if row >= 0 else x.new_zeros((1, x.shape[1]))
    if ids is not None:
        if row < 0:
            raise ValueError("the reference has no integer input for row -1")
        return ids[row:row + 1]
    return None


def _pack(parts, as_tuple):
    return tuple(parts) if as_tuple else parts[0]


def _unpack(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def reduce_messages(messages, how):
    """messages: per incoming message, its list of components; one tensor per component.
    "softmax": component 0 holds the scores; the node gets their log-sum-exp and the other
    components weighted by their softmax."""
    stacked = [torch.stack(c) for c in zip(*messages)]
    if how == "softmax":
        weights = torch.softmax(stacked[0], 0)
        return [torch.logsumexp(stacked[0], 0)] + [(weights * v).sum(0) for v in stacked[1:]]
    if how == "sum":
        return [s.sum(0) for s in stacked]
    if how == "mean":
        return [s.mean(0) for s in stacked]
    return [s.max(0).values for s in stacked]


def _run(packed, x, ids, nodes, edges, message, message_tuple, state_tuple, how, initial, hook,
         dropout):
    states, n = [], packed.num_nodes
    for k in range(n):
        incoming = []
        for a in range(packed.pred_ptr[k].item(), packed.pred_ptr[k + 1].item()):
            j, kind = packed.pred_ids[a].item(), packed.arc_types[a].item()
            if not edges:
                incoming.append(states[j])
                continue
            if hook:
                hook.index, hook.site = n + a, dropout[2][kind]
            incoming.append(_unpack(_pick(edges, kind)(_pack(states[j], state_tuple),
                                                       _input(x, ids,
                                                              packed.arc_inputs[a].item()))))
        if incoming:
            reduced = reduce_messages(incoming, how)
        elif initial is not None:
            reduced = [w.view(1, -1) for w in initial]
        else:
            like = x if x is not None else torch.zeros(0)
            reduced = [like.new_zeros((1, s)) for s in message]
        kind = packed.node_types[k].item()
        if hook:
            hook.index, hook.site = k, dropout[1][kind]
        out = _pick(nodes, kind)(_input(x, ids, packed.node_inputs[k].item()),
                                 _pack(reduced, message_tuple))
        states.append(_unpack(out))
    return states
