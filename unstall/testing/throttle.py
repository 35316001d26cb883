"""A store with a set throughput shared by every process that reads it: slow storage, on demand.

Benchmarks need storage to be the bottleneck on a machine whose disks and page
cache are fast. `ThrottledStore` wraps another store and models one link of
``bytes_per_s``: each read reserves its transfer time on a clock shared through a
small shared-memory file (all worker processes queue on the same link), then
sleeps until its transfer would be done, plus ``latency_s``.
"""

from __future__ import annotations

import time
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
        from unstall.cache.shm.words import SharedWords

        self.inner = inner
        self.bytes_per_s = float(bytes_per_s)
        self.latency_s = float(latency_s)
        self._words = SharedWords("throttle", 8, np.float64)

    @property
    def url(self) -> str:
        return self.inner.url

    def _transfer(self, nbytes: int, requests: int) -> None:
        """Queue ``nbytes`` on the shared link and sleep until they would have arrived."""
        with self._words.locked() as words:
            now = time.monotonic()
            done = max(now, float(words[_NEXT])) + nbytes / self.bytes_per_s
            words[_NEXT] = done
            words[_REQUESTS] += requests
            words[_BYTES] += nbytes
            pause = done + self.latency_s - now
            words[_WAIT] += pause
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
        words = self._words.view()
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
        self._words.close()
        self.inner.close()
