"""The tier interface, and what the RAM and disk tiers share: one mapping per process, one
slot of counters in the index, and one stats shape.

A tier (`Tier`) gets many items, puts many, reports its stats and closes. Both tiers
keep their items under an index of the same layout (`unstall.cache.shm.index`): the
RAM tier's in its shared-memory segment, the disk tier's in a mapped file beside its
data file. A tier object is pickled (or forked) into the loader's workers; each
process maps the index itself on first use (`MappedTier.mapped`: a forked child must
not share its parent's descriptor, whose ``flock`` would be shared too) and counts in
its own slot, so the owner sums its workers' figures without messages.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import numpy as np

from unstall.cache.shm import lifecycle
from unstall.cache.shm.index import EMPTY, READY, ShmCache


@runtime_checkable
class Tier(Protocol):
    """What the composing layer (`unstall.cache.tiered.TieredLayer`) asks of a tier."""

    def get_many(
        self, indices: list[int], versions: np.ndarray | None
    ) -> tuple[list[bytes | None], int]:
        """Bytes of each item held under its expected version (None: a miss), and the stale."""
        ...

    def put_many(
        self, items: list[tuple[int, bytes]], versions: np.ndarray | None, since: int
    ) -> tuple[int, int]:
        """Store what the tier takes; returns (items, bytes) stored."""
        ...

    def stats(self) -> dict[str, Any]:
        """This bind's figures for the tier (all its processes)."""
        ...

    def close(self) -> bool:
        """Leave the tier (the owner process only); idempotent."""
        ...


def hit_figures(counts: dict[str, int]) -> dict[str, Any]:
    """The figures a tier's stats report from summed counts, with the hit rate."""
    total = counts["hits"] + counts["misses"]
    return {
        "hits": counts["hits"],
        "misses": counts["misses"],
        "hit_rate": counts["hits"] / total if total else 0.0,
        "inserted": counts["inserted"],
        "inserted_bytes": counts["inserted_bytes"],
        "stale": counts["stale"],
    }


class MappedTier:
    """A tier whose index is mapped once per process (see the module notes).

    Subclasses say how a process maps it (`_attach`), how items are read and stored,
    the figures of its header (`_figures`) and what leaving does (`_release`).
    ``path=None``: the tier is off (no space could be had); every get misses.
    """

    def __init__(
        self,
        *,
        path: str | None,
        name: str,
        group: int,
        owner: int,
        capacity: int,
        how: str,
        reason: str = "",
    ):
        self.path, self.name, self.group, self.owner = path, name, group, owner
        self.capacity, self.how, self.reason = capacity, how, reason
        self._index: ShmCache | None = None
        self._fd = -1  # this process's descriptor of a data file beside the index (disk tier)
        self._slot = -1
        self._pid = -1
        self._closed = False
        self._local = dict.fromkeys(lifecycle.COUNTERS, 0)
        self._last: dict[str, Any] = {}

    def adopt(self, index: ShmCache, slot: int, fd: int = -1) -> None:
        """Use a mapping (and data file) opened in this process: `unstall.cache.opening`, the
        one place tiers are opened, calls this once per bind."""
        self._index, self._slot, self._fd, self._pid = index, slot, fd, os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_index=None, _slot=-1, _fd=-1, _pid=-1)
        return state

    def mapped(self) -> ShmCache | None:
        """This process's mapping of the index (made on first use in a worker); None if off."""
        if self._pid == os.getpid():
            return self._index
        # first use in a forked or spawned worker: map our own copy, take a slot
        self._pid, self._index, self._slot = os.getpid(), None, -1
        self._local = dict.fromkeys(self._local, 0)
        if self.path is not None and not self._closed:
            got = self._attach()
            if got is not None:
                self._index, self._slot = got
        return self._index

    def _attach(self) -> tuple[ShmCache, int] | None:
        raise NotImplementedError

    # Items ---------------------------------------------------------------------------
    def get_many(
        self, indices: list[int], versions: np.ndarray | None = None
    ) -> tuple[list[bytes | None], int]:
        """Bytes of each item held under its expected version (None: a miss), and how many
        were held under another version (stale); all misses when the tier is off."""
        index = self.mapped()
        if index is None:
            return [None] * len(indices), 0
        return self._lookup(index, indices, versions)

    def _lookup(
        self, index: ShmCache, indices: list[int], versions: np.ndarray | None
    ) -> tuple[list[bytes | None], int]:
        raise NotImplementedError

    def put_many(
        self, items: list[tuple[int, bytes]], versions: np.ndarray | None, since: int
    ) -> tuple[int, int]:
        """Store what the tier takes (items it lacks, or holds stale); returns (items, bytes)."""
        raise NotImplementedError

    def check(self) -> None:
        """Assert the tier's index is consistent (tests); no-op when off."""
        raise NotImplementedError

    def not_cached(self, indices: list[int], versions: np.ndarray | None = None) -> list[int]:
        """``indices`` less those READY (under the expected ``versions``) in this tier."""
        index = self.mapped()
        if index is None or not indices:
            return indices
        cached = index.state[indices] == READY
        if versions is not None:
            cached &= index.version[indices] == versions
        return [i for i, hit in zip(indices, cached.tolist(), strict=True) if not hit]

    def held(self, indices: list[int], versions: np.ndarray | None, since: int) -> np.ndarray:
        """Which items the tier has (or another process is storing) for us: not EMPTY, and
        with ``versions`` under ours or a newer job's (stored after ``since``, left alone).
        All False when the tier is off."""
        index = self.mapped()
        if index is None:
            return np.zeros(len(indices), dtype=bool)
        held = index.state[indices] != EMPTY
        if versions is not None:
            held &= (index.version[indices] == versions) | (index.stored_by[indices] > since)
        return held

    def ready(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(READY per item, version per item) of this process's mapping; None if off (tests)."""
        index = self.mapped()
        return None if index is None else (index.state == READY, index.version)

    def count(self, hits: int, misses: int, inserted: int, size: int, stale: int = 0) -> None:
        """Add one fetch's figures to this process's slot (or to its own count, with none)."""
        index = self.mapped()  # a forked worker counts in its own slot, never its parent's
        lifecycle.add_counts(index, self._slot, self._local, hits, misses, inserted, size, stale)

    # Stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """This bind's figures (all its processes): identity, size, header figures, hits."""
        index = self._index if self._pid == os.getpid() else None
        out: dict[str, Any] = {
            **self._identity(),
            "enabled": self.path is not None,
            "opened": self.how,
            "capacity_bytes": self.capacity,
        }
        if self.reason:
            out["reason"] = self.reason
        if index is None:
            counts = dict(self._local)
        else:
            counts = lifecycle.group_counts(index, self.group, plus=self._local)
            self._last = self._figures(index)
        out.update(self._last)
        out.update(hit_figures(counts))
        return out

    def _identity(self) -> dict[str, Any]:
        return {}

    def _figures(self, index: ShmCache) -> dict[str, Any]:
        raise NotImplementedError

    # Lifecycle -----------------------------------------------------------------------
    def close(self) -> bool:
        """Leave the tier (the owner process only); True if that removed it. Idempotent."""
        if self._closed or os.getpid() != self.owner or self._pid != self.owner:
            return False
        self.stats()  # keep the last figures for stats() after close
        self._closed = True
        index, self._index = self._index, None
        if index is None:
            return False
        self._local = lifecycle.group_counts(index, self.group, plus=self._local)
        return self._release(index)

    def _release(self, index: ShmCache) -> bool:
        raise NotImplementedError
