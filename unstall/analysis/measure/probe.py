"""Storage's throughput and latency, from two timed reads of cold samples.

One sample alone takes ``L + s/B``; a batch of ``m`` samples in rounds of ``q``
in flight takes ``ceil(m/q)*L + m*s/B`` (a store reading one file at a time is
then latency only: its workers scale until something else limits them). Two
probes, two unknowns: B and L. The samples probed are not among the analysed
steps, and are evicted again after.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unstall.analysis.measure.storage import evict

#: Stand-in for "no limit" where a probe cannot see the bandwidth [byte/s].
UNLIMITED = 1e11


@dataclass(frozen=True)
class StorageProbe:
    """Measured storage [Unit: byte, second]; ``inflight``: requests one worker keeps in flight."""

    sample_bytes: float
    bandwidth: float
    latency_s: float
    inflight: int
    single_s: float
    batch_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "sample_bytes": round(self.sample_bytes, 1),
            "bandwidth_bytes_per_s": round(self.bandwidth, 1),
            "latency_ms": round(self.latency_s * 1e3, 3),
            "inflight_per_worker": self.inflight,
            "single_read_ms": round(self.single_s * 1e3, 3),
            "batch_read_ms": round(self.batch_s * 1e3, 3),
        }


def store_inflight(dataset: Any, batch_size: int) -> int:
    """Requests one worker keeps in flight: S3's ``max_inflight``, a batch, or one for files."""
    store = getattr(dataset, "store", None)
    limit = getattr(getattr(store, "settings", None), "max_inflight", None)
    if isinstance(limit, int) and limit > 0:
        return min(limit, batch_size)
    name = type(store).__name__
    if name == "LocalStore":
        return 1
    return batch_size


def probe_storage(dataset: Any, indices: Sequence[int], batch_size: int) -> StorageProbe:
    """Time single reads and one batch read of ``indices`` (cold), then solve for B and L."""
    indices = list(indices)
    singles = indices[:5]
    batch = indices[5 : 5 + batch_size]
    evict(dataset, singles + batch)
    times, sizes = [], []
    for i in singles:
        t0 = time.perf_counter()
        raw = dataset.fetch([i])[0]
        times.append(time.perf_counter() - t0)
        sizes.append(len(raw))
    t0 = time.perf_counter()
    raws = dataset.fetch(batch)
    batch_s = time.perf_counter() - t0
    sizes += [len(r) for r in raws]
    evict(dataset, singles + batch)
    single_s = min(times)  # the machine's noise only ever adds: the least is the storage
    size = sum(sizes) / len(sizes)
    # one read: L + s/B; a batch of m in rounds of q: R*L + m*s/B, R = ceil(m/q)
    m, q = len(batch), store_inflight(dataset, batch_size)
    rounds = -(-m // q)
    extra = batch_s - rounds * single_s
    # one request at a time, or no visible transfer time: latency only
    bandwidth = (m - rounds) * size / extra if m > rounds and extra > 1e-4 * m else UNLIMITED
    latency = max(0.0, single_s - size / bandwidth)
    return StorageProbe(
        sample_bytes=size,
        bandwidth=bandwidth,
        latency_s=latency,
        inflight=q,
        single_s=single_s,
        batch_s=batch_s,
    )
