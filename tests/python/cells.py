"""User cells for the tests: one node cell per supported operation (each form: function, method,
module), LSTM-like tuple cells, edge cells. Values stay bounded over deep structures."""
import math

import torch
import torch.nn.functional as F
from torch import nn


def _rms_norm(size):
    module = nn.RMSNorm(size, eps=1e-4)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    return module


def _small(module, scale=0.3):
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(scale)
    return module


def _stack_attention(c, a, m):
    """Attention over a stack written with broadcasting, as PyTorch users write it."""
    s = torch.stack([a, m, torch.tanh(a * m)], 1)  # (batch, 3, n)
    w = torch.softmax((m.unsqueeze(1) * s).sum(-1) / math.sqrt(a.size(-1)), -1)
    pooled = (w.unsqueeze(-1) * s).sum(1)
    w2 = torch.softmax(s @ a.unsqueeze(-1), dim=1)  # (batch, 3, 1)
    alt = (w2 * torch.sigmoid(s)).sum(dim=1) + torch.log_softmax(s, dim=1).mean(1)
    norms = F.layer_norm(s, (a.size(-1),)).amax(1) + F.normalize(s, dim=-1).sum(1)
    picked = (s[:, :, 1:3].sum(1).sum(-1, keepdim=True) + s[:, 1] + s[..., 0].sum(-1, keepdim=True)
              + s[:, :, ::2].mean(-1).sum(-1, keepdim=True) + s[:, 0:2].max(1).values)
    return (pooled + alt + norms + picked + (s * c.b2).max(dim=-1, keepdim=True).values.sum(1)
            + (2.0 - s).pow(2).mean(1) * 0.1 + (s / (1.5 + s.abs())).sum(dim=1))


def _stack_einsum(c, a, m):
    """einsum, transposes and products with a weight of stacks."""
    s = torch.stack([a, m, torch.tanh(a - m)], 1)  # (batch, 3, n)
    w = torch.softmax(torch.einsum("bkn,bn->bk", s, m), -1)
    t = s.transpose(1, 2)  # (batch, n, 3)
    outer = torch.einsum("bi,bj->bij", a, torch.sigmoid(m))  # (batch, n, n)
    return (torch.einsum("bk,bkn->bn", w, s) + (t * w.unsqueeze(1)).sum(-1)
            + s.permute(0, 2, 1).amax(2) + s.mT.mean(-1) + torch.transpose(s, -1, -2)[:, :, 1]
            + outer.sum(1) * 0.1 + torch.einsum("bkn->bnk", s).sum(2)
            + torch.einsum("bkn,bkn->b", s, s).unsqueeze(-1) * 0.01
            + (s.swapaxes(1, 2) @ c.W[:3]).sum(1) * 0.1 + torch.einsum("xz,xzy->xy", w, s))


def _sequence_first(c, a, m):
    """Attention over torch.stack(tensors) (dim 0: (k, batch, n)), its scores (k, batch)."""
    hs = torch.stack([a, m, torch.tanh(a * m)])
    scores = (hs * m).sum(-1) / math.sqrt(a.size(-1))  # (3, batch)
    w = torch.softmax(scores, 0)
    return ((w.unsqueeze(-1) * hs).sum(0) + (torch.log_softmax(scores * 2 + 1, dim=0).exp()
                                              .unsqueeze(2) * torch.sigmoid(hs)).sum(0)
            + (hs * c.b2 - 1).amax(0) + hs.mean(-1, keepdim=True).sum(0) + scores[1][:, None]
            + torch.softmax(hs, -1)[2] + F.layer_norm(c.U(hs), (a.size(-1),)).sum(0))


def _in_place(c, a, m):
    """In-place operators, methods, functions, inplace=True and assignment on values the cell
    computes: another name of a value sees its changes, a value computed from it before does
    not."""
    h = c.two(a)  # (batch, 2n), a value of its own
    alias = h
    before = torch.tanh(h)  # computed before the changes: the old h
    h += torch.cat([m, m], -1)
    h -= 0.25
    h.mul_(0.5).add_(before, alpha=0.3)
    h /= 1.5
    g = c.back(alias)  # the changed h (saved by the linear map: no change after it)
    g.sub_(m)
    c.act(g)  # nn.LeakyReLU(inplace=True) changes g
    s = torch.stack([a, m], 1)
    s *= 0.5
    r = a.sum(-1, keepdim=True)
    r.mul_(0.1)
    k = a * 0.5 + 0.1  # assignment along the features
    k[:, 1:3] = m[:, :2]
    k[:, 0] = m[:, 2]
    k[k > 0.5] = 0.5
    k[..., [4, 0]] = r
    k[:, 5:] = -0.25
    e = torch.empty(a.size(0), 2 * a.size(1))  # filled in place before it is read
    e[:, :a.size(1)] = a
    e[:, a.size(1):] = m
    f = torch.empty_like(m).fill_(0.5) + a.new_empty(a.shape).copy_(m)
    q = a * 2.0  # views along the features changed in place: q changes there too
    q[:, :3].mul_(0.5)
    q[:, 4].add_(1.0)
    q[:, ::3].sub_(0.1)
    picked = q[:, [1, 2]]  # a copy, not a view
    picked.mul_(3.0)
    q.narrow(1, 5, 2).relu_()
    own = torch.clone(a)  # its own copy: a, read below, stays as it is
    own[:, 0] = 1.0
    own.mul_(0.5)
    return (g + torch.sigmoid_(m * 2.0) + F.relu(a - 0.1, inplace=True) + s.sum(1)
            + before[:, :a.size(-1)] + alias[:, 1:a.size(-1) + 1] + r
            + (a * 0.5).tanh_() + F.dropout(a + 1, 0.0, True, True) + (a * 2.0).fill_(0.25)
            + (a - 1.0).copy_(m) + (a * 1.5).zero_() + (a + 2.0).copy_(r) + k + own + q
            + picked.sum(-1, keepdim=True) + c.back(e) + f)


def _attention_module(c, a, m):
    """nn.MultiheadAttention of a node's query over three of its tensors, batch first, and over
    keys and values of other sizes in the (L, batch, E) layout."""
    s = torch.stack([a, m, torch.tanh(a * m)], 1)
    out, w = c.mha(a.unsqueeze(1), s, s)
    keys = torch.stack([a[:, :3], m[:, 2:5]])
    values = torch.stack([m[:, :5], torch.sigmoid(a[:, 1:6])])
    other = c.mha_kv(m.unsqueeze(0), keys, values, need_weights=False)[0]
    return (out.squeeze(1) + w.squeeze(1).sum(-1, keepdim=True) + other.squeeze(0)
            + c.mha(s, s, s)[0].mean(1))


class OpCell(nn.Module):
    """Node cell: a = lin(x) + U(m), then the operation `op` (OPS) on a, m and x."""

    def __init__(self, op, size, input_size, vocab=0):
        super().__init__()
        S, D = size, input_size
        self.op = op
        self.lin = nn.Linear(D, S) if D else None
        self.emb = nn.Embedding(vocab, S) if vocab else None
        self.U = _small(nn.Linear(S, S))
        self.W = nn.Parameter(0.3 * torch.randn(S, S))
        self.Wx = nn.Parameter(0.3 * torch.randn(max(D, 1), S))
        self.b = nn.Parameter(0.3 * torch.randn(S))
        self.b2 = nn.Parameter(1 + 0.1 * torch.randn(S))
        self.two = _small(nn.Linear(S, 2 * S), 1.0)
        self.back = _small(nn.Linear(2 * S, S), 1.0)
        self.gate = nn.Linear(S, 1)
        self.s = nn.Parameter(torch.tensor([0.7]))
        self.gru = nn.GRUCell(S, S)
        self.lstm = nn.LSTMCell(S, S, bias=False)
        self.rnn = nn.RNNCell(S, S, nonlinearity="relu")
        self.ln = nn.LayerNorm(S)
        self.ln_plain = nn.LayerNorm(S, elementwise_affine=False)
        self.flat = nn.Flatten()
        self.cpad = nn.ConstantPad1d((1, 0), 0.3)
        self.zpad = getattr(nn, "ZeroPad1d", lambda p: nn.ConstantPad1d(p, 0.0))((-1, 2))
        self.mha = nn.MultiheadAttention(S, 1, batch_first=True)
        self.mha_kv = nn.MultiheadAttention(S, 1, kdim=3, vdim=5)  # (L, batch, E) layout
        self.t = nn.Parameter(torch.tensor(1.3))  # 0-d: a learned temperature
        self.softplus = nn.Softplus(beta=3, threshold=1)
        self.rrelu = nn.RReLU(0.05, 0.4).eval()
        self.unflatten = nn.Unflatten(1, (S, 2))
        self.alpha_dropout = nn.AlphaDropout(0.4).eval()
        self.register_buffer("scale", 0.5 + torch.rand(S))
        self.register_buffer("keep", torch.arange(S) % 3 != 0)
        self.act = {"nn.Sigmoid": nn.Sigmoid(), "nn.Tanh": nn.Tanh(), "nn.ReLU": nn.ReLU(),
                    "nn.GELU": nn.GELU(), "nn.Softplus": nn.Softplus(),
                    "nn.Softmax": nn.Softmax(-1), "nn.LogSoftmax": nn.LogSoftmax(dim=-1),
                    "nn.Identity": nn.Identity(), "nn.SiLU": nn.SiLU(),
                    "nn.LogSigmoid": nn.LogSigmoid(), "nn.LeakyReLU": nn.LeakyReLU(0.2),
                    "nn.ELU": nn.ELU(alpha=0.5), "nn.Hardtanh": nn.Hardtanh(-0.5, 0.8),
                    "nn.ReLU6": nn.ReLU6(), "nn.GLU": nn.GLU(), "nn.Mish": nn.Mish(),
                    "nn.Softsign": nn.Softsign(), "nn.Tanhshrink": nn.Tanhshrink(),
                    "nn.Hardsigmoid": nn.Hardsigmoid(),
                    "nn.Hardswish": nn.Hardswish(), "nn.SELU": nn.SELU(),
                    "nn.CELU": nn.CELU(0.6), "nn.PReLU": nn.PReLU(S, 0.3),
                    "nn.Softmin": nn.Softmin(-1), "nn.Hardshrink": nn.Hardshrink(0.3),
                    "nn.Softshrink": nn.Softshrink(0.2), "in-place": nn.LeakyReLU(0.1, True),
                    "group_norm": nn.GroupNorm(2, 2 * S, eps=1e-3),
                    "nn.GELU(tanh)": nn.GELU(approximate="tanh"),
                    "nn.CosineSimilarity": nn.CosineSimilarity(eps=1e-6),
                    "nn.PairwiseDistance": nn.PairwiseDistance(keepdim=True, eps=1e-4),
                    "nn.Bilinear": nn.Bilinear(S, max(D, 1), S),
                    "F.bilinear": nn.Bilinear(max(D, 1), S, 3, bias=False),
                    **({"nn.RMSNorm": _rms_norm(S)} if hasattr(nn, "RMSNorm") else {}),
                    }.get(op, nn.Identity())

    def pre(self, x, m):
        if self.emb is not None:
            return self.emb(x) + self.U(m)
        return (self.lin(x) if self.lin is not None else 0) + self.U(m)

    def forward(self, x, m):
        a = self.pre(x, m)
        return torch.tanh(OPS[self.op](self, a, m, x))


OPS = {
    "nn.Linear": lambda c, a, m, x: a,
    "F.linear": lambda c, a, m, x: F.linear(m, c.U.weight, c.U.bias) + F.linear(a, c.W),
    "@": lambda c, a, m, x: a @ c.W + x @ c.Wx,
    "torch.matmul": lambda c, a, m, x: torch.matmul(a, c.W),
    "torch.addmm": lambda c, a, m, x: torch.addmm(c.b, a, c.W),
    "W.t()": lambda c, a, m, x: a @ c.W.t() + m @ c.U.weight.T,
    "tensor arithmetic": lambda c, a, m, x: a * m - a / (m * m + 1) + m,
    "scalar arithmetic": lambda c, a, m, x: 2.0 * a - 1.5 + a / 4 - (3 - a) * 0.5 + 1 * a,
    "rdiv": lambda c, a, m, x: 1 / (a * a + 1),
    "neg": lambda c, a, m, x: -a + (+m),
    "torch.add/sub/mul/div": lambda c, a, m, x: torch.div(torch.mul(torch.sub(a, m), 0.5),
                                                          torch.add(m * m, 2)),
    "methods add/sub/mul/div/neg": lambda c, a, m, x: a.add(m).mul(0.5).sub(m.div(2)).neg(),
    "vector weights": lambda c, a, m, x: (a + c.b) * c.b2 - c.b,
    "sigmoid": lambda c, a, m, x: torch.sigmoid(a) + torch.sigmoid(m) + a.sigmoid(),
    "tanh": lambda c, a, m, x: torch.tanh(a) + torch.tanh(m) + a.tanh(),
    "relu": lambda c, a, m, x: torch.relu(a) + F.relu(m) + a.relu(),
    "gelu": lambda c, a, m, x: F.gelu(a) + F.gelu(m, approximate="none"),
    "softplus": lambda c, a, m, x: (F.softplus(a) + F.softplus(m, beta=1, threshold=20)
                                    + F.softplus(a, beta=2.5, threshold=0.8) + F.softplus(m, -0.7)
                                    + c.softplus(a) + F.softplus(m * 9, threshold=3)),
    "exp": lambda c, a, m, x: torch.exp(torch.tanh(a)) + m.tanh().exp(),
    "log": lambda c, a, m, x: torch.log(a * a + 1) + (m * m + 0.5).log(),
    "sqrt": lambda c, a, m, x: torch.sqrt(a * a + 1) + (m * m + 0.5).sqrt(),
    "sin, cos, erf": lambda c, a, m, x: (torch.sin(a * 3) + m.cos() + torch.erf(a) + m.sin() +
                                         torch.cos(a) * m + torch.special.erf(m * 2) +
                                         0.5 * a * (1 + torch.erf(a / math.sqrt(2)))),
    "atan": lambda c, a, m, x: torch.atan(a * 3) + m.atan() + torch.arctan(m * 4),
    # The inverse functions of [-1, 1] read tanh of their input, scaled inside the domain.
    "sinh, cosh, asinh, atanh, asin, acos": lambda c, a, m, x: (
        torch.sinh(torch.tanh(a)) + m.tanh().cosh() * 0.5 + torch.asinh(a * 3) + m.arcsinh()
        + torch.atanh(0.9 * torch.tanh(a)) + torch.arctanh(0.5 * m.tanh())
        + torch.asin(0.8 * a.tanh()) + torch.arccos(0.7 * torch.tanh(m)) * 0.5),
    "tan, log2, log10, exp2": lambda c, a, m, x: (
        torch.tan(a * 0.5) + m.tan() * 0.5 + torch.log2(a * a + 1) + (m * m + 0.5).log10()
        + torch.exp2(torch.tanh(a)) + m.tanh().exp2()),
    "nn.Sigmoid": lambda c, a, m, x: c.act(a), "nn.Tanh": lambda c, a, m, x: c.act(a),
    "nn.ReLU": lambda c, a, m, x: c.act(a), "nn.GELU": lambda c, a, m, x: c.act(a),
    "nn.Softplus": lambda c, a, m, x: c.act(a), "nn.Softmax": lambda c, a, m, x: c.act(a),
    "nn.LogSoftmax": lambda c, a, m, x: c.act(a), "nn.Identity": lambda c, a, m, x: c.act(a),
    "torch.cat": lambda c, a, m, x: c.back(torch.cat([a, m], -1)) + c.back(torch.cat((m, a), 1)),
    "chunk": lambda c, a, m, x: _product(c.two(a).chunk(2, -1)) + _product(
        torch.chunk(c.two(m), 2, dim=1)),
    "split": lambda c, a, m, x: _product(torch.split(c.two(a), a.shape[-1], dim=-1)) + _product(
        c.two(m).split([m.size(-1), m.size(1)], 1)),
    "narrow": lambda c, a, m, x: torch.narrow(c.two(a), -1, a.size(-1), a.size(-1)) * c.two(
        m).narrow(1, 0, m.shape[1]),
    "slicing": lambda c, a, m, x: torch.cat([c.two(a)[:, :3], c.two(m)[..., 3 - a.shape[-1]:]],
                                            -1),
    "layer_norm": lambda c, a, m, x: c.ln(a) + c.ln_plain(m) + F.layer_norm(
        a, (a.shape[-1],), c.b2, c.b, eps=1e-3) + F.layer_norm(m, [m.size(-1)]),
    "softmax": lambda c, a, m, x: torch.softmax(a, -1) + F.softmax(m, dim=-1) + a.softmax(-1),
    "log_softmax": lambda c, a, m, x: (torch.log_softmax(a, -1) + F.log_softmax(m, dim=1) +
                                       m.log_softmax(dim=-1)) / 10,
    "like": lambda c, a, m, x: a + torch.ones_like(a) * 0.5 + torch.zeros_like(m) +
    torch.full_like(a, 0.25),
    "contiguous": lambda c, a, m, x: a.contiguous() + m.clone(),
    "in-place": lambda c, a, m, x: _in_place(c, a, m),
    "(batch,) values": lambda c, a, m, x: (
        torch.sigmoid((a * m).sum(-1) / math.sqrt(a.size(-1))).unsqueeze(-1) * a
        + (a[:, 0] * m[:, 1] - 0.5).unsqueeze(1) + torch.where(a[:, 2] > m[:, 3], a[:, 4],
                                                                -m[:, 5])[:, None]
        + F.relu(a.amax(-1) ** 2 + c.s).tanh().unsqueeze(-1) * m
        + torch.clamp(a.mean(-1), min=m[:, 6]).exp()[:, None]),
    "group_norm": lambda c, a, m, x: (
        c.back(c.act(c.two(a))) + c.back(F.group_norm(c.two(m), 2, eps=1e-3))
        + F.group_norm(a, 1, c.b2, c.b)),
    "repeat_interleave": lambda c, a, m, x: (
        c.back(a.repeat_interleave(2, dim=-1)) + torch.repeat_interleave(
            m[:, :3], torch.tensor([2, 0, 5]), -1)),
    "pow": lambda c, a, m, x: (a ** 2 + torch.pow(m, 3) * 0.1 + (m * m + 1) ** 0.5 +
                               (a * a + 1) ** -1 + (m * m + 1).pow(-0.5) + (a * a + 1) ** -2 +
                               2 ** torch.tanh(a) + torch.pow(0.5, m.tanh()) + a ** 1),
    "square, rsqrt, reciprocal": lambda c, a, m, x: (
        torch.square(a) + m.square() * 0.5 + torch.rsqrt(a * a + 1) + (m * m + 1).rsqrt() +
        torch.reciprocal(a * a + 1) + (m * m + 2).reciprocal()),
    "silu": lambda c, a, m, x: F.silu(a) + F.silu(m, inplace=False),
    "logsigmoid": lambda c, a, m, x: F.logsigmoid(a) + F.logsigmoid(m) / 2,
    "nn.SiLU": lambda c, a, m, x: c.act(a), "nn.LogSigmoid": lambda c, a, m, x: c.act(a),
    "leaky_relu": lambda c, a, m, x: F.leaky_relu(a) + F.leaky_relu(m, 0.3) + F.leaky_relu(
        a, negative_slope=0.1, inplace=False),
    "elu": lambda c, a, m, x: F.elu(a) + F.elu(m, alpha=0.5),
    "abs": lambda c, a, m, x: torch.abs(a) + m.abs(),
    "nn.LeakyReLU": lambda c, a, m, x: c.act(a), "nn.ELU": lambda c, a, m, x: c.act(a),
    # Reductions over the features, kept as one value per row that broadcasts.
    "sum, mean": lambda c, a, m, x: (a * torch.sum(m, -1, keepdim=True) * 0.1 +
                                     a.sum(dim=-1, keepdim=True) / a.shape[-1] -
                                     a.mean(-1, keepdim=True) +
                                     torch.mean(m, dim=[-1], keepdim=True) * m),
    "var": lambda c, a, m, x: ((a - a.mean(-1, keepdim=True)) /
                               torch.sqrt(a.var(-1, keepdim=True, unbiased=False) + 1e-3) +
                               torch.var(m, -1, keepdim=True) + m.var(dim=-1, keepdim=True,
                                                                      correction=0) * a),
    "size-1 gate, expand": lambda c, a, m, x: (
        torch.sigmoid(c.gate(a)) * a + (1 - torch.sigmoid(c.gate(m))) * m +
        c.gate(a).expand_as(a) * 0.1 + torch.tanh(c.gate(m)).expand(-1, a.shape[-1]) +
        m / (2 + c.gate(a).abs())),
    "max, min, logsumexp over features": lambda c, a, m, x: (
        a - a.max(-1, keepdim=True).values + torch.max(m, dim=-1, keepdim=True)[0] * a +
        torch.amin(a, -1, keepdim=True) + m.amax(dim=-1, keepdim=True) +
        torch.min(a, -1, keepdim=True).values - torch.logsumexp(a, -1, keepdim=True) +
        (m * 3).logsumexp(dim=-1, keepdim=True) * 0.5),
    "norm, normalize": lambda c, a, m, x: (a.norm(dim=-1, keepdim=True) * 0.1 + F.normalize(a) +
                                           F.normalize(m, p=2, dim=-1) * torch.norm(
                                               m, 2, -1, True) +
                                           torch.linalg.vector_norm(a, dim=[-1], keepdim=True) +
                                           a.norm(2, -1, True) + m.var(-1, False, True)),
    # (batch,) values, a weight vector broadcast as the second operand.
    "cosine_similarity, pairwise_distance": lambda c, a, m, x: (
        a * F.cosine_similarity(a, m).unsqueeze(-1) +
        torch.cosine_similarity(m, c.scale, dim=-1, eps=1e-3)[:, None] * m +
        F.pairwise_distance(a, m).unsqueeze(-1) * 0.1 +
        torch.pairwise_distance(m * 2, a, eps=0.0, keepdim=True) * 0.05),
    "nn.CosineSimilarity": lambda c, a, m, x: a * c.act(a, m + 0.5).unsqueeze(-1) + m,
    "nn.PairwiseDistance": lambda c, a, m, x: c.act(a, x2=m) * 0.1 + a,
    # x's size differs from the state's, so a transposed weight would be refused or wrong.
    "nn.Bilinear": lambda c, a, m, x: c.act(a, x) + m,
    "F.bilinear": lambda c, a, m, x: a + torch.cat(
        [F.bilinear(x, m, c.act.weight), torch.bilinear(x, a, c.act.weight * 0.5, c.b[:3]),
         m[:, 6:]], -1),
    "nn.GRUCell": lambda c, a, m, x: c.gru(a, m) + c.gru(m) * 0.5,
    "nn.LSTMCell": lambda c, a, m, x: _product(c.lstm(a, (m, torch.tanh(a)))) + c.lstm(m)[1],
    "nn.RNNCell": lambda c, a, m, x: c.rnn(a, m) + c.rnn(a, hx=m * 0.5),
    "glu, mish, softsign, tanhshrink, hardsigmoid, hardswish": lambda c, a, m, x: (
        F.glu(c.two(a)) + F.glu(torch.cat([m, a], -1), dim=-1) + F.mish(a) + F.softsign(m * 3) +
        F.tanhshrink(a) + F.hardsigmoid(a * 5) + F.hardswish(m * 6 - 1)),
    "nn.GLU": lambda c, a, m, x: c.act(c.two(a)), "nn.Mish": lambda c, a, m, x: c.act(a),
    "nn.Softsign": lambda c, a, m, x: c.act(a), "nn.Tanhshrink": lambda c, a, m, x: c.act(a),
    "nn.Hardsigmoid": lambda c, a, m, x: c.act(a * 5),
    "nn.Hardswish": lambda c, a, m, x: c.act(a * 5),
    "size-1 weight": lambda c, a, m, x: a * c.s - c.s + m / (c.s * c.s + 1),
    "maximum, minimum": lambda c, a, m, x: (torch.maximum(a, m) + torch.minimum(a, m * 0.5) +
                                            a.max(m * 2) + torch.min(a, c.gate(m)) +
                                            a.minimum(m)),
    "clamp": lambda c, a, m, x: (torch.clamp(a, -0.5, 0.5) + a.clamp(min=-0.2) +
                                 torch.clamp_max(m, 0.3) + m.clip(-0.1, 0.1) + a.clamp_min(0.1) +
                                 torch.clamp(a, min=c.gate(m), max=m + 0.5)),
    "hardtanh, relu6": lambda c, a, m, x: (F.hardtanh(a * 2) + F.relu6(a * 8) +
                                           F.hardtanh(m, -0.5, 0.5)),
    "nn.Hardtanh": lambda c, a, m, x: c.act(a), "nn.ReLU6": lambda c, a, m, x: c.act(a * 8),
    # Compositions (trace_compose.py) and alpha= / integer exponents (trace_ops.py).
    "lerp, addcmul, addcdiv": lambda c, a, m, x: (
        torch.lerp(a, m, 0.3) + torch.lerp(a, m, torch.sigmoid(a)) + a.lerp(m, c.s) +
        torch.addcmul(a, m, a, value=0.5) + torch.addcdiv(m, a, m * m + 1) + a.addcmul(m, m) +
        m.addcdiv(a, a * a + 2, value=-2)),
    "add, sub with alpha": lambda c, a, m, x: (torch.add(a, m, alpha=0.5) +
                                               torch.sub(a, m, alpha=2) + a.add(m, alpha=-1) +
                                               torch.add(a, 2, alpha=3) + m.sub(c.b, alpha=0.5)),
    "integer powers": lambda c, a, m, x: (
        torch.tanh(a) ** 4 + m.tanh().pow(5) + (a * a + 1) ** -3 + torch.pow(m * m + 1, -4) +
        a ** 0 + torch.tanh(m) ** 16 + torch.pow(a.tanh(), 7.0) + (m * m + 1) ** -1),
    "gelu tanh": lambda c, a, m, x: (F.gelu(a, approximate="tanh") +
                                     F.gelu(m * 3, approximate="tanh")),
    "selu, celu, prelu, softmin": lambda c, a, m, x: (
        F.selu(a) + F.celu(m, alpha=0.7) + F.celu(a) + F.prelu(a, c.s) + F.prelu(m, c.b) +
        F.softmin(a, -1) + torch.selu(m)),
    "log1p, expm1": lambda c, a, m, x: (torch.log1p(a * a) + m.tanh().expm1() +
                                        a.sigmoid().log1p() + torch.expm1(a.tanh())),
    "nn.SELU": lambda c, a, m, x: c.act(a), "nn.CELU": lambda c, a, m, x: c.act(a),
    "nn.PReLU": lambda c, a, m, x: c.act(a), "nn.Softmin": lambda c, a, m, x: c.act(a),
    "nn.GELU(tanh)": lambda c, a, m, x: c.act(a * 2),
    "logaddexp, logaddexp2": lambda c, a, m, x: (torch.logaddexp(a, m) + a.logaddexp2(m * 2) * 0.5
                                                 + torch.logaddexp(a[:, :1], m)),
    "hardshrink, softshrink": lambda c, a, m, x: (F.hardshrink(a, 0.3) + F.softshrink(a, 0.2) +
                                                  torch.hardshrink(m) + F.softshrink(m * 2, 0.4)),
    "nn.Hardshrink": lambda c, a, m, x: c.act(a), "nn.Softshrink": lambda c, a, m, x: c.act(a),
    # jumps where PyTorch's are, 0 gradient (frac's 1), times a so that the product carries a's
    "floor, ceil, round, trunc, frac": lambda c, a, m, x: (
        torch.floor(a * 3) * a + (m * 2).ceil() * m + torch.round(a * 2.5) * m
        + a.round() + torch.trunc(m * 3) * a + (a * 2).fix() + torch.frac(a * 3)
        + m.frac() * a),
    # no gradient through the detached values (a straight-through rounding among them), a
    # comparison's and a (batch,) value's detach, and a weight's, which PyTorch computes
    "detach": lambda c, a, m, x: (
        torch.tanh(a) + m.detach() * a + (torch.round(a * 2) / 2 - a).detach() + a
        + torch.detach(m * m) + torch.where((a > 0).detach(), a, m)
        + m.sum(-1).detach().unsqueeze(-1) * 0.1 + a @ c.W.detach()),
    # aliases: tile as repeat, linalg.norm as the vector norm, torch.special's, .type(float32);
    # nan_to_num of finite values (its NaN and infinities: test_propagate)
    "tile, linalg.norm, special, type, nan_to_num": lambda c, a, m, x: (
        torch.tile(a, (2,))[:, 3:10] + m.tile((1, 2))[:, :7] * a
        + a / torch.linalg.norm(a, dim=-1, keepdim=True) + torch.linalg.norm(m, 1, -1)[:, None]
        + torch.special.expit(a) + torch.special.log1p(m * m) + torch.special.expm1(torch.tanh(a))
        + torch.special.logsumexp(m, -1, keepdim=True) * 0.1 + a.type(torch.float32)
        + (m > 0).type(torch.float32) + torch.nan_to_num(a) * m.nan_to_num(nan=1.0)),
    "atan2": lambda c, a, m, x: torch.atan2(a, m) + m.arctan2(c.b2) + torch.arctan2(c.b, a),
    # Per-row products through size-1 dims: dot products, attention pooling over a stack.
    "per-row bmm, dot products": lambda c, a, m, x: (
        a * torch.bmm(a.unsqueeze(1), m.unsqueeze(2)).squeeze(2) * 0.1
        + torch.matmul(m.unsqueeze(-2), a.unsqueeze(-1)).squeeze(-1).squeeze(-1).unsqueeze(-1) * m
        + a.unsqueeze(-1).squeeze(-1) + (m.unsqueeze(1) @ torch.stack([a, m, a * m], 2)).view(
            a.size(0), -1).sum(-1, keepdim=True) * 0.1
        + torch.bmm(torch.stack([a, m], 1), torch.stack([m, a], 2)).flatten(1).mean(
            -1, keepdim=True) + a.unsqueeze(2).view(-1, a.shape[-1]) * 0.5
        # squeeze of a dim whose size is not 1: PyTorch's no-op
        + torch.stack([a, m], 1).squeeze(-1).sum(1) * 0.5 + m.unsqueeze(1).squeeze(2).squeeze(1)),
    "per-row bmm, attention pooling": lambda c, a, m, x: (
        torch.bmm(torch.softmax(torch.cat([a[:, :1], m[:, :1], (a * m)[:, 1:2]], -1), -1)
                  .unsqueeze(1), torch.stack([a, m, a * m], 1)).squeeze(1)
        + (torch.sigmoid(a[:, :1]).unsqueeze(1) @ m.unsqueeze(1)).squeeze(1)
        + torch.bmm(m[:, None], a[..., None])[:, 0]
        * torch.bmm(a[:, None, :], m[:, :, None])[:, 0]),
    "attention over a stack, broadcast": lambda c, a, m, x: _stack_attention(c, a, m),
    "einsum and transposes of stacks": lambda c, a, m, x: _stack_einsum(c, a, m),
    "nn.MultiheadAttention": lambda c, a, m, x: _attention_module(c, a, m),
    "attention over torch.stack(tensors), dim 0": lambda c, a, m, x: _sequence_first(c, a, m),
    "step slices, flip": lambda c, a, m, x: (
        torch.cat([a[:, ::2], m[:, 1::2]], -1) + torch.flip(a, (-1,)) * m.flip(-1)
        + torch.cat([a[..., 1:6:3], m[:, 5:], torch.fliplr(a)[:, :3]], -1) + a.fliplr()),
    "feature indices, index_select, tensor_split": lambda c, a, m, x: (
        a[:, [6, 0, 1, 2, 2, -3, 3]] + m[..., [True, False] * 3 + [True]].repeat(1, 2)[:, :7]
        + torch.index_select(a, -1, torch.tensor([5, 6, 4, 0, 1, 2, 3]))
        + m.index_select(1, torch.arange(6, -1, -1))
        + a[:, torch.tensor([1, 1, 1, 1, 1, 1, 1])]
        + torch.cat(a.tensor_split(3, -1)[::-1], -1)
        + torch.cat(torch.tensor_split(m, [2, -2], dim=1)[::-1], 1)
        + torch.cat(torch.tensor_split(a, (4, 9), 1)[:2][::-1], 1)),
    "tensor constants made in the cell": lambda c, a, m, x: (
        a * torch.arange(7).float() / 7 + torch.linspace(-1, 1, 7) * m
        + torch.tensor([[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]]) + a @ torch.eye(7)
        + torch.tanh(m) @ torch.tensor([[0.1 * (i - j) for j in range(7)] for i in range(7)]).t()
        + F.linear(a, torch.ones(3, 7) / 7, torch.tensor([0.1, 0.2, 0.3])).sum(-1, keepdim=True)
        # as GPU code writes them: device= and dtype= of a traced value, sizes from x.size(-1)
        + m * torch.arange(a.size(-1), device=a.device, dtype=a.dtype) / a.shape[-1]
        + a @ torch.eye(m.size(1), device=m.device) + m[:, torch.arange(6, -1, -1, device=m.device)]
        + torch.tensor([0.3] * 7, device=a.device) * torch.linspace(1, 2, 7, device=a.device)
        + a.new_tensor([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]) * m
        + a[:, m.new_tensor([1, 0, 2, 3, 4, 6, 5], dtype=torch.long)]),
    "unflatten": lambda c, a, m, x: (
        c.two(a).unflatten(-1, (2, 7)).sum(1) + c.unflatten(c.two(m)).amax(-1)
        + torch.unflatten(c.two(a), 1, (-1, 7)).mean(1)),
    "movedim, aliases, rrelu and alpha_dropout (eval), deg2rad": lambda c, a, m, x: (
        torch.stack([a, m], 1).movedim(1, 2).sum(-1) + torch.moveaxis(
            torch.stack([a, m], 1), -1, 1).mean(2) + torch.rsub(a, m) + torch.rsub(a, 2.0, 3)
        + torch.true_divide(a, m * m + 1) + a.true_divide(2) + torch.subtract(a, m, alpha=2)
        + torch.multiply(a, m) + m.divide(3) + a.multiply(m) + torch.divide(m, 4)
        + F.rrelu(a) + F.rrelu(m, 0.1, 0.3, training=False) + c.rrelu(a)
        + F.alpha_dropout(m, 0.3, training=False) + c.alpha_dropout(a)
        + F.feature_alpha_dropout(a, 0.2) + torch.deg2rad(a) + m.rad2deg() * 0.01
        + torch.softmax(a, -1, dtype=torch.float32) + F.log_softmax(m, 1, dtype=torch.float32)
        + a.softmax(-1, torch.float32) + F.softmax(m, -1, 3) + F.softmin(a, -1, 3, torch.float32)
        + a.sum(-1, True, dtype=torch.float32) * 0.1),
    "cumsum, cumprod, cummax, cummin": lambda c, a, m, x: (
        torch.cumsum(a, -1) * 0.2 + m.cumprod(-1) + torch.cumprod(torch.sigmoid(a), dim=1)
        + (m * 0.5).cumsum(dim=-1) + c.b2.cumsum(-1) + torch.cummax(a, -1).values
        + m.cummin(dim=-1)[0]),
    "logcumsumexp, prod, roll, diff": lambda c, a, m, x: (
        torch.logcumsumexp(a, -1) * 0.1 + m.prod(-1, keepdim=True) + torch.roll(a, 2, -1)
        + m.roll(-3, 1) * torch.prod(c.b2, -1) + torch.diff(a, prepend=m[:, :1])
        + m.diff(append=c.b[:1].expand(m.size(0), 1))),
    "nansum, nanmean, logit, sinc, var_mean, isfinite, xor": lambda c, a, m, x: (
        torch.nansum(a, -1, keepdim=True) + m.nanmean(dim=-1, keepdim=True)
        + torch.logit(torch.sigmoid(a)) * 0.1 + torch.special.logit(torch.sigmoid(m), eps=0.2)
        + torch.sinc(a) + m.sinc() + torch.var_mean(a, -1, keepdim=True)[0]
        + torch.std_mean(m, dim=-1, keepdim=True)[1]
        + torch.where(torch.isfinite(a) ^ (m > 0), a, m)
        + torch.logical_xor(a > 0, m > 0).float() * torch.isnan(m).float() + torch.sgn(a) * m),
    "hypot, xlogy": lambda c, a, m, x: (
        torch.hypot(a, m) + m.hypot(c.b2) + torch.xlogy(a, m * m + 0.5) +
        torch.special.xlogy(m, 2.0) + a.xlogy(c.b2) + torch.xlogy(3.0, torch.sigmoid(a))),
    "erfc, lgamma, digamma, erfinv, ndtr": lambda c, a, m, x: (
        torch.erfc(a) + m.erfc() * 0.5 + torch.lgamma(a.abs() + 0.5) * 0.3
        + torch.special.gammaln(torch.sigmoid(m) + 0.2) + torch.digamma(a * a + 1.0) * 0.3
        + torch.special.psi(torch.sigmoid(a) + 0.5) * 0.1 + (torch.sigmoid(m) + 0.1).digamma() * 0.1
        + torch.erfinv(torch.tanh(a) * 0.9) + torch.special.erfinv(torch.sigmoid(m) - 0.5)
        + torch.special.ndtr(a) + torch.lgamma(torch.sigmoid(a) * 0.8 - 0.9) * 0.2
        + torch.special.multigammaln(a.abs() + 2.0, 3) * 0.1 + torch.mvlgamma(m * m + 1.5, 2) * 0.1
        + torch.polygamma(0, torch.sigmoid(m) + 1.0) + torch.special.xlog1py(a, m * m)
        + torch.special.xlog1py(m, 0.5) + torch.special.softmax(a, -1)
        + torch.special.log_softmax(m, dim=-1) * 0.1 + torch.special.round(a) * m),
    "fmod, remainder, %, copysign, signbit": lambda c, a, m, x: (
        torch.fmod(a, 0.7) + m.fmod(torch.sigmoid(a) + 0.5) + torch.remainder(a, -0.6)
        + m % 0.8 + torch.remainder(a, c.b2.abs() + 0.4)
        + torch.copysign(a, m) + m.copysign(-1.0) + torch.signbit(a - m).float() * a
        + torch.where(m.signbit(), a, m)),
    "sort, topk, kthvalue, median": lambda c, a, m, x: (
        torch.sort(a, -1).values * 0.5 + m.sort(descending=True)[0] + torch.cat(
            [torch.topk(a * m, 3).values, m.topk(2, largest=False, dim=-1).values], -1).sum(
                -1, keepdim=True) + torch.kthvalue(a, 2, -1, keepdim=True).values
        + a.median(-1, keepdim=True).values + torch.median(m, dim=1)[0].unsqueeze(-1)
        + torch.sort(torch.sigmoid(a[:, :5]), stable=True).values.sum(-1, keepdim=True)),
    "fmax, fmin": lambda c, a, m, x: torch.fmax(a, m) + m.fmin(a * 0.5) + torch.fmin(a, c.b),
    # made when the cell is traced: Python numbers to it
    "0-d tensor constants": lambda c, a, m, x: (
        a * torch.tensor(0.5) + m / torch.sqrt(torch.tensor(7)) + torch.tensor(2.0) * a
        - torch.tensor(1.5, dtype=torch.float64) + torch.max(m, torch.tensor(1.0))
        + torch.minimum(torch.tensor(0.2), a) + (torch.tensor(1.0) - m) / torch.tensor(3.0)),
    "norm, normalize with p=1": lambda c, a, m, x: (
        F.normalize(a, p=1, dim=-1) + a.norm(p=1, dim=-1, keepdim=True) * 0.1
        + torch.linalg.vector_norm(m, ord=1, dim=-1, keepdim=True) * 0.1
        + F.pairwise_distance(a, m, 1, keepdim=True) * 0.1),
    # torch 2.4 and later only.
    **({"rms_norm": lambda c, a, m, x: (F.rms_norm(a, (a.shape[-1],), c.b2) +
                                        F.rms_norm(m, [m.size(-1)], eps=1e-3)),
        "nn.RMSNorm": lambda c, a, m, x: c.act(a)} if hasattr(F, "rms_norm") else {}),
    # (batch,) values: reductions without keepdim, x[:, i], squeeze(-1), back through
    # unsqueeze(-1), [:, None] and view(-1, 1).
    "(batch,) values": lambda c, a, m, x: (
        a * m.sum(-1).unsqueeze(-1) * 0.1 + a.mean(dim=-1)[:, None] +
        torch.unsqueeze(m.max(-1).values, -1) + m[:, 2].unsqueeze(1) * a +
        c.gate(a).squeeze(-1).view(-1, 1) + torch.squeeze(c.gate(m), 1)[..., None] +
        a.norm(dim=-1).reshape(-1, 1) + m[:, -1].reshape((-1, 1)) + a[:, :1].view(-1)[:, None] +
        a.squeeze(-1) + torch.logsumexp(m, -1).unsqueeze(-1)),
    # (Their constants cancel, so that the cell's tanh stays away from saturation.)
    "new tensors, views": lambda c, a, m, x: (
        a + torch.zeros(a.size(0), a.shape[-1], device=a.device) + torch.ones(a.shape[0], 1) * m -
        m.new_full((m.size(0), m.size(1)), 0.5) + torch.full((a.shape[-1],), 0.25, dtype=a.dtype) +
        a.view(a.size(0), -1) * m.reshape(-1, m.shape[1]) + a.new_ones(a.shape) * 0.15 +
        torch.zeros(a.size(0)).unsqueeze(-1) + m.new_zeros(m.size()) +
        torch.ones(size=(1, 7)) * 0.1 + a.new_zeros(a.shape[:-1] + m.shape[1:]) +
        F.layer_norm(a, a.shape[-1:]) * 0.1 + m.view(*m.shape[:-1], -1) * (a.dim() - 1) +
        a / a.ndim + (m if m.dim() == 2 and a.ndimension() == 2 else -m)),
    "torch.stack, reduced": lambda c, a, m, x: (
        torch.stack([a, m, a * m], 0).sum(0) + torch.stack([a, m], dim=-1).mean(-1) +
        torch.stack((a, m * 2), 1).max(1).values + torch.stack([m, a]).min(dim=0)[0] +
        torch.amax(torch.stack([a, m], 2), dim=2) + torch.stack([a]).amin(0) +
        torch.sum(torch.stack([c.gate(a), c.gate(m)], -1), -1)),
    "std, repeat": lambda c, a, m, x: (
        (a - a.mean(-1, keepdim=True)) / (a.std(-1, keepdim=True) + 1e-2) * 0.3 +
        torch.std(m, -1, keepdim=True, unbiased=False) * m + m.std(dim=-1).unsqueeze(-1) +
        c.back(a.repeat(1, 2)) + c.back(m.repeat((1, 2))) * a.repeat(1, 1)),
    "flatten, pad": lambda c, a, m, x: (
        a.flatten(1) + torch.flatten(m, 1, -1) + c.back(c.flat(torch.stack([a, m], 1)))
        + c.back(torch.stack((m, a), dim=1).flatten(start_dim=-2)) * 0.5
        + torch.flatten(a.sum(-1)).unsqueeze(-1) + F.pad(a, (2, -2)) + F.pad(m[:, 1:], (0, 1),
                                                                              value=0.5)
        + F.pad(a, (-1, 1, 0, 0), "constant", -0.25) + c.cpad(a)[:, 1:] + c.zpad(m)[:, :-1]
        + F.pad(a, pad=[1, 1])[:, 1:-1]),
    "(batch, k, n) views, unbind, stack items": lambda c, a, m, x: (
        _product(c.two(a).view(-1, 2, a.shape[-1]).unbind(1)) +
        c.two(m).view(m.size(0), 2, -1)[:, 1] * a + c.two(a).reshape(-1, 2, a.size(1)).sum(1) +
        c.back(torch.stack([a, m], 1).view(a.size(0), -1)) + torch.stack([a, m])[1] +
        torch.stack((a, m * 2), -1)[..., 0] + c.two(m).view(-1, 2, a.shape[-1]).max(1).values +
        torch.unbind(torch.stack([a, m], 2), -1)[1] + torch.stack([a, m], 1)[:, -1] +
        c.two(m).view(-1, 2, a.shape[-1])[:, 0, :] + torch.stack([a, m])[1, ...]),
    # Comparisons as masks and torch.where, whose branch not taken (log of a negative value
    # here) may be NaN without reaching the result or the gradients.
    "comparisons, where": lambda c, a, m, x: (
        torch.where(a > 0, a, 0.1 * a) + torch.where(m < a, m, a) +
        torch.where(a >= m, 1.0, -1.0) * 0.1 + (a > m).float() * m +
        torch.where(~(a <= 0.2) & (m != a) | (m == 0.5), a, 0.0) +
        torch.where(a.gt(0.1), torch.log(a), 0.0) + torch.where(m.le(c.b), c.b, m) +
        torch.gt(a, m).float() * a + a.lt(m).type_as(a) * m +
        torch.logical_and(a > 0, m > 0).float() + torch.logical_not(a > 0).to(a.dtype) * a +
        torch.where(c.gate(a) > 0, a, m) + (a > 0) * m + a.masked_fill(m > 0.3, -1.0) +
        torch.masked_fill(m, a < m, 0.5)),
    # Slices, index lists, pieces and cats of comparisons stay comparisons (bool in PyTorch).
    "comparison slices": lambda c, a, m, x: (
        torch.where(torch.cat([(a > 0)[:, :3], (m > a)[:, 3:]], -1), a, m)
        + torch.where((a > 0)[:, [6, 0, 1, 2, 3, 4, 5]], a, 0.5 * m)
        + torch.where((a > m)[:, 2, None], a, m) + torch.where((a > 0)[:, 1].unsqueeze(-1), m, a)
        + torch.where(torch.cat((a > 0.1).chunk(7, -1)[::-1], -1), m, a)
        + torch.where((a < 0).flip(-1), a, -m)),
    # Infinite constants (JSON has none: the program writes them as strings): masking scores
    # with -inf before a softmax (a column left unmasked, so no row is all -inf), clamps without
    # a bound, an infinite branch clamped.
    "infinite constants": lambda c, a, m, x: (
        torch.softmax(torch.cat([a[..., :1], a[..., 1:].masked_fill(a[..., 1:] < 0,
                                                                    float("-inf"))], -1), -1)
        + torch.clamp(a, min=float("-inf"), max=0.5)
        + torch.where(m > 0.2, torch.full_like(a, float("inf")), a).clamp(max=2.0)),
    # Buffers in expressions, bool buffers and comparisons of weights alone as masks, a 0-d
    # parameter.
    "buffers, weight masks, 0-d weights": lambda c, a, m, x: (
        a * (c.scale * 2) + m * c.scale.exp() + F.linear(a, c.W * (c.W > 0))
        + a.masked_fill(c.b > 0, 0.25) + torch.where(c.keep, a, m) + a * c.keep + a / c.t
        + m * (c.scale > 0.9) + torch.where(~c.keep & (c.b < 0.2), m, 0.5 * a) + c.t * m),
    "sign, threshold": lambda c, a, m, x: (torch.sign(a) * m + a.sign() +
                                           F.threshold(a, 0.1, -0.5) + F.threshold(m, -0.2, 0.3)),
    "einsum": lambda c, a, m, x: (
        torch.einsum("bi,ij->bj", a, c.W) + torch.einsum("bk,jk->bj", m, c.W)
        + torch.einsum("bi,bi->bi", [a, m]) + torch.einsum("i,bi->bi", c.b, a)
        + torch.einsum("zi,zi->z", a, m).unsqueeze(-1) + torch.einsum("ij,bj", c.W, m)
        + torch.einsum("bi,i", a, c.b2)[:, None] + torch.einsum("bi->b", m)[:, None]
        + torch.einsum("bi -> bi", a) + torch.einsum("ij,bi->bj", c.W.t(), a)),
    # Weight expressions: computed by PyTorch from the weights on every call.
    "weight slices": lambda c, a, m, x: (
        torch.cat([F.linear(a, w) for w in c.W.chunk(2, 0)], -1) + a @ c.W[:, :3] @ c.W[:3]
        + torch.cat([c.b[:2], c.b[2:]]) + F.linear(m[:, 1:6], c.W.split([5, 2], 1)[0])
        + m @ c.W.t()[:, :7]
        + c.W[1] * c.W.narrow(1, 2, 1).t()),
    "weight arithmetic": lambda c, a, m, x: (
        F.linear(a, c.W / c.W.norm(dim=1, keepdim=True)) + m @ ((c.W + c.W.t()) / 2)
        + a * c.s.exp() + m * c.W.mean() + F.linear(a, c.W * torch.tril(torch.ones_like(c.W)))),
}


def _product(parts):
    p, q = parts
    return torch.tanh(p) * torch.sigmoid(q)


class LSTMCell(nn.Module):
    """Node cell over (h, c): Tree-LSTM-like gates of x and the summed message."""

    def __init__(self, size, input_size, dropout=0.0):
        super().__init__()
        self.W = nn.Linear(input_size, 4 * size)
        self.U = _small(nn.Linear(size, 4 * size, bias=False), 1.0)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, state):
        h, c = state
        i, o, u, f = (self.W(x) + self.U(h)).chunk(4, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f) * c * 0.5
        h = torch.sigmoid(o) * torch.tanh(self.drop(c))
        return h, c


class GateEdge(nn.Module):
    """Edge cell over (h, c): (U h, sigmoid(V h + W x) * c); reads the arc's input."""

    def __init__(self, size, input_size, dropout=0.0):
        super().__init__()
        self.U = _small(nn.Linear(size, size))
        self.V = nn.Linear(size, size)
        self.W = nn.Linear(input_size, size, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, state, x):
        h, c = state
        return torch.tanh(self.U(self.drop(h))), torch.sigmoid(self.V(h) + self.W(x)) * c


class AttentionEdge(nn.Module):
    """Edge cell for reduce="softmax" over (h, c): (score, value, c) with a size-1 score of the
    source state and the arc's input, scaled up so that the weights are far from uniform."""

    def __init__(self, size, input_size):
        super().__init__()
        self.score = nn.Linear(size, 1)
        self.key = nn.Linear(input_size, size)
        self.value = _small(nn.Linear(size, size))

    def forward(self, state, x):
        h, c = state
        return 4 * self.score(h * torch.tanh(self.key(x))), self.value(h), c


class AttentionNode(nn.Module):
    """Node cell reading the attention's (log-sum-exp, weighted value, weighted c)."""

    def __init__(self, size, input_size):
        super().__init__()
        self.x = nn.Linear(input_size, size)
        self.lse = nn.Linear(1, size)

    def forward(self, x, message):
        lse, v, c = message
        h = torch.tanh(self.x(x) + v + self.lse(lse))
        return h, 0.5 * c + h


class ScaleEdge(nn.Module):
    """Edge cell over a single state: tanh(alpha * A h)."""

    def __init__(self, size, alpha=1.0):
        super().__init__()
        self.A = _small(nn.Linear(size, size, bias=False), 1.0)
        self.alpha = alpha

    def forward(self, h, x):
        return torch.tanh(self.alpha * self.A(h))


class EmbedFirst(nn.Module):
    """An x cell that embeds its id first (node cells: (ids, message); edge cells: (state, ids))."""

    def __init__(self, embed, cell, edge=False, scale=None):
        super().__init__()
        self.embed, self.cell, self.edge, self.scale = embed, cell, edge, scale

    def forward(self, a, b):
        e = self.embed(b if self.edge else a)
        if self.scale is not None:  # an embedding read directly as well (not only projected)
            e = e * self.scale(e).sigmoid()
        return self.cell(a, e) if self.edge else self.cell(e, b)
