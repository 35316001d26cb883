"""The measured window: steady state only, never the start-up burst.

When an iterator starts, its workers prepare ``num_workers x prefetch_factor``
batches at once; a loop that starts after them finds them ready and runs at the
model's speed until they are used up. Timing those batches is how a job that is
starved of data gets called compute-bound. So every iterator's first batches (its
burst) are skipped, and the window is taken only when the per-step time has
settled; it is long enough when it covers both a number of steps and a time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

#: Drop the window's first quarter while its steps are this much faster than the rest's.
SETTLE_RATIO = 0.7
#: Batches an iterator must keep past its skipped ones to give a step (a step spans two).
LEAST_KEPT = 2


@dataclass(frozen=True)
class Handout:
    """One batch handed to the loop: when, after how long a wait, how many samples, in which
    iterator; this process's CPU seconds and the machine's busy seconds at that moment."""

    t: float
    wait: float
    n: int
    seg: int
    cpu: float = 0.0
    busy: float = 0.0
    workers_cpu: float = 0.0  # iterable datasets' workers, from /proc (no per-batch spans)
    workers_runq: float = 0.0
    loop_runq: float = 0.0  # seconds the loop's thread waited for a core so far (schedstat)
    receive: float = 0.0  # the loop thread's CPU in the loader's ``__next__`` so far


@dataclass
class Window:
    """Steps of the steady window [Unit: second]: ``(wait, compute, samples)`` each, a step
    the loop's work on one batch and its wait for the next: the stretch between two hand-outs,
    over which the CPU and busy seconds beside them are read."""

    steps: list[tuple[float, float, int]] = field(default_factory=list)
    bounds: list[tuple[float, float]] = field(default_factory=list)  # per iterator: start, end
    main_cpu_s: float = 0.0
    machine_busy_s: float = 0.0
    workers_cpu_s: float = 0.0
    workers_runq_s: float = 0.0
    loop_runq_s: float = 0.0
    receive_cpu_s: float = 0.0  # the loader's ``__next__``: the receive of each step's batch
    skipped: int = 0  # batches left out: each iterator's burst, the first one's warm-up
    iterators: int = 0  # the iterators (epochs, passes) the hand-outs came from

    @property
    def wall_s(self) -> float:
        return sum(w + c for w, c, _ in self.steps)

    @property
    def samples(self) -> int:
        return sum(n for _, _, n in self.steps)

    def covers(self, t: float) -> bool:
        """Whether time ``t`` falls in one of the window's stretches."""
        return any(a <= t <= b for a, b in self.bounds)


def burst_depth(loader: Any) -> int:
    """Batches an iterator of ``loader`` has prepared before the loop asks: its workers' burst."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    if workers <= 0:
        return 0
    return workers * int(getattr(loader, "prefetch_factor", None) or 2)


def loader_worker_pids(loader: Any) -> list[int]:
    """Process ids of the workers of ``loader``'s current iterator (none when unknown)."""
    pids = getattr(loader, "worker_pids", None)  # torch's own DataLoader has none
    return list(pids()) if callable(pids) else []


def steady_window(handouts: list[Handout], *, skip_first: int, skip_each: int) -> Window:
    """The steps after each iterator's burst (and the first iterator's warm-up), settled."""
    out = Window()
    segs: dict[int, list[Handout]] = {}
    for h in handouts:
        segs.setdefault(h.seg, []).append(h)
    out.iterators = len(segs)
    first = True
    for seg in segs.values():
        skip = skip_first if first else skip_each
        first = False
        kept = seg[skip:]
        out.skipped += min(skip, len(seg))
        if len(kept) < LEAST_KEPT:
            continue
        pairs = list(itertools.pairwise(kept))
        pairs = _settled(pairs)
        for a, b in pairs:
            # the loop's step on batch a, then its wait for b: the stretch (a.t, b.t] whose
            # CPU and busy time are read below (a's own wait came before it)
            compute = max(0.0, b.t - b.wait - a.t)
            out.steps.append((b.wait, compute, a.n))
            out.main_cpu_s += b.cpu - a.cpu
            out.machine_busy_s += b.busy - a.busy
            out.workers_cpu_s += max(0.0, b.workers_cpu - a.workers_cpu)
            out.workers_runq_s += max(0.0, b.workers_runq - a.workers_runq)
            out.loop_runq_s += max(0.0, b.loop_runq - a.loop_runq)
            out.receive_cpu_s += max(0.0, b.receive - a.receive)
        out.bounds.append((pairs[0][0].t - pairs[0][0].wait, pairs[-1][1].t))
    return out


def _settled(pairs: list[tuple[Handout, Handout]]) -> list[tuple[Handout, Handout]]:
    """Drop leading quarters whose steps are much shorter than the rest (burst left-overs)."""
    for _ in range(3):
        if len(pairs) < 8:
            break
        q = len(pairs) // 4
        head = sum(b.t - a.t for a, b in pairs[:q]) / q
        rest = sum(b.t - a.t for a, b in pairs[q:]) / (len(pairs) - q)
        if head >= SETTLE_RATIO * rest:
            break
        pairs = pairs[q:]
    return pairs


def enough(window: Window, *, min_steps: int, min_s: float) -> bool:
    """A window long enough to measure: ``min_steps`` steps and ``min_s`` seconds."""
    return len(window.steps) >= min_steps and window.wall_s >= min_s
