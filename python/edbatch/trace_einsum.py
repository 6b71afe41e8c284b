"""torch.einsum in cells, for the contractions a program has: a per-node tensor is (batch,
features), so its subscripts are two, the batch's first, and the batch stays first in the
result. With one or two operands (per-node tensors or weights):
  "bi->bi", "bi->b"                     the tensor, its feature sum;
  "bi,bi->bi", "bi,bi->b"               the product, its feature sum (a dot product per row);
  "bi,i->bi", "bi,i->b"                 with a vector weight;
  "bi,ij->bj", "bi,ji->bj"              products with a weight matrix (x @ W, F.linear(x, W));
in either operand order and with any letters, the output given or implicit. A contraction of
weights alone is a weight expression (trace_weights), computed by PyTorch. With (batch, k, n)
stacks among the operands, or a 3-D result, trace_stack.einsum."""
import torch

from .trace_reduce import sum_of
from .trace_values import Param, Refusal, Rows, Stack, Vec, describe, ops

_FORMS = ('"bi->b", "bi,bi->bi", "bi,bi->b", "bi,i->bi", "bi,i->b", "bi,ij->bj", "bi,ji->bj" '
          '(any letters, either order); of per-node tensors and (batch, k, n) stacks, with at '
          'most two subscripts besides the batch\'s ("bkn,bn->bk", "bk,bkn->bn", "bkn->bnk")')


def einsum(body, args, kwargs):
    if not args or not isinstance(args[0], str):
        raise Refusal("torch.einsum needs its equation first")
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    equation = args[0].replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    specs = lhs.split(",")
    if "." in equation or len(specs) != len(operands) or not 1 <= len(specs) <= 2:
        _refuse(equation, "one or two operands without '...'")
    if not arrow:  # implicit: the subscripts seen once, in alphabetical order
        out = "".join(sorted(c for c in set(lhs) if c != "," and lhs.count(c) == 1))
    if any(isinstance(o, Stack) for o in operands) or len(out) == 3:
        from .trace_stack import einsum as stack_einsum
        return stack_einsum(body, equation, specs, out, operands)
    terms = [_term(equation, s, o) for s, o in zip(specs, operands)]
    terms.sort(key=lambda t: not isinstance(t[1], Vec))  # the per-node tensors first
    spec, x = terms[0]
    if not isinstance(x, Vec):
        _refuse(equation, "a per-node tensor among the operands")
    batch, feature = spec
    if not out.startswith(batch) or len(out) > 2:
        _refuse(equation, f"the batch subscript {batch!r} first in the result, and at most one "
                          f"feature subscript after it")
    if len(terms) == 2:
        x, feature = _contract(body, equation, x, feature, *terms[1])
    if out == batch + feature:
        return x
    if out == batch:
        return Rows(sum_of(body, x))
    _refuse(equation, "a result the operands' subscripts give")


def _term(equation, spec, operand):
    if isinstance(operand, Vec):
        if len(spec) != 2:
            _refuse(equation, "two subscripts for a per-node tensor: (batch, features)")
    elif isinstance(operand, Param):
        dims = operand.tensor.dim()
        if len(spec) != dims:
            raise Refusal(f"torch.einsum {equation!r}: subscripts {spec!r} for a weight of "
                          f"{dims} dims", ValueError)
    else:
        raise Refusal(f"torch.einsum of {describe(operand)} is not supported")
    return spec, operand


def _contract(body, equation, x, feature, spec, y):
    """x (batch, feature) with the second operand: (value, the result's feature subscript)."""
    if isinstance(y, Vec) or len(spec) == 1:  # another per-node tensor, or a vector weight
        if spec[-1] != feature:
            _refuse(equation, "the same feature subscript for the tensor and the other operand "
                              "(an outer product would be 3-D)")
        size = y.size if isinstance(y, Vec) else y.tensor.shape[0]
        if size != x.size:
            raise Refusal(f"torch.einsum {equation!r}: subscript {feature!r} of sizes {x.size} "
                          f"and {size}", ValueError)
        return ops().binary("mul")(body, (x, y), {}), feature
    if feature in spec and spec[0] != spec[1]:  # a weight matrix
        form = "matmul" if spec[0] == feature else "linear"
        return ops().linear_of(body, x, y, None, form), spec[1] if form == "matmul" else spec[0]
    _refuse(equation, "a weight sharing the tensor's feature subscript once")


def _refuse(equation, what):
    raise Refusal(f"torch.einsum {equation!r} is not supported: it needs {what} (supported: "
                  f"{_FORMS})")


FUNCTIONS = {torch.einsum: einsum}

SUPPORTED = f"torch.einsum of the forms {_FORMS}"
