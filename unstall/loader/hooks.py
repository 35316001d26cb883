"""Observers of every unstall loader in the process: how `unstall run` and `analyze` watch.

Library code calls `notify_*` at a loader's construction, after each batch it hands
out, and at the end of each iteration; with no observer registered each call is a
single truth test. Observers must be quick and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol


class Observer(Protocol):
    """What `unstall run` (and the analyzer) learn of each loader."""

    def created(self, loader: Any) -> None: ...

    def batch(self, loader: Any, wait_s: float) -> None: ...

    def finished(self, loader: Any) -> None: ...


_observers: list[Observer] = []


def add_observer(observer: Observer) -> Callable[[], None]:
    """Register ``observer`` for every loader made from now on; returns its removal."""
    _observers.append(observer)

    def remove() -> None:
        if observer in _observers:
            _observers.remove(observer)

    return remove


def observed() -> bool:
    return bool(_observers)


def notify_created(loader: Any) -> None:
    for observer in _observers:
        observer.created(loader)


def notify_batch(loader: Any, wait_s: float) -> None:
    for observer in _observers:
        observer.batch(loader, wait_s)


def iterate_override(loader: Any) -> Iterator[Any] | None:
    """An observer's own iteration for ``loader`` (the analyzer's synthetic run), else None.

    Observers may define ``iterate(loader)``; the first one that returns an iterator wins.
    """
    for observer in _observers:
        iterate = getattr(observer, "iterate", None)
        if iterate is not None:
            out = iterate(loader)
            if out is not None:
                return out
    return None


def notify_finished(loader: Any) -> None:
    for observer in _observers:
        observer.finished(loader)
