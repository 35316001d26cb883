"""A few numbers shared by a loader's processes: a one-page shared-memory file of words.

Used for counters summed over worker processes (peer traffic) and for clocks
shared by them (the throttled test link). The creating process owns the file and
unlinks it when the object is collected or closed; pickled copies (workers) map
it again in their own process, each with its own descriptor, so `locked` is a
real cross-process lock (``flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import random
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from unstall.cache.shm.segment import segment_name, segment_path

_PAGE = 4096


class SharedWords:
    """``count`` words of ``dtype`` in a shared-memory file named after ``kind``."""

    def __init__(self, kind: str, count: int, dtype: Any = np.int64):
        self.count, self.dtype = count, np.dtype(dtype)
        if count * self.dtype.itemsize > _PAGE:
            raise ValueError(f"{count} words of {self.dtype} do not fit in one page")
        tag = f"{os.getpid()}-{random.getrandbits(40):x}"
        self.path = segment_path(segment_name("", kind, name=tag))
        self.owner = os.getpid()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.posix_fallocate(fd, 0, _PAGE)
        os.close(fd)
        weakref.finalize(self, _unlink_if_owner, self.path, self.owner)
        self._state: tuple[int, np.ndarray] | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_state=None, _pid=-1)
        return state

    def _shared(self) -> tuple[int, np.ndarray]:
        if self._pid != os.getpid() or self._state is None:  # own fd per process: own flock
            fd = os.open(self.path, os.O_RDWR)
            mm = mmap.mmap(fd, _PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            words = np.ndarray((self.count,), self.dtype, mm, 0)
            self._state, self._pid = (fd, words), os.getpid()
        return self._state

    def view(self) -> np.ndarray:
        """The words, for reads without the lock (each aligned word reads whole)."""
        return self._shared()[1]

    @contextlib.contextmanager
    def locked(self) -> Iterator[np.ndarray]:
        """The words, under an exclusive lock across processes."""
        fd, words = self._shared()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield words
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Remove the file (in the owner process only)."""
        _unlink_if_owner(self.path, self.owner)


def _unlink_if_owner(path: str, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
