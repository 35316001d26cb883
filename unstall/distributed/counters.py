"""Counters of one loader's peer traffic, summed over its worker processes (a small shm file)."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import random
import weakref
from typing import Any

import numpy as np

from unstall.cache.segment import segment_name, segment_path

NAMES = ("peer_hits", "peer_bytes", "peer_errors", "storage_reads", "storage_bytes")


class SharedCounters:
    """int64 counters in a shared-memory file, one writer lock; picklable into workers."""

    def __init__(self) -> None:
        tag = f"{os.getpid()}-{random.getrandbits(40):x}"
        self.path = segment_path(segment_name("", "peers", name=tag))
        self.owner = os.getpid()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.posix_fallocate(fd, 0, 4096)
        os.close(fd)
        weakref.finalize(self, _unlink_if_owner, self.path, self.owner)
        self._state: tuple[int, np.ndarray] | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_state=None, _pid=-1)
        return state

    def _shared(self) -> tuple[int, np.ndarray]:
        if self._pid != os.getpid() or self._state is None:
            fd = os.open(self.path, os.O_RDWR)
            mm = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._state, self._pid = (fd, np.ndarray((len(NAMES),), np.int64, mm, 0)), os.getpid()
        return self._state

    def add(self, **counts: int) -> None:
        fd, words = self._shared()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for name, value in counts.items():
                words[NAMES.index(name)] += value
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def read(self) -> dict[str, int]:
        try:
            _fd, words = self._shared()
        except FileNotFoundError:  # closed: nothing left to report
            return dict.fromkeys(NAMES, 0)
        return {name: int(words[k]) for k, name in enumerate(NAMES)}

    def close(self) -> None:
        _unlink_if_owner(self.path, self.owner)


def _unlink_if_owner(path: str, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
