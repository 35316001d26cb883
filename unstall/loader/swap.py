"""Put `unstall.DataLoader` in the place of `torch.utils.data.DataLoader`, and take it out.

`TorchDataLoader` (`unstall.loader.torch_class`) is torch's own class, captured when
unstall is first imported: unstall builds its inner loaders from it, so the swap can
never recurse.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch.utils.data
import torch.utils.data.dataloader

from unstall.loader.dataloader import DataLoader
from unstall.loader.torch_class import TorchDataLoader

#: Where torch exposes the class by name: every one is swapped and restored together.
_PLACES = (torch.utils.data, torch.utils.data.dataloader)


def patch_torch() -> Callable[[], None]:
    """Make ``torch.utils.data.DataLoader`` (both of its public names) be `unstall.DataLoader`.

    Code that looks the name up afterwards (``from torch.utils.data import DataLoader``
    included) builds unstall loaders; unstall's own machinery keeps torch's class.
    Safe to call twice. Returns the undo (`unpatch_torch`).
    """
    for module in _PLACES:
        module.DataLoader = DataLoader  # type: ignore[attr-defined]
    return unpatch_torch


def unpatch_torch() -> None:
    """Give ``torch.utils.data.DataLoader`` back its own class (safe without a patch)."""
    for module in _PLACES:
        module.DataLoader = TorchDataLoader  # type: ignore[attr-defined]


def is_patched() -> bool:
    """True while ``torch.utils.data.DataLoader`` is unstall's class."""
    return torch.utils.data.DataLoader is not TorchDataLoader


def patched_modules() -> list[str]:
    """Names of the modules whose ``DataLoader`` attribute the swap changes (for messages)."""
    return [m.__name__ for m in _PLACES if m.__name__ in sys.modules]
