"""nn.MultiheadAttention in a cell, over the few tensors of one node: its query, key and value
are (batch, L, E) stacks with batch_first=True (torch.stack(tensors, 1), x.unsqueeze(1)), else
(L, batch, E) stacks along 0 (torch.stack(tensors), x.unsqueeze(0)). Each query row attends over
the key rows head by head, as F.multi_head_attention_forward computes it: the input
projections (slices of in_proj_weight, or q/k/v_proj_weight), dot products scaled by
1/sqrt(head_dim), a softmax over the keys, the values weighted by it, the heads side by side and
out_proj (the dot products and weighted sums are trace_bmm's per-row products). The result is
a stack of the same layout and, with need_weights, the weights averaged over the heads, (batch,
Lq, Lk). trace_ops merges this table into its own."""
import math

import torch

from .trace_features import slice_of
from .trace_values import Refusal, Stack, apply, bind, describe
from .trace_weights import as_weight

nn = torch.nn


def _rows(p, begin, end):
    """Rows [begin, end) of a weight, as a weight PyTorch slices from it on every call."""
    label, get = p.key
    return as_weight(f"{label}[{begin}:{end}]", lambda: get()[begin:end], p.tensor[begin:end])


def _projections(body, m):
    """(W, b) of the query, key and value projections."""
    e = m.embed_dim
    bias = body.param_of(m, "in_proj_bias")
    if m._qkv_same_embed_dim:
        w = body.param_of(m, "in_proj_weight")
        weights = [_rows(w, i * e, (i + 1) * e) for i in range(3)]
    else:
        weights = [body.param_of(m, f"{n}_proj_weight") for n in "qkv"]
    biases = [None if bias is None else _rows(bias, i * e, (i + 1) * e) for i in range(3)]
    return list(zip(weights, biases))


def _sequence(v, layout, name, e):
    if not isinstance(v, Stack) or v.dim != layout:
        shape = "(batch, L, E) (torch.stack(tensors, 1), x.unsqueeze(1)) with batch_first=True" \
            if layout == 1 else "(L, batch, E) (torch.stack(tensors), x.unsqueeze(0))"
        raise Refusal(f"nn.MultiheadAttention's {name} is {describe(v)}: a cell gives it "
                      f"{shape}", ValueError)
    if v.parts[0].size != e:
        raise Refusal(f"nn.MultiheadAttention's {name} has {v.parts[0].size} features, "
                      f"embed_dim (or kdim / vdim) {e}", ValueError)
    return v.parts


def multihead_attention(body, m, args, kwargs):
    a = bind(args, kwargs, ("query", "key", "value", "key_padding_mask", "need_weights",
                            "attn_mask", "average_attn_weights", "is_causal"),
             {"key_padding_mask": None, "need_weights": True, "attn_mask": None,
              "average_attn_weights": True, "is_causal": False})
    for option in ("key_padding_mask", "attn_mask"):
        if a[option] is not None:
            raise Refusal(f"nn.MultiheadAttention with {option} is not supported: the keys are "
                          "a node's own tensors (select among them with torch.where)")
    if a["is_causal"]:
        raise Refusal("nn.MultiheadAttention with is_causal=True is not supported")
    if m.training and m.dropout > 0:
        raise Refusal("nn.MultiheadAttention's attention dropout is not supported: dropout=0, "
                      "or the module in eval mode")
    if m.bias_k is not None or m.add_zero_attn:
        raise Refusal("nn.MultiheadAttention with add_bias_kv or add_zero_attn is not supported")
    if a["need_weights"] and not a["average_attn_weights"]:
        raise Refusal("nn.MultiheadAttention's weights per head (average_attn_weights=False) "
                      "are 4-D: average them, or need_weights=False")
    layout = 1 if m.batch_first else 0
    e, heads = m.embed_dim, m.num_heads
    d = e // heads
    query = _sequence(a["query"], layout, "query", e)
    key = _sequence(a["key"], layout, "key", m.kdim)
    value = _sequence(a["value"], layout, "value", m.vdim)
    if len(key) != len(value):
        raise Refusal(f"nn.MultiheadAttention of {len(key)} keys and {len(value)} values",
                      ValueError)
    from .trace_bmm import _product
    from .trace_ops import linear_of
    (wq, bq), (wk, bk), (wv, bv) = _projections(body, m)
    qs = [linear_of(body, r, wq, bq, "linear") for r in query]

    def heads_of(rows, w, b):
        """Per head, the rows' projections' slices of that head: (batch, d) each."""
        projected = [linear_of(body, r, w, b, "linear") for r in rows]
        return [[slice_of(body, p, h * d, (h + 1) * d) for p in projected] for h in range(heads)]
    # Per head, the keys as columns (batch, d, Lk) and the values as rows (batch, Lk, d), for the
    # per-row products of trace_bmm: the scores of a query row, then the values weighted by them.
    keys = [Stack(k, 2) for k in heads_of(key, wk, bk)]
    values = [Stack(v, 1) for v in heads_of(value, wv, bv)]
    out_w, out_b = body.param_of(m.out_proj, "weight"), body.param_of(m.out_proj, "bias")
    outputs, weights = [], []
    for q in qs:
        heads_out, mean = [], None
        for h in range(heads):
            q_h = Stack([slice_of(body, q, h * d, (h + 1) * d)], 1)
            scores = _product(body, q_h, keys[h], "attention").parts[0]
            scores = body.emit("scale", scores.size, [scores], alpha=1.0 / math.sqrt(d), beta=0.0)
            w = body.emit("softmax", scores.size, [scores])
            heads_out.append(_product(body, Stack([w], 1), values[h], "attention").parts[0])
            mean = w if mean is None else apply(body, "add", mean, w)
        joined = heads_out[0] if heads == 1 else body.emit("cat", e, heads_out)
        outputs.append(linear_of(body, joined, out_w, out_b, "linear"))
        if heads > 1:
            mean = body.emit("scale", mean.size, [mean], alpha=1.0 / heads, beta=0.0)
        weights.append(mean)
    return Stack(outputs, layout), (Stack(weights, 1) if a["need_weights"] else None)


MODULES = {nn.MultiheadAttention: multihead_attention}

SUPPORTED = ("nn.MultiheadAttention over a node's tensors (query, key, value stacks: "
             "batch_first=True (batch, L, E), else (L, batch, E); no masks, no attention "
             "dropout in training, weights averaged over the heads)")
