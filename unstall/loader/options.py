"""The loader's own options: the order's seed and this process's shard.

torch's options are checked by torch itself (a torch loader is built from the same
arguments first), so every bad value or combination gets torch's own error.
"""

from __future__ import annotations

import torch


def resolve_seed(seed: int | None, generator: torch.Generator | None, world_size: int) -> int:
    """The seed of unstall's order (asked for by ``seed``, shards or ``coordinate``):
    ``seed``; else drawn from ``generator``; else ``torch.initial_seed()`` (fixed by
    ``torch.manual_seed``, new in each unseeded run); with several ranks 0, as
    `DistributedSampler`, so shards agree. Without those options torch's order is followed."""
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative int")
        return seed
    if generator is not None:
        return int(torch.randint(0, 2**62, (), generator=generator))
    if world_size > 1:
        return 0
    return int(torch.initial_seed()) % 2**63


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's shard: explicit only (torch's DataLoader never shards by itself)."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass both rank and world_size or neither; got {rank=}, {world_size=}")
    if rank is None or world_size is None:
        return 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    return rank, world_size
