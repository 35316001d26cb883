"""Opening a bind's tiers: the RAM tier's segment (shrunk to the free shared memory) and the
disk tier's files (sized "auto" from the free disk), each with the reason when it is off.

The one place a tier adopts the mapping made for it in the binding process (workers
map their own, `unstall.cache.tier.MappedTier.mapped`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from unstall.cache import disk_files
from unstall.cache.capacity import estimate_dataset_bytes, format_bytes, resolve_capacity
from unstall.cache.disk_tier import DiskFullWarning, DiskTier
from unstall.cache.policy import policy_named
from unstall.cache.ram_tier import RamTier
from unstall.cache.shm import keep, lifecycle, segment
from unstall.cache.shm.index import Layout
from unstall.machine import SHM_OPEN_MARGIN

#: Bytes of shared memory left free when the cache is shrunk to fit (the machine's named
#: margin for opening a tier, `unstall.machine.SHM_OPEN_MARGIN`).
SHM_MARGIN = SHM_OPEN_MARGIN
#: Below this many bytes of data a shrunk cache is not worth having: run uncached.
MIN_CAPACITY = 1 << 20


class SharedMemoryWarning(UserWarning):
    """Shared memory could not hold the cache as asked: it runs smaller, shared, or off."""


def open_ram(
    dataset: Any,
    capacity: int | float,
    *,
    policy: str,
    fingerprint: str,
    name: str | None,
    group: int,
    keep_s: float,
) -> tuple[RamTier, int]:
    """The RAM tier of ``dataset`` (off, with its reason, if shared memory cannot hold it)
    and the dataset's estimated bytes."""
    n = len(dataset)
    capacity, total = resolve_capacity(capacity, dataset)
    capacity = min(capacity, total + total // 10 + MIN_CAPACITY)  # no need to reserve more
    page = policy_named(policy).page_size(total / n)
    seg_name = segment.segment_name(fingerprint, policy, name)
    path = segment.segment_path(seg_name)
    args: dict[str, Any] = dict(
        name=seg_name, policy=policy, group=group, owner=os.getpid(), keep_s=keep_s
    )
    layout = Layout(n_items=n, capacity=max(capacity, page), policy=policy, page_size=page)
    keep.sweep(need_bytes=0 if os.path.exists(path) else layout.file_size + SHM_MARGIN)
    # looked at again: the sweep may have released it
    fitted, reason = (layout, "") if os.path.exists(path) else _fit_to_free_space(layout, seg_name)
    tier = None
    if fitted is not None:
        tier, reason = _open(path, fitted, fingerprint, total, reason, args)
    if tier is None:
        return RamTier(path=None, capacity=0, how="off", reason=reason, **args), total
    _bypass_page_cache(getattr(dataset, "store", None))  # our cache holds the data now
    return tier, total


def _open(
    path: str, layout: Layout, fingerprint: str, total: int, reason: str, args: dict[str, Any]
) -> tuple[RamTier | None, str]:
    """Open or create the segment and wrap it in a tier; ``(None, why)`` if no space."""
    name = args["name"]
    try:
        cache, slot, how = lifecycle.open_or_create(
            path, layout, fingerprint, total, group=args["group"]
        )
    except OSError as exc:
        if not segment.is_no_space(exc):
            raise
        reason = (
            f"cannot reserve {format_bytes(layout.file_size)} in {segment.shm_dir()} "
            f"for cache {name}: {exc}; running uncached"
        )
        warnings.warn(reason, SharedMemoryWarning, stacklevel=5)
        return None, reason
    if how == "attached" and cache.capacity != layout.capacity:
        reason = (
            f"cache {name} is already open with capacity {format_bytes(cache.capacity)} "
            f"({cache.capacity} bytes), not the {layout.capacity} bytes asked for: "
            "sharing it as it is"
        )
        warnings.warn(reason, SharedMemoryWarning, stacklevel=5)
    tier = RamTier(path=path, capacity=cache.capacity, how=how, reason=reason, **args)
    tier.adopt(cache, slot)
    return tier, reason


def _fit_to_free_space(layout: Layout, seg_name: str) -> tuple[Layout | None, str]:
    """Shrink ``layout`` to what shared memory can hold (warning), or None if nothing fits."""
    directory = segment.shm_dir()
    free = segment.free_bytes(directory)
    if layout.file_size + SHM_MARGIN <= free:
        return layout, ""
    fit = policy_named(layout.policy).fit(free - SHM_MARGIN - layout.overhead(), layout.page_size)
    want = format_bytes(layout.file_size)
    if fit < MIN_CAPACITY:
        reason = (
            f"cache {seg_name} needs {want} ({layout.file_size} bytes) of shared memory but "
            f"{directory} has {format_bytes(free)} ({free} bytes) free: running uncached; "
            "enlarge it (docker run --shm-size, or mount -o remount,size=... /dev/shm) or "
            "lower the capacity"
        )
        warnings.warn(reason, SharedMemoryWarning, stacklevel=5)
        return None, reason
    reason = (
        f"cache {seg_name} needs {want} ({layout.file_size} bytes) of shared memory but "
        f"{directory} has {format_bytes(free)} ({free} bytes) free: caching "
        f"{format_bytes(fit)} instead; enlarge it (docker run --shm-size) or lower the capacity"
    )
    warnings.warn(reason, SharedMemoryWarning, stacklevel=5)
    return Layout(layout.n_items, fit, layout.policy, layout.page_size), reason


def _bypass_page_cache(store: Any) -> None:
    """Make local stores (also wrapped ones, via ``inner``) drop pages after reading, so
    memory does not hold the data twice."""
    for _ in range(8):
        if store is None:
            return
        if hasattr(store, "bypass_page_cache"):
            store.bypass_page_cache = True
        store = getattr(store, "inner", None)


def open_disk(
    disk: int | float | str,
    dataset: Any,
    *,
    fingerprint: str,
    name: str | None,
    group: int,
    total: int | None = None,
) -> DiskTier:
    """The disk tier of ``dataset`` (off, with its reason, if the disk cannot hold it)."""
    if total is None:
        try:
            total = estimate_dataset_bytes(dataset)
        except Exception:  # a bad key or a slow store: errors belong to the epoch that meets them
            if disk != "auto":
                raise
            total = 1 << 62  # unknown: the free space decides
    if disk == "auto":
        capacity = disk_files.auto_disk_bytes(total)
    elif isinstance(disk, float):
        capacity = max(1, int(disk * total))
    else:
        capacity = min(int(disk), total + total // 10 + disk_files.MIN_DISK)  # no need for more
    seg_name = segment.segment_name(fingerprint, "noevict", name)
    args: dict[str, Any] = dict(name=seg_name, group=group, owner=os.getpid())
    root = disk_files.cache_dir()
    if capacity < (disk_files.MIN_DISK if disk == "auto" else 1):
        reason = (
            f"no disk tier: {format_bytes(capacity)} would fit under {root} "
            f"(free {format_bytes(disk_files.free_bytes(root))})"
        )
        return DiskTier(path=None, capacity=0, how="off", reason=reason, **args)
    try:
        index, slot, fd, how = disk_files.open_tier(
            seg_name, len(dataset), capacity, fingerprint, total, group
        )
    except OSError as exc:
        if not segment.is_no_space(exc):
            raise
        reason = f"cannot create the disk cache in {disk_files.tier_dir()}: {exc}; no disk tier"
        warnings.warn(reason, DiskFullWarning, stacklevel=4)
        return DiskTier(path=None, capacity=0, how="off", reason=reason, **args)
    path = disk_files.index_path(seg_name)
    tier = DiskTier(path=path, capacity=capacity, how=how, **args)
    tier.adopt(index, slot, fd)
    return tier
