"""Claim, prepare, publish, map: how one batch is made once for the whole group.

Each batch (epoch ``e``, batch ``b``) has a claim file ``c<e>-<b>`` made with
``O_CREAT | O_EXCL`` (atomic on one node, no lock to leak: the claimer's pid and
start stamp are in it, so a dead claimer is seen at once and a stuck one after
``claim_timeout_s``). The claimer prepares the batch with the loader's own task,
collating it straight into the file ``p<e>-<b>`` (`publish.py`: written under a
temporary name, then renamed, so readers never see half a batch). Readers map it
copy-on-write without a copy, so one job's in-place edit never reaches another.
Batches below the group's ``floor`` (the lowest position an attached member still
needs) are reclaimed with their claims; a member that fell below it prepares its
batches itself instead of waiting.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from unstall.cache.shm.segment import pid_alive, process_stamp
from unstall.coordination.publish import FREE_PREFIX, PublishTarget, map_batch, recycle
from unstall.loader import TaskFailure, planned_batch


class Published:
    """What a worker hands the main process: where the batch lies, and who made it."""

    __slots__ = ("how", "path", "task", "wait_s")

    def __init__(self, path: str, how: str, wait_s: float, task: Any):
        self.path, self.how, self.wait_s, self.task = path, how, wait_s, task


class CoordinatedTask(torch.utils.data.Dataset):
    """Wraps a loader's `BatchTask`: claims a keyed batch, or waits for the member that did."""

    def __init__(
        self,
        inner: Any,
        path: str,
        *,
        per_epoch: int,
        order: Any,
        ahead: int,
        in_flight: int,
        claim_timeout_s: float,
        wait_timeout_s: float,
    ):
        self.inner = inner
        self.per_epoch = per_epoch
        self.order = order
        self.ahead = ahead
        self.in_flight = in_flight  # this member's tasks in flight: how far it asks ahead
        self._indices: tuple[int, Any] = (-1, None)
        self.path = path
        self.claim_timeout_s = claim_timeout_s
        self.wait_timeout_s = wait_timeout_s

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, task: Any) -> Any:
        key = getattr(task, "key", None)
        if key is None:
            return self.inner[task]
        _, epoch, b, _ = key
        position = epoch * self.per_epoch + b
        pub = os.path.join(self.path, f"p{epoch}-{b}")
        claim = os.path.join(self.path, f"c{epoch}-{b}")
        t0 = time.monotonic()
        delay = 0.0005
        while True:
            if os.path.exists(pub):
                waited = time.monotonic() - t0
                return Published(pub, "taken", waited, task), (0.0, 0.0)
            floor = read_floor(self.path)
            if position < floor:
                return self._private(task, "reclaimed")
            if position >= floor + 2 * self.ahead + self.in_flight:  # the slowest member is
                return self._private(task, "ahead of the window")  # far behind: memory bounded
            if _try_claim(claim):
                return self._prepare(task, pub, claim, time.monotonic() - t0)
            _drop_stale(claim, self.claim_timeout_s)
            if time.monotonic() - t0 > self.wait_timeout_s:
                return self._private(task, "wait timeout")
            if self._help(key, b):  # rather than wait: prepare a batch ahead nobody claimed
                delay = 0.0005
                continue
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def _help(self, key: tuple[int, int, int, int], b: int) -> bool:
        """Claim and publish the first unclaimed batch among the next ``ahead`` ones
        (and less than ``ahead`` beyond the group's floor).

        torch gives each worker its batches in order; without this, every member's
        workers would wait on the same one or two batches while cores sit idle.
        """
        seed, epoch, _, rank = key
        floor = read_floor(self.path)
        for b2 in range(b + 1, min(b + 1 + self.ahead, self.per_epoch)):
            position = epoch * self.per_epoch + b2
            if position < floor:
                continue
            if position >= floor + self.ahead:
                return False
            pub = os.path.join(self.path, f"p{epoch}-{b2}")
            claim = os.path.join(self.path, f"c{epoch}-{b2}")
            if os.path.exists(claim) or os.path.exists(pub) or not _try_claim(claim):
                continue
            if self._indices[0] != epoch:
                self._indices = (epoch, self.order.indices(epoch))
            bs = self.order.batch_size
            indices = self._indices[1][b2 * bs : (b2 + 1) * bs].tolist()
            self._prepare(planned_batch(indices, [], (seed, epoch, b2, rank)), pub, claim, 0.0)
            return True
        return False

    def _prepare(self, task: Any, pub: str, claim: str, waited: float) -> Any:
        target = PublishTarget(pub)
        try:
            batch, times = self.inner[(task, target)]  # collated straight into the group's file
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(claim)  # let another member try
            raise
        if batch is not target:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(claim)  # failed (TaskFailure) or not published: another member may
            if isinstance(batch, TaskFailure):
                return batch, times
            return ("private", f"publish failed: {target.error}", batch), times
        _count_prepared(self.path)
        return Published(pub, "prepared", waited, task), times

    def _private(self, task: Any, why: str) -> Any:
        batch, times = self.inner[task]
        if isinstance(batch, TaskFailure):
            return batch, times
        return ("private", why, batch), times


def _try_claim(claim: str) -> bool:
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except FileNotFoundError:  # the group directory went away
        return False
    pid = os.getpid()
    os.write(fd, f"{pid} {process_stamp(pid)}".encode())
    os.close(fd)
    return True


def _drop_stale(claim: str, timeout_s: float) -> None:
    """Remove a claim whose holder died, or that is older than ``timeout_s`` unpublished."""
    try:
        with open(claim) as f:
            text = f.read()
        age = time.time() - os.stat(claim).st_mtime
    except FileNotFoundError:
        return
    parts = text.split()
    if len(parts) < 2:  # being written right now
        if age > 1.0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(claim)
        return
    if not pid_alive(int(parts[0]), int(parts[1])) or age > timeout_s:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(claim)


def receive(
    source: Iterator[Any],
    group: Any,
    stats: dict[str, Any],
    task: CoordinatedTask,
    *,
    epoch: int,
    start: int,
    per_epoch: int,
) -> Iterator[Any]:
    """The main-process side: map published batches, advance this member, reclaim old ones."""
    b = start
    group.set_position(epoch * per_epoch + b)
    last_reclaim = 0.0
    for item in source:
        batch, times = item
        if isinstance(batch, Published):
            try:
                out = map_batch(batch.path)
            except FileNotFoundError:  # reclaimed while this member was stopped
                out = None
            if out is None:
                batch = ("private", "reclaimed", task.inner[batch.task][0])
            else:
                group.note_rejoined(epoch * per_epoch + b)  # caught up, if it was detached
                stats["taken" if batch.how == "taken" else "on_demand"] += 1
                stats["wait_s"] += batch.wait_s
                if batch.how == "taken":
                    stats["waits"] += batch.wait_s > 0.001
                item = (out, times)
        if type(batch) is tuple and len(batch) == 3 and batch[0] == "private":
            stats["prepared_privately"] += 1
            if batch[1] == "reclaimed":
                group.note_detached(
                    epoch * per_epoch + b,
                    "its batches were reclaimed: more "
                    f"than window={group.window} behind for "
                    f"{group.detach_after_s}s",
                )
            item = (batch[2], times)
        b += 1
        position = epoch * per_epoch + b
        group.set_position(position)
        now = time.monotonic()
        if now - last_reclaim > 0.05:
            last_reclaim = now
            reclaim(group, now)
        yield item


def _member_pid() -> int:
    """The member (loader's process) this code prepares for: a worker's parent, or itself."""
    return os.getppid() if torch.utils.data.get_worker_info() is not None else os.getpid()


def _count_prepared(path: str) -> None:
    """One byte per batch this member's workers published (on demand or ahead)."""
    with contextlib.suppress(OSError):
        fd = os.open(
            os.path.join(path, f"n-{_member_pid()}"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
        )
        os.write(fd, b"1")
        os.close(fd)


def prepared_count(path: str) -> int | None:
    """Batches this process's workers published for the group (None if the group is gone)."""
    try:
        return os.stat(os.path.join(path, f"n-{os.getpid()}")).st_size
    except FileNotFoundError:
        return 0 if os.path.isdir(path) else None


def read_floor(path: str) -> int:
    """The group's floor: positions below it are reclaimed (0 if none yet; huge if gone)."""
    try:
        with open(os.path.join(path, "floor")) as f:
            return int(f.read() or 0)
    except FileNotFoundError:
        return 0 if os.path.isdir(path) else 1 << 62
    except ValueError:
        return 0


def reclaim(group: Any, now: float) -> None:
    """Raise the floor; retire published batches and claims below it.

    A retired batch nobody maps any more is kept for reuse (at most ``window`` such
    files wait), else unlinked. One still mapped (the slowest member's latest) is
    retried later; more than ``window`` below the floor it is unlinked, and its
    holders keep their pages.
    """
    floor, _ = group.floor(now)
    if floor <= read_floor(group.path):
        return
    tmp = os.path.join(group.path, f"floor.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(str(floor))
        os.rename(tmp, os.path.join(group.path, "floor"))
        names = os.listdir(group.path)
    except FileNotFoundError:
        return
    per = group.identity["batches_per_epoch"]
    free = sum(n.startswith(FREE_PREFIX) for n in names)
    for n in names:
        if n[0] not in "pc" or not n[1].isdigit():
            continue
        e, b = n[1:].split("-")[:2]
        if not b.isdigit():
            continue  # a temporary file being written
        position = int(e) * per + int(b)
        if position >= floor:
            continue
        path = os.path.join(group.path, n)
        if n[0] == "c":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        spare = None
        if free < group.window:
            spare = os.path.join(group.path, f"{FREE_PREFIX}{os.getpid()}-{next(_spares)}")
        free += recycle(path, spare, busy_unlink=position < floor - group.window) == "reused"


_spares = itertools.count()
