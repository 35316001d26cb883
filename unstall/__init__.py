"""unstall: find and remove data stalls in PyTorch training.

Every name loads on first use, so ``import unstall`` (and with it the ``unstall``
command and each process of an ``unstall run``) costs nothing until torch is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_HOMES = {
    "Cache": "unstall.cache",
    "DataLoader": "unstall.loader",
    "FileDataset": "unstall.data",
    "ImageFolder": "unstall.data",
    "ImagePipeline": "unstall.pipeline",
    "Peers": "unstall.distributed",
    "Remote": "unstall.remote",
    "SampleError": "unstall.errors",
    "Store": "unstall.stores",
    "StoreError": "unstall.errors",
    "analyze": "unstall.analysis",
    "open_store": "unstall.stores",
    "patch_torch": "unstall.loader.swap",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name.startswith("__"):  # e.g. probes for __wrapped__: never a module
        raise AttributeError(f"module 'unstall' has no attribute {name!r}")
    try:  # a sub-package not imported yet (`import unstall; unstall.loader`)
        return importlib.import_module(f"unstall.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"unstall.{name}":
            raise
    raise AttributeError(f"module 'unstall' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


if TYPE_CHECKING:  # for type checkers and editors: the names as if imported eagerly
    from unstall.analysis import analyze
    from unstall.cache import Cache
    from unstall.data import FileDataset, ImageFolder
    from unstall.distributed import Peers
    from unstall.errors import SampleError, StoreError
    from unstall.loader import DataLoader
    from unstall.loader.swap import patch_torch
    from unstall.pipeline import ImagePipeline
    from unstall.remote import Remote
    from unstall.stores import Store, open_store

__all__ = [
    "Cache",
    "DataLoader",
    "FileDataset",
    "ImageFolder",
    "ImagePipeline",
    "Peers",
    "Remote",
    "SampleError",
    "Store",
    "StoreError",
    "analyze",
    "open_store",
    "patch_torch",
]
