"""What each supported PyTorch operation becomes in a cell program (docs/programs.md).

Handlers take the cell being built (`Body`) and the traced call's arguments, already mapped to
symbolic values, and return the result's value: a `Vec` (a feature vector of the program), an
`Ids` (the integer input), a `Param` (a weight, possibly transposed), a `Shape`, a tuple of
values, or a plain Python number. They raise `Refusal` for anything docs/programs.md cannot say.
"""
import math
import operator

import torch
import torch.nn.functional as F

from . import trace_lock, trace_reduce, trace_stack, trace_weights
from .trace_features import (cat, chunk, diff, dims, flip, fliplr, getitem,  # noqa: F401
                             index_select, narrow, new_tensor, pad, pieces, roll, size, slice_of,
                             split, tensor_split)
# Refusal and the values are defined beside; trace.py reads them here too.
from .trace_values import (Batch, Ids, Mask, Param, Refusal, Rows, Shape, Stack,  # noqa: F401
                           Vec, bind, broadcast_pair, describe, feature_dim, float32_only,
                           is_number, note_inplace)

nn = torch.nn

SUPPORTED = (
    "nn.Linear, F.linear, x @ W, torch.matmul, torch.addmm (W an nn.Parameter, or W.t()); "
    "+ - * / with tensors, weight vectors and Python numbers (also torch.subtract, multiply, "
    "divide, true_divide, rsub), unary minus; "
    "sigmoid, tanh, relu, gelu, softplus, exp, log, sqrt, sin, cos, "
    "erf, atan, sinh, cosh, asinh, atanh, asin, acos (and the arc- names), erfc, lgamma / "
    "special.gammaln, digamma / special.psi, erfinv "
    "(torch., F., method and module forms); x ** e (e an integer from -16 to 16, 0.5, -0.5) and "
    "a ** x (a > 0), square, rsqrt, reciprocal, silu, logsigmoid, leaky_relu, elu, abs; "
    "torch.cat, chunk, split, tensor_split, narrow, slicing (x[:, a:b], x[:, a:b:k]), feature "
    "indices known when traced (x[:, [2, 0, 1]], index_select), flip / fliplr, roll "
    "and diff along the last dim; nn.Embedding and F.one_hot (num_classes given) "
    "of the integer input; nn.LayerNorm / F.layer_norm over the last dim; nn.Dropout / "
    "F.dropout; softmax / log_softmax over the last dim; zeros_like / ones_like / full_like; "
    "x.detach(); tuple returns and unpacking")


# ---- elementwise ----

_SCALAR_RIGHT = {"add": lambda s: (1.0, s), "sub": lambda s: (1.0, -s),
                 "mul": lambda s: (s, 0.0), "div": lambda s: (_reciprocal(s), 0.0)}
_SCALAR_LEFT = {"add": lambda s: (1.0, s), "sub": lambda s: (-1.0, s), "mul": lambda s: (s, 0.0)}


def _reciprocal(s):
    """1 / s, infinite for a zero as PyTorch's division by it (x / 0.0 = inf * x)."""
    return 1.0 / s if s != 0 else math.copysign(math.inf, s)


_PYTHON = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "div": operator.truediv}


def binary(name):
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "other"), {"alpha": 1})
        x, y = a["input"], a["other"]
        if isinstance(x, Mask) and isinstance(y, Mask) and name != "mul":
            raise Refusal(f"{name} of two comparisons (PyTorch's bool tensors) is not "
                          f"supported: combine them with & and |, or .float() one first")
        if a["alpha"] != 1:  # x + alpha * y, x - alpha * y
            if name not in ("add", "sub") or not is_number(a["alpha"]):
                raise Refusal(f"{name} with alpha={a['alpha']!r} is not supported")
            y = binary("mul")(body, (y, a["alpha"]), {})
        if is_number(x) and is_number(y):
            return _PYTHON[name](x, y)
        if isinstance(x, Stack) or isinstance(y, Stack):
            return trace_stack.binary(body, name, x, y)
        if is_number(y):
            alpha, beta = _SCALAR_RIGHT[name](float(y))
            return body.emit("scale", body.vector(x).size, [body.vector(x)], alpha=alpha,
                             beta=beta)
        if is_number(x):
            v = body.vector(y)
            if name == "div":
                return body.emit("rdiv", v.size, [v], alpha=float(x))
            alpha, beta = _SCALAR_LEFT[name](float(x))
            return body.emit("scale", v.size, [v], alpha=alpha, beta=beta)
        x, y = broadcast_pair(body, body.vector(x), body.vector(y), f"{name} of tensors")
        return body.emit(name, x.size, [x, y])
    return handle


def rsub(body, args, kwargs):
    """torch.rsub(input, other, alpha=1): other - alpha * input."""
    a = bind(args, kwargs, ("input", "other", "alpha"), {"alpha": 1})
    return binary("sub")(body, (a["other"], a["input"]), {"alpha": a["alpha"]})


def negate(body, args, kwargs):
    v = body.vector(args[0])
    return body.emit("scale", v.size, [v], alpha=-1.0, beta=0.0)


def identity(body, args, kwargs):
    return args[0]


def clone(body, args, kwargs):
    """x.clone(): x's value as an object of its own, which an in-place change may rebind alone
    (trace_inplace.py) while x keeps its value."""
    v = args[0]
    if isinstance(v, Vec):
        return type(v)(v.index, v.size)
    if isinstance(v, Rows):
        return Rows(clone(body, (v.vec,), {}))
    if isinstance(v, Stack):
        return Stack([clone(body, (p,), {}) for p in v.parts], v.dim)
    return v


def unary(name, check=None):
    def handle(body, args, kwargs):
        if check is not None:
            check(args[1:], kwargs)
        v = body.vector(args[0])
        return body.emit(name, v.size, [v])
    return handle


def detach(body, args, kwargs):
    """x.detach(): its value, through which no gradient passes (`stop_gradient`). A comparison
    has none to stop; a (batch,) value stays one."""
    v = args[0]
    if isinstance(v, Mask):
        return v
    if isinstance(v, Rows):
        return Rows(detach(body, (v.vec,), kwargs))
    x = body.vector(v)  # a weight's detach() is PyTorch's, on every call (trace_weights)
    return body.emit("stop_gradient", x.size, [x])


def _note_inplace(args, kwargs):
    note_inplace(kwargs.get("inplace") or (args and args[0] is True))


def like(value):
    def handle(body, args, kwargs):
        a = bind(args, kwargs, ("input", "fill_value"),
                 {"fill_value": value, "dtype": None, "device": None, "requires_grad": False,
                  "memory_format": None, "layout": None, "pin_memory": None})
        v = body.vector(a["input"])
        return body.emit("const", v.size, [], value=float(a["fill_value"]))
    return handle


def softmax_arguments(args, kwargs):
    """The arguments of a softmax, log_softmax or softmin: the third positional one is
    torch.softmax's and Tensor.softmax's dtype, and F.softmax's _stacklevel (then dtype)."""
    names = ("input", "dim", "dtype") if len(args) > 2 and isinstance(args[2], torch.dtype) \
        else ("input", "dim", "_stacklevel", "dtype")
    return bind(args, kwargs, names, {"dim": None, "_stacklevel": 3, "dtype": None})


def softmax(name):
    def handle(body, args, kwargs):
        a = softmax_arguments(args, kwargs)
        float32_only(a["dtype"], name)
        if isinstance(a["input"], Stack):
            if a["dim"] is None:
                raise Refusal(f"{name} of a (batch, k, n) stack needs a dim (1 or -1)",
                              ValueError)
            return trace_stack.softmax(body, name, a["input"], a["dim"])
        if a["dim"] is not None:  # None: PyTorch's implicit dim, 1 for (batch, features)
            feature_dim(a["dim"], name)
        v = body.vector(a["input"])
        return body.emit(name, v.size, [v])
    return handle


# ---- products ----

def linear_of(body, x, weight, bias, form):
    """x W^T + b (form "linear": weight is torch (out, in)) or x W + b (form "matmul"); of a
    (batch, k, n) stack, of each row."""
    if isinstance(x, Stack):
        rows, dim = trace_stack.feature_rows(body, x)
        return Stack([linear_of(body, r, weight, bias, form) for r in rows], dim)
    if not isinstance(x, Vec):
        raise Refusal(f"a product needs a tensor on the left, got {describe(x)}")
    if not isinstance(weight, Param) or weight.tensor.dim() != 2:
        raise Refusal("products are supported with a weight matrix (an nn.Parameter of the cell, "
                      f"or its .t()) on the right, got {describe(weight)}")
    rows, cols = weight.tensor.shape
    as_is = (form == "matmul") != weight.transposed
    layout = "as_is" if as_is else "transpose"
    size_in, size_out = (rows, cols) if as_is else (cols, rows)
    if x.size != size_in:
        raise Refusal(f"a product of a size-{x.size} tensor with a weight expecting {size_in} "
                      f"inputs", ValueError)
    b = -1
    if bias is not None:
        if not isinstance(bias, Param) or bias.tensor.dim() != 1:
            out = body.emit("linear", size_out, [x], weight=body.weight(weight, layout), bias=-1)
            return binary("add")(body, (out, bias), {})
        if bias.tensor.shape[0] != size_out:
            raise Refusal(f"a bias of size {bias.tensor.shape[0]} for {size_out} outputs",
                          ValueError)
        b = body.weight(bias, "vector")
    return body.emit("linear", size_out, [x], weight=body.weight(weight, layout), bias=b)


def f_linear(body, args, kwargs):
    a = bind(args, kwargs, ("input", "weight", "bias"), {"bias": None})
    return linear_of(body, a["input"], a["weight"], a["bias"], "linear")


def matmul(body, args, kwargs):
    a = bind(args, kwargs, ("input", "other"), {})
    return linear_of(body, a["input"], a["other"], None, "matmul")


def addmm(body, args, kwargs):
    a = bind(args, kwargs, ("input", "mat1", "mat2"), {"beta": 1, "alpha": 1})
    if a["beta"] != 1 or a["alpha"] != 1:
        raise Refusal("addmm with alpha or beta other than 1 is not supported")
    return linear_of(body, a["mat1"], a["mat2"], a["input"], "matmul")


def transpose_weight(body, args, kwargs):
    w = args[0]
    if isinstance(w, Param) and w.tensor.dim() == 2:
        return Param(w.key, w.tensor, not w.transposed)
    raise Refusal(f"transposing {describe(w)} is not supported (only a weight matrix's .t())",
                  ValueError if isinstance(w, Vec) else TypeError)


def embedding_of(body, ids, weight, options):
    if not isinstance(ids, Ids):
        raise Refusal(f"an embedding reads the integer input (input kind 'ids'), got "
                      f"{describe(ids)}")
    for name in ("max_norm", "scale_grad_by_freq", "sparse"):
        value = options.get(name)
        if value is not None and value is not False:
            raise Refusal(f"an embedding with {name}={value!r} is not supported")
    if options.get("padding_idx") is not None:
        weight = trace_weights.padding_table(weight, options["padding_idx"])
    return body.emit("embedding", weight.tensor.shape[1], [ids], weight=body.weight(weight,
                                                                                    "lookup"))


def f_embedding(body, args, kwargs):
    a = bind(args, kwargs, ("input", "weight", "padding_idx", "max_norm", "norm_type",
                            "scale_grad_by_freq", "sparse"), {})
    return embedding_of(body, a["input"], a["weight"], a)


def get_attribute(body, args, kwargs):
    v, name = args
    if name == "T":
        return transpose_weight(body, (v,), {})
    if name == "mT" and isinstance(v, Stack):
        return trace_stack.transposed(v)
    if name == "shape":
        return size(body, (v,), {})
    if name == "ndim":
        return dims(body, (v,), {})
    if name == "dtype" and isinstance(v, Vec):  # for x.to(y.dtype), mask.type(...)
        return torch.bool if isinstance(v, Mask) else torch.float32
    if name == "device" and isinstance(v, Vec):  # for device=x.device, x.to(y.device)
        return "device"
    if isinstance(v, tuple) and name in getattr(v, "_fields", ()):  # (values, indices) of max
        return getattr(v, name)
    raise Refusal(f"the attribute .{name} is not supported")


# ---- layer norm, dropout ----

def layer_norm_of(body, x, shape, weight, bias, eps):
    v = body.vector(x)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if shape != (v.size,):
        raise Refusal(f"layer_norm over shape {shape} of a size-{v.size} tensor: only the last "
                      f"dim is supported", ValueError)
    refs = []
    for p in (weight, bias):
        if p is not None and not (isinstance(p, Param) and p.tensor.dim() == 1):
            raise Refusal("layer_norm's weight and bias must be vector weights (nn.Parameter)")
        refs.append(-1 if p is None else body.weight(p, "vector"))
    return body.emit("layer_norm", v.size, [v], eps=float(eps), weight=refs[0], bias=refs[1])


def f_layer_norm(body, args, kwargs):
    a = bind(args, kwargs, ("input", "normalized_shape", "weight", "bias", "eps"),
             {"weight": None, "bias": None, "eps": 1e-5})
    return layer_norm_of(body, a["input"], a["normalized_shape"], a["weight"], a["bias"],
                         a["eps"])


def dropout_of(body, x, p, training, inplace):
    note_inplace(inplace)
    if not 0 <= p < 1:
        raise Refusal(f"dropout with p={p} is not supported (0 <= p < 1)", ValueError)
    v = body.vector(x)
    if not training or p == 0:
        return v
    return body.emit("dropout", v.size, [v], p=float(p))


def f_dropout(body, args, kwargs):
    a = bind(args, kwargs, ("input", "p", "training", "inplace"),
             {"p": 0.5, "training": True, "inplace": False})
    return dropout_of(body, a["input"], a["p"], a["training"], a["inplace"])


# ---- compositions: operations written with the ops above ----

_EXPONENTS = "integers from -16 to 16, 0.5, -0.5"


def power_of(body, v, e):
    """v ** e for the exponents that program ops express exactly: integers by repeated squaring
    (x ** 0 is 1, its gradient 0, as PyTorch's), and square roots."""
    def mul(a, b):
        return body.emit("mul", v.size, [a, b])

    def rdiv(a):
        return body.emit("rdiv", v.size, [a], alpha=1.0)

    if e == 0.5:
        return body.emit("sqrt", v.size, [v])
    if e == -0.5:
        return rdiv(body.emit("sqrt", v.size, [v]))
    if e != int(e) or abs(e) > 16:
        raise Refusal(f"x ** {e:g} is not supported (exponents {_EXPONENTS}; a ** x with a "
                      f"number a > 0)")
    n = abs(int(e))
    if n == 0:
        return body.emit("const", v.size, [], value=1.0)
    # x ** -n as (1 / x) ** n: the reciprocal of x ** n would have a gradient through x ** -2n,
    # which overflows float32 where PyTorch's -n x ** -(n + 1) is finite (x ** -3 at 2e-7).
    result, square = None, rdiv(v) if e < 0 else v
    while n:
        if n & 1:
            result = square if result is None else mul(result, square)
        n >>= 1
        if n:
            square = mul(square, square)
    return result


def power(body, args, kwargs):
    a = bind(args, kwargs, ("input", "exponent"), {})
    x, e = a["input"], a["exponent"]
    if is_number(x) and is_number(e):
        return x ** e
    if is_number(e):
        return power_of(body, body.vector(x), float(e))
    if is_number(x):  # a ** v = exp(v ln a)
        if x <= 0:
            raise Refusal(f"{x} ** x is not supported (a number raised to a tensor must be > 0)")
        v = body.vector(e)
        return body.emit("exp", v.size,
                         [body.emit("scale", v.size, [v], alpha=math.log(x), beta=0.0)])
    raise Refusal("x ** y with a tensor exponent is not supported (exponents "
                  f"{_EXPONENTS}, or a number a > 0 raised to a tensor)")


def fixed_power(e):
    def handle(body, args, kwargs):
        return power_of(body, body.vector(args[0]), e)
    return handle


def silu_of(body, x):
    v = body.vector(x)
    return body.emit("mul", v.size, [v, body.emit("sigmoid", v.size, [v])])


def silu(body, args, kwargs):
    _note_inplace(args[1:], kwargs)
    return silu_of(body, args[0])


def logsigmoid(body, args, kwargs):  # log sigmoid(x) = -softplus(-x)
    v = body.vector(args[0])
    minus = body.emit("scale", v.size, [v], alpha=-1.0, beta=0.0)
    return body.emit("scale", v.size, [body.emit("softplus", v.size, [minus])], alpha=-1.0,
                     beta=0.0)


def leaky_relu(body, args, kwargs):
    a = bind(args, kwargs, ("input", "negative_slope", "inplace"),
             {"negative_slope": 0.01, "inplace": False})
    note_inplace(a["inplace"])
    v = body.vector(a["input"])
    return body.emit("leaky_relu", v.size, [v], alpha=float(a["negative_slope"]))


def elu(body, args, kwargs):
    a = bind(args, kwargs, ("input", "alpha", "inplace"), {"alpha": 1.0, "inplace": False})
    note_inplace(a["inplace"])
    v = body.vector(a["input"])
    return body.emit("elu", v.size, [v], alpha=float(a["alpha"]))


# ---- the tables ----

_ACTIVATIONS = {"sigmoid": (torch.sigmoid, F.sigmoid, torch.special.expit),
                "tanh": (torch.tanh, F.tanh),
                "relu": (torch.relu, F.relu), "exp": (torch.exp,), "log": (torch.log,),
                "sqrt": (torch.sqrt,), "sin": (torch.sin,), "cos": (torch.cos,),
                "erf": (torch.erf, torch.special.erf), "atan": (torch.atan, torch.arctan),
                "sinh": (torch.sinh,), "cosh": (torch.cosh,),
                "asinh": (torch.asinh, torch.arcsinh),
                "atanh": (torch.atanh, torch.arctanh), "asin": (torch.asin, torch.arcsin),
                "acos": (torch.acos, torch.arccos),
                "erfc": (torch.erfc, torch.special.erfc),
                "lgamma": (torch.lgamma, torch.special.gammaln),
                "digamma": (torch.digamma, torch.special.digamma, torch.special.psi),
                "erfinv": (torch.erfinv, torch.special.erfinv)}

FUNCTIONS = {
    operator.add: binary("add"), operator.sub: binary("sub"), operator.mul: binary("mul"),
    operator.truediv: binary("div"), operator.neg: negate, operator.pos: identity,
    torch.clone: clone,
    torch.add: binary("add"), torch.sub: binary("sub"), torch.mul: binary("mul"),
    torch.div: binary("div"), torch.neg: negate, torch.detach: detach,
    torch.subtract: binary("sub"), torch.multiply: binary("mul"), torch.rsub: rsub,
    operator.matmul: matmul, torch.matmul: matmul, torch.mm: matmul, F.linear: f_linear,
    torch.addmm: addmm, torch.t: transpose_weight,
    torch.cat: cat, torch.chunk: chunk, torch.split: split, torch.narrow: narrow,
    torch.flip: flip, torch.fliplr: fliplr, torch.roll: roll, torch.diff: diff, F.pad: pad,
    torch.index_select: index_select, torch.tensor_split: tensor_split,
    torch.zeros: new_tensor(0.0), torch.ones: new_tensor(1.0), torch.full: new_tensor(None),
    operator.getitem: getitem, getattr: get_attribute,
    F.embedding: f_embedding, F.layer_norm: f_layer_norm, F.dropout: f_dropout,
    torch.softmax: softmax("softmax"), F.softmax: softmax("softmax"),
    torch.log_softmax: softmax("log_softmax"), F.log_softmax: softmax("log_softmax"),
    torch.zeros_like: like(0.0), torch.ones_like: like(1.0), torch.full_like: like(None),
    operator.pow: power, torch.pow: power, torch.square: fixed_power(2),
    torch.rsqrt: fixed_power(-0.5), torch.reciprocal: fixed_power(-1), F.silu: silu,
    F.logsigmoid: logsigmoid, F.leaky_relu: leaky_relu, F.elu: elu, torch.abs: unary("abs"),
}
for _name, _fns in _ACTIVATIONS.items():
    for _fn in _fns:
        FUNCTIONS[_fn] = unary(_name, _note_inplace if _fn is F.relu else None)

METHODS = {
    "add": binary("add"), "sub": binary("sub"), "mul": binary("mul"), "div": binary("div"),
    "subtract": binary("sub"), "multiply": binary("mul"),
    "neg": negate, "matmul": matmul, "mm": matmul, "t": transpose_weight,
    "chunk": chunk, "split": split, "narrow": narrow, "flip": flip, "fliplr": fliplr,
    "index_select": index_select, "tensor_split": tensor_split,
    "roll": roll, "diff": diff, "new_zeros": new_tensor(0.0), "new_ones": new_tensor(1.0),
    "new_full": new_tensor(None),
    "size": size, "dim": dims, "ndimension": dims,
    "softmax": softmax("softmax"), "log_softmax": softmax("log_softmax"),
    "contiguous": identity, "clone": clone, "detach": detach,
    "pow": power, "square": fixed_power(2), "rsqrt": fixed_power(-0.5),
    "reciprocal": fixed_power(-1), "abs": unary("abs"),
    **{name: unary(name) for name in _ACTIVATIONS},
    **{f"arc{name[1:]}": unary(name) for name in ("atan", "asinh", "atanh", "asin", "acos")},
}


def _module_activation(name, check=None):
    def handle(body, module, args, kwargs):
        if check is not None:
            check(module)
        return unary(name)(body, args, kwargs)
    return handle


def _check_module_inplace(module):
    note_inplace(getattr(module, "inplace", False))


def _module_linear(body, m, args, kwargs):
    return linear_of(body, args[0], body.param_of(m, "weight"), body.param_of(m, "bias"),
                     "linear")


def _module_embedding(body, m, args, kwargs):
    options = {"padding_idx": m.padding_idx, "max_norm": m.max_norm,
               "scale_grad_by_freq": m.scale_grad_by_freq, "sparse": m.sparse}
    return embedding_of(body, args[0], body.param_of(m, "weight"), options)


def _module_layer_norm(body, m, args, kwargs):
    return layer_norm_of(body, args[0], m.normalized_shape, body.param_of(m, "weight"),
                         body.param_of(m, "bias"), m.eps)


def _module_dropout(body, m, args, kwargs):
    return dropout_of(body, args[0], m.p, m.training, m.inplace)


def _module_silu(body, m, args, kwargs):
    _check_module_inplace(m)
    return silu_of(body, args[0])


def _module_softmax(name):
    def handle(body, m, args, kwargs):
        return softmax(name)(body, (args[0], m.dim), {})
    return handle


MODULES = {
    nn.Linear: _module_linear, nn.Embedding: _module_embedding,
    nn.LayerNorm: _module_layer_norm, nn.Dropout: _module_dropout,
    nn.Sigmoid: _module_activation("sigmoid"), nn.Tanh: _module_activation("tanh"),
    nn.ReLU: _module_activation("relu", _check_module_inplace),
    nn.Softmax: _module_softmax("softmax"), nn.LogSoftmax: _module_softmax("log_softmax"),
    nn.Identity: lambda body, m, args, kwargs: args[0],
    nn.SiLU: _module_silu,
    nn.LeakyReLU: lambda body, m, args, kwargs: leaky_relu(body, (args[0], m.negative_slope,
                                                                   m.inplace), {}),
    nn.ELU: lambda body, m, args, kwargs: elu(body, (args[0], m.alpha, m.inplace), {}),
    nn.LogSigmoid: lambda body, m, args, kwargs: logsigmoid(body, args, kwargs),
    nn.ConstantPad1d: lambda body, m, args, kwargs: pad(
        body, (args[0], tuple(m.padding), "constant", m.value), {}),
}
if hasattr(nn, "ZeroPad1d"):  # torch 2.1 and later
    MODULES[nn.ZeroPad1d] = MODULES[nn.ConstantPad1d]

# Feature reductions, maxima, minima and clamps (trace_reduce.py); activations written with them
# (trace_activations.py); other compositions (trace_compose.py, which reads binary and softmax
# above); per-row products through size-1 dims (trace_bmm.py, which reads matmul and binary);
# comparisons and torch.where (trace_select.py, which reads binary); recurrent cells
# (trace_rnn.py, which reads linear_of and pieces above); einsum (trace_einsum.py, which reads
# binary and linear_of); scans along the features (trace_scan.py); nn.MultiheadAttention over
# stacks (trace_attention.py, which reads binary and linear_of); sorting along the features
# (trace_sort.py); special functions and float modulo (trace_special.py); zero_, fill_ and copy_
# (trace_inplace.py, which the tracer's in-place calls reach).
from . import (trace_activations, trace_attention, trace_bmm, trace_compose,  # noqa: E402
               trace_einsum, trace_inplace, trace_rnn, trace_rows, trace_scan, trace_select,
               trace_sort, trace_special)

FUNCTIONS.update(trace_reduce.FUNCTIONS)
METHODS.update(trace_reduce.METHODS)
MODULES.update(trace_reduce.MODULES)
FUNCTIONS.update(trace_bmm.FUNCTIONS)  # per-row products: over trace_reduce's and matmul above
METHODS.update(trace_bmm.METHODS)
MODULES.update(trace_rnn.MODULES)
MODULES.update(trace_bmm.MODULES)
FUNCTIONS.update(trace_activations.FUNCTIONS)
METHODS.update(trace_activations.METHODS)
MODULES.update(trace_activations.MODULES)
FUNCTIONS.update(trace_compose.FUNCTIONS)
METHODS.update(trace_compose.METHODS)
MODULES.update(trace_compose.MODULES)
FUNCTIONS.update(trace_select.FUNCTIONS)
METHODS.update(trace_select.METHODS)
FUNCTIONS.update(trace_einsum.FUNCTIONS)
FUNCTIONS.update(trace_scan.FUNCTIONS)
METHODS.update(trace_scan.METHODS)
MODULES.update(trace_attention.MODULES)
FUNCTIONS.update(trace_sort.FUNCTIONS)
METHODS.update(trace_sort.METHODS)
FUNCTIONS.update(trace_special.FUNCTIONS)
METHODS.update(trace_special.METHODS)
FUNCTIONS.update(trace_inplace.FUNCTIONS)
METHODS.update(trace_inplace.METHODS)
SUPPORTED += "; ".join(["", trace_reduce.SUPPORTED, trace_bmm.SUPPORTED,
                        trace_activations.SUPPORTED, trace_compose.SUPPORTED,
                        trace_select.SUPPORTED, trace_rnn.SUPPORTED, trace_einsum.SUPPORTED,
                        trace_scan.SUPPORTED, trace_attention.SUPPORTED, trace_sort.SUPPORTED,
                        trace_special.SUPPORTED, trace_inplace.SUPPORTED])

# Factories of constants called with a size the trace knows (torch.arange(x.size(-1))).
for _name in trace_lock.CONSTANT_FACTORIES:
    FUNCTIONS[getattr(torch, _name)] = trace_weights.constant_factory(getattr(torch, _name), _name)
METHODS["new_tensor"] = trace_weights.new_tensor
FUNCTIONS[F.one_hot] = trace_weights.one_hot

# Elementwise functions of one tensor also take a stack, tensor by tensor (trace_stack.py).
_ELEMENTWISE = [fn for fns in _ACTIVATIONS.values() for fn in fns] + [
    F.softplus, torch.abs, operator.neg, torch.neg, torch.square, torch.rsqrt, torch.reciprocal,
    F.silu, F.logsigmoid, F.leaky_relu, F.elu, operator.pow, torch.pow, F.gelu, F.relu,
    torch.detach]
for _fn in _ELEMENTWISE:
    FUNCTIONS[_fn] = trace_stack.each_part(FUNCTIONS[_fn])
for _name in [*_ACTIVATIONS, "neg", "abs", "square", "rsqrt", "reciprocal", "pow", "gelu",
              "detach"]:
    METHODS[_name] = trace_stack.each_part(METHODS[_name])
for _module in (nn.Sigmoid, nn.Tanh, nn.ReLU, nn.Softplus, nn.SiLU, nn.LeakyReLU, nn.ELU,
                nn.LogSigmoid, nn.GELU):
    MODULES[_module] = trace_stack.each_part_of_module(MODULES[_module])
# Transposes of stacks.
FUNCTIONS[torch.transpose] = trace_stack.transpose
FUNCTIONS[torch.swapaxes] = trace_stack.transpose
FUNCTIONS[torch.permute] = trace_stack.permute
FUNCTIONS[torch.movedim] = FUNCTIONS[torch.moveaxis] = trace_stack.movedim
METHODS.update(transpose=trace_stack.transpose, swapaxes=trace_stack.transpose,
               permute=trace_stack.permute, movedim=trace_stack.movedim,
               moveaxis=trace_stack.movedim)
# Functions along the last dim take a stack row by row.
FUNCTIONS[F.layer_norm] = trace_stack.each_row(FUNCTIONS[F.layer_norm])
FUNCTIONS[F.normalize] = trace_stack.each_row(FUNCTIONS[F.normalize], ("dim", 2, 1))
MODULES[nn.LayerNorm] = trace_stack.each_row_of_module(MODULES[nn.LayerNorm])
# Elementwise operations of (batch,) values with one another and with numbers.
trace_rows.install(FUNCTIONS, METHODS, MODULES)
