"""The fetch layer a loader gets from `Cache.bind`: cache first, the dataset's store for misses.

It is pickled (or forked) into the loader's worker processes with the batch
task; each process maps the segment itself on its first fetch (a forked child
must not share its parent's file descriptor, whose ``flock`` would be shared
too). Counters live in the process's slot in the segment, so the main process
sums its workers' hits and misses without any message passing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from unstall.cache import lifecycle
from unstall.cache.policy import lru_check, lru_get_many, lru_put_many
from unstall.cache.shm_cache import (
    H_CACHED_BYTES,
    H_CACHED_ITEMS,
    H_EVICTIONS,
    H_RECLAIMS,
    H_STALE_BYTES,
    H_TOO_LARGE,
    READY,
    ShmCache,
)


def fetch_from_storage(dataset: Any, indices: list[int]) -> list[bytes]:
    """``dataset.fetch(indices)`` as bytes; a ValueError naming the dataset if the count is off."""
    raws = [bytes(raw) for raw in dataset.fetch(indices)]
    if len(raws) != len(indices):
        raise ValueError(
            f"{type(dataset).__name__}.fetch returned {len(raws)} items for {len(indices)} indices"
        )
    return raws


def item_versions(dataset: Any) -> np.ndarray | None:
    """The version of each item's source (int64 per item, see `unstall.stores.listing`), or
    None for a dataset that cannot say (its items are then trusted as they are)."""
    versions = getattr(dataset, "versions", None)
    if not callable(versions):
        return None
    out = versions()
    if out is None:
        return None
    if len(out) != len(dataset):
        raise ValueError(
            f"{type(dataset).__name__}.versions() has {len(out)} entries for "
            f"{len(dataset)} samples: one version per sample"
        )
    return out


def versions_of(dataset: Any, indices: list[int]) -> np.ndarray | None:
    """The expected versions of ``indices`` (None when the dataset has none)."""
    versions = item_versions(dataset)
    return None if versions is None else versions[indices]


def not_cached(
    cache: ShmCache | None, indices: list[int], versions: np.ndarray | None = None
) -> list[int]:
    """``indices`` less those READY (under the expected ``versions``) in ``cache``."""
    if cache is None or not indices:
        return indices
    cached = cache.state[indices] == READY
    if versions is not None:
        cached &= cache.version[indices] == versions
    return [i for i, hit in zip(indices, cached.tolist(), strict=True) if not hit]


class CacheLayer:
    """Serves a batch's raw bytes from the shared segment, fetching and storing the misses.

    Built by `Cache.bind`; not meant to be made directly. With ``path=None`` the
    cache is off (no shared memory could be had) and every fetch goes to storage.
    """

    def __init__(
        self,
        *,
        path: str | None,
        name: str,
        policy: str,
        group: int,
        owner: int,
        capacity: int,
        how: str,
        reason: str = "",
        keep_s: float = 0.0,
    ):
        self.path, self.name, self.policy = path, name, policy
        self.keep_s = keep_s  # seconds the segment stays after its last user (`cache.keep`)
        #: When this bind happened (ns): items this job stores are marked with it, and it
        #: replaces no stale item stored by a later bind (`ShmCache.claim`).
        self.bound_ns = time.time_ns()
        self.group, self.owner, self.capacity = group, owner, capacity
        self.how, self.reason = how, reason
        self._cache: ShmCache | None = None
        self._slot = -1
        self._pid = -1
        self._closed = False
        self._local = dict.fromkeys(lifecycle.COUNTERS, 0)
        self._last: dict[str, Any] = {}
        #: Optional hook for misses (unstall.distributed's BoundPeers, set by `Cache.bind`):
        #: ``fetch_missing(dataset, indices) -> (raws, ours)`` and ``ours(dataset, index)``.
        self.peers: Any = None

    def _adopt(self, cache: ShmCache, slot: int) -> None:
        """Use a mapping made in this process (by `Cache.bind`)."""
        self._cache, self._slot, self._pid = cache, slot, os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_cache=None, _slot=-1, _pid=-1)
        return state

    def _attached(self) -> ShmCache | None:
        if self._pid == os.getpid():
            return self._cache
        # first use in a forked or spawned worker: map our own copy, take a slot
        self._pid, self._cache, self._slot = os.getpid(), None, -1
        self._local = dict.fromkeys(self._local, 0)
        if self.path is not None and not self._closed:
            got = lifecycle.attach(self.path, owner=self.owner, group=self.group)
            if got is not None:
                self._cache, self._slot = got
        return self._cache

    # Fetch layer ---------------------------------------------------------------------
    def fetch(self, dataset: Any, indices: Sequence[int]) -> list[bytes]:
        """Raw bytes of ``indices`` in order: cached ones of the dataset's current versions
        from shared memory, the rest (stale ones too) fetched and stored."""
        cache = self._attached()
        indices = list(indices)
        if cache is None:
            self._count(0, len(indices), 0, 0)
            return dataset.fetch(indices)
        versions = versions_of(dataset, indices)
        lru = cache.layout.policy == "lru"
        got, stale = (
            lru_get_many(cache, indices, versions) if lru else cache.lookup(indices, versions)
        )
        missing = [k for k, raw in enumerate(got) if raw is None]
        if not missing:
            self._count(len(indices), 0, 0, 0)
            return cast("list[bytes]", got)  # all hits: no None left
        ours = None  # with peers, only the misses this node owns are cached here
        if self.peers is not None:
            raws, ours = self.peers.fetch_missing(dataset, [indices[k] for k in missing])
        else:
            raws = fetch_from_storage(dataset, [indices[k] for k in missing])
        items = [(indices[k], raw) for k, raw in zip(missing, raws, strict=True)]
        wanted = versions[missing] if versions is not None else None
        if ours is not None:
            items = [item for item, mine in zip(items, ours, strict=True) if mine]
            wanted = wanted[np.asarray(ours, dtype=bool)] if wanted is not None else None
        put = lru_put_many if lru else ShmCache.put_many
        inserted, size = put(cache, items, wanted, self.bound_ns)
        self._count(len(indices) - len(missing), len(missing), inserted, size, stale)
        fetched = iter(raws)
        return [raw if raw is not None else next(fetched) for raw in got]

    def begin_epoch(self) -> None:
        """The loader starts an epoch (main process): peers that failed rejoin now."""
        if self.peers is not None:
            self.peers.begin_epoch()

    def prefetch(self, dataset: Any, indices: Sequence[int]) -> None:
        """Pass the look-ahead hint on for the samples not cached (those never hit storage)."""
        indices = list(indices)
        indices = not_cached(self._attached(), indices, versions_of(dataset, indices))
        if self.peers is not None:  # peers' items come from them, not from storage
            indices = [i for i in indices if self.peers.ours(dataset, i)]
        if indices:
            dataset.prefetch(indices)

    def _count(self, hits: int, misses: int, inserted: int, size: int, stale: int = 0) -> None:
        lifecycle.add_counts(
            self._cache, self._slot, self._local, hits, misses, inserted, size, stale
        )

    # Stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Cumulative counters of this loader (all its workers): ``{"cache": {...}}``."""
        cache = self._cache if self._pid == os.getpid() else None
        out: dict[str, Any] = {
            "name": self.name,
            "policy": self.policy,
            "enabled": self.path is not None,
            "opened": self.how,
            "capacity_bytes": self.capacity,
        }
        if self.reason:
            out["reason"] = self.reason
        if cache is None:
            counts = dict(self._local)
            out.update(self._last)
        else:
            counts = lifecycle.group_counts(cache, self.group, plus=self._local)
            hdr = cache.hdr
            used = cache.used_bytes()
            self._last = {
                "cached_bytes": int(hdr[H_CACHED_BYTES]),
                "used_bytes": used,
                "items_cached": int(hdr[H_CACHED_ITEMS]),
                "items": cache.layout.n_items,
                "fill_fraction": round(used / cache.capacity, 6) if cache.capacity else 0.0,
                "evictions": int(hdr[H_EVICTIONS]),
                "too_large": int(hdr[H_TOO_LARGE]),
                "reclaims": int(hdr[H_RECLAIMS]),
                "stale_bytes": int(hdr[H_STALE_BYTES]),
                "keep_s": self.keep_s,
            }
            out.update(self._last)
        out.update(lifecycle.hit_figures(counts))
        if self.peers is not None:
            return {"cache": out, "peers": self.peers.stats()}
        return {"cache": out}

    def check(self) -> None:
        """Assert the segment's index is consistent (for tests); no-op when uncached."""
        cache = self._attached()
        if cache is not None:
            if cache.layout.policy == "lru":
                lru_check(cache)
            else:
                cache.check()

    # Lifecycle -----------------------------------------------------------------------
    def close(self) -> bool:
        """Leave the segment (the owner process only); True if this removed it. Idempotent."""
        if self._closed or os.getpid() != self.owner or self._pid != self.owner:
            return False
        self.stats()  # keep the last figures for stats() after close
        self._closed = True
        cache, self._cache = self._cache, None
        if cache is None:
            return False
        self._local = lifecycle.group_counts(cache, self.group, plus=self._local)
        removed = lifecycle.release(cache, group=self.group, keep_s=self.keep_s)
        if not removed and self.keep_s > 0:
            from unstall.cache.keep import start_reaper, sweep

            if self.path is not None and os.path.exists(self.path):
                start_reaper(self.path)
            sweep()  # a kept segment counts against the limits now
        return removed
