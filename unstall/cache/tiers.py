"""Binding the disk tier, sizing it, and the loader's default: a disk tier for remote datasets.

`bind_cache` is what `unstall.DataLoader` calls with its ``cache=`` argument:
an object with ``bind`` is bound; ``False`` means no cache; ``None`` (not given)
means a disk tier (``Cache(disk="auto")``) when the dataset's store is remote
(``s3://``, ``http(s)://``: no local files behind it), and no cache for local
datasets, whose files the page cache and the disk already hold.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import warnings
from typing import Any

from unstall.cache import disk_tier, segment
from unstall.cache.capacity import _local_store, estimate_dataset_bytes, format_bytes
from unstall.cache.layer import CacheLayer
from unstall.cache.tiered import DiskFullWarning, TieredLayer

log = logging.getLogger("unstall")

#: "auto" takes at most this share of the free space of the cache directory's disk ...
AUTO_SHARE = 0.5
#: ... and always leaves this much free.
KEEP_FREE = 10 << 30
#: A disk tier smaller than this is not worth a file: none is made.
MIN_DISK = 1 << 20
_announced: set[str] = set()


def free_bytes(directory: str) -> int:
    """Free bytes on the disk that holds ``directory`` (or its nearest existing parent)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return segment.free_bytes(path)


def auto_disk_bytes(dataset_bytes: int) -> int:
    """min(dataset + 10 %, AUTO_SHARE of the free space, free space - KEEP_FREE), >= 0."""
    free = free_bytes(disk_tier.cache_dir())
    room = max(0, min(int(free * AUTO_SHARE), free - KEEP_FREE))
    return min(dataset_bytes + dataset_bytes // 10 + MIN_DISK, room)


def bind_tiers(
    ram: CacheLayer | None,
    disk: int | float | str,
    dataset: Any,
    fingerprint: str,
    name: str | None,
    total: int | None = None,
) -> TieredLayer:
    """Open the disk tier of ``dataset`` under the RAM layer ``ram`` (None: no RAM tier)."""
    if total is None:
        try:
            total = estimate_dataset_bytes(dataset)
        except Exception:  # a bad key or a slow store: errors belong to the epoch that meets them
            if disk != "auto":
                raise
            total = 1 << 62  # unknown: the free space decides
    if disk == "auto":
        capacity = auto_disk_bytes(total)
    elif isinstance(disk, float):
        capacity = max(1, int(disk * total))
    else:
        capacity = min(int(disk), total + total // 10 + MIN_DISK)  # no need to reserve more
    seg_name = segment.segment_name(fingerprint, "noevict", name)
    group = ram.group if ram is not None else random.getrandbits(62) + 1
    args: dict[str, Any] = dict(name=seg_name, group=group, owner=os.getpid())
    if capacity < (MIN_DISK if disk == "auto" else 1):
        reason = (
            f"no disk tier: {format_bytes(capacity)} would fit under {disk_tier.cache_dir()} "
            f"(free {format_bytes(free_bytes(disk_tier.cache_dir()))})"
        )
        return TieredLayer(ram, path=None, capacity=0, how="off", reason=reason, **args)
    n = len(dataset)
    try:
        index, slot, fd, how = disk_tier.open_tier(seg_name, n, capacity, fingerprint, total, group)
    except OSError as exc:
        if not segment.is_no_space(exc):
            raise
        reason = f"cannot create the disk cache in {disk_tier.tier_dir()}: {exc}; no disk tier"
        warnings.warn(reason, DiskFullWarning, stacklevel=4)
        return TieredLayer(ram, path=None, capacity=0, how="off", reason=reason, **args)
    path = disk_tier.index_path(seg_name)
    layer = TieredLayer(ram, path=path, capacity=capacity, how=how, **args)
    layer._adopt(index, slot, fd)
    import weakref

    weakref.finalize(layer, _close_layer, layer.__dict__)
    return layer


def _close_layer(state: dict[str, Any]) -> None:
    layer = TieredLayer.__new__(TieredLayer)
    layer.__dict__ = state
    layer.close()


def is_remote(dataset: Any) -> bool:
    """True if the dataset reads from a store with no local files behind it (``s3://``...)."""
    store = getattr(dataset, "store", None)
    return store is not None and _local_store(store) is None


def bind_cache(cache: Any, dataset: Any) -> Any:
    """The loader's fetch layer for its ``cache=`` argument (see the module notes)."""
    if cache is False:
        return None
    if isinstance(cache, (str, int, float)) and not isinstance(cache, bool):
        from unstall.cache import Cache

        cache = Cache(cache)  # a RAM tier's size, as the config file's "cache" key takes it
    if cache is not None:
        if not callable(getattr(cache, "bind", None)):
            raise TypeError(
                f"cache={cache!r}: pass unstall.Cache(...), a RAM size such as '16GiB', "
                "None (a disk tier for remote data) or False (no cache)"
            )
        return cache.bind(dataset)
    if not is_remote(dataset) or not all(
        callable(getattr(dataset, a, None)) for a in ("fetch", "key", "fingerprint")
    ):
        return None
    from unstall.cache import Cache
    from unstall.cache.layer import item_versions

    try:
        item_versions(dataset)  # the listing that gives each item's version
    except Exception as exc:  # a store that fails now fails the epoch, naming the sample
        _say(
            f"unstall: no disk cache for {getattr(dataset.store, 'url', 'the dataset')}: "
            f"listing the objects' versions failed ({type(exc).__name__}: {exc})"
        )
        return None
    layer = Cache(disk="auto").bind(dataset)
    _announce(layer, dataset)
    return layer


def _announce(layer: TieredLayer, dataset: Any) -> None:
    """One line per dataset and process: where the default disk tier is, its size, how to change."""
    if layer.name in _announced:
        return
    _announced.add(layer.name)
    url = getattr(getattr(dataset, "store", None), "url", "the dataset")
    if layer.path is None:
        line = f"unstall: {layer.reason} for {url} (epoch 2 fetches from storage again)"
    else:
        line = (
            f"unstall: caching {url} on local disk in {disk_tier.tier_dir()}, up to "
            f"{format_bytes(layer.capacity)} (epoch 2 reads it from there); change with "
            "cache=unstall.Cache(ram=..., disk=...) or $UNSTALL_CACHE_DIR, turn off with "
            "cache=False"
        )
    _say(line)


def _say(line: str) -> None:
    if logging.getLogger("unstall").hasHandlers():
        log.info(line)
    else:  # logging not set up: the line must still be seen once
        print(line, file=sys.stderr, flush=True)
