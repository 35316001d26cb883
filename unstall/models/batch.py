"""How many samples a collated batch holds: the loader's stats and the simulated model count
them (a leaf module, so the models never import the loader above them)."""

from __future__ import annotations

from typing import Any

import torch


def batch_size_of(batch: Any) -> int:
    """Number of samples in a collated batch: the leading dimension of its first tensor,
    or the length of a list of plain samples (bytes, numbers, strings)."""
    while True:
        if isinstance(batch, torch.Tensor):
            return int(batch.size(0)) if batch.dim() > 0 else 1  # nested: no .shape
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)) and batch:
            first = batch[0]
            if not isinstance(first, (torch.Tensor, list, tuple, dict)) and not hasattr(
                first, "shape"
            ):
                return len(batch)
            batch = first
        elif hasattr(batch, "shape") and len(batch.shape) > 0:
            return int(batch.shape[0])
        else:
            return len(batch) if hasattr(batch, "__len__") else 1
