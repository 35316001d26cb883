"""A store with a set throughput shared by every process that reads it: slow storage, on demand.

Benchmarks need storage to be the bottleneck on a machine whose disks and page
cache are fast. `ThrottledStore` wraps another store and models one link of
``bytes_per_s``: each read reserves its transfer time on a clock shared through a
small shared-memory file (all worker processes queue on the same link), then
sleeps until its transfer would be done, plus ``latency_s``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from unstall.stores.base import Store

# shared words (float64): next free time on the link, requests, bytes, seconds slept
_NEXT, _REQUESTS, _BYTES, _WAIT = range(4)


class ThrottledStore(Store):
    """``inner`` behind a link of ``bytes_per_s``, shared by all processes (a token-bucket clock).

    Args:
        inner: the store holding the data (usually a `LocalStore` reading around the
            page cache).
        bytes_per_s: throughput of the link [Unit: byte/second], for all readers together.
        latency_s: extra time per request [Unit: second].

    Its ``url`` is the inner store's, so datasets over both have the same fingerprint.
    """

    def __init__(self, inner: Store, *, bytes_per_s: float, latency_s: float = 0.0):
        if not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s={bytes_per_s!r} must be > 0 (e.g. 50e6 for 50 MB/s)")
        if latency_s < 0:
            raise ValueError(f"latency_s={latency_s!r} must be >= 0")
        from unstall.cache.segment import segment_name, segment_path

        self.inner = inner
        self.bytes_per_s = float(bytes_per_s)
        self.latency_s = float(latency_s)
        tag = f"{os.getpid()}-{random.getrandbits(40):x}"
        self._path = segment_path(segment_name("", "throttle", name=tag))
        self._owner = os.getpid()
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.posix_fallocate(fd, 0, 4096)
        os.close(fd)
        weakref.finalize(self, _unlink_if_owner, self._path, self._owner)
        self._state: tuple[int, np.ndarray] | None = None
        self._pid = -1

    @property
    def url(self) -> str:
        return self.inner.url

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_state=None, _pid=-1)
        return state

    def _shared(self) -> tuple[int, np.ndarray]:
        if self._pid != os.getpid() or self._state is None:  # own fd per process: own flock
            fd = os.open(self._path, os.O_RDWR)
            mm = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._state, self._pid = (fd, np.ndarray((8,), np.float64, mm, 0)), os.getpid()
        return self._state

    def _transfer(self, nbytes: int, requests: int) -> None:
        """Queue ``nbytes`` on the shared link and sleep until they would have arrived."""
        import fcntl

        fd, words = self._shared()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            now = time.monotonic()
            done = max(now, float(words[_NEXT])) + nbytes / self.bytes_per_s
            words[_NEXT] = done
            words[_REQUESTS] += requests
            words[_BYTES] += nbytes
            pause = done + self.latency_s - now
            words[_WAIT] += pause
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        if pause > 0:
            time.sleep(pause)

    def _get(self, key: str) -> bytes:
        data = self.inner.get(key)
        self._transfer(len(data), 1)
        return data

    def _get_many(self, keys: list[str]) -> list[bytes]:
        data = self.inner.get_many(keys)
        self._transfer(sum(len(d) for d in data), len(keys))
        return data

    def _list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def _put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        return self._get_many(list(keys))  # the inner store validates the keys

    def path(self, key: str) -> Any:
        """The inner store's file for ``key`` (for size estimates), if it has files."""
        return self.inner.path(key)  # type: ignore[attr-defined]

    def stats(self) -> dict[str, Any]:
        """Cumulative reads through the link, all processes: ``{"storage": {...}}``."""
        _fd, words = self._shared()
        return {
            "storage": {
                "requests": int(words[_REQUESTS]),
                "bytes": int(words[_BYTES]),
                "throttle_s": round(float(words[_WAIT]), 6),
                "bytes_per_s_limit": self.bytes_per_s,
            }
        }

    def close(self) -> None:
        """Remove the shared clock (owner only); safe to call twice."""
        if os.getpid() == self._owner:
            _unlink_if_owner(self._path, self._owner)
        self.inner.close()


def _unlink_if_owner(path: str, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
