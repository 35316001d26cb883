"""torch's DataLoader internals, reached in this one module: every private name of torch's
loader, its iterators and their worker machinery that unstall reads or writes.

unstall runs its map-style epochs on torch's own worker pool and watches it from outside:
which batch task went to which worker (the watchdog's report), the workers' processes
(their deaths, their memory, their shutdown), the base seed a pool was started with
(resume), the persistent iterator a loader keeps. torch exposes none of this publicly,
so each such name is read here and nowhere else (tests/loader/test_torch_iter.py fails
on one named elsewhere).

`check` holds the names against the installed torch (run once, when the first loader is
made): a torch that moved one raises `TorchInternalsError` naming the attribute and what
unstall reads it for, instead of a stray ``AttributeError`` mid-epoch. The names are those
of torch 2.1 to 2.13 (``torch>=2.1``, the package's range).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import _utils as torch_utils
from torch.utils.data import dataloader as torch_dataloader

from unstall.errors import UnstallError

_Loader = torch_dataloader.DataLoader
_BaseIter = torch_dataloader._BaseDataLoaderIter
_MultiIter = torch_dataloader._MultiProcessingDataLoaderIter

#: How long torch's iterator waits on its result queue per read [s] (torch's default).
STATUS_CHECK_S: float = torch_utils.MP_STATUS_CHECK_INTERVAL

#: Every private attribute unstall reads or writes: name -> (torch's class that sets it
#: (or defines it, for methods), what unstall uses it for).
NAMES: dict[str, tuple[type, str]] = {
    "_iterator": (_Loader, "the persistent workers' iterator a loader keeps"),
    "_get_iterator": (_Loader, "the watchdog records the first tasks an iterator sends"),
    "_IterableDataset_len_called": (_Loader, "an epoch's length asked without a warning"),
    "_DataLoader__initialized": (_Loader, "unstall's loader sets its own attributes"),
    "_base_seed": (_BaseIter, "a resumed epoch's workers get the base seed they had"),
    "_next_index": (_BaseIter, "the watchdog records each batch task's indices"),
    "_shutdown": (_MultiIter, "a shut-down iterator is not reported"),
    "_persistent_workers": (_BaseIter, "persistent workers stop with their loader"),
    "_workers": (_MultiIter, "the workers' processes (pids, deaths, memory)"),
    "_workers_status": (_MultiIter, "the watchdog reports retired workers"),
    "_index_queues": (_MultiIter, "queue locks freed after a worker's death; feeders joined"),
    "_task_info": (_MultiIter, "which worker each batch task was sent to"),
    "_rcvd_idx": (_MultiIter, "the batch task the loop waits for"),
    "_send_idx": (_MultiIter, "the batch tasks sent so far"),
    "_worker_pids_set": (_MultiIter, "killed workers' exits raise nothing"),
    "_try_get_data": (_MultiIter, "the watchdog's bounded waits"),
    "_shutdown_workers": (_MultiIter, "an iterator's workers stopped"),
}


class TorchInternalsError(UnstallError, RuntimeError):
    """The installed torch lacks a private name of its DataLoader that unstall uses."""


def _missing(name: str) -> TorchInternalsError:
    owner, why = NAMES[name]
    return TorchInternalsError(
        f"unstall: torch {torch.__version__}'s {owner.__name__} has no attribute {name!r} "
        f"(unstall reads it: {why}); unstall supports torch>=2.1 as far as this name stays "
        "(unstall/loader/workers/torch_iter.py): use a torch release unstall was tested with"
    )


@functools.cache
def _class_block(cls: type) -> str | None:
    """The lines of ``cls``'s module from ``class <name>`` to the next top-level statement:
    its source, cut from the module's text (read once a module, through linecache) without
    the parse `inspect.getsource` runs over the whole module for a class on every call (17
    calls: 0.8 s of CPU in every process that made a loader). None: no source shipped."""
    try:
        text = inspect.getsource(sys.modules[cls.__module__])
    except (OSError, TypeError, KeyError):
        return None
    start = re.search(rf"^class {re.escape(cls.__name__)}\b", text, re.M)
    if start is None:
        return None
    end = re.compile(r"^(?=[^\s#])", re.M).search(text, start.end())
    return text[start.start() : end.start() if end else len(text)]


def _assigns(source: str, name: str, cls: type) -> bool:
    mangled = f"_{cls.__name__}__"
    short = name[len(mangled) - 2 :] if name.startswith(mangled) else name  # self.__x
    return re.search(rf"self\.{re.escape(short)}\b\s*(:[^=\n]*)?=", source) is not None


def _set_in_source(cls: type, name: str) -> bool | None:
    """Whether ``cls``'s source assigns ``self.<name>`` (None: its source is not readable).
    A name not in the quick cut (`_class_block`) is looked for in `inspect.getsource`'s."""
    block = _class_block(cls)
    if block is not None and _assigns(block, name, cls):
        return True
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return None
    return _assigns(source, name, cls)


@functools.cache
def check() -> None:
    """Raise `TorchInternalsError` if the installed torch lacks a name of `NAMES` (once a
    process): methods are looked up on their class, attributes in the class's source (an
    instance sets them; where the source is not shipped, only the methods are checked)."""
    for name, (cls, _) in NAMES.items():
        if callable(getattr(cls, name, None)):
            continue
        if _set_in_source(cls, name) is False:
            raise _missing(name)
    if not callable(getattr(torch_utils.signal_handling, "_remove_worker_pids", None)):
        raise TorchInternalsError(
            f"unstall: torch {torch.__version__} has no "
            "torch.utils.data._utils.signal_handling._remove_worker_pids (unstall calls it: "
            "killed workers' exits raise nothing)"
        )


def _read(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _missing(name) from None


# The loader (torch's ``DataLoader``) ------------------------------------------------
def running_iterator(inner: Any) -> Any:
    """The iterator torch's loader ``inner`` keeps for its persistent workers (or None)."""
    return getattr(inner, "_iterator", None)


def forget_iterator(inner: Any, it: Any) -> None:
    """If ``inner`` keeps ``it`` (persistent workers), forget it: the next ``iter()``
    starts a new pool."""
    if getattr(inner, "_iterator", None) is it:
        inner._iterator = None


def length_unasked(inner: Any) -> int | None:
    """``len(inner)`` (None: no length) without counting as the user's own ``len()``, past
    which torch warns that an iterable dataset yields more than its length."""
    asked = _read(inner, "_IterableDataset_len_called")
    try:  # an iterable dataset with __len__ has a length (torch's estimate)
        length: int | None = len(inner)
    except TypeError:
        length = None
    inner._IterableDataset_len_called = asked
    return length


def adopt(loader: Any, inner: Any) -> None:
    """``loader`` (unstall's) takes torch's loader ``inner``'s attributes, torch's guard
    against setting them opened until `set_initialized`; the names here are checked first
    (`check`, once a process)."""
    check()
    loader.__dict__.update(inner.__dict__)
    set_initialized(loader, False)


def set_initialized(loader: Any, done: bool) -> None:
    """Open (False) or close (True) torch's guard against setting a loader's attributes."""
    loader.__dict__["_DataLoader__initialized"] = done


def iter_prepared(inner: Any, prepare: Callable[[Any], None]) -> Iterator[Any]:
    """``iter(inner)`` (workers: a multiprocess iterator), ``prepare`` given the iterator
    before its ``__init__`` runs, which already sends the first ``prefetch_factor x
    num_workers`` tasks."""

    def make() -> Any:
        inner.check_worker_number_rationality()
        it = _MultiIter.__new__(_MultiIter)
        prepare(it)
        _MultiIter.__init__(it, inner)
        return it

    inner._get_iterator = make
    try:
        return iter(inner)
    finally:
        del inner._get_iterator


# The iterator and its workers -----------------------------------------------------
def is_torch_iter(obj: Any) -> bool:
    """Whether ``obj`` is one of torch's loader iterators."""
    return isinstance(obj, _BaseIter)


def base_seed(it: Any) -> int | None:
    """The base seed ``it``'s workers were started with (None: not one of torch's)."""
    return getattr(it, "_base_seed", None)


def workers(it: Any) -> list[Any]:
    """``it``'s worker processes (none without workers)."""
    return getattr(it, "_workers", None) or []


def persistent(it: Any) -> bool:
    """Whether ``it``'s workers outlive its epoch (``persistent_workers=True``)."""
    return bool(getattr(it, "_persistent_workers", False))


def is_shut_down(it: Any) -> bool:
    """Whether ``it``'s workers were shut down."""
    return bool(getattr(it, "_shutdown", False))


def worker_active(it: Any, worker: int) -> bool:
    """Whether worker ``worker`` of ``it`` still takes tasks (not retired)."""
    return bool(_read(it, "_workers_status")[worker])


def task_info(it: Any) -> dict[int, tuple[Any, ...]]:
    """``it``'s tasks in flight: task number -> ``(worker,)``, or ``(worker, batch)`` once
    the batch arrived out of order (empty without workers)."""
    return getattr(it, "_task_info", {})


def waiting_for(it: Any) -> int | None:
    """The number of the batch task ``it`` hands out next (the one the loop waits for)."""
    return getattr(it, "_rcvd_idx", None)


def tasks_sent(it: Any) -> int | None:
    """How many batch tasks ``it`` has sent (the number the one being sent gets)."""
    return getattr(it, "_send_idx", None)


def wrap_next_index(it: Any, next_index: Callable[[], Any]) -> None:
    """``it`` takes each task's indices from ``next_index`` (which calls `next_index_of`)."""
    it._next_index = next_index


def next_index_of(it: Any) -> Any:
    """torch's own ``_next_index`` of ``it``: the next task's indices from its sampler."""
    return type(it)._next_index(it)


def wrap_try_get_data(it: Any, try_get_data: Callable[..., tuple[bool, Any]]) -> None:
    """``it`` waits for each result through ``try_get_data`` (which calls `try_get_data_of`)."""
    it._try_get_data = try_get_data


def try_get_data_of(it: Any, timeout: float) -> tuple[bool, Any]:
    """torch's own ``_try_get_data`` of ``it``: one read of the result queue."""
    return type(it)._try_get_data(it, timeout)


def forget_worker_pids(it: Any) -> None:
    """torch forgets ``it``'s worker pids: their exits (a kill) raise nothing in the loop."""
    if getattr(it, "_worker_pids_set", False):
        torch_utils.signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False


def shutdown_workers(it: Any) -> None:
    """torch's own shutdown of ``it``'s workers (queues closed, workers joined)."""
    _read(it, "_shutdown_workers")()


def index_queue_locks(it: Any) -> list[Any]:
    """The ``_notempty`` conditions of ``it``'s index queues (`multiprocessing.Queue`'s)."""
    locks = (getattr(q, "_notempty", None) for q in getattr(it, "_index_queues", ()))
    return [lock for lock in locks if lock is not None]


def index_queue_feeders(it: Any) -> list[Any]:
    """The feeder threads of ``it``'s index queues (`multiprocessing.Queue`'s) still set."""
    feeders = (getattr(q, "_thread", None) for q in getattr(it, "_index_queues", ()))
    return [feeder for feeder in feeders if feeder is not None]
