"""Datasets over stores, and the synthetic dataset writer.

Names load on first use: ``unstall cache list`` reads the shards' copies here without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import lazy_exports

_HOMES = {
    "FileDataset": "unstall.data.files",
    "ImageFolder": "unstall.data.files",
    "KeyTable": "unstall.data.keys",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

if TYPE_CHECKING:
    from unstall.data.files import FileDataset, ImageFolder
    from unstall.data.keys import KeyTable

__all__ = ["FileDataset", "ImageFolder", "KeyTable"]
