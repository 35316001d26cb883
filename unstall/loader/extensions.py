"""Loader options served by packages above the loader (``coordinate=``): a small registry.

The loader builds its machinery without importing the layers above it: a package that
serves an option registers its factory here when it is imported, and the loader imports
the package named for an option only when a loader asks for that option.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_factories: dict[str, Callable[..., Any]] = {}
#: The package that registers each option's factory when it is imported.
PROVIDERS = {"coordinate": "unstall.coordination"}


def register(name: str, factory: Callable[..., Any]) -> None:
    """Serve loader option ``name`` with ``factory`` (called by the providing package)."""
    _factories[name] = factory


def get(name: str) -> Callable[..., Any]:
    """The factory serving option ``name``, importing its provider on first use."""
    if name not in _factories and name in PROVIDERS:
        importlib.import_module(PROVIDERS[name])
    try:
        return _factories[name]
    except KeyError:
        raise ValueError(f"no loader extension serves {name!r}") from None
