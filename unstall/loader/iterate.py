"""One epoch's iterator: times the training loop's waits and hands batches out.

Like torch's iterator, it has a length, and an error raised by the dataset for
one batch leaves the rest of the epoch loadable: the iterator is an object, not
a generator that would end at the first exception.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from unstall.loader import hooks
from unstall.loader.failures import is_task_error, raise_if_failed
from unstall.loader.handoff import unpack
from unstall.loader.slot_handoff import SlotHandoff
from unstall.loader.stats import LoaderStats, batch_size_of
from unstall.loader.worker_death import release_stuck_locks


class _Timed:
    """What both iterators share: the epoch's clock, its end, and observers told of it."""

    def __init__(self, loader: Any, torch_iter: Any, stats: LoaderStats):
        self._loader = loader
        self._torch_iter = torch_iter
        self._stats = stats
        self._done = False
        stats.begin()

    def __iter__(self) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        """torch's iterator's own attributes (e.g. ``_workers``, which torch's tests read)."""
        inner = self.__dict__.get("_torch_iter")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._stats.end()
            if hooks.observed():
                hooks.notify_finished(self._loader)

    def __del__(self) -> None:  # a loop left early: stop the clock
        with contextlib.suppress(Exception):  # interpreter shutdown
            self._finish()


class EpochIterator(_Timed):
    """Host batches of one epoch from torch's worker iterator (slots when zero-copy).

    Args:
        loader: the `DataLoader` (named to observers only).
        torch_iter: the inner torch iterator; yields ``(batch, (fetch_s, prep_s))``.
        position: ``[epoch, batches handed out]``, shared with the loader (resume).
        on_epoch_end: called once when the epoch is complete.
    """

    def __init__(
        self,
        loader: Any,
        torch_iter: Iterator[Any],
        length: int,
        position: list[int],
        stats: LoaderStats,
        *,
        handoff: SlotHandoff | None,
        unpack_inline: bool,
        main_cpu: list[Any],
        on_epoch_end: Callable[[], None],
    ):
        super().__init__(loader, torch_iter, stats)
        self._length = length
        self._position = position
        if handoff is not None and handoff.size == 0:
            handoff = None  # slots not worth it for these batches: inline unpacking only
        self._handoff = handoff
        self._unpack = unpack_inline
        self._cpu = main_cpu
        self._on_epoch_end = on_epoch_end

    def __len__(self) -> int:
        return self._length

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        handoff, stats = self._handoff, self._stats
        if handoff is not None:
            handoff.reclaim()  # slots of batches nothing references any more
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            batch, timing = next(self._torch_iter)
        except StopIteration:
            stats.epochs_completed += 1
            self._finish()
            self._on_epoch_end()
            raise
        except BaseException as exc:
            if is_task_error(exc):  # the dataset's error for one batch: the epoch goes on
                raise
            release_stuck_locks(exc)  # e.g. a worker died: see worker_death.py
            if handoff is not None:
                handoff.retire()  # e.g. a worker died: its slots may never come back
            self._finish()
            raise
        raise_if_failed(batch, handoff)  # the dataset's error; the epoch goes on after it
        if handoff is not None:
            batch = handoff.receive(batch)
        elif self._unpack:
            batch = unpack(batch)
        wait = time.perf_counter() - t0
        stats.wait.add(wait)
        stats.add_task(timing, t0, wait)  # fetch and prep seconds (and the timeline's span)
        stats.samples += batch_size_of(batch)
        self._position[1] += 1
        self._cpu[0] += time.thread_time() - c0
        self._cpu[1] += 1
        if hooks.observed():
            hooks.notify_batch(self._loader, wait)
        return batch


class SizedIterator:
    """A generator (the device path's one-ahead loop) given the epoch's length."""

    def __init__(self, loader: Any, gen: Iterator[Any], length: int, stats: LoaderStats):
        self._loader = loader
        self._gen = gen
        self._length = length
        self._stats = stats

    def __iter__(self) -> SizedIterator:
        return self

    def __next__(self) -> Any:
        try:
            out = next(self._gen)
        except StopIteration:
            if hooks.observed():
                hooks.notify_finished(self._loader)
            raise
        except BaseException as exc:
            release_stuck_locks(exc)  # e.g. a worker died: see worker_death.py
            raise
        if hooks.observed():
            hooks.notify_batch(self._loader, self._stats.wait.last)
        return out

    def __len__(self) -> int:
        return self._length

    def close(self) -> None:
        close = getattr(self._gen, "close", None)
        if close is not None:
            close()


class PassthroughIterator(_Timed):
    """torch's own iterator (iterable datasets), with the training loop's waits timed."""

    def __len__(self) -> int:
        return len(self._torch_iter)

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        stats = self._stats
        t0 = time.perf_counter()
        try:
            batch = next(self._torch_iter)
        except StopIteration:
            stats.epochs_completed += 1
            self._finish()
            stats.close_epoch(stats.epochs_completed - 1, {})
            raise
        except BaseException as exc:
            release_stuck_locks(exc)  # e.g. a worker died: see worker_death.py
            self._finish()
            raise
        wait = time.perf_counter() - t0
        stats.wait.add(wait)
        stats.samples += batch_size_of(batch)
        if hooks.observed():
            hooks.notify_batch(self._loader, wait)
        return batch
