"""Observers of every unstall loader in the process: how `unstall run` and `analyze` watch.

Library code calls `notify_*` at a loader's construction, after each batch it hands
out, and when an iterator's epoch ends (exhausted, dropped, or replaced by the next
``iter()``); with no observer registered each call is a single truth test.
Observers must be quick and must not raise.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class Observer(Protocol):
    """What `unstall run` (and the analyzer) learn of each loader.

    ``batch`` gets ``samples``, the number of samples in the batch counted from the
    batch itself (its first tensor's leading dimension, or its length), when it
    declares a ``samples`` parameter (or ``**kwargs``); observers written before it
    keep their two-argument ``batch(loader, wait_s)``.
    """

    def created(self, loader: Any) -> None: ...

    def batch(self, loader: Any, wait_s: float, samples: int | None = None) -> None: ...

    def finished(self, loader: Any) -> None: ...


_observers: list[tuple[Observer, bool]] = []  # (observer, whether its batch() takes samples)
_before_first: list[Callable[[], Any]] = []


def before_first_loader(callback: Callable[[], Any]) -> None:
    """Run ``callback`` once, as the next unstall loader starts to be made: how `unstall run`
    (which swaps torch's class on its first lookup) also watches a script that makes
    ``unstall.DataLoader`` itself and never names torch's."""
    _before_first.append(callback)


def first_loader() -> None:
    """Run the `before_first_loader` callbacks (each once); a single truth test after."""
    while _before_first:
        _before_first.pop(0)()


def add_observer(observer: Observer) -> Callable[[], None]:
    """Register ``observer`` for every loader made from now on; returns its removal."""
    entry = (observer, _takes_samples(observer))
    _observers.append(entry)

    def remove() -> None:
        if entry in _observers:
            _observers.remove(entry)

    return remove


def _takes_samples(observer: Observer) -> bool:
    try:
        params = inspect.signature(observer.batch).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "samples" or p.kind is p.VAR_KEYWORD for p in params)


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """No observer sees the loaders made and iterated inside: a measurement's own loader (the
    analyzer timing a worker's hand-off in the script's process) is not one of the job's."""
    saved = _observers[:]
    _observers.clear()
    try:
        yield
    finally:
        _observers[:] = saved


def observed() -> bool:
    return bool(_observers)


def notify_created(loader: Any) -> None:
    for observer, _ in _observers:
        observer.created(loader)


def notify_batch(loader: Any, wait_s: float, samples: int | None = None) -> None:
    """One batch of ``samples`` samples handed out after ``wait_s`` seconds in ``__next__``."""
    for observer, takes_samples in _observers:
        if takes_samples:
            observer.batch(loader, wait_s, samples=samples)
        else:
            observer.batch(loader, wait_s)


def iterate_override(loader: Any) -> Iterator[Any] | None:
    """An observer's own iteration for ``loader`` (the analyzer's synthetic run), else None.

    Observers may define ``iterate(loader)``; the first one that returns an iterator wins.
    """
    for observer, _ in _observers:
        iterate = getattr(observer, "iterate", None)
        if iterate is not None:
            out = iterate(loader)
            if out is not None:
                return out
    return None


def next_replacer(loader: Any) -> Callable[[Callable[[], Any]], Any] | None:
    """The observer's ``next_batch`` that hands out ``loader``'s next batch in place of the
    iterator, in an epoch already running (the analyzer's model-alone phase, after its measured
    window on the job's own batches), else None. Observers may define ``replaces_next(loader)``
    and ``next_batch(loader, pull)``, ``pull`` taking a real batch as the iterator would."""
    for observer, _ in _observers:
        replaces = getattr(observer, "replaces_next", None)
        if replaces is not None and replaces(loader):
            return functools.partial(observer.next_batch, loader)  # type: ignore[attr-defined]
    return None


def notify_finished(loader: Any) -> None:
    for observer, _ in _observers:
        observer.finished(loader)
