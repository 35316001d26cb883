"""The local-disk tier's files: where they live, how big "auto" makes them, opening, leaving,
listing and removing them (the tier itself, reads and writes: `unstall.cache.disk_tier`).

The root is `unstall.machine.cache_dir` (``$UNSTALL_CACHE_DIR``, default ``~/.cache/unstall``) and
the budget of a disk tier sized "auto" is `auto_disk_bytes`: anything else the node
keeps on local disk for the cache (shard copies) uses the same two.

Files live in ``$UNSTALL_CACHE_DIR/tiers`` (``<name>.idx``, the index, and
``<name>.<ino>-<created>.data``, the items); `unstall.cache.disk_tier` says why and how
they are written.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
from typing import Any

import numpy as np

from unstall.cache.shm import lifecycle, segment
from unstall.cache.shm.index import (
    CLAIMED,
    EMPTY,
    H_BUMP,
    H_CACHED_BYTES,
    H_CACHED_ITEMS,
    H_CREATED,
    H_DATASET_BYTES,
    H_FP0,
    H_FP1,
    READY,
    S_GROUP,
    Layout,
    ShmCache,
)
from unstall.machine import cache_dir

# header words of the disk index, after the segment's own (0..19)
H_DISK_CAPACITY, H_BOOT, H_CLEAN, H_FULL = 20, 21, 22, 23
#: "auto" takes at most this share of the free space of the cache directory's disk ...
AUTO_SHARE = 0.5
#: ... and always leaves this much free.
KEEP_FREE = 10 << 30
#: A disk tier smaller than this is not worth a file: none is made.
MIN_DISK = 1 << 20


def tier_dir() -> str:
    """Where the disk tiers' files are: ``<cache_dir>/tiers``."""
    return os.path.join(cache_dir(), "tiers")


def free_bytes(directory: str) -> int:
    """Free bytes on the disk that holds ``directory`` (or its nearest existing parent)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return segment.free_bytes(path)


def auto_disk_bytes(dataset_bytes: int) -> int:
    """The local-disk budget for ``dataset_bytes`` of data under `cache_dir`: min(dataset +
    10 %, AUTO_SHARE of the free space, free space - KEEP_FREE), >= 0."""
    free = free_bytes(cache_dir())
    room = max(0, min(int(free * AUTO_SHARE), free - KEEP_FREE))
    return min(dataset_bytes + dataset_bytes // 10 + MIN_DISK, room)


def index_path(name: str) -> str:
    return os.path.join(tier_dir(), f"{name}.idx")


def boot_id() -> int:
    """This boot's id as an int64 (0 where the kernel does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            raw = hashlib.blake2b(f.read().strip(), digest_size=8).digest()
    except OSError:
        return 0
    return int(np.frombuffer(raw, dtype=np.int64)[0])


def data_path(index: ShmCache) -> str:
    """The data file that belongs to this index (named by its inode and creation time)."""
    base = index.path[: -len(".idx")]
    return f"{base}.{os.fstat(index.fd).st_ino}-{int(index.hdr[H_CREATED])}.data"


def open_tier(
    name: str, n_items: int, capacity: int, fingerprint: str, dataset_bytes: int, group: int
) -> tuple[ShmCache, int, int, str]:
    """Open (or create) the tier's index and data file; ``(index, slot, data_fd, how)``.

    Raises ``OSError`` (ENOSPC etc.) when the directory cannot hold even the index.
    """
    os.makedirs(tier_dir(), exist_ok=True)
    path = index_path(name)
    layout = Layout(n_items=n_items, capacity=0)
    index, slot, how = lifecycle.open_or_create(
        path, layout, fingerprint, dataset_bytes, group=group
    )
    try:
        with index.locked():
            hdr = index.hdr
            if how == "created":
                _remove_other_data_files(path, keep=data_path(index))
            elif how == "reclaimed" and int(hdr[H_BOOT]) != boot_id() and not int(hdr[H_CLEAN]):
                _empty(index)  # written before a crash of the machine: not trusted
            if how != "attached":  # no live user: this job's size and this boot apply
                hdr[H_DISK_CAPACITY] = max(capacity, int(hdr[H_BUMP]))
                hdr[H_BOOT], hdr[H_FULL] = boot_id(), 0
            hdr[H_CLEAN] = 0
            fd = os.open(data_path(index), os.O_RDWR | os.O_CREAT, 0o600)
            if how == "reclaimed":
                _cut_tail(index, fd)
            if how != "attached":  # index files half-created by dead processes
                _remove_dead_tmp(glob.escape(path) + ".*.tmp")
    except BaseException:
        with index.locked():
            index.slots[index.slots[:, S_GROUP] == group] = 0
        index.close()
        raise
    return index, slot, fd, how


def attach_tier(path: str, *, owner: int, group: int) -> tuple[ShmCache, int, int] | None:
    """Map the index and open the data file from a worker; None if the tier is gone."""
    got = lifecycle.attach(path, owner=owner, group=group)
    if got is None:
        return None
    index, slot = got
    try:
        fd = os.open(data_path(index), os.O_RDWR)
    except FileNotFoundError:
        index.close()
        return None
    return index, slot, fd


def _empty(index: ShmCache) -> None:
    index.state[:] = EMPTY
    index.offset[:] = 0
    index.length[:] = 0
    hdr = index.hdr
    hdr[H_BUMP] = hdr[H_CACHED_ITEMS] = hdr[H_CACHED_BYTES] = 0


def _cut_tail(index: ShmCache, fd: int) -> None:
    """Give back the space of dropped claims at the data file's end (lock held)."""
    ready = index.state == READY
    end = int((index.offset[ready] + index.length[ready]).max()) if ready.any() else 0
    if (index.state == CLAIMED).any():
        return  # a live writer's claims (cannot happen after a reclaim; be safe)
    index.hdr[H_BUMP] = end
    os.ftruncate(fd, end)


def _remove_other_data_files(index_file: str, keep: str) -> None:
    base = index_file[: -len(".idx")]
    for path in glob.glob(glob.escape(base) + ".*.data"):
        if path != keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _remove_dead_tmp(pattern: str) -> list[str]:
    """Remove ``<file>.<pid>.tmp`` files matching ``pattern`` whose creating process is gone."""
    removed = []
    for path in glob.glob(pattern):
        pid = path[: -len(".tmp")].rpartition(".")[2]
        if pid.isdigit() and not segment.pid_alive(int(pid), 0):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(os.path.basename(path))
    return removed


def release(index: ShmCache, fd: int, *, group: int) -> None:
    """An owner leaves; the last one syncs the data and marks the index clean. Never removes."""
    with index.locked():
        index.slots[index.slots[:, S_GROUP] == group] = 0
        if not lifecycle.alive_owners(index) and segment.still_linked(index.fd, index.path):
            with contextlib.suppress(OSError):
                os.fdatasync(fd)
            index.mm.flush()
            index.hdr[H_CLEAN] = 1
            index.mm.flush()
    os.close(fd)
    index.close()


def describe(path: str) -> dict[str, Any] | None:
    """What `unstall cache list` shows for one disk tier; None if not a valid index."""
    cache = lifecycle.map_file(path, skip=(FileNotFoundError, PermissionError))
    if not isinstance(cache, ShmCache):
        return None
    try:
        if not cache.valid():
            return None
        hdr = cache.hdr
        fp = np.array([hdr[H_FP0], hdr[H_FP1]], dtype=np.int64).tobytes().hex()
        data = data_path(cache)
        on_disk = os.stat(data).st_blocks * 512 if os.path.exists(data) else 0
        return {
            "tier": "disk",
            "name": os.path.basename(path)[: -len(".idx")],
            "fingerprint": fp,
            "policy": "noevict",
            "capacity_bytes": int(hdr[H_DISK_CAPACITY]),
            "used_bytes": int(hdr[H_BUMP]),
            "items_cached": int(hdr[H_CACHED_ITEMS]),
            "items": cache.layout.n_items,
            "file_bytes": on_disk + os.fstat(cache.fd).st_size,
            "dataset_bytes": int(hdr[H_DATASET_BYTES]),
            "users_alive": lifecycle.alive_owners(cache),
            "path": data,
        }
    finally:
        cache.close()


def list_names() -> list[str]:
    """Disk tiers of this user (by the segment prefix) in `tier_dir`."""
    try:
        names = os.listdir(tier_dir())
    except FileNotFoundError:
        return []
    prefix = segment.name_prefix()
    return sorted(n[: -len(".idx")] for n in names if n.startswith(prefix) and n.endswith(".idx"))


def remove(name: str, *, force: bool = False) -> bool:
    """Remove a disk tier (index and data) if no live process uses it (or anyway with force)."""
    path = index_path(name)
    if not os.path.exists(path):
        return False
    cache = lifecycle.map_file(path)
    if isinstance(cache, ShmCache):
        try:
            with segment.locked(cache.fd):
                if cache.valid() and lifecycle.alive_owners(cache) and not force:
                    return False
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        finally:
            cache.close()
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    _remove_other_data_files(path, keep="")
    return True


def remove_orphans() -> list[str]:
    """Data files with no index, and half-created index files of dead processes."""
    removed = []
    indexes = {index_path(n)[: -len(".idx")] for n in list_names()}
    prefix = os.path.join(tier_dir(), segment.name_prefix())
    for path in glob.glob(glob.escape(prefix) + "*.data"):
        if not any(path.startswith(base + ".") for base in indexes):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(os.path.basename(path))
    return removed + _remove_dead_tmp(glob.escape(prefix) + "*.tmp")
