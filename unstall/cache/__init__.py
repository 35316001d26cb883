"""A node-wide cache of raw sample bytes in shared memory that fills once and never evicts.

With a fresh random order every epoch no cache of C items can hit more than C/N
of the time, and one that never evicts reaches exactly that (DESIGN.md section 2).
One segment per dataset is shared by every worker and every job of the user on
the node. Use it as ``unstall.DataLoader(ds, cache=unstall.Cache("8GiB"))``. A local-disk tier
can sit under it (``Cache(ram="8GiB", disk="500GiB")``, `unstall.cache.disk_tier`); remote
datasets get one by default (`unstall.cache.tiers.bind_cache`).
"""

from __future__ import annotations

import os
import random
import warnings
import weakref
from typing import Any

from unstall.cache import disk_tier, keep, lifecycle, segment
from unstall.cache.capacity import format_bytes, parse_capacity, resolve_capacity
from unstall.cache.keep import keep_seconds
from unstall.cache.layer import CacheLayer, item_versions
from unstall.cache.policy import page_size_for
from unstall.cache.shm_cache import POLICIES, Layout
from unstall.cache.tiers import DiskFullWarning, bind_tiers

#: Bytes of shared memory left free when the cache is shrunk to fit.
SHM_MARGIN = 16 << 20
#: Below this many bytes of data a shrunk cache is not worth having: run uncached.
MIN_CAPACITY = 1 << 20


class SharedMemoryWarning(UserWarning):
    """Shared memory could not hold the cache as asked: it runs smaller, shared, or off."""


class Cache:
    """Raw bytes of a dataset's samples in shared memory, and optionally on local disk below it.

    Args:
        capacity: size of the RAM (shared-memory) tier, the same as ``ram=``: bytes
            (int), a size string (``"8GiB"``, ``"500MB"``) or a float in
            (0, 1]: that fraction of the dataset's total bytes (estimated from the
            sizes of up to 256 evenly spaced samples times the sample count).
        ram: the RAM tier's size (another name for ``capacity``); None: no RAM tier.
        disk: the local-disk tier's size in the same forms, or ``"auto"`` (the dataset,
            at most half the free space of the cache directory's disk, keeping 10 GiB
            free); None: no disk tier. It lives in ``$UNSTALL_CACHE_DIR`` (default
            ``~/.cache/unstall``), is shared by the node's jobs, and outlives them.
        policy: ``"noevict"`` (default: fill until full, then keep) or ``"lru"``
            (evicts the least recently used; only for comparisons).
        name: segment name instead of the dataset fingerprint (two datasets with the
            same name must not be used at once).
        peers: `unstall.Peers()` to partition the cache across the job's nodes (each
            item cached by its owner node only, in its RAM tier or, with ``disk``, its
            disk tier; other nodes' items come from them).
        keep: seconds the RAM segment stays after its last user leaves, so the next
            job hits from its first epoch [Unit: second]; default
            ``$UNSTALL_CACHE_KEEP_S``, else 3600; 0 removes it at once. Kept segments
            are released earlier when memory is short (`unstall.cache.keep`).

    ``bind(dataset)`` (called by `unstall.DataLoader`) maps the segment, creating it
    if no process on the node has, and switches local stores to reading around
    the page cache, so memory does not hold the data twice. Every item is stored
    with the version of its source (``dataset.versions()``: size + mtime + inode of
    a local file, size + ETag of an S3 object), and an item whose source changed
    since is a miss (``stale`` in the stats), never served. When the last process
    using the segment closes (`close`, or at exit) it is kept ``keep`` seconds, then
    removed; one left by a killed job is reclaimed by the next.
    """

    def __init__(
        self,
        capacity: int | float | str | None = None,
        *,
        ram: int | float | str | None = None,
        disk: int | float | str | None = None,
        policy: str = "noevict",
        name: str | None = None,
        peers: Any = None,
        keep: float | None = None,
    ):
        if capacity is not None and ram is not None:
            raise ValueError(
                f"Cache({capacity!r}, ram={ram!r}): capacity is the RAM tier; give one"
            )
        ram = capacity if capacity is not None else ram
        if ram is None and disk is None:
            raise ValueError("Cache() needs a size: Cache('8GiB'), Cache(ram=..., disk=...)")
        self.capacity = parse_capacity(ram) if ram is not None else None
        self.disk = disk if disk is None or disk == "auto" else parse_capacity(disk)
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is unknown; use one of {sorted(POLICIES)}")
        if disk is not None and policy != "noevict":
            raise ValueError(f"policy={policy!r} evicts: a disk tier needs policy='noevict'")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"name={name!r} must be a non-empty string or None")
        self.policy = policy
        self.name = name
        self.peers = peers  # e.g. unstall.Peers(): a cache partitioned across nodes
        self.keep = keep if keep is None else keep_seconds(keep)  # None: the env at bind
        self._layers: list[Any] = []

    def __repr__(self) -> str:
        disk = f", disk={self.disk!r}" if self.disk is not None else ""
        return f"Cache({self.capacity!r}{disk}, policy={self.policy!r}, name={self.name!r})"

    def bind(self, dataset: Any) -> Any:
        """Open the dataset's segment (and disk tier) and return the fetch layer for a loader."""
        for attr in ("fetch", "key", "fingerprint"):
            if not callable(getattr(dataset, attr, None)):
                raise TypeError(
                    f"Cache needs a dataset with fetch(indices), key(i) and fingerprint(); "
                    f"{type(dataset).__name__} has no {attr}(): use unstall.FileDataset or "
                    "add these methods"
                )
        n = len(dataset)
        if n == 0:
            raise ValueError(f"dataset {type(dataset).__name__} is empty: nothing to cache")
        fingerprint = str(dataset.fingerprint())
        item_versions(dataset)  # here, once, before workers fork: they inherit the versions
        if self.capacity is None:  # disk tier only
            layer = bind_tiers(None, self.disk, dataset, fingerprint, self.name)
            return self._bound(layer, dataset)
        capacity, total = resolve_capacity(self.capacity, dataset)
        capacity = min(capacity, total + total // 10 + MIN_CAPACITY)  # no need to reserve more
        page = page_size_for(total / n) if self.policy == "lru" else 0
        seg_name = segment.segment_name(fingerprint, self.policy, self.name)
        path = segment.segment_path(seg_name)
        group = random.getrandbits(62) + 1
        layer_args = dict(
            name=seg_name,
            policy=self.policy,
            group=group,
            owner=os.getpid(),
            keep_s=keep_seconds(self.keep),
        )
        layout = Layout(n_items=n, capacity=max(capacity, page), policy=self.policy, page_size=page)
        keep.sweep(need_bytes=0 if os.path.exists(path) else layout.file_size + SHM_MARGIN)
        fitted, reason = (
            (layout, "") if os.path.exists(path) else _fit_to_free_space(layout, seg_name)
        )
        layer = None
        if fitted is not None:
            layer, reason = _open(path, fitted, fingerprint, total, reason, layer_args)
        if layer is None:
            layer = CacheLayer(path=None, capacity=0, how="off", reason=reason, **layer_args)
        else:  # our cache holds the data now: the page cache should not hold it too
            _bypass_page_cache(getattr(dataset, "store", None))
        if self.disk is not None:
            layer = bind_tiers(layer, self.disk, dataset, fingerprint, self.name, total)
        return self._bound(layer, dataset)

    def _bound(self, layer: Any, dataset: Any) -> Any:
        if self.peers is not None:  # each node caches the items it owns; peers serve the rest
            layer.peers = self.peers.attach(layer, dataset)
        self._layers.append(layer)
        return layer

    def check(self) -> None:
        """Assert every bound segment's index is consistent (for tests and debugging)."""
        for layer in self._layers:
            layer.check()

    def close(self) -> None:
        """Leave every segment this cache bound (removing those no one else uses). Idempotent."""
        for layer in self._layers:
            layer.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(
    path: str, layout: Layout, fingerprint: str, total: int, reason: str, args: dict[str, Any]
) -> tuple[CacheLayer | None, str]:
    """Open or create the segment and wrap it in a layer; ``(None, why)`` if no space."""
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
        warnings.warn(reason, SharedMemoryWarning, stacklevel=4)
        return None, reason
    if how == "attached" and cache.capacity != layout.capacity:
        reason = (
            f"cache {name} is already open with capacity {format_bytes(cache.capacity)} "
            f"({cache.capacity} bytes), not the {layout.capacity} bytes asked for: "
            "sharing it as it is"
        )
        warnings.warn(reason, SharedMemoryWarning, stacklevel=4)
    layer = CacheLayer(path=path, capacity=cache.capacity, how=how, reason=reason, **args)
    layer._adopt(cache, slot)
    weakref.finalize(layer, _close_layer, layer.__dict__)
    return layer, reason


def _close_layer(state: dict[str, Any]) -> None:
    """Finalizer: close a layer given its ``__dict__`` (no reference to the layer itself)."""
    layer = CacheLayer.__new__(CacheLayer)
    layer.__dict__ = state
    layer.close()


def _fit_to_free_space(layout: Layout, seg_name: str) -> tuple[Layout | None, str]:
    """Shrink ``layout`` to what shared memory can hold (warning), or None if nothing fits."""
    directory = segment.shm_dir()
    free = segment.free_bytes(directory)
    if layout.file_size + SHM_MARGIN <= free:
        return layout, ""
    fit = free - SHM_MARGIN - layout.overhead()
    if layout.policy == "lru":
        fit = fit // layout.page_size * layout.page_size
    want = format_bytes(layout.file_size)
    if fit < MIN_CAPACITY:
        reason = (
            f"cache {seg_name} needs {want} ({layout.file_size} bytes) of shared memory but "
            f"{directory} has {format_bytes(free)} ({free} bytes) free: running uncached; "
            "enlarge it (docker run --shm-size, or mount -o remount,size=... /dev/shm) or "
            "lower the capacity"
        )
        warnings.warn(reason, SharedMemoryWarning, stacklevel=4)
        return None, reason
    reason = (
        f"cache {seg_name} needs {want} ({layout.file_size} bytes) of shared memory but "
        f"{directory} has {format_bytes(free)} ({free} bytes) free: caching "
        f"{format_bytes(fit)} instead; enlarge it (docker run --shm-size) or lower the capacity"
    )
    warnings.warn(reason, SharedMemoryWarning, stacklevel=4)
    return Layout(layout.n_items, fit, layout.policy, layout.page_size), reason


def _bypass_page_cache(store: Any) -> None:
    """Make local stores (also wrapped ones, via ``inner``) drop pages after reading."""
    for _ in range(8):
        if store is None:
            return
        if hasattr(store, "bypass_page_cache"):
            store.bypass_page_cache = True
        store = getattr(store, "inner", None)


def list_caches(everyone: bool = False) -> list[dict[str, Any]]:
    """One dict per RAM segment of this user (every user's with ``everyone``), then one per
    disk tier of this user: `unstall cache list`."""
    out = []
    for name in segment.list_segment_names(everyone):
        info = lifecycle.describe(segment.segment_path(name))
        if info is not None:
            out.append({"tier": "ram", **info})
    for name in disk_tier.list_names():
        info = disk_tier.describe(disk_tier.index_path(name))
        if info is not None:
            out.append(info)
    return out


def clear_caches(name: str | None = None, *, force: bool = False) -> list[str]:
    """Remove this user's segments (or the one named) that no live process uses; returns names."""
    names = segment.list_segment_names() if name is None else [name]
    removed = [n for n in names if lifecycle.remove(segment.segment_path(n), force=force)]
    disk_names = disk_tier.list_names() if name is None else [name]
    removed += [f"{n} (disk)" for n in disk_names if disk_tier.remove(n, force=force)]
    if name is None:
        removed += segment.remove_dead_tmp_files()
        removed += disk_tier.remove_orphans()
    return removed


__all__ = [
    "Cache",
    "DiskFullWarning",
    "SharedMemoryWarning",
    "clear_caches",
    "list_caches",
    "parse_capacity",
]
