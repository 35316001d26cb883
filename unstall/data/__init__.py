"""Datasets over stores, and the synthetic dataset writer.

Names load on first use: a submodule that needs no torch (the shards' local copies, which
`unstall cache list` reads) is imported without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import homes_of, lazy_exports

_HOMES = homes_of(
    {"unstall.data.files": "FileDataset ImageFolder", "unstall.data.keys": "KeyTable"}
)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

if TYPE_CHECKING:
    from unstall.data.files import FileDataset, ImageFolder
    from unstall.data.keys import KeyTable

__all__ = ["FileDataset", "ImageFolder", "KeyTable"]
