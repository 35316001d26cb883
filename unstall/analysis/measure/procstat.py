"""CPU figures from the OS, read around a measured window: this process, and the machine.

The loader's workers report their own CPU and run-queue time per batch (the spans);
the main process (training loop, hand-off, pin-memory thread) and the rest of the
machine (other jobs) are read here, so the analyzer can price cores, not workers.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from unstall import machine

#: /proc/stat counts in clock ticks.
_TICK = machine.clock_tick_s()


class Snapshot(NamedTuple):
    """CPU seconds so far: this process (all its threads) and the whole machine (busy)."""

    self_cpu_s: float
    machine_busy_s: float


def snapshot() -> Snapshot:
    t = os.times()
    return Snapshot(t.user + t.system, machine_busy_s())


def machine_busy_s() -> float:
    """CPU seconds the cores this process may run on spent busy (not idle, not waiting on
    I/O): `unstall.machine.cpu_ticks`."""
    ticks = machine.cpu_ticks()
    return 0.0 if ticks is None else ticks.busy * _TICK


def workers_cpu(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds, seconds waiting for a core) these processes have used so far, together.

    For workers that report no per-batch timings (an iterable dataset on torch's own
    iterator): ``/proc/PID/stat`` (user + system ticks) and ``/proc/PID/schedstat``.
    A process that is gone counts nothing.
    """
    cpu = runq = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) * _TICK
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                runq += int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return cpu, runq
