"""Changing a running epoch's worker pool between two batches, losing and repeating nothing.

The change is the resume mechanism applied in place (`DataLoader.start_epoch` with
``continues=``): the running torch iterator is ended after the last batch the loop took
(with a device stage: the last one pulled, the stage's batch ahead is kept), and a new
one, with the new worker count and prefetch, starts at exactly the next batch of the
same epoch. Tasks the old workers had prefetched but not handed over are dropped and
made again by the new pool; with ``seed=`` a batch's random draws follow ``(seed, epoch,
batch)``, so they come out the same. The old pool's zero-copy slots are retired
(unlinked: batches the loop still holds stay readable) and a pool sized for the new
prefetch depth is opened.

`TunedLoader` declares what the tuner calls on the loader it tunes: its one public entry
for starting an epoch at a position, `unstall.DataLoader.start_epoch`.
"""

from __future__ import annotations

from typing import Any, Protocol


class TunedLoader(Protocol):
    """The loader a tuner changes the pool of (`unstall.DataLoader` is one)."""

    dataset: Any

    def start_epoch(self, *, workers: int | None, prefetch: int | None, continues: Any) -> Any:
        """Continue epoch iterator ``continues`` from its next batch on a pool of ``workers``
        x ``prefetch`` (the pool change); see `unstall.DataLoader.start_epoch`."""


def can_restart(it: Any) -> bool:
    """Whether ``it`` has batches left to make (no change is worth it otherwise)."""
    return bool(it.has_more())


def restart_pool(loader: TunedLoader, it: Any, workers: int, prefetch: int) -> Any:
    """Continue ``it``'s epoch on a new pool of ``workers`` x ``prefetch`` (its old workers
    stop); returns the new torch iterator (its workers started)."""
    loader.start_epoch(continues=it, workers=workers, prefetch=prefetch)
    return it.workers_iter
