"""Cache capacity: bytes, a size string ("8GiB") or a fraction of the dataset, resolved to bytes."""

from __future__ import annotations

import math
import os
from typing import Any

from unstall.sizes import parse_size

#: Keys whose sizes are looked at to estimate a dataset's total bytes.
SIZE_SAMPLE = 256


def parse_capacity(value: Any) -> int | float:
    """Check a capacity and return it as bytes (int) or a dataset fraction (float in (0, 1]).

    Raises:
        ValueError: naming the value and the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(_bad(value, "a bool is not a capacity"))
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(_bad(value, "bytes must be > 0"))
        return value
    if isinstance(value, float):
        if not (0.0 < value <= 1.0) or math.isnan(value):
            raise ValueError(_bad(value, "a float is a fraction of the dataset, in (0, 1]"))
        return value
    if isinstance(value, str):
        try:
            size = parse_size(value)
        except ValueError:
            raise ValueError(_bad(value, "cannot read this size")) from None
        if size <= 0:
            raise ValueError(_bad(value, "size must be > 0 bytes"))
        return size
    raise ValueError(_bad(value, f"type {type(value).__name__} is not a capacity"))


def _bad(value: Any, why: str) -> str:
    return (
        f"capacity={value!r}: {why}; pass bytes (int > 0), a size string such as '8GiB' "
        "or '500MB', or a fraction of the dataset such as 0.5"
    )


def resolve_capacity(capacity: int | float, dataset: Any) -> tuple[int, int]:
    """``(capacity_bytes, estimated_dataset_bytes)`` for ``dataset``.

    A fraction is of the dataset's estimated total bytes: the mean size of up to
    `SIZE_SAMPLE` evenly spaced keys times ``len(dataset)`` (exact when the
    dataset has at most that many samples). Sizes come from the dataset's ``raw_sizes``
    where it has one (exact, no read), ``os.stat`` when the store maps keys to local
    files, else from fetching a few samples.
    """
    total = estimate_dataset_bytes(dataset)
    if isinstance(capacity, float):
        return max(1, math.ceil(capacity * total)), total
    return int(capacity), total


def estimate_dataset_bytes(dataset: Any) -> int:
    """Estimated total raw bytes of ``dataset`` (see `resolve_capacity`)."""
    n = len(dataset)
    if n == 0:
        return 0
    sized = getattr(dataset, "raw_sizes", None)
    if callable(sized):  # known without a read (shards: from their index): exact
        return int(sized(range(n)).sum())
    store = local_store(getattr(dataset, "store", None))
    if store is not None:
        picks = _spread(n, SIZE_SAMPLE)
        sizes = [os.stat(store.path(dataset.key(i))).st_size for i in picks]
    else:
        picks = _spread(n, 16)
        sizes = _listed_sizes(dataset, picks)
        if sizes is None:
            sizes = [len(raw) for raw in dataset.fetch(picks)]
    return math.ceil(sum(sizes) / len(sizes) * n)


def _listed_sizes(dataset: Any, picks: list[int]) -> list[int] | None:
    """Sizes of ``picks`` from the listing the store made (no request), or None."""
    listed = getattr(getattr(dataset, "store", None), "listed", None)
    listing = listed() if callable(listed) else None
    if listing is None:
        return None
    sizes = listing.sizes_of([dataset.key(i) for i in picks])
    return None if (sizes < 0).any() else sizes.tolist()


def _spread(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    return sorted({i * n // k for i in range(k)})


def local_store(store: Any) -> Any:
    """The innermost store that maps keys to files (has ``path``), following ``inner`` links."""
    seen = 0
    while store is not None and seen < 8:
        if callable(getattr(store, "path", None)):
            return store
        store = getattr(store, "inner", None)
        seen += 1
    return None


def format_bytes(size: float) -> str:
    """``1536`` -> ``'1.5 KiB'``: sizes in messages and tables."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def entry_bytes(mean_bytes: float) -> int:
    """The bytes a cache-point segment plans per entry of about ``mean_bytes`` (room for
    larger ones): what the segment is sized by and what the analyzer prices its room with."""
    return int(mean_bytes * 1.25) + 4096
