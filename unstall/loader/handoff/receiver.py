"""The main process's side of the zero-copy hand-off: which slots are taken, and when they free.

`SlotHandoff` owns every piece of slot bookkeeping for one loader (pools, size,
batches in use, counters); `SlotSampler` hands each task a free slot as torch
dispatches it. The rules are in `unstall.loader.handoff.slots`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch.utils.data
from torch.multiprocessing.reductions import StorageWeakRef

from unstall.loader.handoff.slots import (
    MIN_SLOT_BATCH_BYTES,
    SlotBatch,
    SlotPool,
    SlotRef,
    large_bytes,
    rebuild,
    slot_dir,
    slot_size_for,
)

log = logging.getLogger("unstall")

#: Slots beyond one per task in flight: batches the loop (or the device stage) still holds.
SPARE_SLOTS = 4


def slots_for(workers: int, prefetch: int | None) -> int:
    """Slots a pool of ``workers`` x ``prefetch`` tasks in flight needs (prefetch None: 2)."""
    return (prefetch or 2) * workers + SPARE_SLOTS


class SlotHandoff:
    """The main side's slot bookkeeping: pools, sizing, release, counters; one per loader.

    The slot size is decided from the first batch that arrives the normal way:
    batches under `MIN_SLOT_BATCH_BYTES` of large tensors never use slots.
    """

    def __init__(self, count: int, *, batch_bytes: int | None = None, cuda_register: bool = False):
        self.count = count
        self.cuda_register = cuda_register
        self.size: int | None = None  # None: undecided; 0: slots not worth it
        if batch_bytes is not None:  # declared by the pipeline: slots from the first task on
            self.size = slot_size_for(batch_bytes) if batch_bytes >= MIN_SLOT_BATCH_BYTES else 0
        self.current: SlotPool | None = None
        self.pools: dict[int, SlotPool] = {}
        self._in_use: list[tuple[SlotPool, int, list[StorageWeakRef]]] = []
        self.slot_batches = 0
        self.spilled = 0
        self.no_free_slot = 0

    def acquire(self) -> SlotRef | None:
        current = self.current
        if current is None:
            return None
        ref = current.acquire()
        if ref is None:
            self.no_free_slot += 1
        return ref

    def receive(self, batch: Any) -> Any:
        """The batch as tensors; its slot stays taken while anything references them."""
        if type(batch) is SlotBatch:
            pool = self.pools.get(batch.pool)
            if pool is None:
                raise RuntimeError(
                    "a batch arrived for a slot pool this loader already freed: two iterators "
                    "of one loader were used at once; finish or delete the old one first"
                )
            if batch.spilled:
                self.spilled += 1
                pool.release(batch.index)
                if batch.error is not None:
                    self._give_up(batch.error)
                return rebuild(batch.payload)
            self.slot_batches += 1
            watch: list[StorageWeakRef] = []
            out = pool.wrap(batch, watch)
            if watch:
                self._in_use.append((pool, batch.index, watch))
            else:  # only bytes (copied out) or small leaves: nothing views the slot
                pool.release(batch.index)
            return out
        batch = rebuild(batch)
        if self.size is None:
            nbytes = large_bytes(batch)
            self.size = slot_size_for(nbytes) if nbytes >= MIN_SLOT_BATCH_BYTES else 0
        if self.size and self.current is None:
            self._open(self.size)
        return batch

    def release_slot(self, pool: int, index: int) -> None:
        """Give back the slot of a task that failed before writing to it."""
        owner = self.pools.get(pool)
        if owner is not None:
            owner.release(index)

    def reclaim(self) -> None:
        """Free the slots whose batches nothing references any more (call at each request)."""
        in_use = self._in_use
        if not in_use:
            return
        keep = []
        for entry in in_use:
            if all(ref.expired() for ref in entry[2]):
                entry[0].release(entry[1])
            else:
                keep.append(entry)
        self._in_use = keep

    def _open(self, size: int) -> None:
        try:
            self.current = SlotPool(self.count, size)
        except OSError as exc:
            self._give_up(f"{exc}")
            return
        self.pools[self.current.pool] = self.current
        if self.cuda_register:
            self.current.register_with_cuda()

    def _give_up(self, error: str) -> None:
        """No room for slots: log once, unlink them, let every batch take torch's path."""
        if self.size:
            log.warning(
                "zero-copy slots disabled: cannot reserve %d x %.1f MiB in %s (%s); batches "
                "take torch's path. Enlarge /dev/shm (docker: --shm-size) or pass zero_copy=False",
                self.count,
                self.size / 2**20,
                slot_dir(),
                error,
            )
        self.size = 0
        self.retire()

    def begin_epoch(self) -> None:
        """Forget retired pools; retire the current one if an abandoned epoch left slots taken.

        Slots still held by batches the consumer keeps stay taken (not an abandoned epoch).
        """
        self.reclaim()
        for key in [k for k, p in self.pools.items() if p.closed]:
            del self.pools[key]
        current = self.current
        if current is not None:
            kept = sum(1 for pool, _, _ in self._in_use if pool is current)
            if current.free_count + kept != len(current.refs):
                self.retire()
        if self.current is None and self.size:
            self._open(self.size)

    def retire(self) -> None:
        """Unlink the current pool (e.g. a worker died); batches in flight stay readable."""
        if self.current is not None:
            self.current.close()
            self.current = None

    def close(self) -> None:
        """Unlink every pool; safe to call twice."""
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        self.current = None

    def stats(self) -> dict[str, Any]:
        return {
            "slot_batches": self.slot_batches,
            "spilled": self.spilled,
            "no_free_slot": self.no_free_slot,
            "slot_bytes": self.size or 0,
            "slots": self.count if self.current is not None else 0,
            "slots_held": len(self._in_use),
        }


class SlotSampler(torch.utils.data.Sampler):
    """Wraps the loader's batch sampler: a task gets ``(indices, SlotRef)`` when a slot is free."""

    def __init__(self, inner: torch.utils.data.Sampler, handoff: SlotHandoff):
        self.inner = inner
        self.handoff = handoff

    def __iter__(self) -> Iterator[Any]:
        if self.handoff.size == 0:  # batches too small for slots: torch's path, nothing added
            yield from self.inner
            return
        acquire = self.handoff.acquire
        for indices in self.inner:
            ref = acquire()
            yield indices if ref is None else (indices, ref)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]
