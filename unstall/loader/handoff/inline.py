"""How a finished batch crosses from a worker process to the training loop.

torch sends every tensor from a worker through a new shared-memory file and a
passed file descriptor: right for large tensors, but for small ones (labels,
indices, tiny features) the fd passing and mmap cost far more than copying the
bytes. `pack` turns small CPU tensors into inline numpy arrays that pickle by
value; `unpack` wraps them back as tensors without a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

#: Tensors at most this many bytes travel inline (pickled); larger ones use torch's shm path.
INLINE_MAX_BYTES = 64 * 1024

_NUMPY_DTYPES = {
    torch.float32,
    torch.float64,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


class Inline:
    """A small tensor travelling by value as a numpy array."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        return (Inline, (self.array,))


def pack(batch: Any) -> Any:
    """Replace small CPU tensors in ``batch`` (tuples, lists, dicts) with `Inline` arrays."""
    if isinstance(batch, torch.Tensor):
        if (
            batch.device.type == "cpu"
            and batch.layout == torch.strided  # not nested or sparse: numel/numpy refuse those
            and not batch.is_nested
            and batch.dtype in _NUMPY_DTYPES
            and batch.numel() * batch.element_size() <= INLINE_MAX_BYTES
            and not batch.requires_grad
            and type(batch) is torch.Tensor
        ):
            return Inline(batch.numpy())
        return batch
    return _each(pack, batch)


def unpack(batch: Any) -> Any:
    """Undo `pack`: `Inline` arrays become tensors sharing their memory."""
    if type(batch) is Inline:
        return torch.from_numpy(batch.array)
    return _each(unpack, batch)


def _each(fn: Callable[[Any], Any], batch: Any) -> Any:
    """``fn`` applied to each item of a tuple, list or dict batch (exact types); else the batch."""
    if type(batch) is tuple:
        return tuple(fn(x) for x in batch)
    if type(batch) is list:
        return [fn(x) for x in batch]
    if type(batch) is dict:
        return {k: fn(v) for k, v in batch.items()}
    return batch
