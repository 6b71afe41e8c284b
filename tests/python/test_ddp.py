"""DistributedDataParallel: 2 processes (gloo, CPU), each with half of a mini-batch, take one SGD
step; the parameters equal one single-process step on the whole mini-batch."""
import os
import random
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import edbatch

WORLD = 2


def make_model():
    torch.manual_seed(7)
    return torch.nn.ModuleDict({"tree": edbatch.nn.TreeLSTM(40, 6, 8, threads=1),
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
        h, _ = self.model["tree"](packed)
        return self.model["out"](h)


def loss_of(module, packed):
    return torch.nn.functional.cross_entropy(module(packed), packed.labels, reduction="sum")


def worker(rank, store_path, result_path):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=WORLD)
    model = torch.nn.parallel.DistributedDataParallel(Classifier(make_model()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    loss_of(model, shards()[rank]).backward()  # DDP averages the two shards' gradients
    opt.step()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()},
                   result_path)
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_step_equals_single_process_step():
    with tempfile.TemporaryDirectory() as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.pt")
        mp.spawn(worker, args=(store, result), nprocs=WORLD, join=True)
        distributed = torch.load(result)

    single = Classifier(make_model())
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    opt.zero_grad()
    whole = edbatch.concat_packed(shards())
    (loss_of(single, whole) / WORLD).backward()
    opt.step()
    before = Classifier(make_model()).state_dict()
    for name, value in single.state_dict().items():
        assert not torch.equal(value, before[name]), f"{name} did not change"
        torch.testing.assert_close(distributed[name], value, rtol=1e-5, atol=1e-6, msg=name)
