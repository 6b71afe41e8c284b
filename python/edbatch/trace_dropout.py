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


def dropout_mask(seed, index, site, size, p):
    """The kept entries (a bool tensor of `size`) of one dropout invocation."""
    key = dropout_key(seed, index, site)
    threshold = dropout_threshold(p)
    return torch.tensor([dropout_hash(key, i) >= threshold for i in range(size)],
                        dtype=torch.bool)
