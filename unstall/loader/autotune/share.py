"""Ranks of one job on one node share the cores: a small file in shared memory.

Each rank writes the workers it holds (and whether its loop waits for more) into one
file named after the job (torchrun's ``MASTER_ADDR``/``MASTER_PORT``/run id and the
host, or ``$UNSTALL_AUTOTUNE_JOB``), under an exclusive ``flock``; every rank reads
the others' claims from it. A rank may hold the cores the others do not, and no
more than its fair share while another rank waits. Entries of dead processes are
dropped; the last rank to leave removes the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

from unstall import machine
from unstall.loader.handoff.slots import process_alive, slot_dir

#: Every share file's name starts with this.
SHARE_PREFIX = "unstall_autotune"


def job_key() -> str | None:
    """This job's key on this node, or None (a single process: nothing to share)."""
    own = machine.autotune_job()
    if own:
        return own
    job = machine.torchrun_job()
    return f"{job}|{socket.gethostname()}" if job else None


def share_path(key: str) -> str:
    """The share file of job ``key`` (per user)."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return os.path.join(slot_dir(), f"{SHARE_PREFIX}-u{os.getuid()}-{digest}")


@dataclass(frozen=True)
class Others:
    """What the other ranks of the node hold: workers, how many ranks, how many wait."""

    workers: int = 0
    ranks: int = 0
    waiting: int = 0


class NodeShare:
    """This rank's entry in its job's share file (None key: no file, nobody else)."""

    def __init__(self, key: str | None):
        self.path = share_path(key) if key else None
        self.pid = os.getpid()

    def claim(self, workers: int, waiting: bool) -> Others:
        """Record this rank's ``workers`` and whether it ``waiting``; the others' claims."""
        if self.path is None:
            return Others()
        with self._locked() as doc:
            doc[str(self.pid)] = {"workers": workers, "waiting": bool(waiting)}
            others = [v for k, v in doc.items() if k != str(self.pid)]
        return Others(
            workers=sum(int(v["workers"]) for v in others),
            ranks=len(others),
            waiting=sum(1 for v in others if v.get("waiting")),
        )

    def leave(self) -> None:
        """Remove this rank's entry; the last one removes the file."""
        if self.path is None or not os.path.exists(self.path):
            return
        with contextlib.suppress(OSError), self._locked() as doc:
            doc.pop(str(self.pid), None)
        self.path = None

    @contextlib.contextmanager
    def _locked(self) -> Any:
        path = self.path
        assert path is not None
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 1 << 16, 0)
            try:
                doc = json.loads(raw) if raw else {}
            except ValueError:
                doc = {}
            doc = {k: v for k, v in doc.items() if process_alive(int(k))}
            yield doc
            if doc:
                data = json.dumps(doc).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        finally:
            os.close(fd)
