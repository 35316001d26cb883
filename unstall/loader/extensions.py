"""Loader options served by packages above the loader: a small registry.

The loader builds its machinery without importing the layers above it: a plug-in module
registers the factory serving an option here when it is imported, and the loader imports
the module named for an option only when a loader asks for that option. Four are served:
``coordinate=`` (`unstall.coordination.plugin`: the group a loader joins), the GPU
stage of ``prep=`` (`unstall.gpu.plugin`: its parts for the workers and the device),
``"adapt"`` (`unstall.adapt.plugin`: a torchvision dataset's pipeline run as unstall's,
for ``prep="lean"|"gpu"|"hybrid"|"auto"``) and ``remote=`` (`unstall.remote.plugin`:
workers on other machines, a `Remote` served).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

_factories: dict[str, Callable[..., Any]] = {}
#: The module that registers each option's factory when it is imported.
PROVIDERS = {
    "coordinate": "unstall.coordination.plugin",
    "prep": "unstall.gpu.plugin",
    "adapt": "unstall.adapt.plugin",
    "remote": "unstall.remote.plugin",
}


class Member(Protocol):
    """What ``"coordinate"``'s factory, ``(coordinate, dataset, order, prep)``, returns."""

    def wrap(self, task: Any, in_flight: int) -> Any:
        """The task torch's workers run in place of the loader's own `BatchTask`."""

    def prefetch_factor(self, prefetch_factor: int | None, num_workers: int) -> int:
        """Tasks in flight per worker."""

    def receive(self, torch_iter: Iterator[Any], epoch: int, start: int) -> Iterator[Any]:
        """The epoch's ``(batch, timing)`` pairs from torch's iterator, shared ones mapped."""

    def stats(self) -> dict[str, Any]:
        """Sections merged into `DataLoader.stats`."""

    def close(self) -> None:
        """Leave (called when the loader closes or is collected)."""


class Remote(Protocol):
    """What ``"remote"``'s factory, ``(remote, task)``, returns."""

    def split(self, sampler: Any) -> Any:
        """The sampler torch's workers iterate in place of ``sampler`` (the plan)."""

    def receive(self, torch_iter: Iterator[Any], epoch: int, start: int) -> Iterator[Any]:
        """The epoch's ``(batch, timing)`` pairs, local and remote, in the plan's order."""

    @property
    def workers(self) -> int:
        """The remote workers started: the most the autotuner may use."""

    def use(self, count: int) -> None:
        """Send new batches to ``count`` remote workers from now on (the autotuner's)."""

    def stats(self) -> dict[str, Any]:
        """Sections merged into `DataLoader.stats`."""

    def close(self) -> None:
        """Stop the remote workers (called when the loader closes or is collected)."""


#: ``"prep"``'s factory: ``(dataset, pipeline, device, prep, batch_size, num_workers)`` ->
#: ``(prep, the workers' dataset, their collate_fn, the device-side prep)``, or None to
#: prepare on the CPU (``"auto"`` without a GPU decoder).
StageParts = Callable[..., "tuple[str, Any, Any, Any] | None"]


def register(name: str, factory: Callable[..., Any]) -> None:
    """Serve loader option ``name`` with ``factory`` (called by the plug-in module)."""
    _factories[name] = factory


def get(name: str) -> Callable[..., Any]:
    """The factory serving option ``name``, importing its provider on first use."""
    if name not in _factories and name in PROVIDERS:
        importlib.import_module(PROVIDERS[name])
    try:
        return _factories[name]
    except KeyError:
        raise ValueError(f"no loader extension serves {name!r}") from None
