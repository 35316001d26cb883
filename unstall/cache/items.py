"""A dataset's items as the cache sees them: their versions, and fetching them from storage."""

from __future__ import annotations

from typing import Any

import numpy as np


def fetch_from_storage(dataset: Any, indices: list[int]) -> list[bytes]:
    """``dataset.fetch(indices)`` as bytes; a ValueError naming the dataset if the count is off."""
    raws = [bytes(raw) for raw in dataset.fetch(indices)]
    if len(raws) != len(indices):
        raise ValueError(
            f"{type(dataset).__name__}.fetch returned {len(raws)} items for {len(indices)} indices"
        )
    return raws


def item_versions(dataset: Any) -> np.ndarray | None:
    """The version of each item's source (int64 per item, see `unstall.stores.listing`), or
    None for a dataset that cannot say (its items are then trusted as they are)."""
    versions = getattr(dataset, "versions", None)
    if not callable(versions):
        return None
    out = versions()
    if out is None:
        return None
    if len(out) != len(dataset):
        raise ValueError(
            f"{type(dataset).__name__}.versions() has {len(out)} entries for "
            f"{len(dataset)} samples: one version per sample"
        )
    return out


def versions_of(dataset: Any, indices: list[int]) -> np.ndarray | None:
    """The expected versions of ``indices`` (None when the dataset has none)."""
    versions = item_versions(dataset)
    return None if versions is None else versions[indices]


def pick(versions: np.ndarray | None, positions: list[int]) -> np.ndarray | None:
    """``versions`` at ``positions`` (None stays None)."""
    return None if versions is None else versions[positions]
