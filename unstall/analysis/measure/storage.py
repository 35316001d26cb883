"""Storage as the runs need it: files dropped from the page cache (cold), and an unstall
`Cache` filled with exactly the steps' samples before timing (cached)."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any


def evict(dataset: Any, indices: Sequence[int]) -> bool:
    """Drop these samples' files from the page cache (no root needed); False if not files."""
    store = getattr(dataset, "store", None)
    while store is not None and not hasattr(store, "drop_page_cache"):
        store = getattr(store, "inner", None)
    if store is None or not hasattr(dataset, "key"):
        return False
    store.drop_page_cache([dataset.key(i) for i in indices])
    return True


@contextlib.contextmanager
def filled_cache(dataset: Any, indices: Sequence[int], sample_bytes: float) -> Iterator[Any]:
    """An unstall `Cache` holding exactly ``indices`` (filled before timing); removed after."""
    from unstall.cache import Cache

    store = getattr(dataset, "store", None)
    bypass = getattr(store, "bypass_page_cache", None)
    capacity = int(sample_bytes * len(indices) * 1.5) + (8 << 20)
    name = f"analyze-{os.getpid()}-{random.getrandbits(32):08x}"
    cache = Cache(capacity, name=name, keep=0)  # the analyzer's own: never kept for a next job
    try:
        layer = cache.bind(dataset)
        for i in range(0, len(indices), 64):
            layer.fetch(dataset, list(indices[i : i + 64]))
        yield cache
    finally:
        cache.close()
        if bypass is not None:
            store.bypass_page_cache = bypass
