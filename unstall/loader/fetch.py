"""What a worker does for one batch: fetch, prepare, collate, and time each step.

`BatchTask` is handed to torch's worker processes as their "dataset"; each
task it receives is a whole batch of indices, so a store can fetch the batch
with many requests in flight.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch.utils.data

from unstall.errors import SampleError
from unstall.loader.handoff import pack
from unstall.loader.sampling import Planned
from unstall.loader.slot_writer import SlotWriter


@runtime_checkable
class SplitDataset(Protocol):
    """A dataset whose loading is two steps: ``fetch`` raw bytes, then ``prepare``."""

    def key(self, index: int) -> str: ...

    def fetch(self, indices: Sequence[int]) -> list[bytes]: ...

    def prepare(self, index: int, raw: bytes) -> Any: ...


class FetchLayer(Protocol):
    """Gets raw bytes for a batch, e.g. through a cache before the dataset's store."""

    def fetch(self, dataset: SplitDataset, indices: Sequence[int]) -> list[bytes]: ...

    def prefetch(self, dataset: SplitDataset, indices: Sequence[int]) -> None: ...


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

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, task: Any) -> tuple[Any, tuple[float, float]]:
        """``task``: a list of indices, or ``(indices, SlotRef)`` to collate into that slot."""
        ref = None
        if type(task) is tuple:
            task, ref = task
        indices: list[int] = task
        t0 = time.perf_counter()
        if self.split:
            if type(task) is Planned:
                self._prefetch(indices + task.ahead)
            raws = self._fetch(indices)
            t1 = time.perf_counter()
            prepare = self.dataset.prepare
            samples = [prepare(i, raw) for i, raw in zip(indices, raws, strict=True)]
        else:
            t1 = t0
            samples = self._load_plain(indices)
        if ref is not None and self.writer is not None:
            batch = self.writer.collate(samples, self.collate_fn, ref)
            return batch, (t1 - t0, time.perf_counter() - t1)
        batch = self.collate_fn(samples[0] if self.unbatched else samples)
        if self.pack:
            batch = pack(batch)
        return batch, (t1 - t0, time.perf_counter() - t1)

    def _fetch(self, indices: list[int]) -> list[bytes]:
        try:
            if self.fetch_layer is not None:
                return self.fetch_layer.fetch(self.dataset, indices)
            return self.dataset.fetch(indices)
        except SampleError:
            raise
        except Exception as exc:
            raise _name_culprit(exc, self.dataset, indices, "fetching") from exc

    def _prefetch(self, indices: list[int]) -> None:
        """Start this batch's and the next one's fetches (a hint: failures surface in fetch)."""
        with contextlib.suppress(Exception):  # the fetch that follows reports real problems
            if self.fetch_layer is not None:
                self.fetch_layer.prefetch(self.dataset, indices)
            else:
                self.dataset.prefetch(indices)

    def _load_plain(self, indices: list[int]) -> list[Any]:
        try:
            if self.batched_get is not None:
                return list(self.batched_get(indices))
            return [self.dataset[i] for i in indices]
        except SampleError:
            raise
        except Exception as exc:
            raise _name_culprit(exc, self.dataset, indices, "loading") from exc


def _name_culprit(exc: Exception, dataset: Any, indices: list[int], step: str) -> SampleError:
    """Build a `SampleError` naming the index (and key) whose loading fails alone."""
    culprit = getattr(exc, "index", None)
    if culprit is None and len(indices) == 1:
        culprit = indices[0]
    if culprit is None:
        for i in indices:
            try:
                if isinstance(dataset, SplitDataset):
                    dataset.fetch([i])
                else:
                    dataset[i]
            except Exception:
                culprit = i
                break
    key = None
    if culprit is not None and hasattr(dataset, "key"):
        try:
            key = dataset.key(culprit)
        except Exception:
            key = None
    where = f"sample {culprit}" if culprit is not None else f"batch of indices {indices}"
    if key is not None:
        where += f" (key {key!r})"
    return SampleError(
        f"error while {step} {where}: {type(exc).__name__}: {exc}", index=culprit, key=key
    )
