"""Runs a cell program (docs/programs.md) in Python, instruction by instruction and node by node:
a stand-in for the extension's op `edbatch::propagate`, so that the tracer's programs are checked
against the eager reference before (and besides) the op. Sizes are checked on every value."""
import torch
import torch.nn.functional as F

from edbatch.trace import dropout_mask

from reference import reduce_messages


def _linear(v, w, layout):
    return v @ w.t() if layout == "transpose" else v @ w


def _dropout(v, ins, ctx):
    mask = dropout_mask(ctx["seed"], ctx["index"], ctx["site"], ins["size"], ins["p"])
    ctx["site"] += 1
    return v * mask.to(v.dtype) / (1 - ins["p"])


_UNARY = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu, "gelu": F.gelu,
          "softplus": F.softplus, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
          "sin": torch.sin, "cos": torch.cos, "erf": torch.erf,
          "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "asinh": torch.asinh,
          "atanh": torch.atanh, "asin": torch.asin, "acos": torch.acos, "floor": torch.floor,
          "round": torch.round, "stop_gradient": torch.detach, "erfc": torch.erfc,
          "lgamma": torch.lgamma, "digamma": torch.digamma, "erfinv": torch.erfinv,
          "softmax": lambda v: torch.softmax(v, -1),
          "log_softmax": lambda v: torch.log_softmax(v, -1)}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
           "atan2": torch.atan2, "hypot": torch.hypot, "fmod": torch.fmod,
           "remainder": torch.remainder, "copysign": torch.copysign}


def _value(ins, vals, inputs, weights, layouts, ctx):
    op, args = ins["op"], [vals[i] for i in ins.get("args", ())]
    if op in ("input", "ids"):
        return inputs[ins["slot"]]
    if op == "weight":
        return weights[ins["weight"]].view(1, -1)
    if op == "const":
        return torch.full((1, ins["size"]), ins["value"])
    if op == "linear":
        out = _linear(args[0], weights[ins["weight"]], layouts[ins["weight"]])
        return out if ins["bias"] < 0 else out + weights[ins["bias"]]
    if op == "embedding":  # id -1 (no input row): zeros
        table, ids = weights[ins["weight"]], args[0]
        return table[ids.clamp(min=0)] * (ids >= 0).unsqueeze(-1)
    if op in _BINARY:
        return _BINARY[op](args[0], args[1])
    if op == "scale":
        return ins["alpha"] * args[0] - (0.0 - ins["beta"])  # beta 0 keeps a zero's sign
    if op == "rdiv":
        return ins["alpha"] / args[0]
    if op == "leaky_relu":
        return F.leaky_relu(args[0], ins["alpha"])
    if op == "elu":
        return F.elu(args[0], ins["alpha"])
    if op == "abs":
        return torch.abs(args[0])
    if op == "step":
        return (args[0] >= 0 if ins["alpha"] else args[0] > 0).to(args[0].dtype)
    if op == "keep":
        return torch.where(args[1] > 0, args[0], torch.zeros_like(args[0]))
    if op in _UNARY:
        return _UNARY[op](args[0])
    if op == "cat":
        return torch.cat(args, 1)
    if op == "slice":
        return args[0][:, ins["begin"]:ins["end"]]
    if op == "layer_norm":
        w, b = (None if i < 0 else weights[i] for i in (ins["weight"], ins["bias"]))
        return F.layer_norm(args[0], (ins["size"],), w, b, ins["eps"])
    if op == "dropout":
        return _dropout(args[0], ins, ctx)
    if op == "sum_features":
        return args[0].sum(-1, keepdim=True)
    if op == "max_features":
        return args[0].max(-1, keepdim=True).values
    if op == "broadcast":
        return args[0].expand(-1, ins["size"])
    if op in ("max", "min"):  # at a tie the first argument takes the gradient; NaN wins
        pick = (args[0] >= args[1] if op == "max" else args[0] <= args[1]) | args[0].isnan()
        return torch.where(pick, args[0], args[1])
    raise ValueError(f"unknown instruction {op}")


def run_cell(cell, inputs, weights, layouts, ctx):
    vals = []
    for ins in cell["body"]:
        v = _value(ins, vals, inputs, weights, layouts, ctx)
        if ins["op"] != "ids":
            assert v.shape[-1] == ins["size"], (cell["name"], ins, tuple(v.shape))
        vals.append(v)
    return [vals[i] for i in cell["outputs"]]


def _input(x, ids, kind, row):
    if kind == "x":
        return x[row:row + 1] if row >= 0 else x.new_zeros((1, x.shape[1]))
    if kind == "ids":
        return ids[row:row + 1] if row >= 0 else ids.new_full((1,), -1)
    return None


def run_program(program, x, ids, packed, weights, seed, policy, threads):
    """The op's signature (edbatch.propagate.run_program); returns one tensor per component."""
    doc = program.doc
    layouts = [w["layout"] for w in doc["weights"]]
    kind, n, cells = doc["input"]["kind"], packed.num_nodes, doc["cells"]
    states = []
    for k in range(n):
        messages = []
        for a in range(packed.pred_ptr[k].item(), packed.pred_ptr[k + 1].item()):
            j = packed.pred_ids[a].item()
            if not doc["edge_cells"]:
                messages.append(states[j])
                continue
            c = doc["edge_cells"][packed.arc_types[a].item()]
            ctx = {"seed": seed, "index": n + a, "site": program.cell_sites[c]}
            arc_in = _input(x, ids, kind, packed.arc_inputs[a].item())
            slots = states[j] + ([arc_in] if arc_in is not None else [])
            messages.append(run_cell(cells[c], slots, weights, layouts, ctx))
        if messages:
            reduced = reduce_messages(messages, doc["reduce"])
        elif doc["initial"] == "learned":
            reduced = [weights[w].view(1, -1) for w in doc["initial_weights"]]
        else:
            reduced = [torch.zeros(1, s) for s in doc["message"]]
        c = doc["node_cells"][packed.node_types[k].item()]
        ctx = {"seed": seed, "index": k, "site": program.cell_sites[c]}
        node_in = _input(x, ids, kind, packed.node_inputs[k].item())
        slots = [node_in] + reduced  # slot 0 is the input, None for input kind "none"
        states.append(run_cell(cells[c], slots, weights, layouts, ctx))
    return [torch.cat([s[i] for s in states]) if states else torch.zeros(0, size)
            for i, size in enumerate(doc["state"])]
