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


def first_epoch_order(shard_first: np.ndarray, window: int, *, seed: int, epoch: int) -> np.ndarray:
    """Every sample once, for an epoch that starts while the shards still arrive: shards
    permuted (the order they are downloaded in), cut into windows of 1, 2, 4 ... ``window``
    shards whose samples are permuted together. The first batch needs one shard; each
    window's shards land while the windows before it are read."""
    n_shards = len(shard_first) - 1
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x1F57])))
    shard_order = rng.permutation(n_shards)
    parts, w, size = [], 0, 1
    while w < n_shards:
        members = [
            np.arange(shard_first[s], shard_first[s + 1], dtype=np.int64)
            for s in shard_order[w : w + size]
        ]
        parts.append(rng.permutation(np.concatenate(members)))
        w += size
        size = min(window, 2 * size)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def shards_in_order(sample_shard: np.ndarray, samples: np.ndarray) -> list[int]:
    """The shards of ``samples`` in the order they are first needed."""
    shards = sample_shard[samples]
    _, first = np.unique(shards, return_index=True)
    return shards[np.sort(first)].tolist()


def describe_first(window: int, n_shards: int) -> str:
    """What epoch 0 gives up when it starts while the shards arrive, for `stats()`."""
    w = min(window, n_shards)
    return (
        f"epoch 0 in shard-window order: shards in download order, samples permuted within "
        f"windows of 1, 2, 4 ... {w} of {n_shards} shards (training starts when the first "
        f"shard lands; epoch 0's mixing is limited to a window); the full permutation from "
        "epoch 1"
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
