"""The dropout masks of a traced program, as kernels/op_math.h draws them: edbatch.dropout_mask
rebuilds the masks of a call from its seed (Propagate.last_seed)."""
import math
import struct

import torch

_M32 = 0xFFFFFFFF


def _mix(h):
    """murmur3's fmix32."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def dropout_key(seed, index, site):
    """The key of one dropout invocation: index is the node number (node cells) or num_nodes +
    the arc number (edge cells), site the dropout instruction's number in the program."""
    low, high = seed & _M32, (seed >> 32) & _M32
    return _mix(_mix(low ^ _mix(high)) ^ _mix(index & _M32) ^ ((site * 0x9E3779B9) & _M32))


def dropout_hash(key, i):
    return _mix(key ^ ((i * 0x27D4EB2F) & _M32) ^ 0x165667B1)


def dropout_threshold(p):
    """The least hash kept: p as the engine holds it (float32) times 2^32, rounded up."""
    return math.ceil(struct.unpack("f", struct.pack("f", p))[0] * 4294967296.0)


def _mul32(h, c, t):
    """h = (h * c) mod 2^32, in place, for an int64 tensor h of 32-bit values (t: scratch of h's
    size), without leaving 64 signed bits: the low 16 bits' product, plus the high 16 bits'
    product's low 16 bits shifted up."""
    t.copy_(h).__irshift__(16)
    t.mul_(c).bitwise_and_(0xFFFF).__ilshift__(16)
    h.bitwise_and_(0xFFFF).mul_(c).add_(t).bitwise_and_(_M32)


def _mix_all(h, t):
    """_mix over an int64 tensor of 32-bit values, in place (t: scratch)."""
    for shift, c in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h.bitwise_xor_(t.copy_(h).__irshift__(shift))
        _mul32(h, c, t)
    h.bitwise_xor_(t.copy_(h).__irshift__(16))


def dropout_mask(seed, index, site, size, p):
    """The kept entries (a bool tensor of `size`) of one dropout invocation: dropout_hash of
    every entry, computed over a tensor at once."""
    h, t = torch.arange(size, dtype=torch.int64), torch.empty(size, dtype=torch.int64)
    _mul32(h, 0x27D4EB2F, t)
    h.bitwise_xor_(dropout_key(seed, index, site) ^ 0x165667B1)
    _mix_all(h, t)
    return h >= dropout_threshold(p)
