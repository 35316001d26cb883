"""How many samples a collated batch holds: the loader's stats and the simulated model count
them (a leaf module, so the models never import the loader above them)."""

from __future__ import annotations

from typing import Any

import torch


def batch_size_of(batch: Any) -> int:
    """Number of samples in a collated batch: the leading dimension of its first tensor,
    or the length of a list of plain samples (bytes, numbers, strings), or of a batch
    collated as lists of samples with target dicts (`listed_samples`: detection's)."""
    while True:
        listed = listed_samples(batch)
        if listed is not None:
            return listed
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


def listed_samples(batch: Any) -> int | None:
    """The samples in a batch a detection script collates as lists: ``tuple(zip(*samples))``
    (per field, one value per sample: images of different sizes, target dicts) or the samples
    as they are (``[(image, target), ...]``); None for any other batch. Told apart from
    torch's ``default_collate`` (which makes a dict of batched values of target dicts, never
    a list of dicts) by the dicts among the fields' items; a field of one type per item is
    a list of samples' values, a sample of mixed types one sample."""
    if not isinstance(batch, (list, tuple)) or not batch:
        return None
    if not all(isinstance(f, (list, tuple)) and f for f in batch):
        return None
    if len({len(f) for f in batch}) != 1:
        return None
    if not any(isinstance(x, dict) for f in batch for x in f):
        return None
    transposed = all(len({type(x) for x in f}) == 1 for f in batch)
    return len(batch[0]) if transposed else len(batch)
