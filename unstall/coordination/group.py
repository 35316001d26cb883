"""A coordination group on one node: identity, members, progress, and cleanup.

The group is a directory in the shared-memory filesystem
(``<shm>/unstall-u<uid>-coord-<name>``). It holds ``identity.json`` (what every
member must agree on), one ``m-<pid>-<stamp>`` file per member with its position
(global batch number), and the published batches (`claims.py`). Joining and
leaving hold an exclusive ``flock`` on the shm directory, so a group found with
no live member (left by a killed sweep) is removed before it is reused, and the
last member out removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

from unstall.cache.shm.segment import name_prefix, pid_alive, process_stamp, shm_dir

#: Fields every member must share, in the order a mismatch is reported.
IDENTITY_FIELDS = (  # the transform first: the fingerprint of a plain dataset includes it
    "group",
    "transform",
    "prep",
    "fingerprint",
    "seed",
    "batch_size",
    "world_size",
    "rank",
    "num_samples",
    "shuffle",
    "drop_last",
)


class GroupMismatch(ValueError):
    """A loader's settings differ from the group's: it would get other data, so it is refused."""


def group_dir(name: str) -> str:
    """Where group ``name`` lives: ``<shm>/unstall-u<uid>-coord-<name>``."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)
    return os.path.join(shm_dir(), f"{name_prefix()}coord-{safe}")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    fd = os.open(shm_dir(), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def live_members(path: str) -> dict[str, int]:
    """Live members' file names -> position; a dead member's file is removed (its refs released)."""
    out: dict[str, int] = {}
    try:
        names = [n for n in os.listdir(path) if n.startswith("m-")]
    except FileNotFoundError:
        return out
    for n in names:
        _, pid, stamp = n.split("-")[:3]
        full = os.path.join(path, n)
        if not pid_alive(int(pid), int(stamp)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)
            continue
        try:
            with open(full) as f:
                out[n] = int(f.read() or 0)
        except (FileNotFoundError, ValueError):
            continue
    return out


class Group:
    """This process's membership of a group (made by `join`)."""

    def __init__(self, name: str, identity: dict[str, Any], *, window: int, detach_after_s: float):
        self.name = name
        self.path = group_dir(name)
        self.identity = identity
        self.window = window
        self.detach_after_s = detach_after_s
        pid = os.getpid()
        self.member = f"m-{pid}-{process_stamp(pid)}"
        self._behind: dict[str, float] = {}  # member -> when it fell behind the window
        self.detached = False
        self.events: list[dict[str, Any]] = []
        self.left = False
        self._join()

    def _join(self) -> None:
        with _locked():
            if os.path.isdir(self.path) and not live_members(self.path):
                shutil.rmtree(self.path, ignore_errors=True)  # left by a killed sweep
            os.makedirs(self.path, exist_ok=True)
            ident = os.path.join(self.path, "identity.json")
            if os.path.exists(ident):
                with open(ident) as f:
                    theirs = json.load(f)
                for key in IDENTITY_FIELDS:
                    if theirs.get(key) != self.identity.get(key):
                        raise GroupMismatch(
                            f"coordinate={self.name!r}: this loader has {key}="
                            f"{self.identity.get(key)!r} but the group has {key}="
                            f"{theirs.get(key)!r}; members must share dataset, seed, batch "
                            "size, world size/rank and preparation (or use another group name)"
                        )
            else:
                with open(ident + ".tmp", "w") as f:
                    json.dump(self.identity, f)
                os.rename(ident + ".tmp", ident)
            self.set_position(0)

    def set_position(self, position: int) -> None:
        """Publish this member's position (global batch number it needs next)."""
        tmp = os.path.join(self.path, f"t{self.member}")
        with open(tmp, "w") as f:
            f.write(str(position))
        os.rename(tmp, os.path.join(self.path, self.member))

    def note_rejoined(self, position: int) -> None:
        """This member got a published batch again: if it was detached, it caught up."""
        if self.detached:
            self.detached = False
            self.events[-1]["rejoined_at"] = position

    def floor(self, now: float) -> tuple[int, int]:
        """(the lowest position an attached live member still needs, the leader's position).

        Batches below the floor are reclaimed. A member more than ``window`` batches
        behind the leader for ``detach_after_s`` seconds no longer holds the floor: it
        is detached, finds its batches gone and prepares them itself, exactly.
        """
        members = live_members(self.path)
        if not members:
            return 0, 0
        lead = max(members.values())
        keep = []
        for m, p in members.items():
            if lead - p > self.window:
                since = self._behind.setdefault(m, now)
                if now - since >= self.detach_after_s:
                    continue
            else:
                self._behind.pop(m, None)
            keep.append(p)
        return (min(keep) if keep else lead), lead

    def note_detached(self, position: int, why: str) -> None:
        """This member found its batch reclaimed: it loads privately until it catches up."""
        if not self.detached:
            self.detached = True
            self.events.append({"t": round(time.time(), 3), "position": position, "why": why})

    def leave(self) -> None:
        """Leave; the last member out removes the group's shared memory."""
        if self.left:
            return
        self.left = True
        with _locked():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.path, self.member))
            if not live_members(self.path):
                shutil.rmtree(self.path, ignore_errors=True)
