"""torch's own DataLoader class, captured when unstall is first imported.

unstall builds its inner loaders from it, so swapping `unstall.DataLoader` into torch's
place (`unstall.loader.swap`) can never make unstall recurse into itself.
"""

from __future__ import annotations

import torch.utils.data.dataloader

#: torch's real DataLoader class, whatever the public name points at later.
TorchDataLoader: type = torch.utils.data.dataloader.DataLoader
if getattr(TorchDataLoader, "__module__", "").startswith("unstall."):  # imported after a swap
    TorchDataLoader = next(
        c for c in TorchDataLoader.__mro__ if c.__module__ == "torch.utils.data.dataloader"
    )
