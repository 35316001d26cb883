"""Counters of an S3 store shared by the process that made it and its forked workers.

Requests happen in torch's worker processes, but ``loader.stats()`` runs in the
main process. The counters live in an anonymous shared memory page created with
the store, so every forked process (helper, workers) adds to the same numbers.
A copy made by pickling (spawn/forkserver workers) gets a fresh, private block:
then the main process sees only its own requests.
"""

from __future__ import annotations

import mmap
import multiprocessing
from typing import Any

import numpy as np

#: Counters (summed over processes) and gauges (last value any process wrote).
COUNTERS = (
    "requests", "retries", "errors", "bytes", "get_s", "list_requests", "prefetched",
    "queued",  # requests that waited for a slot: the requests-in-flight limit was reached
)  # fmt: skip
GAUGES = ("latency_ms", "max_inflight")
#: Settings the process that made the store sets for every process sharing it (0: unset):
#: ``inflight_limit``, the requests in flight per process (``num_workers="auto"`` turns it).
SETTINGS = ("inflight_limit",)
_FIELDS = COUNTERS + GAUGES + SETTINGS


class SharedStats:
    """A few float64 slots in shared memory, updated once per batch under a lock."""

    def __init__(self) -> None:
        self._buf = mmap.mmap(-1, 8 * len(_FIELDS))
        self._values = np.frombuffer(self._buf, dtype=np.float64)
        self._lock = multiprocessing.Lock()
        self._index = {name: i for i, name in enumerate(_FIELDS)}

    def add(self, **deltas: float) -> None:
        """Add to counters, e.g. ``add(requests=32, bytes=2.4e6)``."""
        with self._lock:
            for name, value in deltas.items():
                self._values[self._index[name]] += value

    def set(self, **values: float) -> None:
        """Set gauges, e.g. ``set(latency_ms=21.3, max_inflight=43)``."""
        with self._lock:
            for name, value in values.items():
                self._values[self._index[name]] = value

    def get(self, name: str) -> float:
        """One slot's value, read without the lock (a single aligned float64)."""
        return float(self._values[self._index[name]])

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            values = self._values.tolist()
        out: dict[str, Any] = {}
        for name, value in zip(_FIELDS, values, strict=True):
            if name == "get_s":
                out[name] = round(value, 4)
            elif name == "latency_ms":
                out[name] = round(value, 2) if value else None
            elif name in ("max_inflight", "inflight_limit"):
                out[name] = int(value) if value else None
            else:
                out[name] = int(value)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        # shared memory cannot travel through pickle: a copy counts on its own
        return (SharedStats, ())
