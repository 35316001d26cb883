"""An epoch's order given in chunks, for a dataset whose length is not known yet.

A remote tar dataset indexed as its shards land (`unstall.data.shards`) knows its
sample count only once every shard is read; its first epoch comes window by window
(``epoch_order`` gives an object with ``chunks()``). `streamed_batches` cuts such an
order into exactly the batches `OrderSpec.batches` would give over the whole order,
so exactly once and exact resume hold whether the order streamed or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


def known_len(dataset: Any) -> int:
    """``len(dataset)``, or -1 while a dataset says its length is not known yet
    (``length_known`` False: asking would first index every shard)."""
    return len(dataset) if getattr(dataset, "length_known", True) else -1


def streamed_batches(chunks: Iterator[np.ndarray], spec: Any, start: int) -> Iterator[list[int]]:
    """The batches of an order given in chunks, from batch ``start`` on: exactly those of
    `OrderSpec.batches` over the whole order (every ``world_size``-th index from ``rank``,
    padded at the end with the order's first indices; the last batch short or dropped)."""
    rank, world, bs = spec.rank, spec.world_size, spec.batch_size
    head: list[int] = []  # the order's first ``world`` indices: the padding
    pos = b = 0
    batch: list[int] = []
    for chunk in chunks:
        chunk = np.asarray(chunk, dtype=np.int64)
        if len(head) < world:
            head.extend(chunk[: world - len(head)].tolist())
        for i in chunk[(rank - pos) % world :: world].tolist():
            batch.append(i)
            if len(batch) == bs:
                if b >= start:
                    yield batch
                b, batch = b + 1, []
        pos += len(chunk)
    if world > 1 and pos:
        pad = -pos % world
        for k, i in enumerate(np.resize(np.asarray(head, np.int64), pad).tolist()):
            if (pos + k) % world == rank:
                batch.append(i)
                if len(batch) == bs:
                    if b >= start:
                        yield batch
                    b, batch = b + 1, []
    if batch and not spec.drop_last and b >= start:
        yield batch
