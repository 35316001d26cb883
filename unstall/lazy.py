"""Names of a package loaded on first use: the one helper its ``__init__`` asks for its
``__getattr__`` and ``__dir__`` (PEP 562), so that importing the package costs nothing
until a name is used (``import unstall`` for every command and every process of an
``unstall run``; the loader's package for the launcher, which reads a config without torch).

The bottom floor: the standard library only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, homes: dict[str, str], *, submodules: bool = False
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name of ``homes`` (name -> the
    module that defines it) imported on first use and kept in the package (later lookups
    skip the function); with ``submodules``, a sub-package not imported yet as well
    (``import unstall; unstall.loader``). Anything else is an AttributeError naming it."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
            setattr(sys.modules[package], name, value)
            return value
        if submodules and not name.startswith("__"):  # e.g. probes for __wrapped__: never one
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__


def homes_of(groups: dict[str, str]) -> dict[str, str]:
    """``{module: "Name other_name ..."}`` as `lazy_exports`'s ``homes`` (name -> module):
    a package's names written a module a line."""
    return {name: module for module, names in groups.items() for name in names.split()}
