"""What a worker does for one batch: fetch, prepare, collate, and time each step.

`BatchTask` is handed to torch's worker processes as their "dataset"; each
task it receives is a whole batch of indices, so a store can fetch the batch
with many requests in flight.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch.utils.data

from unstall.errors import SampleError, UnstallError
from unstall.loader.failures import add_note, describe, failure_from, mark_task_error
from unstall.loader.handoff import SlotRef, SlotWriter, pack
from unstall.loader.sampling import Planned
from unstall.loader.schedclock import runq_s
from unstall.pipeline.batch_seed import batch_rng


@runtime_checkable
class SplitDataset(Protocol):
    """A dataset whose loading is two steps: ``fetch`` raw bytes, then ``prepare``.

    What a cache binds is the other protocol, `unstall.stores.base.KeyedDataset` (``fetch``,
    ``key``, ``fingerprint``), tested by `unstall.stores.base.is_keyed` alone.
    """

    def key(self, index: int) -> str: ...

    def fetch(self, indices: Sequence[int]) -> list[bytes]: ...

    def prepare(self, index: int, raw: bytes) -> Any: ...


class CollateTarget(Protocol):
    """Where a task's batch goes instead of the ordinary hand-off (given as ``(indices, target)``).

    ``collate`` collates ``samples`` with ``collate_fn`` into its own memory and returns
    what the worker hands back for the batch.
    """

    def collate(self, samples: list[Any], collate_fn: Callable[[list[Any]], Any]) -> Any: ...


class FetchLayer(Protocol):
    """Gets raw bytes for a batch, e.g. through a cache before the dataset's store."""

    def fetch(self, dataset: SplitDataset, indices: Sequence[int]) -> list[bytes]: ...

    def prefetch(self, dataset: SplitDataset, indices: Sequence[int]) -> None: ...


class Timing:
    """A task's ``(fetch_s, prep_s)``, plus ``span`` for the analyzer's timeline (issue 17).

    ``span``: ``(worker id, start, fetch end, end, prepare CPU seconds, samples, run-queue
    seconds)``, times from `time.perf_counter` (one monotonic clock shared by the
    processes); the CPU seconds are the worker thread's while preparing (while loading,
    for a dataset that does not separate fetching from preparing); the run-queue seconds
    are the task's whole time runnable but waiting for a core (`schedclock`). Unpacks as
    the plain 2-tuple it was. Not a tuple itself: torch's pin-memory thread rebuilds every
    tuple and sequence it is handed (``pin_memory=True`` on a CUDA machine), which would
    drop ``span`` and leave the analyzer without worker timings; other objects it passes
    through as they are.
    """

    __slots__ = ("fetch_s", "prep_s", "remote", "span")

    def __init__(
        self,
        fetch_s: float,
        prep_s: float,
        span: tuple[int, float, float, float, float, int, float] | None = None,
        *,
        remote: bool = False,
    ):
        self.fetch_s, self.prep_s, self.span = fetch_s, prep_s, span
        self.remote = remote  # prepared by a remote worker (issue 45)

    def __iter__(self) -> Iterator[float]:
        return iter((self.fetch_s, self.prep_s))

    def __repr__(self) -> str:
        return f"Timing(fetch_s={self.fetch_s!r}, prep_s={self.prep_s!r}, span={self.span!r})"

    @staticmethod
    def of(t0: float, t1: float, c0: float, n: int, q0: float = -1.0) -> Timing:
        t2, cpu = time.perf_counter(), time.thread_time() - c0
        runq = max(0.0, runq_s() - q0) if q0 >= 0 else 0.0
        info = torch.utils.data.get_worker_info()
        span = (-1 if info is None else info.id, t0, t1, t2, cpu, n, runq)
        return Timing(t1 - t0, t2 - t1, span)


class BatchTask(torch.utils.data.Dataset):
    """Turns a list of indices into ``(batch, (fetch_s, prep_s))``; runs in workers.

    Errors name the sample at fault: a failure for a whole batch is retried
    index by index to find the culprit, so the message gives its index and key.
    """

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[list[Any]], Any],
        *,
        fetch_layer: FetchLayer | None = None,
        unbatched: bool = False,
        pack: bool = False,
        slots: bool = False,
    ):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.fetch_layer = fetch_layer
        self.unbatched = unbatched
        self.pack = pack
        self.writer = SlotWriter() if slots and not unbatched else None
        self.split = isinstance(dataset, SplitDataset)
        self.batched_get = getattr(dataset, "__getitems__", None)
        self._step = "loading"  # what the running task does: named in error notes
        self._index: int | None = None  # the sample being loaded or prepared, if one at a time

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, task: Any) -> tuple[Any, tuple[float, float]]:
        """``task``: a list of indices, or ``(indices, SlotRef | CollateTarget)`` to collate
        into that slot or target.

        A failure comes back as a `TaskFailure` from a worker process (the training
        loop re-raises it, the iterator stays usable) and is raised here in the main
        process; either way with the dataset's own exception type and a note naming
        the sample, or as `SampleError` for unstall's own datasets.
        """
        ref = None
        if type(task) is tuple:
            task, ref = task
        self._index = None
        try:
            with batch_rng(task):  # issue 18: augmentation from (seed, epoch, batch) alone
                return self._run(task, ref)
        except Exception as exc:
            error, note, index, key = self._explain(exc, list(task))
            if torch.utils.data.get_worker_info() is None:
                add_note(error, note)
                mark_task_error(error)
                if error is exc:
                    raise
                raise error from exc
            if error is exc:
                return failure_from(exc, note, index, key, ref), (0.0, 0.0)
            try:
                raise error from exc
            except Exception:
                return failure_from(error, note, index, key, ref), (0.0, 0.0)

    def _run(self, indices: list[int], ref: Any) -> tuple[Any, tuple[float, float]]:
        q0 = runq_s()
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.split:
            if type(indices) is Planned and indices.ahead is not None:
                self._prefetch(indices + indices.ahead)
            self._step = "fetching"
            raws = self._fetch(indices)
            t1, c0 = time.perf_counter(), time.thread_time()
            self._step = "preparing"
            prepare, samples = self.dataset.prepare, []
            for i, raw in zip(indices, raws, strict=True):
                self._index = i
                samples.append(prepare(i, raw))
        else:
            t1 = t0
            self._step = "loading"
            samples = self._load_plain(indices)
        self._step = "collating"
        return self._collate(samples, ref), Timing.of(t0, t1, c0, len(indices), q0)

    def _collate(self, samples: list[Any], ref: Any) -> Any:
        """The batch: into a zero-copy slot, into a `CollateTarget`, or the ordinary way."""
        if type(ref) is SlotRef and self.writer is not None:
            return self.writer.collate(samples, self.collate_fn, ref)
        if ref is not None and type(ref) is not SlotRef:  # e.g. a coordination group's file
            return ref.collate(samples, self._collate_one if self.unbatched else self.collate_fn)
        batch = self.collate_fn(samples[0] if self.unbatched else samples)
        return pack(batch) if self.pack else batch

    def _collate_one(self, samples: list[Any]) -> Any:
        return self.collate_fn(samples[0])

    def _explain(
        self, exc: Exception, indices: list[int]
    ) -> tuple[Exception, str, int | None, str | None]:
        """(the exception to raise, its note, the culprit index and key) for a failed task."""
        step = self._step
        if isinstance(exc, SampleError):
            index, key = exc.index, exc.key
            return exc, describe(step, index, key, indices), index, key
        if step == "collating":
            return exc, describe(step, None, None, indices), None, None
        index = self._index if self._index is not None else _culprit(exc, self.dataset, indices)
        key = _key_of(self.dataset, index)
        if step == "fetching" or isinstance(exc, UnstallError):  # unstall's own store or data
            error = _sample_error(exc, index, key, indices, step)
            return error, describe(step, index, key, indices), index, key
        return exc, describe(step, index, key, indices), index, key

    def _fetch(self, indices: list[int]) -> list[bytes]:
        if self.fetch_layer is not None:
            return self.fetch_layer.fetch(self.dataset, indices)
        return self.dataset.fetch(indices)

    def _prefetch(self, indices: list[int]) -> None:
        """Start this batch's and the next one's fetches (a hint: failures surface in fetch)."""
        with contextlib.suppress(Exception):  # the fetch that follows reports real problems
            if self.fetch_layer is not None:
                self.fetch_layer.prefetch(self.dataset, indices)
            else:
                self.dataset.prefetch(indices)

    def _load_plain(self, indices: list[int]) -> list[Any]:
        if self.batched_get is not None:
            return list(self.batched_get(indices))
        samples, dataset = [], self.dataset
        for i in indices:
            self._index = i
            samples.append(dataset[i])
        return samples


def _culprit(exc: Exception, dataset: Any, indices: list[int]) -> int | None:
    """The index whose loading fails alone (``exc.index`` if it names one)."""
    culprit = getattr(exc, "index", None)
    if isinstance(culprit, int):
        return culprit
    if len(indices) == 1:
        return indices[0]
    for i in indices:
        try:
            if isinstance(dataset, SplitDataset):
                dataset.fetch([i])
            else:
                dataset[i]
        except Exception:
            return i
    return None


def _key_of(dataset: Any, index: int | None) -> str | None:
    if index is None or not hasattr(dataset, "key"):
        return None
    try:
        return dataset.key(index)
    except Exception:
        return None


def _sample_error(
    exc: Exception, index: int | None, key: str | None, indices: list[int], step: str
) -> SampleError:
    """A `SampleError` naming the index (and key) whose loading fails alone."""
    where = f"sample {index}" if index is not None else f"batch of indices {indices}"
    if key is not None:
        where += f" (key {key!r})"
    return SampleError(
        f"error while {step} {where}: {type(exc).__name__}: {exc}", index=index, key=key
    )
