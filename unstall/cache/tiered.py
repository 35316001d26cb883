"""The fetch layer of a cache with a disk tier: shared memory first, then local disk, then storage.

An item fetched from storage goes to the RAM tier if it fits there, else to the
disk tier: never to both. Both tiers fill once and never evict, so from epoch 2
the hit rate is (RAM items + disk items) / N. Like `CacheLayer`, each process
maps the disk index and opens the data file itself on first use, and counts in
its own slot of the index, so the owner sums its workers' figures.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from unstall.cache import disk_tier, lifecycle
from unstall.cache.capacity import format_bytes
from unstall.cache.layer import CacheLayer, fetch_from_storage, not_cached, versions_of
from unstall.cache.shm_cache import (
    EMPTY,
    H_BUMP,
    H_CACHED_BYTES,
    H_CACHED_ITEMS,
    READY,
    ShmCache,
)


class DiskFullWarning(UserWarning):
    """The disk under the cache directory filled up: the disk tier stops growing."""


class TieredLayer:
    """RAM tier (a `CacheLayer`, or None) over a disk tier; built by `Cache.bind`."""

    def __init__(
        self,
        ram: CacheLayer | None,
        *,
        path: str | None,
        name: str,
        group: int,
        owner: int,
        capacity: int,
        how: str,
        reason: str = "",
    ):
        self.ram = ram
        self.path, self.name, self.group, self.owner = path, name, group, owner
        self.capacity, self.how, self.reason = capacity, how, reason
        self.bound_ns = ram.bound_ns if ram is not None else time.time_ns()  # see CacheLayer
        self._index: ShmCache | None = None
        self._fd = -1
        self._slot = -1
        self._pid = -1
        self._closed = False
        self._local = dict.fromkeys(lifecycle.COUNTERS, 0)
        self._last: dict[str, Any] = {}
        #: Optional hook for misses in both tiers (unstall.distributed's BoundPeers): as in
        #: `CacheLayer`, peers' items come from them and only this node's are stored here.
        self.peers: Any = None

    def _adopt(self, index: ShmCache, slot: int, fd: int) -> None:
        self._index, self._slot, self._fd, self._pid = index, slot, fd, os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_index=None, _slot=-1, _fd=-1, _pid=-1)
        return state

    def _attached(self) -> ShmCache | None:
        if self._pid == os.getpid():
            return self._index
        self._pid, self._index, self._slot, self._fd = os.getpid(), None, -1, -1
        self._local = dict.fromkeys(self._local, 0)
        if self.path is not None and not self._closed:
            got = disk_tier.attach_tier(self.path, owner=self.owner, group=self.group)
            if got is not None:
                self._index, self._slot, self._fd = got
        return self._index

    # Fetch layer ---------------------------------------------------------------------
    def fetch(self, dataset: Any, indices: Sequence[int]) -> list[bytes]:
        """Raw bytes of ``indices`` in order: from RAM, else disk, else storage (then stored);
        a tier's item of another version than the dataset's is stale: a miss."""
        indices = list(indices)
        versions = versions_of(dataset, indices)
        ram = self.ram._attached() if self.ram is not None else None
        got: list[bytes | None] = [None] * len(indices)
        ram_stale = 0
        if ram is not None:
            got, ram_stale = ram.lookup(indices, versions)
        ram_hits = sum(raw is not None for raw in got)
        index = self._attached()
        need = [k for k, raw in enumerate(got) if raw is None]
        disk_stale = 0
        if index is not None and need:
            from_disk, disk_stale = disk_tier.get_many(
                index, self._fd, [indices[k] for k in need], _pick(versions, need)
            )
            for k, raw in zip(need, from_disk, strict=True):
                got[k] = raw
        missing = [k for k, raw in enumerate(got) if raw is None]
        disk_hits = len(need) - len(missing)
        stored = (0, 0, 0, 0)
        if missing:
            wanted = [indices[k] for k in missing]
            ours = None
            if self.peers is not None:
                raws, ours = self.peers.fetch_missing(dataset, wanted)
            else:
                raws = fetch_from_storage(dataset, wanted)
            for k, raw in zip(missing, raws, strict=True):
                got[k] = raw
            items = list(zip(wanted, raws, strict=True))
            item_versions = _pick(versions, missing)
            if ours is not None:  # a partitioned cache: this node stores only what it owns
                items = [item for item, mine in zip(items, ours, strict=True) if mine]
                item_versions = _pick(item_versions, np.flatnonzero(ours).tolist())
            stored = self._store(items, item_versions)
        if self.ram is not None:
            self.ram._count(ram_hits, len(indices) - ram_hits, stored[0], stored[1], ram_stale)
        self._count(disk_hits, len(missing), stored[2], stored[3], disk_stale)
        return got  # type: ignore[return-value]  # every None was filled

    def _store(
        self, items: list[tuple[int, bytes]], versions: np.ndarray | None
    ) -> tuple[int, int, int, int]:
        """Fetched items to RAM, those RAM cannot take to disk: (ram n, bytes, disk n, bytes)."""
        ram = self.ram._cache if self.ram is not None else None
        ram_n = ram_b = 0
        if ram is not None:
            ram_n, ram_b = ram.put_many(items, versions, self.bound_ns)
            # not in RAM under our version (EMPTY, or stale): it did not fit (the bump pointer
            # only grows, so it never will); held: RAM has it (or another process stores it)
            which = [i for i, _ in items]
            held = ram.state[which] != EMPTY
            if versions is not None:  # ours, or a newer job's (which we leave alone)
                held &= (ram.version[which] == versions) | (ram.stored_by[which] > self.bound_ns)
            left = (~held).tolist()
            items = [item for item, out in zip(items, left, strict=True) if out]
            versions = versions[np.asarray(left, dtype=bool)] if versions is not None else None
        index = self._index
        if index is None or not items:
            return ram_n, ram_b, 0, 0
        disk_n, disk_b, first_full = disk_tier.put_many(
            index, self._fd, items, versions, self.bound_ns
        )
        if first_full:
            warnings.warn(
                f"the disk under {disk_tier.tier_dir()} is full: the disk cache {self.name} "
                f"stops at {format_bytes(int(index.hdr[H_BUMP]))}; items past that are fetched "
                "from storage (free space, or set UNSTALL_CACHE_DIR to a larger disk)",
                DiskFullWarning,
                stacklevel=3,
            )
        return ram_n, ram_b, disk_n, disk_b

    def prefetch(self, dataset: Any, indices: Sequence[int]) -> None:
        """Pass the look-ahead hint on for samples in neither tier."""
        indices = list(indices)
        ram = self.ram._attached() if self.ram is not None else None
        indices = not_cached(ram, indices, versions_of(dataset, indices))
        indices = not_cached(self._attached(), indices, versions_of(dataset, indices))
        if self.peers is not None:  # peers' items come from them, not from storage
            indices = [i for i in indices if self.peers.ours(dataset, i)]
        if indices:
            dataset.prefetch(indices)

    def begin_epoch(self) -> None:
        """The loader starts an epoch (main process): peers that failed rejoin now."""
        if self.peers is not None:
            self.peers.begin_epoch()

    def _count(self, hits: int, misses: int, inserted: int, size: int, stale: int = 0) -> None:
        lifecycle.add_counts(
            self._index, self._slot, self._local, hits, misses, inserted, size, stale
        )

    # Stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """``{"cache": {...}}``: totals over both tiers, and ``ram`` / ``disk`` sections."""
        ram = self.ram.stats()["cache"] if self.ram is not None else None
        disk = self._disk_stats()
        hits = (ram["hits"] if ram else 0) + disk["hits"]
        misses = disk["misses"]
        out: dict[str, Any] = {
            "name": self.name,
            "policy": "noevict",
            "enabled": True,
            "tiers": [t for t, s in (("ram", ram), ("disk", disk)) if s and s["enabled"]],
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "stale": (ram["stale"] if ram else 0) + disk["stale"],
            "ram_hits": ram["hits"] if ram else 0,
            "disk_hits": disk["hits"],
            "ram_cached_bytes": ram.get("cached_bytes", 0) if ram else 0,
            "disk_cached_bytes": disk.get("cached_bytes", 0),
            "ram_inserted_bytes": ram["inserted_bytes"] if ram else 0,
            "disk_inserted_bytes": disk["inserted_bytes"],
            "disk": disk,
        }
        if ram is not None:
            out["ram"] = ram
        if self.peers is not None:
            return {"cache": out, "peers": self.peers.stats()}
        return {"cache": out}

    def _disk_stats(self) -> dict[str, Any]:
        index = self._index if self._pid == os.getpid() else None
        out: dict[str, Any] = {
            "enabled": self.path is not None,
            "dir": disk_tier.tier_dir(),
            "opened": self.how,
            "capacity_bytes": self.capacity,
        }
        if self.reason:
            out["reason"] = self.reason
        if index is None:
            counts = dict(self._local)
            out.update(self._last)
        else:
            counts = lifecycle.group_counts(index, self.group, plus=self._local)
            hdr, cap = index.hdr, int(index.hdr[disk_tier.H_DISK_CAPACITY])
            self._last = {
                "capacity_bytes": cap,
                "cached_bytes": int(hdr[H_CACHED_BYTES]),
                "used_bytes": int(hdr[H_BUMP]),
                "items_cached": int(hdr[H_CACHED_ITEMS]),
                "items": index.layout.n_items,
                "fill_fraction": round(int(hdr[H_BUMP]) / cap, 6) if cap else 0.0,
                "full": bool(int(hdr[disk_tier.H_FULL])),
            }
            out.update(self._last)
        out.update(lifecycle.hit_figures(counts))
        return out

    def check(self) -> None:
        """Assert both indexes are consistent and no item is READY in both tiers (tests)."""
        if self.ram is not None:
            self.ram.check()
        index = self._attached()
        if index is None:
            return
        index.capacity = int(index.hdr[disk_tier.H_DISK_CAPACITY])  # check() bounds items by it
        index.check()
        ram = self.ram._attached() if self.ram is not None else None
        if ram is not None:
            both = (ram.state == READY) & (index.state == READY) & (ram.version == index.version)
            if both.any():
                raise AssertionError(
                    f"items {both.nonzero()[0][:10].tolist()} are in both tiers (same version)"
                )

    # Lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Leave both tiers (owner process only); the disk tier's files stay. Idempotent."""
        if self.ram is not None:
            self.ram.close()
        if self._closed or os.getpid() != self.owner or self._pid != self.owner:
            return
        self._disk_stats()  # keep the last figures for stats() after close
        self._closed = True
        index, self._index = self._index, None
        if index is None:
            return
        self._local = lifecycle.group_counts(index, self.group, plus=self._local)
        disk_tier.release(index, self._fd, group=self.group)


def _pick(versions: np.ndarray | None, positions: list[int]) -> np.ndarray | None:
    """``versions`` at ``positions`` (None stays None)."""
    return None if versions is None else versions[positions]
