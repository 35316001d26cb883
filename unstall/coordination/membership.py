"""One loader's membership in a coordination group: its task, its batches, its counts.

`Coordination` is what ``coordinate=`` builds for a loader (through the loader's
extension registry, `plugin.py`): it names the group (``coordinate=True``: from the
dataset's fingerprint), wraps the loader's task in claim-or-map (`claims.py`), maps
each epoch's published batches, and reports the group's counts in ``stats()``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from unstall import machine
from unstall.coordination.claims import CoordinatedTask, prepared_count, receive
from unstall.coordination.group import Group

# The group's window and time-outs: `unstall.machine.coord_defaults` (``$UNSTALL_COORD_*``):
# the published batches a member may lag behind the leader before it can be detached, the
# seconds it may stay beyond them, before a live claimer that has not published loses its
# claim, and that a worker waits for another member's batch before preparing it itself.


def dataset_fingerprint(dataset: Any) -> str:
    """What identifies the data: the dataset's own ``fingerprint()``, else type, length, keys."""
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return str(own())
    h = hashlib.sha256(f"{type(dataset).__module__}.{type(dataset).__qualname__}".encode())
    n = len(dataset)
    h.update(str(n).encode())
    key = getattr(dataset, "key", None)
    if callable(key):
        for i in sorted({0, n // 2, n - 1} - {-1}):
            h.update(str(key(i)).encode())
    h.update(repr(getattr(dataset, "transform", "")).encode())
    return h.hexdigest()[:16]


class Coordination:
    """One loader's membership: wraps its task, maps its batches, counts for `stats`."""

    def __init__(self, coordinate: Any, dataset: Any, order: Any, prep: str):
        if order is None:
            raise ValueError(
                f"coordinate={coordinate!r} needs unstall's own order (no sampler or "
                "batch_sampler): members must agree on every epoch's batches"
            )
        self.order = order
        fingerprint = dataset_fingerprint(dataset)
        name = fingerprint if coordinate is True else str(coordinate)
        if not name:
            raise ValueError("coordinate='' : give a group name or True")
        self.identity = {
            "group": name,
            "fingerprint": fingerprint,
            "seed": order.seed,
            "batch_size": order.batch_size,
            "world_size": order.world_size,
            "rank": order.rank,
            "prep": prep,
            "transform": repr(getattr(dataset, "transform", None)),
            "num_samples": order.num_samples,
            "shuffle": order.shuffle,
            "drop_last": order.drop_last,
            "batches_per_epoch": order.num_batches(),
        }
        limits = machine.coord_defaults()
        self.group = Group(
            name, self.identity, window=limits.window, detach_after_s=limits.detach_s
        )
        self.counts: dict[str, Any] = dict.fromkeys(
            ("taken", "on_demand", "prepared_for_group", "prepared_privately", "waits"), 0
        )
        self.counts["wait_s"] = 0.0

    def wrap(self, task: Any, in_flight: int) -> CoordinatedTask:
        """The task torch's workers run: claim-or-map around the loader's own `BatchTask`.

        ``in_flight``: the loader's tasks in flight (prefetch factor x workers).
        """
        self.task = CoordinatedTask(
            task,
            self.group.path,
            per_epoch=self.identity["batches_per_epoch"],
            order=self.order,
            ahead=self.group.window,
            in_flight=in_flight,
            claim_timeout_s=machine.coord_defaults().claim_timeout_s,
            wait_timeout_s=machine.coord_defaults().wait_timeout_s,
        )
        return self.task

    def prefetch_factor(self, prefetch_factor: int | None, num_workers: int) -> int:
        """Tasks in flight per worker: at least ``window / 2`` per loader, so workers stay busy.

        A task whose batch another member published costs its worker nothing; with
        torch's usual 2 per worker, a member's workers would then sit idle until the
        training loop asks for more, while the group's next batches wait to be prepared.
        Tasks in flight hold only references to published batches.
        """
        return max(prefetch_factor or 2, -(-max(self.group.window // 2, 1) // num_workers))

    def receive(self, torch_iter: Any, epoch: int, start: int) -> Any:
        """Map this epoch's published batches as they come from torch's iterator."""
        per = self.identity["batches_per_epoch"]
        return receive(
            torch_iter, self.group, self.counts, self.task, epoch=epoch, start=start, per_epoch=per
        )

    def stats(self) -> dict[str, Any]:
        """``{"coordination": {...}}`` for `DataLoader.stats`."""
        self._refresh()
        c = dict(self.counts)
        c["wait_s"] = round(c["wait_s"], 4)
        return {
            "coordination": {
                "group": self.group.name,
                **c,
                "detached": list(self.group.events),
                "window": self.group.window,
            }
        }

    def _refresh(self) -> None:
        n = prepared_count(self.group.path) if not self.group.left else None
        if n is not None:
            self.counts["prepared_for_group"] = n

    def close(self) -> None:
        """Leave the group (the last member out removes its shared memory)."""
        self._refresh()
        self.group.leave()
