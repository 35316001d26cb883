"""The fetch layer a loader gets from `Cache.bind`: the RAM tier, then the disk tier, then
storage (or the peers that own the item).

An item fetched from storage goes to the first tier that takes it: RAM if it fits
there, else the disk tier, never both. Both fill once and never evict, so from
epoch 2 the hit rate is (RAM items + disk items) / N. The layer calls only the
tiers' public methods (`unstall.cache.tier.Tier`); it is pickled (or forked) into
the loader's workers, where each tier maps itself on first use.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from unstall.cache.disk_tier import DiskTier
from unstall.cache.items import fetch_from_storage, pick, versions_of
from unstall.cache.ram_tier import RamTier
from unstall.cache.tier import MappedTier


class TieredLayer:
    """A RAM tier (or None) over a disk tier (or None); built by `Cache.bind`.

    With no disk tier its stats are the RAM tier's own (``{"cache": {...}}``); with
    one, totals over both tiers and ``ram`` / ``disk`` sections.
    """

    def __init__(self, ram: RamTier | None, disk: DiskTier | None):
        if ram is None and disk is None:
            raise ValueError("a cache layer needs a RAM tier, a disk tier or both")
        self.ram, self.disk = ram, disk
        self.tiers: list[MappedTier] = [t for t in (ram, disk) if t is not None]
        #: When this bind happened (ns): items this job stores are marked with it, and it
        #: replaces no stale item stored by a later bind (`ShmCache.claim`).
        self.bound_ns = time.time_ns()
        #: Optional hook for misses (unstall.distributed's BoundPeers, set by `Cache.bind`):
        #: ``fetch_missing(dataset, indices) -> (raws, ours)`` and ``ours(dataset, index)``;
        #: peers' items come from them and only this node's are stored here.
        self.peers: Any = None

    def attach(self) -> None:
        """Map every tier in this process now (the peer server's read threads must not race)."""
        for tier in self.tiers:
            tier.mapped()

    # Fetch layer ---------------------------------------------------------------------
    def fetch(self, dataset: Any, indices: Sequence[int]) -> list[bytes]:
        """Raw bytes of ``indices`` in order: from the first tier that has them under the
        dataset's current version, else storage (then stored); a stale item is a miss."""
        indices = list(indices)
        if self.disk is None and self.ram is not None and self.ram.mapped() is None:
            self.ram.count(0, len(indices), 0, 0)  # the cache is off: straight to storage
            return dataset.fetch(indices)
        versions = versions_of(dataset, indices)
        got, stale = self.tiers[0].get_many(indices, versions)
        need = [k for k, raw in enumerate(got) if raw is None]
        found = [(len(indices), len(indices) - len(need), stale)]  # per tier: asked, hits, stale
        for tier in self.tiers[1:]:  # the next tier is asked for what the ones above missed
            asked, hits, stale = len(need), 0, 0
            if need:
                raws, stale = tier.get_many([indices[k] for k in need], pick(versions, need))
                left = []
                for k, raw in zip(need, raws, strict=True):
                    if raw is None:
                        left.append(k)
                    else:
                        got[k] = raw
                hits, need = asked - len(left), left
            found.append((asked, hits, stale))
        stored = [(0, 0)] * len(self.tiers)
        if need:
            wanted = [indices[k] for k in need]
            ours = None
            if self.peers is not None:
                raws, ours = self.peers.fetch_missing(dataset, wanted)
            else:
                raws = fetch_from_storage(dataset, wanted)
            for k, raw in zip(need, raws, strict=True):
                got[k] = raw
            items = list(zip(wanted, raws, strict=True))
            item_versions = pick(versions, need)
            if ours is not None:  # a partitioned cache: this node stores only what it owns
                items = [item for item, mine in zip(items, ours, strict=True) if mine]
                item_versions = pick(item_versions, np.flatnonzero(ours).tolist())
            stored = self._store(items, item_versions)
        for tier, (asked, hits, stale), (n, size) in zip(self.tiers, found, stored, strict=True):
            tier.count(hits, asked - hits, n, size, stale)
        return got  # type: ignore[return-value]  # every None was filled

    def _store(
        self, items: list[tuple[int, bytes]], versions: np.ndarray | None
    ) -> list[tuple[int, int]]:
        """Fetched items to the first tier that takes them: (items, bytes) stored per tier."""
        out = []
        for k, tier in enumerate(self.tiers):
            if not items:
                out.append((0, 0))
                continue
            out.append(tier.put_many(items, versions, self.bound_ns))
            if k + 1 < len(self.tiers):
                # not held under our version (EMPTY, or stale): it did not fit (the bump pointer
                # only grows, so it never will); held: the tier has it (or another process
                # stores it), or a newer job's version, which we leave alone
                left = ~tier.held([i for i, _ in items], versions, self.bound_ns)
                items = [item for item, out_ in zip(items, left.tolist(), strict=True) if out_]
                versions = versions[left] if versions is not None else None
        return out

    def prefetch(self, dataset: Any, indices: Sequence[int]) -> None:
        """Pass the look-ahead hint on for samples in no tier (those never hit storage)."""
        indices = list(indices)
        for tier in self.tiers:
            indices = tier.not_cached(indices, versions_of(dataset, indices))
        if self.peers is not None:  # peers' items come from them, not from storage
            indices = [i for i in indices if self.peers.ours(dataset, i)]
        if indices:
            dataset.prefetch(indices)

    def begin_epoch(self) -> None:
        """The loader starts an epoch (main process): peers that failed rejoin now."""
        if self.peers is not None:
            self.peers.begin_epoch()

    # Stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """``{"cache": {...}}`` (and ``"peers"``): see the class notes."""
        if self.disk is None:
            assert self.ram is not None
            out = self.ram.stats()
        else:
            out = _tiered_stats(self.ram.stats() if self.ram is not None else None, self.disk)
        if self.peers is not None:
            return {"cache": out, "peers": self.peers.stats()}
        return {"cache": out}

    def check(self) -> None:
        """Assert every tier's index is consistent and no item is READY in two tiers (tests)."""
        for tier in self.tiers:
            tier.check()
        ready = [r for r in (t.ready() for t in self.tiers) if r is not None]
        if len(ready) == 2:
            (a, va), (b, vb) = ready
            both = a & b & (va == vb)
            if both.any():
                raise AssertionError(
                    f"items {both.nonzero()[0][:10].tolist()} are in both tiers (same version)"
                )

    # Lifecycle -----------------------------------------------------------------------
    def close(self) -> bool:
        """Leave every tier (owner process only); the disk tier's files stay. True if the RAM
        segment was removed. Idempotent."""
        return any([tier.close() for tier in self.tiers])

    @staticmethod
    def close_state(state: dict[str, Any]) -> None:
        """Finalizer: close a layer given its ``__dict__`` (no reference to the layer itself)."""
        layer = TieredLayer.__new__(TieredLayer)
        layer.__dict__ = state
        layer.close()


def _tiered_stats(ram: dict[str, Any] | None, disk_tier: DiskTier) -> dict[str, Any]:
    """Totals over both tiers, with their own sections."""
    disk = disk_tier.stats()
    hits = (ram["hits"] if ram else 0) + disk["hits"]
    misses = disk["misses"]
    out: dict[str, Any] = {
        "name": disk_tier.name,
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
    return out
