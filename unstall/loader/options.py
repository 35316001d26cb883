"""The loader's option checks: every bad value or combination rejected up front, named.

As torch's `DataLoader.__init__` does: each error names the option, its value
and what to do instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data


def resolve_seed(seed: int | None, generator: torch.Generator | None) -> int:
    if seed is not None:
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative int")
        return seed
    if generator is not None:
        return int(torch.randint(0, 2**62, (), generator=generator))
    return 0


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass both rank and world_size or neither; got {rank=}, {world_size=}")
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    return rank, world_size


def validate(dataset: Any, **o: Any) -> None:
    """Reject bad option combinations up front, naming option and value (as torch does)."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise TypeError(
            f"unstall.DataLoader takes map-style datasets; {type(dataset).__name__} is an "
            "IterableDataset: use torch.utils.data.DataLoader for it"
        )
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TypeError(f"dataset {type(dataset).__name__} needs __len__ and __getitem__")
    if o["num_workers"] < 0:
        raise ValueError(f"num_workers={o['num_workers']} must be >= 0; use 0 to load inline")
    if o["timeout"] < 0:
        raise ValueError(f"timeout={o['timeout']} must be >= 0")
    if o["batch_sampler"] is not None:
        if o["batch_size"] != 1 or o["shuffle"] or o["sampler"] is not None or o["drop_last"]:
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                "and drop_last"
            )
    elif o["batch_size"] is None:
        if o["drop_last"]:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually "
                "exclusive with drop_last"
            )
    elif not isinstance(o["batch_size"], int) or o["batch_size"] < 1:
        raise ValueError(f"batch_size={o['batch_size']!r} must be a positive int")
    if o["sampler"] is not None and o["shuffle"]:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if o["num_workers"] == 0:
        if o["prefetch_factor"] is not None:
            raise ValueError(
                f"prefetch_factor={o['prefetch_factor']} needs num_workers > 0 (workers prefetch)"
            )
        if o["persistent_workers"]:
            raise ValueError("persistent_workers option needs num_workers > 0")
    if len(dataset) == 0:
        raise ValueError(f"dataset {type(dataset).__name__} is empty: nothing to load")
