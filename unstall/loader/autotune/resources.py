"""What the tuner may use: the cores left for workers and the memory ceiling, measured.

Cores: the CPUs this process may run on (`os.sched_getaffinity`, capped by a cgroup's
``cpu.max`` quota), less the cores the training process's own threads keep busy
(measured: its CPU seconds over the wall time); and the idle cores among those it may use
(`unstall.machine.cpu_ticks`): a pool grows only into cores nothing else uses (a
neighbour's job, a storage server on the same node). Memory: each worker's proportional
set size (``/proc/PID/smaps_rollup``, RSS where that is missing) against the node's
``MemAvailable``: a pool grows only while half of what is available still covers the
new workers.
"""

from __future__ import annotations

import time
from typing import Any

from unstall import machine

#: Share of the node's available memory new workers may take.
MEMORY_SHARE = 0.5


def node_cores() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup quota (`unstall.machine`)."""
    return machine.cores_available()


class IdleMeter:
    """The idle cores over an interval, of those this process may use (`unstall.machine.cpu_ticks`:
    idle + iowait time)."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[float, float] | None:
        ticks = machine.cpu_ticks()
        if ticks is None:
            return None
        return time.perf_counter(), ticks.idle * machine.clock_tick_s()

    def idle_cores(self) -> float | None:
        """Cores idle on average since the last call (None where not measured)."""
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[0] <= last[0]:
            return None
        return max(0.0, (now[1] - last[1]) / (now[0] - last[0]))


def training_cores(main_cpu_s: float, wall_s: float) -> int:
    """Cores the training process's own threads keep busy over ``wall_s`` (rounded)."""
    if wall_s <= 0:
        return 0
    return max(0, int(main_cpu_s / wall_s + 0.5))


def available_bytes() -> int | None:
    """The node's ``MemAvailable`` in bytes (None where /proc/meminfo has none)."""
    return machine.memory_available_bytes()


def process_bytes(pid: int) -> int | None:
    """A process's proportional set size (shared pages split among their users), else RSS."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return None


def worker_bytes(raw: Any, loader: Any, prefetch: int) -> float | None:
    """Bytes per worker of torch iterator ``raw``'s pool: the mean proportional set size,
    plus its share of ``loader``'s zero-copy slots (``prefetch`` each); None if unmeasured."""
    # here: the adapter imports torch, which the analyzer's own process (`cores_left`) lacks
    from unstall.loader.workers import torch_iter

    sizes = []
    for proc in torch_iter.workers(raw):
        size = process_bytes(proc.pid) if proc.pid else None
        if size:
            sizes.append(size)
    if not sizes:
        return None
    handoff = getattr(loader, "_handoff", None)
    slots = (handoff.size or 0) * prefetch if handoff is not None else 0
    return sum(sizes) / len(sizes) + slots


def memory_ceiling(workers: int, per_worker: float | None, available: int | None) -> int:
    """The most workers memory allows: the ``workers`` running plus what `MEMORY_SHARE` of
    ``available`` bytes holds at ``per_worker`` bytes each (no limit when not measured)."""
    if not per_worker or available is None:
        return 1 << 16
    return workers + int(MEMORY_SHARE * available // per_worker)


def cores_left(
    cores: int, training: int, others_workers: int, others_ranks: int, others_waiting: int
) -> int:
    """Cores this rank's workers may use: the node's ``cores`` less the training process's
    own busy cores and the other ranks' workers; while another rank waits for workers,
    no more than a fair share (``cores`` over the ranks). At least 1."""
    left = cores - training - others_workers
    if others_waiting and others_ranks:
        left = min(left, cores // (others_ranks + 1))
    return max(1, left)


def inflight_store(loader: Any) -> Any:
    """The store of ``loader``'s dataset whose requests in flight can be turned (it has
    ``set_inflight`` and ``inflight``, as `unstall.stores.s3.S3Store`), or None."""
    dataset = getattr(loader, "dataset", None)
    for store in (
        getattr(dataset, "store", None),
        getattr(getattr(dataset, "location", None), "store", None),
    ):
        if hasattr(store, "set_inflight") and hasattr(store, "inflight"):
            return store
    return None
