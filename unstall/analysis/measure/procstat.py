"""CPU figures from the OS, read around a measured window: this process, and the machine.

The loader's workers report their own CPU and run-queue time per batch (the spans);
the main process (training loop, hand-off, pin-memory thread) and the rest of the
machine (other jobs) are read here, so the analyzer can price cores, not workers.
"""

from __future__ import annotations

import contextlib
import os
import time
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
            runq += _schedstat(pid)[1]
        except (OSError, ValueError, IndexError):
            continue
    return cpu, runq


def _schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a core, seconds waiting for one) of process ``pid`` so far, from
    ``/proc/PID/schedstat`` (nanoseconds: finer than the ticks of ``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/schedstat", "rb") as f:
        fields = f.read().split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


def threads_on_cpu_s(pid: int) -> float | None:
    """Seconds process ``pid`` has run on a core so far, all its threads together
    (``/proc/PID/task/*/schedstat``, nanoseconds: a worker's queue feeder thread too); None
    when it is gone."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def wait_idle(pids: list[int], *, step_s: float = 0.05, most_s: float = 5.0) -> float:
    """Wait until these processes are idle (under a tenth of a core between them over
    ``step_s``), at most ``most_s``; the seconds waited. The cold run's workers finish the
    batches they had in hand before the model is timed alone in the same process: their CPU
    would otherwise be counted against the model's rate on a CPU-bound step."""
    start = time.perf_counter()

    def on_cpu() -> float:  # seconds on a core so far, together (a process gone: nothing)
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += _schedstat(pid)[0]
        return total

    before = on_cpu()
    while pids and time.perf_counter() - start < most_s:
        time.sleep(step_s)
        now = on_cpu()
        if now - before < 0.1 * step_s:
            break
        before = now
    return time.perf_counter() - start
