"""edbatch for PyTorch: dynamic batching of tree, lattice and DAG cells as torch ops.

    import edbatch
    packed = edbatch.pack_trees([((1, 2), 3), 4])
    model = edbatch.nn.TreeLSTM(vocab_size=10, input_size=8, hidden_size=16)
    h, c = model(packed)          # every node's states, in packed order

User cells (any nn.Module of supported PyTorch ops) run batched through edbatch.nn.Propagate.
"""
from . import _lib
from ._version import __version__
from .packing import (Packed, pack_trees, parse_sst, pack_sst, pack_lattices, pack_dags,
                      pack_edges, concat_packed)
from .collating import collate
from .sst import LabelledTree
from .ops import (run_cell, prepare, prepare_stats, prefetch, cells, weight_shapes,
                  set_plan_cache, plan_cache_stats, set_check_numerics)

_lib.load()

from . import nn  # noqa: E402  (needs the ops loaded)
from .propagate import Propagate  # noqa: E402
from .propagate import dropout_mask  # noqa: E402  (its arguments checked)
from .info import backends, device_status  # noqa: E402
from .step import apply_gradients  # noqa: E402

__all__ = ["__version__", "backends", "device_status", "Packed", "LabelledTree", "pack_trees",
           "parse_sst", "pack_sst", "pack_lattices", "pack_dags", "pack_edges", "concat_packed",
           "collate", "Propagate", "dropout_mask", "apply_gradients", "run_cell", "prepare",
           "prepare_stats", "prefetch", "cells", "weight_shapes", "set_plan_cache",
           "plan_cache_stats", "set_check_numerics", "nn"]
