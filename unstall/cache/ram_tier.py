"""The RAM tier: a dataset's items in one shared-memory segment, shared by the node's jobs.

Opened by `unstall.cache.opening.open_ram` (which maps the segment, creating it if
no process on the node has); its policy (`unstall.cache.policy`) says how items are
read and stored. When its last user leaves, the segment is kept ``keep_s`` seconds
for the next job (`unstall.cache.shm.keep`), then removed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from unstall.cache.policy import Policy, policy_named
from unstall.cache.shm import keep, lifecycle
from unstall.cache.shm.index import (
    H_CACHED_BYTES,
    H_CACHED_ITEMS,
    H_EVICTIONS,
    H_RECLAIMS,
    H_STALE_BYTES,
    H_TOO_LARGE,
    ShmCache,
)
from unstall.cache.tier import MappedTier


class RamTier(MappedTier):
    """A segment in shared memory under ``policy``; ``path=None``: off (no shared memory)."""

    def __init__(self, *, policy: str, keep_s: float = 0.0, **args: Any):
        super().__init__(**args)
        self.policy = policy
        #: The policy object (chosen by name, once: `unstall.cache.policy`).
        self.rule: Policy = policy_named(policy)
        self.keep_s = keep_s  # seconds the segment stays after its last user (`shm.keep`)

    @property
    def lock_free(self) -> bool:
        """True if reads take no lock (no eviction): the peer server serves them inline."""
        return self.rule.lock_free

    def _attach(self) -> tuple[ShmCache, int] | None:
        return lifecycle.attach(self.path or "", owner=self.owner, group=self.group)

    def _lookup(
        self, index: ShmCache, indices: list[int], versions: np.ndarray | None
    ) -> tuple[list[bytes | None], int]:
        return self.rule.get_many(index, indices, versions)

    def put_many(
        self, items: list[tuple[int, bytes]], versions: np.ndarray | None, since: int
    ) -> tuple[int, int]:
        """Store items not cached (or stale) under the policy; returns (items, bytes)."""
        index = self.mapped()
        if index is None:
            return 0, 0
        return self.rule.put_many(index, items, versions, since)

    def check(self) -> None:
        """Assert the segment's index is consistent (tests); no-op when off."""
        index = self.mapped()
        if index is not None:
            self.rule.check(index)

    def _identity(self) -> dict[str, Any]:
        return {"name": self.name, "policy": self.policy}

    def _figures(self, index: ShmCache) -> dict[str, Any]:
        hdr, used = index.hdr, index.used_bytes()
        return {
            "cached_bytes": int(hdr[H_CACHED_BYTES]),
            "used_bytes": used,
            "items_cached": int(hdr[H_CACHED_ITEMS]),
            "items": index.layout.n_items,
            "fill_fraction": round(used / index.capacity, 6) if index.capacity else 0.0,
            "evictions": int(hdr[H_EVICTIONS]),
            "too_large": int(hdr[H_TOO_LARGE]),
            "reclaims": int(hdr[H_RECLAIMS]),
            "stale_bytes": int(hdr[H_STALE_BYTES]),
            "keep_s": self.keep_s,
        }

    def _release(self, index: ShmCache) -> bool:
        removed = lifecycle.release(index, group=self.group, keep_s=self.keep_s)
        if not removed and self.keep_s > 0:
            if self.path is not None and os.path.exists(self.path):
                keep.start_reaper(self.path)
            keep.sweep()  # a kept segment counts against the limits now
        return removed
