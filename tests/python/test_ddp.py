"""DistributedDataParallel: 2 processes, each with half of a mini-batch, take one SGD step; the
parameters equal one single-process step on the whole mini-batch. With a built-in cell and with
a user cell (edbatch.nn.Propagate), on the CPU (gloo) and, with two GPUs, on CUDA (NCCL)."""
import os
import random
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import edbatch

WORLD = 2


class UserCell(torch.nn.Module):
    """A Child-Sum style node cell: (h, c) from x and the children's summed (h, c)."""

    def __init__(self, d, h):
        super().__init__()
        self.W, self.U = torch.nn.Linear(d, 4 * h), torch.nn.Linear(h, 4 * h, bias=False)

    def forward(self, x, message):
        h, c = message
        i, o, u, f = (self.W(x) + self.U(h)).chunk(4, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f) * c
        return torch.sigmoid(o) * torch.tanh(c), c


def make_model(kind="builtin"):
    torch.manual_seed(7)
    if kind == "builtin":
        return torch.nn.ModuleDict({"tree": edbatch.nn.TreeLSTM(40, 6, 8, threads=1),
                                    "out": torch.nn.Linear(8, 5)})
    return torch.nn.ModuleDict({"embed": torch.nn.Embedding(40, 6),
                                "tree": edbatch.nn.Propagate(UserCell(6, 8), state_size=(8, 8),
                                                             threads=1),
                                "out": torch.nn.Linear(8, 5)})


def shards():
    rng = random.Random(3)

    def tree(leaves):
        if leaves == 1:
            return rng.randrange(40)
        cut = rng.randint(1, leaves - 1)
        return (tree(cut), tree(leaves - cut))

    trees = [tree(n) for n in [1, 4, 7, 2, 9, 3, 5, 6]]
    packs = []
    for part in (trees[:4], trees[4:]):
        p = edbatch.pack_trees(part)
        p.labels = torch.tensor([rng.randrange(5) for _ in range(p.num_nodes)])
        packs.append(p)
    return packs


class Classifier(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, packed):
        if "embed" in self.model:
            h, _ = self.model["tree"](packed, x=self.model["embed"](packed.input_ids))
        else:
            h, _ = self.model["tree"](packed)
        return self.model["out"](h)


def loss_of(module, packed):
    return torch.nn.functional.cross_entropy(module(packed), packed.labels, reduction="sum")


def worker(rank, store_path, result_path, kind, backend):
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=WORLD)
    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = Classifier(make_model(kind)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    loss_of(model, shards()[rank].to(device)).backward()  # DDP averages the shards' gradients
    opt.step()
    if rank == 0:
        torch.save({k: v.detach().cpu().clone() for k, v in model.module.state_dict().items()},
                   result_path)
    dist.barrier()
    dist.destroy_process_group()


def two_gpus():
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(
    not two_gpus(), reason="NCCL needs two GPUs"))])
@pytest.mark.parametrize("kind", ["builtin", "user"])
def test_ddp_step_equals_single_process_step(kind, backend):
    if backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with tempfile.TemporaryDirectory() as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.pt")
        mp.spawn(worker, args=(store, result, kind, backend), nprocs=WORLD, join=True)
        distributed = torch.load(result)

    single = Classifier(make_model(kind))
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    opt.zero_grad()
    whole = edbatch.concat_packed(shards())
    (loss_of(single, whole) / WORLD).backward()
    opt.step()
    before = Classifier(make_model(kind)).state_dict()
    for name, value in single.state_dict().items():
        assert not torch.equal(value, before[name]), f"{name} did not change"
        torch.testing.assert_close(distributed[name], value, rtol=1e-5, atol=1e-6, msg=name)


def replicated(module):
    """A replica as nn.DataParallel's replicate() makes one (every submodule replicated), without
    the GPUs it needs to copy the parameters."""
    replica = module._replicate_for_data_parallel()
    for name, param in module._parameters.items():
        setattr(replica, name, None if param is None else param.view_as(param))
    for name, child in module._modules.items():
        replica._modules[name] = replicated(child)
    return replica


@pytest.mark.parametrize("kind", ["builtin", "user"])
def test_data_parallel_is_refused(kind):
    """nn.DataParallel would hand each replica the whole packed batch: refused, naming DDP."""
    model = Classifier(make_model(kind))
    packed = shards()[0]
    loss_of(model, packed)  # the module itself runs, before and after a replica was made
    with pytest.raises(RuntimeError, match="nn.DataParallel.*use DistributedDataParallel"):
        loss_of(replicated(model), packed)
    loss_of(model, packed)
    if two_gpus():
        parallel = torch.nn.DataParallel(model.to("cuda:0"), device_ids=[0, 1])
        with pytest.raises(RuntimeError, match="nn.DataParallel"):
            loss_of(parallel, packed.to("cuda:0"))
