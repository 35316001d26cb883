"""unstall: find and remove data stalls in PyTorch training.

Every name loads on first use, so ``import unstall`` (and with it the ``unstall``
command and each process of an ``unstall run``) costs nothing until torch is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, submodules=True)


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
