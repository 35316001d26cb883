"""Zero-copy hand-off: workers write finished batches into shared-memory slots.

torch sends each large tensor from a worker through a fresh shared-memory file
and a passed file descriptor, which the main process maps and faults in: for
image batches that is most of the main process's CPU time. Here the main
process creates a fixed pool of slot files once; the sampler (which torch runs
in the main process) hands each task a free slot; the worker stacks the batch
straight into it and returns only a small descriptor; the main process wraps
the slot's memory as tensors, without copying or unpickling the payload.

Rules:
  * The main process creates, maps and unlinks every slot (STYLE rule 11);
    workers only attach. Names come from `slot_name` alone.
  * A slot is reused only once nothing references its batch: each batch gets
    its own tensor storages over the slot, and at every request the main
    process frees the slots whose storages have all been collected (with a
    CUDA ``device``: also once the copy from them has completed). A consumer
    that drops each batch recycles slots; one that keeps batches (``list(loader)``)
    keeps their slots, and later batches take torch's path: never corrupted.
  * The pool holds prefetch_factor x num_workers + 4 slots: torch keeps at most
    prefetch_factor x num_workers tasks outstanding, plus the batch the consumer
    holds, the one its loop variable still holds during ``next()``, and the one
    a device stage prepares ahead. A task finding no free slot, or a batch bigger
    than its slot, takes torch's normal path (counted).
  * Slots are unlinked when the loader is closed or collected, when an epoch
    fails (e.g. a worker was killed), and when an iteration is abandoned
    mid-way; segments of dead processes are swept when a pool is created.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import re
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data
from torch.multiprocessing.reductions import StorageWeakRef

from unstall import machine
from unstall.loader.handoff.inline import INLINE_MAX_BYTES, Inline

#: Every slot segment name starts with this (then uid, owner pid, pool and slot numbers).
SLOT_PREFIX = "unstall_slot"
#: Batches whose large tensors total less than this keep torch's path (no gain below it).
MIN_SLOT_BATCH_BYTES = 256 * 1024
#: ``bytes`` of at least this size go through the slot (a memcpy each way) instead of
#: pickle and the pipe (four copies): 2,048 JPEGs of 75 kB from 2 workers, 0.17-0.26 s
#: per epoch through the pipe.
BYTES_MIN = 16 * 1024
ALIGN = 64
_HEADROOM = 1.25
_pool_ids = itertools.count()


def slot_dir() -> str:
    """Where slot files live: the shared-memory directory (`unstall.machine.shm_dir`)."""
    return machine.shm_dir()


def job_prefix(owner_pid: int | None = None) -> str:
    """The per-job part of every slot name: user and the owning (main) process."""
    return f"{SLOT_PREFIX}-u{os.getuid()}-p{owner_pid or os.getpid()}-"


def slot_name(pool: int, index: int, owner_pid: int | None = None) -> str:
    """The one place slot segment names are made."""
    return f"{job_prefix(owner_pid)}{pool}-{index}"


def leftover_slots(owner_pid: int | None = None) -> list[str]:
    """Slot files of ``owner_pid`` (default: this process) still in `slot_dir` (tests use it)."""
    prefix = job_prefix(owner_pid)
    return sorted(n for n in os.listdir(slot_dir()) if n.startswith(prefix))


@dataclass(frozen=True)
class SlotRef:
    """A slot as a task carries it to a worker."""

    name: str
    size: int
    pool: int
    index: int


@dataclass(frozen=True)
class SlotTensor:
    """A tensor the worker wrote into its slot: where it lies and what it is."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class SlotBytes:
    """A ``bytes`` object the worker wrote into its slot (fetch-only batches: raw samples);
    the main process copies it out, so the slot is free once the batch has been received."""

    offset: int
    size: int


@dataclass(frozen=True)
class SlotBatch:
    """What crosses the pipe for a task that had a slot: the slot and the batch.

    ``payload`` has `SlotTensor` leaves, or is an ordinary (packed) batch when
    ``spilled`` (it did not fit): either way the main process frees the slot.
    """

    pool: int
    index: int
    payload: Any
    spilled: bool = False
    error: str | None = None


class SlotPool:
    """The main process's slots: created once, recycled, unlinked on close (idempotent)."""

    def __init__(self, count: int, size: int):
        if count < 1 or size < 1:
            raise ValueError(f"slot pool needs count >= 1 and size >= 1; got {count=}, {size=}")
        _sweep_dead_owners()
        self.pool = next(_pool_ids)
        self.size = size
        self.refs: list[SlotRef] = []
        self._bases: list[torch.Tensor] = []
        self._maps: list[mmap.mmap] = []
        self._free = list(range(count - 1, -1, -1))
        self._closed = False
        self._paths: list[str] = []
        paths = self._paths
        self._registered: list[int] = []
        self._closer = weakref.finalize(self, _unlink_all, paths, self._maps, self._registered)
        try:
            for i in range(count):
                name = slot_name(self.pool, i)
                path = os.path.join(slot_dir(), name)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                paths.append(path)
                try:  # workers reserve the pages (posix_fallocate) when they first map a slot
                    os.ftruncate(fd, size)
                    mm = mmap.mmap(fd, size)
                finally:
                    os.close(fd)
                self._maps.append(mm)
                self._bases.append(torch.frombuffer(mm, dtype=torch.uint8))
                self.refs.append(SlotRef(name, size, self.pool, i))
        except BaseException:
            self.close()
            self._closer()
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def free_count(self) -> int:
        return len(self._free)

    def register_with_cuda(self) -> None:
        """Page-lock every slot (``cudaHostRegister``) so copies to the GPU are async DMA."""
        cudart = torch.cuda.cudart()
        for base in self._bases:
            cudart.cudaHostRegister(base.data_ptr(), base.numel(), 0)
            self._registered.append(base.data_ptr())

    def acquire(self) -> SlotRef | None:
        """A free slot for the next task, or None (the task then takes torch's path)."""
        if self._free and not self._closed:
            return self.refs[self._free.pop()]
        return None

    def release(self, index: int) -> None:
        self._free.append(index)

    def all_free(self) -> bool:
        return len(self._free) == len(self.refs)

    def wrap(self, batch: SlotBatch, watch: list[StorageWeakRef]) -> Any:
        """The batch as tensors over the slot's memory (no copy), each on a fresh storage.

        A weak reference to every storage is appended to ``watch``: the slot is in
        use until they have all expired.
        """
        return rebuild(batch.payload, self._maps[batch.index], watch)

    def check(self) -> None:
        """Invariant: every slot is free at most once."""
        if len(set(self._free)) != len(self._free) or not set(self._free) <= set(
            range(len(self.refs))
        ):
            raise RuntimeError(f"slot pool free list is corrupt: {self._free}")

    def close(self) -> None:
        """Unlink every slot file (safe to call twice); stop handing out slots.

        The mappings stay until the pool is collected, so batches already in
        flight can still be read; memory lives on while tensors view it.
        """
        self._free.clear()
        self._closed = True
        for path in self._paths:
            _unlink(path)


def large_bytes(batch: Any) -> int:
    """Bytes of the tensors in ``batch`` that would go into a slot (each above the inline
    limit), and of its ``bytes`` objects of at least `BYTES_MIN`."""
    if isinstance(batch, torch.Tensor):
        n = batch.numel() * batch.element_size()
        return n if n > INLINE_MAX_BYTES else 0
    if type(batch) is bytes:
        return len(batch) if len(batch) >= BYTES_MIN else 0
    if type(batch) in (tuple, list):
        return sum(large_bytes(x) for x in batch)
    if type(batch) is dict:
        return sum(large_bytes(x) for x in batch.values())
    return 0


def slot_size_for(nbytes: int) -> int:
    """Slot size for batches of ``nbytes``: headroom for varying shapes, whole MiB."""
    mib = 1 << 20
    return -(-int(nbytes * _HEADROOM + ALIGN * 16) // mib) * mib


def rebuild(payload: Any, slot: mmap.mmap | None = None, watch: list | None = None) -> Any:
    """Tensors from a payload: `SlotTensor` leaves over ``slot``, `Inline` leaves by value."""
    kind = type(payload)
    if kind is SlotTensor:
        if slot is None or watch is None:
            raise RuntimeError(
                "a spilled slot batch holds slot tensors: a worker wrote a bad batch"
            )
        count = torch.Size(payload.shape).numel()
        flat = torch.frombuffer(slot, dtype=payload.dtype, count=count, offset=payload.offset)
        watch.append(StorageWeakRef(flat.untyped_storage()))
        return flat.view(payload.shape)
    if kind is SlotBytes:
        if slot is None:
            raise RuntimeError("a spilled slot batch holds slot bytes: a worker wrote a bad batch")
        return slot[payload.offset : payload.offset + payload.size]
    if kind is Inline:
        return torch.from_numpy(payload.array)
    if kind is tuple:
        return tuple(rebuild(x, slot, watch) for x in payload)
    if kind is list:
        return [rebuild(x, slot, watch) for x in payload]
    if kind is dict:
        return {k: rebuild(v, slot, watch) for k, v in payload.items()}
    return payload


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _unlink_all(paths: list[str], maps: list[mmap.mmap], registered: list[int]) -> None:
    """Unlink the slot files. Mappings are never closed here: batches (tensors from
    ``torch.frombuffer``, which keep the mmap object alive) may still use them; each
    is unmapped when its last user goes. Page-locked ones stay mapped until exit, as
    unregistering would race with copies and tensors still using them."""
    for path in paths:
        _unlink(path)
    if registered:
        _PAGE_LOCKED.extend(maps)


#: Mappings registered with CUDA: kept (and registered) for the life of the process.
_PAGE_LOCKED: list[mmap.mmap] = []


_OWNER = re.compile(rf"^{SLOT_PREFIX}-u(\d+)-p(\d+)-")


def _sweep_dead_owners() -> None:
    """Remove slot files left by this user's processes that died without cleaning up."""
    uid = str(os.getuid())
    try:
        names = os.listdir(slot_dir())
    except OSError:
        return
    for name in names:
        m = _OWNER.match(name)
        if m is None or m.group(1) != uid or process_alive(int(m.group(2))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(slot_dir(), name))


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
