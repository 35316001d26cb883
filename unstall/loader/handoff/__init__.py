"""Zero-copy hand-off: how a finished batch crosses from a worker to the training loop.

One module per role: `inline` (small tensors by value), `slots` (the shared-memory
slot segments and their rules), `writer` (the worker's side: collate into a slot),
`receiver` (the main process's side: which slots are taken, and when they free).
"""

from unstall.loader.handoff.inline import INLINE_MAX_BYTES, Inline, pack, unpack
from unstall.loader.handoff.receiver import SlotHandoff, SlotSampler, slots_for
from unstall.loader.handoff.slots import (
    ALIGN,
    SlotPool,
    SlotRef,
    large_bytes,
    leftover_slots,
    rebuild,
    slot_size_for,
)
from unstall.loader.handoff.writer import Arena, SlotWriter, collate_into, move_into

__all__ = [
    "ALIGN",
    "INLINE_MAX_BYTES",
    "Arena",
    "Inline",
    "SlotHandoff",
    "SlotPool",
    "SlotRef",
    "SlotSampler",
    "SlotWriter",
    "collate_into",
    "large_bytes",
    "leftover_slots",
    "move_into",
    "pack",
    "rebuild",
    "slot_size_for",
    "slots_for",
    "unpack",
]
