"""A published batch: one shared-memory file the claimer collates straight into.

The zero-copy slots' machinery (`unstall.loader.handoff.writer`), pointed at a file of
the group: the claimer's worker stacks the batch's large tensors directly into the
file (no batch in torch's shared memory first, no serialising copy), then writes
the small payload that describes it (`SlotTensor` leaves, small tensors inline) and
a trailer. It writes under a temporary name and renames into place, so readers
never see half a batch. Every member maps the file copy-on-write (``MAP_PRIVATE``)
and wraps tensors over it without a copy: one job's in-place edit never reaches
another.

Files are recycled, as slots are: a fresh file costs its pages' allocation and
zeroing and a fault per page (4 ms for a 4.8 MB batch, a tenth of preparing it),
a recycled one 0.7 ms. Who still uses a file is known from ``flock``: a reader
takes a shared lock before it maps, and the lock lives as long as its mapping (the
mapping holds a duplicate of the descriptor), so a batch is recycled only when an
exclusive try-lock succeeds; otherwise it is unlinked and its holders keep their
pages. The recycler blanks the trailer under that lock and the trailer names the
batch, so a reader that opened the old name late sees that it lost the race.

Layout: ``[tensor data, 64-byte aligned][pickled payload] ... [trailer]``; the
trailer (the file's last bytes) is ``MAGIC``, the payload's offset and length, and
the batch's file name. Only processes of the same user on one node read these
files (the directory is theirs alone).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import pickle
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils.data

from unstall.loader.handoff import ALIGN, Arena, collate_into, large_bytes, move_into, pack, rebuild

MAGIC = b"UNSTALLB"
_TRAILER = struct.Struct("<8sQQ24s")
#: Name prefix of recycled files waiting for their next batch.
FREE_PREFIX = "f-"


class PublishTarget:
    """Where a claimed batch goes: `BatchTask` collates into it (``task, target``).

    ``collate`` returns the target itself once the batch is published at ``path``;
    if shared memory is full it returns the batch collated the ordinary way (with
    ``error`` set), which the member then hands over privately.
    """

    def __init__(self, path: str):
        self.path = path
        self.error: str | None = None
        self.recycled = False

    def collate(self, samples: list[Any], collate_fn: Callable[[list[Any]], Any]) -> Any:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = -1
        try:
            fd, self.recycled = _open_for_writing(tmp)
            write_batch(fd, os.path.basename(self.path), samples, collate_fn, self.recycled)
            os.rename(tmp, self.path)
        except OSError as exc:  # shm full, or the group was removed under us
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self.error = f"{type(exc).__name__}: {exc}"
            return collate_fn(samples)
        finally:
            if fd >= 0:
                os.close(fd)  # releases the exclusive lock: readers may map it now
        return self


def _open_for_writing(tmp: str) -> tuple[int, bool]:
    """An exclusively locked descriptor at ``tmp``: a recycled file if one is free, else new."""
    folder = os.path.dirname(tmp)
    for name in os.listdir(folder):
        if not name.startswith(FREE_PREFIX):
            continue
        try:
            os.rename(os.path.join(folder, name), tmp)  # atomic: one taker wins
        except FileNotFoundError:
            continue
        fd = os.open(tmp, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a late reader still holds it: leave it to that reader
            os.close(fd)
            os.unlink(tmp)
            continue
        return fd, True
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, False


def write_batch(
    fd: int,
    name: str,
    samples: list[Any],
    collate_fn: Callable[[list[Any]], Any],
    recycled: bool = False,
) -> None:
    """Collate ``samples`` into the file ``fd`` (large tensors in place, then payload, trailer)."""
    payload = None
    if collate_fn is torch.utils.data.default_collate:
        payload, used, size = _fill(
            fd, _bound(samples), recycled, lambda a: collate_into(samples, a)
        )
    if payload is None:  # a custom collate_fn (or a bound that was too low): its batch, moved
        batch = collate_fn(samples)
        need = large_bytes(batch) + ALIGN * (_leaves(batch) + 1)
        payload, used, size = _fill(fd, need, recycled, lambda a: move_into(batch, a))
        if payload is None:
            raise RuntimeError(f"batch does not fit its computed size {need}")  # a bug
    blob = pickle.dumps(pack(payload), protocol=pickle.HIGHEST_PROTOCOL)
    offset = -(-used // ALIGN) * ALIGN
    end = max(size, offset + len(blob) + _TRAILER.size)
    if end > size:  # the pages up to ``size`` were reserved by `_fill` (or a past batch)
        os.posix_fallocate(fd, size, end - size)
    trailer = _TRAILER.pack(MAGIC, offset, len(blob), _name_field(name))
    os.pwrite(fd, blob, offset)
    os.pwrite(fd, trailer, end - _TRAILER.size)


def _fill(
    fd: int, need: int, recycled: bool, write: Callable[[Arena], Any]
) -> tuple[Any, int, int]:
    """(payload, bytes used, file size) after ``write`` put tensors into the file's first
    ``need`` bytes or more; payload None when they did not fit."""
    size = os.fstat(fd).st_size
    if size < need:
        os.posix_fallocate(fd, 0, need)  # a full /dev/shm is an OSError here, not a SIGBUS
        size = need
    # A recycled file's pages exist: map them all at once (a fault per page costs more).
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if recycled else 0)
    mm = mmap.mmap(fd, size, flags=flags)
    arena = Arena(torch.frombuffer(mm, dtype=torch.uint8))
    payload = write(arena)
    used, overflow = arena.used, arena.overflow
    del arena  # the views over the mapping go; the mapping is unmapped with its last user
    return (None if overflow else payload), used, size


def map_batch(path: str) -> Any:
    """The batch published at ``path``, its tensors over a copy-on-write mapping (no copy).

    Raises `FileNotFoundError` when it was reclaimed (or is being recycled), and
    `ValueError` when the file is not a published batch.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # held as long as the mapping
        except BlockingIOError:
            raise FileNotFoundError(f"{path}: being recycled") from None
        size = os.fstat(fd).st_size
        if size < _TRAILER.size:
            raise ValueError(f"{path}: {size} bytes is not a published batch")
        magic, offset, n, name = _TRAILER.unpack(os.pread(fd, _TRAILER.size, size - _TRAILER.size))
        if magic != MAGIC or name.rstrip(b"\0") != _name_field(path):
            raise FileNotFoundError(f"{path}: recycled for another batch")
        if offset + n > size - _TRAILER.size:
            raise ValueError(f"{path}: not a published batch (bad trailer)")
        payload = pickle.loads(os.pread(fd, n, offset))
        mm = mmap.mmap(fd, offset, access=mmap.ACCESS_COPY) if offset else None
    finally:
        os.close(fd)  # the mapping keeps its own descriptor, and with it the shared lock
    return rebuild(payload, mm, [])


def recycle(path: str, free_path: str | None, *, busy_unlink: bool) -> str:
    """Retire the published batch at ``path``: ``"reused"``, ``"unlinked"`` or ``"busy"``.

    A batch nobody maps goes to ``free_path`` for reuse (unlinked when that is None).
    One still mapped is unlinked if ``busy_unlink`` (its holders keep their pages),
    else left for a later try (``"busy"``): the last member to take a batch holds it
    for a step.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return "unlinked"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not busy_unlink:
                return "busy"
            free_path = None
        if free_path is None:
            os.unlink(path)
            return "unlinked"
        size = os.fstat(fd).st_size
        if size >= _TRAILER.size:
            os.pwrite(fd, bytes(_TRAILER.size), size - _TRAILER.size)  # not that batch now
        os.rename(path, free_path)
        return "reused"
    except FileNotFoundError:
        return "unlinked"
    finally:
        os.close(fd)


def _name_field(path: str) -> bytes:
    """The batch's file name as the trailer holds it (its first 24 bytes)."""
    return os.path.basename(path).encode()[:24]


def _bound(samples: list[Any]) -> int:
    """Bytes `collate_into` may use for ``samples``: every tensor, array and number, aligned."""
    total = 0
    stack = list(samples)
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size() + ALIGN
        elif isinstance(x, np.ndarray):
            total += x.nbytes + ALIGN
        elif isinstance(x, (int, float, bool)):
            total += 8
        elif type(x) in (tuple, list):
            stack.extend(x)
        elif type(x) is dict:
            stack.extend(x.values())
    return total + ALIGN


def _leaves(batch: Any) -> int:
    if type(batch) in (tuple, list):
        return sum(_leaves(x) for x in batch)
    if type(batch) is dict:
        return sum(_leaves(x) for x in batch.values())
    return 1
