"""Per-batch randomness: a batch's augmentation depends only on (seed, epoch, batch index).

Not on which worker, process or job prepares it, so ``num_workers`` does not change
what a run sees, and jobs of a coordinated group can share one prepared batch.
Before preparing a tagged batch the task bumps a generation counter that
`ImagePipeline` watches to rebuild its stream and, for batches of unstall's own order
(``seed=``, shards, coordination; ``reseed``), reseeds torch, numpy and `random` too.
A loader that follows torch's order leaves those alone: a plain dataset then sees
torch's per-worker seeding (``base_seed + worker_id``, or its ``worker_init_fn``'s).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data

_current: list[Any] = [None, 0]  # [this batch's seed or None, generation]


def batch_seed(*, seed: int, epoch: int, batch: int, rank: int = 0) -> int:
    """The seed of batch ``batch`` of ``epoch`` (and rank): a pure function of them."""
    state = np.random.SeedSequence([seed, epoch, batch, rank, 0xBA7C]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def seed_batch(task: Any) -> None:
    """Set the batch seed for a task tagged with ``key`` (untagged: no-op); with its
    ``reseed`` (the default) reseed torch, numpy and `random` from it as well."""
    if type(task) is tuple:
        task = task[0]
    key = getattr(task, "key", None)
    if key is None:
        return
    s = batch_seed(seed=key[0], epoch=key[1], batch=key[2], rank=key[3])
    if getattr(task, "reseed", True):
        # the CPU generator only: ``torch.manual_seed`` also queues a lazy CUDA seeding that
        # formats a stack trace each call (0.25 ms a batch) and, with no workers, would
        # reseed the training loop's CUDA generators, which ``fork_rng(devices=[])`` keeps
        torch.default_generator.manual_seed(s)
        random.seed(s)
        np.random.seed(s % 2**32)
    _current[0] = s
    _current[1] += 1


@contextlib.contextmanager
def batch_rng(task: Any) -> Iterator[None]:
    """Seed for a tagged task; in the main process (no worker) restore the caller's RNGs after,
    so a training loop's own random streams are untouched by ``num_workers=0`` loading."""
    if type(task) is tuple:  # (indices, slot) for zero-copy workers
        task = task[0]
    if getattr(task, "key", None) is None:
        yield
        return
    in_worker = torch.utils.data.get_worker_info() is not None
    if in_worker or not getattr(task, "reseed", True):  # torch's order: the RNGs stay torch's
        seed_batch(task)
        try:
            yield
        finally:
            if not in_worker:
                _current[0] = None
        return
    py, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            seed_batch(task)
            yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        _current[0] = None


def current() -> tuple[int | None, int]:
    """(the seed of the batch being prepared or None, a counter bumped at each batch)."""
    return _current[0], _current[1]
