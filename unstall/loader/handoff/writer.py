"""Worker side of the zero-copy hand-off: collate a batch straight into its shared-memory slot.

For torch's `default_collate` on tensors, tuples, lists and dicts, big tensors are
stacked directly into the slot (no intermediate batch, no shared-memory file per
tensor as torch makes in workers); any other ``collate_fn`` runs as usual and its
big tensors are copied in. Small tensors travel inline (`handoff.pack`).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils.data

from unstall.loader.handoff.inline import INLINE_MAX_BYTES, pack
from unstall.loader.handoff.slots import (
    ALIGN,
    BYTES_MIN,
    SlotBatch,
    SlotBytes,
    SlotRef,
    SlotTensor,
    slot_dir,
)


class SlotWriter:
    """Worker side: maps slots by name (once per process) and collates batches into them."""

    def __init__(self) -> None:
        self._maps: dict[str, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_maps": {}}

    def base(self, ref: SlotRef) -> torch.Tensor:
        base = self._maps.get(ref.name)
        if base is None:
            if len(self._maps) > 256:  # pools of closed loaders: forget their mappings
                self._maps.clear()
            fd = os.open(os.path.join(slot_dir(), ref.name), os.O_RDWR)
            try:
                # Reserve the pages first: a full /dev/shm is an OSError here, not a SIGBUS.
                os.posix_fallocate(fd, 0, ref.size)
                base = torch.frombuffer(mmap.mmap(fd, ref.size), dtype=torch.uint8)
            finally:
                os.close(fd)
            self._maps[ref.name] = base
        return base

    def collate(
        self, samples: list[Any], collate_fn: Callable[[list[Any]], Any], ref: SlotRef
    ) -> Any:
        """Collate ``samples`` with large tensors in the slot (spilled when they do not fit)."""
        try:
            base = self.base(ref)
        except OSError as exc:  # no room in /dev/shm (or the slot is gone): torch's path
            batch = pack(collate_fn(samples))
            return SlotBatch(ref.pool, ref.index, batch, spilled=True, error=f"{exc}")
        arena = Arena(base)
        if collate_fn is torch.utils.data.default_collate:
            payload = collate_into(samples, arena)
        else:
            payload = move_into(collate_fn(samples), arena)
        if arena.overflow:
            return SlotBatch(ref.pool, ref.index, pack(collate_fn(samples)), spilled=True)
        return SlotBatch(ref.pool, ref.index, pack(payload))


class Arena:
    """Bump allocator over one slot; records overflow instead of raising."""

    def __init__(self, base: torch.Tensor):
        self.base = base
        self.used = 0
        self.overflow = False

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, int] | None:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        offset = -(-self.used // ALIGN) * ALIGN
        if offset + nbytes > self.base.numel():
            self.overflow = True
            return None
        self.used = offset + nbytes
        return self.base[offset : offset + nbytes].view(dtype).view(shape), offset


def collate_into(samples: list[Any], arena: Arena) -> Any:
    """`default_collate` of tensors, tuples, lists, dicts; big tensors stacked into the slot."""
    elem = samples[0]
    if type(elem) is torch.Tensor and _plain(elem):
        shape = (len(samples), *elem.shape)
        if torch.Size(shape).numel() * elem.element_size() > INLINE_MAX_BYTES and all(
            type(s) is torch.Tensor and s.shape == elem.shape and s.dtype == elem.dtype
            for s in samples
        ):
            taken = arena.take(shape, elem.dtype)
            if taken is None:
                return None
            out, offset = taken
            torch.stack(samples, 0, out=out)
            return SlotTensor(offset, shape, elem.dtype)
    elif type(elem) in (tuple, list) and all(len(s) == len(elem) for s in samples):
        return [collate_into(list(column), arena) for column in zip(*samples, strict=True)]
    elif type(elem) is dict:
        return {k: collate_into([s[k] for s in samples], arena) for k in elem}
    return move_into(torch.utils.data.default_collate(samples), arena)


def move_into(batch: Any, arena: Arena) -> Any:
    """Copy big tensors of an already collated batch into the slot; small ones travel inline."""
    if isinstance(batch, torch.Tensor):
        if type(batch) is not torch.Tensor or batch.is_cuda or not _plain(batch):
            return batch
        if batch.numel() * batch.element_size() <= INLINE_MAX_BYTES:
            return batch
        taken = arena.take(tuple(batch.shape), batch.dtype)
        if taken is None:
            return None
        out, offset = taken
        out.copy_(batch)
        return SlotTensor(offset, tuple(batch.shape), batch.dtype)
    if type(batch) is bytes and len(batch) >= BYTES_MIN:
        taken = arena.take((len(batch),), torch.uint8)
        if taken is None:
            return None
        out, offset = taken
        out.numpy()[:] = np.frombuffer(batch, dtype=np.uint8)
        return SlotBytes(offset, len(batch))
    if type(batch) is tuple:
        return tuple(move_into(x, arena) for x in batch)
    if type(batch) is list:
        return [move_into(x, arena) for x in batch]
    if type(batch) is dict:
        return {k: move_into(v, arena) for k, v in batch.items()}
    return batch


def _plain(t: torch.Tensor) -> bool:
    """A dense strided tensor (nested and sparse ones have no flat bytes to place)."""
    return t.layout == torch.strided and not t.is_nested
