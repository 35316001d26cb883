"""How a remote batch crosses Ray: tensors as numpy arrays, copied out on arrival.

Ray ships numpy arrays out of band (no pickling of their bytes) and maps them read-only
from the object store on the receiving node. `to_wire` turns a batch's tensors into
`Inline` leaves on the actor (the numpy leaf the loader's worker handoff uses too);
`from_wire` copies each into the training process's own memory, so the batch is writable
like a local one and the object store frees at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from unstall.loader.handoff.inline import Inline


def to_wire(batch: Any) -> tuple[Any, int]:
    """``(payload, bytes)``: ``batch`` with its CPU tensors as `Inline` leaves, and the bytes
    of its tensors (those torch has no numpy type for travel pickled, counted too)."""
    total = [0]

    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            total[0] += x.numel() * x.element_size()
            if x.device.type == "cpu" and x.layout == torch.strided and not x.requires_grad:
                try:
                    return Inline(np.ascontiguousarray(x.numpy()))
                except (TypeError, RuntimeError):  # e.g. bfloat16: no numpy type
                    return x
            return x
        if isinstance(x, bytes | bytearray):
            total[0] += len(x)
        return x

    return walk(leaf, batch), total[0]


def from_wire(payload: Any) -> Any:
    """The batch of a payload, each array copied out of the (read-only) object store."""

    def leaf(x: Any) -> Any:
        if type(x) is Inline:
            return torch.from_numpy(np.array(x.array, copy=True))
        return x

    return walk(leaf, payload)


def walk(fn: Callable[[Any], Any], batch: Any) -> Any:
    """``batch`` with ``fn`` applied to each leaf of its tuples, lists, dicts and namedtuples:
    the structures a batch crosses the wire in."""
    kind = type(batch)
    if kind is tuple:
        return tuple(walk(fn, x) for x in batch)
    if kind is list:
        return [walk(fn, x) for x in batch]
    if kind is dict:
        return {k: walk(fn, v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple batch
        return kind(*(walk(fn, x) for x in batch))
    return fn(batch)
