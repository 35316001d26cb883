"""Shuffle modes for sharded data: a full permutation, or a shard-window shuffle.

``full``: the loader's own permutation of every sample (unstall's default
order): best mixing; each batch touches almost every shard, so it wants all
shards local (the default when they fit the disk budget).

``window``: each epoch a new permutation of the shards (from seed and epoch),
cut into windows of ``W`` consecutive shards; the samples of a window are
permuted together and windows follow each other. A batch then touches at most
about ``W`` shards (plus one at a window boundary), so only ``W`` shards need be
local at a time; mixing is limited to a window (as Mosaic's block shuffles are).
The order is a pure function of (seed, epoch): exactly once and exact resume hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

MODES = ("full", "window")


def window_order(shard_first: np.ndarray, window: int, *, seed: int, epoch: int) -> np.ndarray:
    """Every sample once: shards permuted, samples permuted within windows of ``window`` shards.

    ``shard_first``: sample number where each shard starts, plus the total at the end.
    """
    n_shards = len(shard_first) - 1
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x5A4D])))
    shard_order = rng.permutation(n_shards)
    parts = []
    for w in range(0, n_shards, window):
        members = [
            np.arange(shard_first[s], shard_first[s + 1], dtype=np.int64)
            for s in shard_order[w : w + window]
        ]
        samples = np.concatenate(members) if members else np.zeros(0, np.int64)
        parts.append(rng.permutation(samples))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def first_epoch_windows(
    n_shards: int,
    window: int,
    *,
    seed: int,
    epoch: int,
    shard_first: Callable[[int], np.ndarray],
) -> Iterator[np.ndarray]:
    """Every sample once, window by window, for an epoch that starts while the shards still
    arrive: shards in their (key) order, cut into windows of 1, 2, 4 ... ``window`` shards
    whose samples are permuted together. The first batch needs one shard; each window's
    shards land (and are indexed) while the windows before it are read.

    ``shard_first(end)``: where each shard starts for at least shards ``[0, end)`` and
    ``end`` itself (waits, while shards are still indexed, until they are). Shards go in
    key order because a sample's number is only known once the shards before it are
    indexed."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x1F57])))
    w, size = 0, 1
    while w < n_shards:
        end = min(n_shards, w + size)
        first = shard_first(end)
        yield rng.permutation(np.arange(first[w], first[end], dtype=np.int64))
        w, size = end, min(window, 2 * size)


def first_epoch_order(shard_first: np.ndarray, window: int, *, seed: int, epoch: int) -> np.ndarray:
    """`first_epoch_windows` as one array, for a dataset whose every shard is indexed."""
    parts = list(
        first_epoch_windows(
            len(shard_first) - 1,
            window,
            seed=seed,
            epoch=epoch,
            shard_first=lambda _end: shard_first,
        )
    )
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class Streamed:
    """An epoch's order given window by window (``chunks()``), while the shards are still
    indexed: the loader cuts it into batches as it comes (`unstall.loader.sampling`)."""

    def __init__(self, chunks: Callable[[], Iterator[np.ndarray]]):
        self._chunks = chunks

    def chunks(self) -> Iterator[np.ndarray]:
        return self._chunks()


def shards_in_order(sample_shard: np.ndarray, samples: np.ndarray) -> list[int]:
    """The shards of ``samples`` in the order they are first needed."""
    shards = sample_shard[samples]
    _, first = np.unique(shards, return_index=True)
    return shards[np.sort(first)].tolist()


def describe_first(window: int, n_shards: int) -> str:
    """What epoch 0 gives up when it starts while the shards arrive, for `stats()`."""
    w = min(window, n_shards)
    return (
        f"epoch 0 in shard-window order: shards in key order (as they are downloaded and "
        f"indexed), samples permuted within windows of 1, 2, 4 ... {w} of {n_shards} shards "
        "(training starts when the first shard lands; epoch 0's mixing is limited to a "
        "window and its shard sequence is not shuffled); the full permutation from epoch 1"
    )


def describe(mode: str, window: int, n_shards: int) -> str:
    """What the shuffle mode does and costs, for `stats()`."""
    if mode == "full":
        return (
            "full: the loader's permutation of all samples each epoch (any sample anywhere; "
            "each batch touches most shards, so shards are read whole to local disk)"
        )
    w = min(window, n_shards)
    return (
        f"window: shards in a new order each epoch, samples permuted within windows of {w} "
        f"of {n_shards} shards (a batch touches at most ~{w + 1} shards; mixing limited "
        "to a window)"
    )
