"""The local-disk tier: one packed data file per dataset, read with ``os.pread``, and its index.

Files, in ``$UNSTALL_CACHE_DIR/tiers`` (default ``~/.cache/unstall/tiers``; opening,
listing and removing them: `unstall.cache.disk_files`)::

    <name>.idx                 the index: the shared-memory segment's layout with an
                               empty data area (header, process slots, offset/length/state
                               per item), mapped MAP_SHARED by every process
    <name>.<ino>-<created>.data  the items, packed back to back, written with ``pwrite``

Why an index *file* mapped from the cache directory rather than one in ``/dev/shm``:
the disk tier must outlive the jobs (epoch 2 of the next job is its point), and a
mapped file gives every process of the node the same page-cache pages, so the
RAM tier's publication protocol carries over unchanged, as the same code
(`ShmCache.claim` under ``flock``, ``pwrite`` without it, `ShmCache.publish` READY
under ``flock``; readers use the same `ShmCache.lookup`, reading the data file). A
second filler sees CLAIMED or READY and does not store the item again. The data
file's name carries the index's inode and creation time, so a replaced index can
never point into an older data file.

A killed job's claims (items it was writing) are dropped by the next job that
opens the tier with no live user: CLAIMED -> EMPTY, and the data file is cut
back to the end of the last published item when the dropped ones lay at its
tail. Written pages reach the disk only eventually: the last user to close
syncs the data file and marks the index clean; an index found unclean after a
reboot (another boot id) is emptied rather than trusted.
"""

from __future__ import annotations

import errno
import os
import warnings
from typing import Any

import numpy as np

from unstall.cache import disk_files
from unstall.cache.capacity import format_bytes
from unstall.cache.disk_files import (
    H_DISK_CAPACITY,
    H_FULL,
    auto_disk_bytes,
    cache_dir,
    index_path,
    tier_dir,
)
from unstall.cache.shm import segment
from unstall.cache.shm.index import H_BUMP, H_CACHED_BYTES, H_CACHED_ITEMS, ShmCache
from unstall.cache.tier import MappedTier


class DiskFullWarning(UserWarning):
    """The disk under the cache directory filled up: the disk tier stops growing."""


class DiskTier(MappedTier):
    """A dataset's disk tier (`unstall.cache.opening.open_disk`); ``path=None``: off."""

    def _attach(self) -> tuple[ShmCache, int] | None:
        self._fd = -1
        got = disk_files.attach_tier(self.path or "", owner=self.owner, group=self.group)
        if got is None:
            return None
        index, slot, self._fd = got
        return index, slot

    def _lookup(
        self, index: ShmCache, indices: list[int], versions: np.ndarray | None
    ) -> tuple[list[bytes | None], int]:
        fd = self._fd

        def read(offsets: np.ndarray, lengths: np.ndarray) -> list[bytes | None]:
            out: list[bytes | None] = []
            for start, size in zip(offsets.tolist(), lengths.tolist(), strict=True):
                raw = os.pread(fd, size, start)
                out.append(raw if len(raw) == size else None)  # short: cut under us, a miss
            return out

        return index.lookup(indices, versions, read)

    def put_many(
        self, items: list[tuple[int, bytes]], versions: np.ndarray | None, since: int
    ) -> tuple[int, int]:
        """Append items not yet stored (or stored under another version) while space lasts;
        returns (items, bytes). The one process that finds the disk full (ENOSPC) first
        warns; everyone stops writing, and what was stored stays served."""
        index = self.mapped()
        if index is None or not items:
            return 0, 0
        hdr = index.hdr
        if int(hdr[H_FULL]):
            return 0, 0
        claims = index.claim(items, int(hdr[H_DISK_CAPACITY]), versions, since)
        if not claims:
            return 0, 0
        written: set[int] = set()
        failure = None
        for claim in claims:
            try:
                _pwrite_all(self._fd, claim[2], claim[1])
            except OSError as exc:
                if not segment.is_no_space(exc):
                    raise
                failure = exc
                break
            written.add(claim[0])
        with index.locked():  # publish and mark the tier full in one hold
            published, size = index.publish(claims, written)
            first_full = failure is not None and not int(hdr[H_FULL])
            if first_full:
                hdr[H_FULL] = 1
        if first_full:
            warnings.warn(
                f"the disk under {tier_dir()} is full: the disk cache {self.name} "
                f"stops at {format_bytes(int(hdr[H_BUMP]))}; items past that are fetched "
                "from storage (free space, or set UNSTALL_CACHE_DIR to a larger disk)",
                DiskFullWarning,
                stacklevel=4,
            )
        return published, size

    def check(self) -> None:
        """Assert the index is consistent (tests); no-op when off."""
        index = self.mapped()
        if index is not None:
            index.capacity = int(index.hdr[H_DISK_CAPACITY])  # check() bounds items by it
            index.check()

    def _identity(self) -> dict[str, Any]:
        return {"dir": tier_dir()}

    def _figures(self, index: ShmCache) -> dict[str, Any]:
        hdr, cap = index.hdr, int(index.hdr[H_DISK_CAPACITY])
        return {
            "capacity_bytes": cap,
            "cached_bytes": int(hdr[H_CACHED_BYTES]),
            "used_bytes": int(hdr[H_BUMP]),
            "items_cached": int(hdr[H_CACHED_ITEMS]),
            "items": index.layout.n_items,
            "fill_fraction": round(int(hdr[H_BUMP]) / cap, 6) if cap else 0.0,
            "full": bool(int(hdr[H_FULL])),
        }

    def _release(self, index: ShmCache) -> bool:
        disk_files.release(index, self._fd, group=self.group)  # the files stay
        return False


def _pwrite_all(fd: int, raw: bytes, offset: int) -> None:
    view = memoryview(raw)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "short write to the disk cache")
        view, offset = view[n:], offset + n


__all__ = [
    "DiskFullWarning",
    "DiskTier",
    "auto_disk_bytes",
    "cache_dir",
    "index_path",
    "tier_dir",
]
