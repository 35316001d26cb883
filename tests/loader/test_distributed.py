"""Ranks started as torchrun would (env vars + gloo) shard each epoch without overlap."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests import forked
from unstall.testing.ports import free_port

_RANK = """
import json, os, torch, torch.distributed as dist, unstall
dist.init_process_group("gloo")
class D(torch.utils.data.Dataset):
    def __len__(self): return 90
    def __getitem__(self, i): return i
rank, world = dist.get_rank(), dist.get_world_size()
loader = unstall.DataLoader(
    D(), batch_size=4, shuffle=True, seed=7, num_workers=1, rank=rank, world_size=world
)
loader.set_epoch(2)
ids = [i for b in loader for i in b.tolist()]
# Without rank/world_size, as torch's loader, every rank sees the whole dataset.
whole = [i for b in unstall.DataLoader(D(), batch_size=4) for i in b.tolist()]
print(json.dumps({"rank": rank, "world": loader.world_size, "ids": ids, "whole": whole}))
dist.destroy_process_group()
"""


def test_ranks_from_torch_distributed_split_the_epoch(tmp_path: Path):
    world = 3
    port = free_port()
    # each rank a process of its own, forked from one that imported torch and unstall once
    with forked.server((*forked.PRELOAD, "torch.distributed")) as ctx:
        procs = _ranks(ctx, world, port, tmp_path)
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs), [p.output()[1][-2000:] for p in procs]
    _check(outs, world)


def _ranks(ctx, world: int, port: int, out: Path) -> list[forked.Forked]:
    """Rank ``0..world-1`` of the script, with torchrun's environment, started."""
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        output = out / f"rank-{rank}"
        procs.append(forked.Forked(ctx, ["-c", _RANK], env=env, cwd=out, output=output, text=True))
    return procs


def _check(outs: list[dict], world: int) -> None:
    assert sorted(o["rank"] for o in outs) == [0, 1, 2]
    assert all(o["world"] == world for o in outs)
    union = [i for o in outs for i in o["ids"]]
    assert sorted(union) == list(range(90))  # 90 = 3 x 30: no padding, no overlap
