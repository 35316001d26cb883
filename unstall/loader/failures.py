"""A batch task's failure: the dataset's own exception type, with a note naming where.

torch re-raises a worker's exception in the training loop as the same type (its
message holds the worker's traceback); unstall keeps that and adds a PEP 678 note
naming the dataset index, its key and the worker, so ``except KeyError`` in a
script still catches a `KeyError` raised by its dataset. Failures of unstall's own
datasets and stores (a corrupt JPEG, a missing object) are `SampleError`s.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, NoReturn

import torch.utils.data
from torch._utils import ExceptionWrapper

from unstall.errors import SampleError
from unstall.loader.handoff.slots import SlotRef


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+), or the same ``__notes__`` list on 3.10."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


_MARK = "_unstall_task_error"


def mark_task_error(exc: BaseException) -> None:
    """Mark ``exc`` as one batch's failure (raised in the main process): the epoch goes on."""
    with contextlib.suppress(AttributeError):  # an exception type with __slots__
        setattr(exc, _MARK, True)


def is_task_error(exc: BaseException) -> bool:
    """True for a batch's failure, after which the epoch's iterator stays usable."""
    return bool(getattr(exc, _MARK, False))


def where() -> str:
    """``worker N`` inside a DataLoader worker process, else ``the main process``."""
    info = torch.utils.data.get_worker_info()
    return f"DataLoader worker {info.id}" if info is not None else "the main process"


def describe(step: str, index: int | None, key: str | None, indices: list[int]) -> str:
    """The note: what was being done, to which sample (or batch), where."""
    if index is not None:
        what = f"dataset index {index}" + (f" (key {key!r})" if key is not None else "")
    else:
        what = f"the batch of dataset indices {indices}"
    return f"unstall: raised while {step} {what} in {where()}"


@dataclass
class TaskFailure:
    """Sent from a worker instead of a batch: re-raised in the training loop as torch would.

    Unlike an exception escaping the worker, it leaves the epoch's iterator usable
    (as torch's is after a dataset error) and lets the loader free the task's slot.
    """

    wrapper: ExceptionWrapper
    note: str
    index: int | None
    key: str | None
    slot: tuple[int, int] | None = None  # (pool, index) of the slot the task was given

    def reraise(self) -> NoReturn:
        try:
            self.wrapper.reraise()
        except Exception as exc:
            if isinstance(exc, SampleError):
                exc.index, exc.key = self.index, self.key
            add_note(exc, self.note)
            # torch's reraise frame (finished) holds the exception in a local: a reference
            # cycle that keeps the epoch's iterator, and so its workers, alive until the
            # garbage collector runs, which then waits 5 s per worker; clear its locals
            below = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
            while below is not None:
                below.tb_frame.clear()
                below = below.tb_next
            raise
        raise AssertionError("unreachable")  # pragma: no cover


def failure_from(exc: BaseException, note: str, index: int | None, key: str | None, ref: Any):
    """The `TaskFailure` for ``exc`` (just caught in a worker)."""
    wrapper = ExceptionWrapper(where=f"in DataLoader worker process {_worker_id()}")
    slot = (ref.pool, ref.index) if isinstance(ref, SlotRef) else None
    return TaskFailure(wrapper, note, index, key, slot)


def _worker_id() -> int | str:
    info = torch.utils.data.get_worker_info()
    return info.id if info is not None else "main"


def raise_if_failed(batch: Any, handoff: Any = None) -> None:
    """Re-raise a worker's `TaskFailure` here, first giving its slot back."""
    if type(batch) is TaskFailure:
        if batch.slot is not None and handoff is not None:
            handoff.release_slot(*batch.slot)
        batch.reraise()
