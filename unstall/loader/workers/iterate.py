"""One epoch's iterator: times the training loop's waits and hands batches out.

Like torch's iterator, it has a length, and an error raised by the dataset for
one batch leaves the rest of the epoch loadable: the iterator is an object, not
a generator that would end at the first exception.

Statistics are per iterator: each has its own clock, and its epoch ends when it
is exhausted, dropped, or replaced by the loader's next ``iter()``. An epoch
whose every batch was handed out counts as completed even if the loop never
asked for more (Lightning stops after ``len(loader)`` batches).
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from unstall.loader import hooks
from unstall.loader.device import DeviceStage
from unstall.loader.failures import is_task_error, raise_if_failed
from unstall.loader.handoff import SlotHandoff, unpack
from unstall.loader.position import Cursor
from unstall.loader.stats import CpuMeter, LoaderStats
from unstall.loader.workers.stuck_start import StuckAtStart
from unstall.loader.workers.worker_death import release_stuck_locks, retire_on_worker_death
from unstall.models.batch import batch_size_of

#: Iterators not yet garbage: `end_open_epochs` ends theirs at exit.
_open: weakref.WeakSet[_Timed] = weakref.WeakSet()


def end_open_epochs() -> None:
    """End the epoch of every iterator still alive (at exit: a framework may keep its last
    epoch's iterator to the end, e.g. one stopped after ``len(loader)`` batches)."""
    for it in list(_open):
        it.end_epoch()


class _Timed:
    """What the iterators share: the epoch's clock, its end, and observers told of both.

    Args:
        loader: the `DataLoader` (named to observers only).
        torch_iter: the inner iterator.
        stats: the loader's `LoaderStats`.
        length: batches in this epoch (None: unknown; only exhaustion completes it).
        on_epoch_end: called once when the epoch completes (records its figures).
    """

    def __init__(
        self,
        loader: Any,
        torch_iter: Any,
        stats: LoaderStats,
        length: int | None,
        on_epoch_end: Callable[[], None],
    ):
        self._loader = loader
        self._torch_iter = torch_iter
        self._stats = stats
        self._length = length
        self._on_epoch_end = on_epoch_end
        self._handed = 0
        self._done = False  # exhausted or failed: no more batches
        self._counted = False  # the epoch was counted as completed
        self._broken = False  # failed (e.g. a worker died): the epoch never completes
        self._clock = stats.clock()
        _open.add(self)

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        if hooks.observed():
            replace = hooks.next_replacer(self._loader)
            if replace is not None:
                return self._replaced(replace)
        return self._next()

    def _next(self) -> Any:
        raise NotImplementedError

    def _replaced(self, replace: Callable[[Callable[[], Any]], Any]) -> Any:
        """An observer's batch in place of the next (`hooks.next_replacer`): the epoch keeps
        its length, and ends as it would."""
        if self._done or (self._length is not None and self._handed >= self._length):
            self._exhausted()
            raise StopIteration
        before = self._handed
        batch = replace(self._next)
        if self._handed == before:  # not a real batch pulled (that one counted itself)
            self._handed += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        """torch's iterator's own attributes (e.g. ``_workers``, which torch's tests read)."""
        inner = self.__dict__.get("_torch_iter")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def _handed_out(self, now: float, wait: float, batch: Any) -> None:
        """Book one batch handed out at ``now`` after ``wait`` seconds in ``__next__``."""
        stats = self._stats
        samples = batch_size_of(batch)
        stats.wait.add(wait)
        stats.samples += samples
        self._handed += 1
        self._clock.mark(now, full=self._length is not None and self._handed >= self._length)
        if hooks.observed():
            hooks.notify_batch(self._loader, wait, samples)

    def end_epoch(self, *, exhausted: bool = False, failed: bool = False) -> None:
        """End this iterator's epoch: exhausted, or dropped / replaced (then it is
        complete if every batch was handed out). Safe to call again."""
        changed = not self._clock.closed
        self._clock.close(time.perf_counter() if exhausted else None)
        length = self._length
        complete = exhausted or (length is not None and 0 < length <= self._handed)
        self._broken = self._broken or failed
        if complete and not self._broken and not self._counted:
            self._counted = changed = True
            self._stats.epochs_completed += 1
            self._on_epoch_end()
        if changed and hooks.observed():
            hooks.notify_finished(self._loader)

    def _exhausted(self) -> None:
        self._done = True
        self.end_epoch(exhausted=True)

    def _failed(self) -> None:
        self._done = True
        self.end_epoch(failed=True)

    def __del__(self) -> None:  # dropped (a loop left early, or a framework's epoch)
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.end_epoch()


class EpochIterator(_Timed):
    """The batches of one epoch from torch's worker iterator: one body for host batches
    and device batches.

    Each ``next()`` pulls a batch (``(batch, (fetch_s, prep_s))``), takes it out of its
    zero-copy slot (or unpacks it), and with a ``stage`` (`DeviceStage`) sends it to the
    device one batch ahead: the batch handed out was submitted at the call before, so
    its copy (and GPU prep) overlapped the training step.

    A dataset's error for one batch leaves a host epoch loadable; with a device stage
    every error ends the epoch (the batch ahead is lost with it).

    Args:
        loader: the `DataLoader` (named to observers only).
        torch_iter: the inner torch iterator.
        length: batches in this epoch.
        cursor: the epoch's `Cursor` (batches handed out), kept by the loader's position.
        stats: the loader's `LoaderStats`.
        handoff: the loader's slots, or None.
        unpack_inline: batches come packed (`handoff.pack`): unpack them.
        cpu: the loader's `CpuMeter` (main-process CPU per batch).
        on_epoch_end: called once when the epoch is complete.
        stage: the device stage, or None (host batches).
        tuner: ``num_workers="auto"``'s tuner (`unstall.loader.autotune`): told of each
            batch, it may change the pool before the next pull; or None.
        workers_iter: torch's iterator whose workers make the batches (``torch_iter``
            may wrap it, e.g. a coordination group's); default ``torch_iter``.
    """

    def __init__(
        self,
        loader: Any,
        torch_iter: Iterator[Any],
        length: int,
        cursor: Cursor,
        stats: LoaderStats,
        *,
        handoff: SlotHandoff | None,
        unpack_inline: bool,
        cpu: CpuMeter,
        on_epoch_end: Callable[[], None],
        stage: DeviceStage | None = None,
        tuner: Any = None,
        workers_iter: Any = None,
    ):
        super().__init__(loader, torch_iter, stats, length, on_epoch_end)
        self.workers_iter = torch_iter if workers_iter is None else workers_iter
        self._tuner = tuner
        self._last_timing: Any = None  # the last pulled batch's worker timing (for the tuner)
        self._cursor = cursor
        if handoff is not None and handoff.size == 0:
            handoff = None  # slots not worth it for these batches: inline unpacking only
        self._handoff = handoff
        if handoff is not None and stage is None:
            retire_on_worker_death(handoff)  # torch raises a death wherever the loop is
        self._unpack = unpack_inline
        self._cpu = cpu
        self._stage = stage
        self._ahead: Any = None  # with a stage: the batch submitted one ahead (its handle)
        self._pulled_all = False  # with a stage: torch's iterator ran out

    def __len__(self) -> int:
        return self._length or 0

    @property
    def cursor(self) -> Cursor:
        """The epoch and the batches handed out (its start included)."""
        return self._cursor

    @property
    def pulled(self) -> int:
        """Batches of the epoch taken from the workers (handed out, or held ahead)."""
        return self._cursor.handed + (1 if self._ahead is not None else 0)

    def has_more(self) -> bool:
        """Whether batches are left for the workers to make."""
        return not (self._done or self._pulled_all) and self.pulled < (self._length or 0)

    def run_on(self, torch_iter: Any, workers_iter: Any) -> None:
        """Pull the rest of the epoch from ``torch_iter`` (new workers: a pool change)."""
        self._torch_iter, self.workers_iter = torch_iter, workers_iter

    def _next(self) -> Any:
        if self._done:
            raise StopIteration
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            if self._tuner is not None:  # a pool change decided after the last batch
                self._tuner.apply(self)
            if self._stage is None:
                if self._handoff is not None:
                    self._handoff.reclaim()  # slots of batches nothing references any more
                batch, timing = self._pull()
            else:
                batch = self._device_step(t0)
        except StopIteration:
            self._exhausted()
            raise
        except BaseException as exc:
            if self._stage is None and is_task_error(exc):  # one batch's error: epoch goes on
                raise
            release_stuck_locks(exc)  # e.g. a worker died: see worker_death.py
            if self._handoff is not None:
                self._handoff.retire()  # e.g. a worker died: its slots may never come back
            self._failed()
            raise
        if self._stage is None:
            batch = self._received(batch)  # the dataset's error raises here; the epoch goes on
        now = time.perf_counter()
        wait = now - t0
        if self._stage is None:
            self._stats.add_task(timing, t0, wait)  # fetch and prep seconds (and timeline span)
        self._cursor.handed += 1
        self._cpu.add(time.thread_time() - c0)
        self._handed_out(now, wait, batch)
        if self._tuner is not None:
            self._tuner.observe(self, wait, timing if self._stage is None else self._last_timing)
        return batch

    def _pull(self) -> Any:
        """The next batch from the workers; a worker stuck at start restarts them first."""
        while True:
            try:
                return next(self._torch_iter)
            except StuckAtStart as stuck:  # its pool stopped: the epoch goes on on a new one
                stuck.restart(self)

    def _received(self, batch: Any) -> Any:
        """A pulled batch out of its slot (or unpacked); a worker's failure raised here."""
        raise_if_failed(batch, self._handoff)
        if self._handoff is not None:
            return self._handoff.receive(batch)
        return unpack(batch) if self._unpack else batch

    def _device_step(self, t0: float) -> Any:
        """The device stage's step: submit the next batch, hand out the one submitted before."""
        if self._ahead is None:  # the first batch (or none left): submit it, then one more
            self._ahead = self._submit(t0)
            if self._ahead is None:
                raise StopIteration
        handle = self._submit(t0)
        out = self._stage.finish(self._ahead)  # type: ignore[union-attr]
        self._ahead = handle
        return out

    def _submit(self, t0: float) -> Any:
        """Pull one batch and start it on its way to the device; None when none is left."""
        if self._pulled_all:
            return None
        try:
            batch, timing = self._pull()
        except StopIteration:
            batch = timing = None
        raise_if_failed(batch, self._handoff)
        if self._handoff is not None:
            self._handoff.reclaim()  # slots of batches nothing references (the stage included)
        if batch is None:
            self._pulled_all = True
            return None
        handle = self._stage.submit(self._received(batch))  # type: ignore[union-attr]
        del batch  # its slot frees once the stage is done with it
        self._stats.add_task(timing, t0, time.perf_counter() - t0)
        self._last_timing = timing
        return handle

    def end_epoch(self, *, exhausted: bool = False, failed: bool = False) -> None:
        stage = self.__dict__.get("_stage")
        if stage is not None and (exhausted or failed):
            self._close_stage()
        super().end_epoch(exhausted=exhausted, failed=failed)

    def _close_stage(self) -> None:
        """Wait for the device copies in flight and stop the stage's thread (idempotent)."""
        stage = self.__dict__.get("_stage")
        if stage is not None:
            self._ahead = None
            stage.close()

    def close(self) -> None:
        """Stop the epoch now: a device stage (and the slots it holds) is released."""
        self._close_stage()
        self._done = True
        self.end_epoch()

    def __del__(self) -> None:  # dropped: the device stage stops with its epoch
        with contextlib.suppress(Exception):  # interpreter shutdown
            self._close_stage()
        super().__del__()


def _record(stats: LoaderStats) -> None:
    """An iterable dataset's epoch, recorded when it completes."""
    stats.close_epoch(stats.epochs_completed - 1, {})


class PassthroughIterator(_Timed):
    """torch's own iterator (iterable datasets), with the training loop's waits timed."""

    def __init__(self, loader: Any, torch_iter: Any, stats: LoaderStats, length: int | None):
        # not a bound method: the iterator must not hold itself (a cycle keeps torch's
        # iterator, and persistent workers, alive after `del` until the next gc)
        super().__init__(loader, torch_iter, stats, length, functools.partial(_record, stats))

    def __len__(self) -> int:
        return len(self._torch_iter)

    def _next(self) -> Any:
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        try:
            batch = next(self._torch_iter)
        except StopIteration:
            self._exhausted()
            raise
        except BaseException as exc:
            release_stuck_locks(exc)  # e.g. a worker died: see worker_death.py
            self._failed()
            raise
        now = time.perf_counter()
        self._handed_out(now, now - t0, batch)
        return batch
