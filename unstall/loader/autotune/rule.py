"""The decision rule: from one window of measurements, the pool the loader should run.

Pure: it sees numbers only (`Window`, `Budget`), so tests drive it with synthetic
measurements. What it reads, per window of batches:

* ``wait``: the share of the loop's wall time spent waiting in ``next()``. Above
  `GROW_WAIT` the workers are behind, else they keep up.
* ``util``: the share of the workers' wall time spent on tasks (fetch + prepare).
  The loop needs about ``util x workers`` busy workers; the rest sit idle.
* ``contention``: the workers' time runnable but waiting for a core, per second of
  task time. Above `CROWDED` there are no free cores, whatever the count says.

The cap: the cores left hold ``cores / (CPU share of a worker)`` workers (`core_cap`:
a worker waiting on I/O counts as part of a core), never past the memory ceiling.
Rules, in order: above the cap -> down to it; the loop waits and cores are free (under
the cap, idle on the node or I/O-bound workers that never wait for a core, workers not
crowded) -> grow to the workers the measured
costs need (at least one more, at most the cap and the idle cores); the loop does not
wait and workers idle -> shrink to the busy workers plus `HEADROOM`; a store whose requests
in flight can be turned (S3), the loop waiting on workers that mostly wait on I/O with
requests queued at the limit, no room for more workers but half a core idle -> twice the
requests in flight; with
``prefetch_factor="auto"``, the loop waits while the workers idle (bursty costs) -> more
tasks in flight.

Remote workers (``remote=``, issue 45) take the overflow: the loop still waits and the local
workers cannot grow (at their cap, no idle core, or crowded) -> more of the remote workers
used (the workers the measured costs need less the local ones, at least one more, at most
``Remote(workers=N)``); the loop does not wait and workers idle -> fewer remote workers
first, local ones only once no remote one is in use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The loop waiting more than this share of its time: the workers are behind.
GROW_WAIT = 0.05
#: Spare busy capacity kept when shrinking (workers needed x this).
HEADROOM = 1.3
#: Runnable-but-waiting time per task second above which no core counts as free.
CROWDED = 0.5
#: Workers idle more than this share while the loop waits: tasks in flight are short.
BURSTY_UTIL = 0.8
#: The most workers ``"auto"`` ever runs, and the most tasks in flight per worker.
MAX_WORKERS = 64
MAX_PREFETCH = 8
#: Workers that wait on I/O (fetch-bound) may number this many per free core.
IO_WORKERS_PER_CORE = 2
#: Workers using less than this share of a core while busy wait on I/O (fetch-bound).
IO_SHARE = 0.5
#: Runnable-but-waiting time per task second below which I/O-bound workers are not crowded.
UNCROWDED = 0.1
#: The most requests in flight per worker ``"auto"`` asks a store for.
MAX_INFLIGHT = 256
#: Why a shrink to the busy workers is asked (`Decision.why`).
IDLE = "workers idle"


@dataclass(frozen=True)
class Window:
    """Measurements over a run of consecutive batches (seconds are totals)."""

    batches: int
    wall_s: float  # the loop's wall time over the window
    wait_s: float  # of which waiting in next()
    busy_s: float  # workers' task time (fetch + prepare), all workers
    cpu_s: float  # workers' CPU seconds on those tasks
    runq_s: float  # workers' time runnable, waiting for a core
    workers: int
    prefetch: int
    remote: int = 0  # remote workers in use (issue 45)
    remote_busy_s: float = 0.0  # their task time over the window (fetch + prepare there)

    @property
    def rate(self) -> float:
        """Batches per second."""
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def wait(self) -> float:
        return min(1.0, self.wait_s / self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def util(self) -> float:
        if self.wall_s <= 0 or self.workers <= 0:
            return 0.0
        return min(1.0, self.busy_s / (self.wall_s * self.workers))

    @property
    def contention(self) -> float:
        return self.runq_s / self.busy_s if self.busy_s > 0 else 0.0


@dataclass(frozen=True)
class Budget:
    """What the pool may take: ``cores`` for workers (after the training process's threads
    and the other ranks on the node) and ``memory_workers`` (the memory ceiling)."""

    cores: int
    memory_workers: int = 1 << 16
    idle: float | None = None  # the node's idle cores (None: not measured)
    remote_cap: int = 0  # remote workers the loader has (``Remote(workers=N)``; 0: none)

    @property
    def cap(self) -> int:
        return max(1, min(self.cores, self.memory_workers, MAX_WORKERS))


def worker_share(w: Window) -> float:
    """The share of a core one worker keeps busy: CPU seconds per task second not spent
    waiting for a core (at least 1 / `IO_WORKERS_PER_CORE`; 1 when not measured)."""
    running = w.busy_s - w.runq_s  # CPU or I/O
    share = w.cpu_s / running if running > 0 and w.cpu_s > 0 else 1.0
    return min(1.0, max(share, 1.0 / IO_WORKERS_PER_CORE))


def io_bound(w: Window) -> bool:
    """Whether the workers of ``w`` mostly wait on I/O: CPU seconds per task second not
    spent waiting for a core under `IO_SHARE` (measured ones only)."""
    running = w.busy_s - w.runq_s
    return running > 0 and w.cpu_s > 0 and w.cpu_s / running < IO_SHARE


def core_cap(w: Window, budget: Budget) -> int:
    """The most workers ``budget`` allows for the workers measured in ``w``: each counts as
    the share of a core it keeps busy (CPU seconds per task second not spent waiting
    for a core; at least
    1 / `IO_WORKERS_PER_CORE`, one core when not measured), so a fetch-bound pool may run
    more processes than cores while CPU-bound workers get one core each."""
    cores = int(budget.cores / worker_share(w) + 1e-9)
    return max(1, min(cores, budget.memory_workers, MAX_WORKERS))


@dataclass(frozen=True)
class Decision:
    """A new pool: ``workers`` x ``prefetch`` tasks in flight, and why."""

    workers: int
    prefetch: int
    why: str
    inflight: int | None = None  # requests in flight per worker (None: not tuned)
    remote: int | None = None  # remote workers to use (None: as they are)


def decide(
    w: Window,
    budget: Budget,
    *,
    tune_workers: bool = True,
    tune_prefetch: bool = False,
    floor: int = 1,
    ceiling: int = MAX_WORKERS,
    inflight: int | None = None,
    inflight_ceiling: int = MAX_INFLIGHT,
    queued: bool = False,
    remote_floor: int = 0,
    remote_ceiling: int = MAX_WORKERS,
) -> Decision | None:
    """The pool to switch to after window ``w`` under ``budget``, or None (keep it).

    ``floor`` / ``ceiling``: bounds the controller holds for a while after a change
    that did not pay (settling), inside the budget's cap. ``inflight``: the requests in
    flight per worker now, where the store lets them be turned (else None);
    ``inflight_ceiling`` its bound held after a raise that did not pay; ``queued``: requests
    waited for a slot over the window (the limit binds: raising it can pay);
    ``remote_floor`` / ``remote_ceiling``: the bounds held on the remote workers in use.
    """
    n, p = w.workers, w.prefetch
    cap = core_cap(w, budget)
    if tune_workers and n > cap:
        what = "memory ceiling" if budget.memory_workers <= cap else "cores left"
        return Decision(cap, p, f"over the {what} ({cap})", inflight)
    waiting = w.wait > GROW_WAIT
    top_inflight = min(inflight_ceiling, MAX_INFLIGHT)
    if tune_workers and waiting:
        top = min(cap, max(ceiling, 1))
        # new workers only take cores nothing else uses (half a core idle counts: the loop's
        # own share of a core shows as busy); workers that wait on I/O and never for a core
        # take little of one: they may grow to the I/O cap on a busy node
        polite = not (io_bound(w) and w.contention <= UNCROWDED)
        if budget.idle is not None and polite:
            top = min(top, n + int(budget.idle / worker_share(w) + 0.5))
        if n < top and w.contention <= CROWDED:
            # each worker turns out one batch per (task time - time waiting for a core);
            # the loop takes one per (its own time per batch): workers needed to keep up
            own = max(w.wall_s - w.wait_s, 1e-3 * w.batches) / max(w.batches, 1)
            task = max(w.busy_s - w.runq_s, 0.0) / max(w.batches, 1)
            need = math.ceil(task / own) if own > 0 else top
            return Decision(min(top, max(n + 1, need)), p, "loop waits, cores free", inflight)
    more_requests = queued and inflight is not None and inflight < top_inflight and io_bound(w)
    # requests cost CPU too (client and server): only with half a core idle on the node
    spare = budget.idle is None or budget.idle >= 0.5
    if tune_workers and waiting and more_requests and spare:  # no more workers: more requests
        return Decision(n, p, "loop waits on requests", min(top_inflight, 2 * (inflight or 1)))
    if tune_prefetch and waiting and w.util < BURSTY_UTIL and p < MAX_PREFETCH:
        return Decision(n, min(MAX_PREFETCH, p + 2), "loop waits while workers idle", inflight)
    if tune_workers and budget.remote_cap > 0:
        d = _remote(w, budget, waiting, inflight, remote_floor, remote_ceiling)
        if d is not None or w.remote > remote_floor:
            return d  # remote workers in use go back before any local one
    if tune_workers and not waiting and n > max(floor, 1):
        need = max(1, math.ceil(w.util * n * HEADROOM))
        if need < n:
            return Decision(max(need, floor, 1), p, IDLE, inflight)
    return None


def _remote(
    w: Window, budget: Budget, waiting: bool, inflight: int | None, floor: int, ceiling: int
) -> Decision | None:
    """The remote workers to use (issue 45), the local ones unable to grow: while the loop
    waits, as many as the measured costs need beyond the local ones (at least one more);
    while workers idle, the busy ones plus `HEADROOM` less the local ones."""
    n, p, r = w.workers, w.prefetch, w.remote
    top = min(budget.remote_cap, max(ceiling, 0))
    own = max(w.wall_s - w.wait_s, 1e-3 * w.batches) / max(w.batches, 1)
    if waiting and r < top:
        task = (max(w.busy_s - w.runq_s, 0.0) + w.remote_busy_s) / max(w.batches, 1)
        need = math.ceil(task / own) - n if own > 0 else top
        return Decision(
            n, p, "loop waits, local workers at their cap", inflight, min(top, max(r + 1, need))
        )
    if not waiting and r > floor and w.wall_s > 0:
        busy = (w.busy_s + w.remote_busy_s) / w.wall_s  # workers busy, local and remote
        keep = max(floor, math.ceil(busy * HEADROOM) - n, 0)
        if keep < r:
            return Decision(n, p, IDLE, inflight, keep)
    return None
