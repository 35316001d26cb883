"""Per-batch timings of the loader, kept as data: `loader.stats()` reads them."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# where the analyzer reads it from (a batch's sample count lives with the models, below)
from unstall import machine
from unstall.models.batch import batch_size_of as batch_size_of

#: Per-batch records kept for percentiles; totals cover every batch.
_WINDOW = 65536


@dataclass
class CpuMeter:
    """Main-process CPU seconds spent in the loader's iterators, and the batches they handed out;
    of those seconds, ``waiting`` went to the waits themselves (the watchdog's reads that found
    no batch, and its looks at the workers between them), whose cost grows with the wait."""

    seconds: float = 0.0
    batches: int = 0
    waiting: float = 0.0

    def add(self, seconds: float) -> None:
        """One batch handed out after ``seconds`` of this thread's CPU."""
        self.seconds += seconds
        self.batches += 1

    def waited(self, seconds: float) -> None:
        """``seconds`` of this thread's CPU (counted in the next `add` too) spent waiting."""
        self.waiting += seconds

    @property
    def receive_s(self) -> float:
        """The seconds that took batches from the workers: all of them but the waits'."""
        return max(0.0, self.seconds - self.waiting)

    def reset(self) -> None:
        """Count afresh (in place: running iterators keep adding to this meter)."""
        self.seconds, self.batches, self.waiting = 0.0, 0, 0.0


class Series:
    """Running total plus a bounded window of recent values (seconds)."""

    def __init__(self, window: int = _WINDOW):
        self._values = np.zeros(window, dtype=np.float64)
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self._values[self.count % len(self._values)] = value
        self.count += 1
        self.total += value

    @property
    def last(self) -> float:
        """The latest value added (0 before any)."""
        return float(self._values[(self.count - 1) % len(self._values)]) if self.count else 0.0

    def summary(self) -> dict[str, float]:
        """count, total [s], mean/p50/p90/p99/max [ms]."""
        kept = self._values[: min(self.count, len(self._values))]
        if not len(kept):
            return {"count": 0, "total_s": 0.0}
        p50, p90, p99 = np.percentile(kept, [50, 90, 99]) * 1e3
        return {
            "count": self.count,
            "total_s": round(self.total, 6),
            "mean_ms": round(self.total / self.count * 1e3, 4),
            "p50_ms": round(float(p50), 4),
            "p90_ms": round(float(p90), 4),
            "p99_ms": round(float(p99), 4),
            "max_ms": round(float(kept.max()) * 1e3, 4),
        }


class Clock:
    """One iterator's share of the loop's wall time (see `LoaderStats.wall_s`).

    `mark` at each batch handed out, `close` when the iterator's epoch ends
    (exhausted, dropped, replaced). A batch handed out after `close` (an iterator
    used on after a newer one replaced it) extends the span it closed with.
    """

    __slots__ = ("_stats", "closed", "full", "last", "start")

    def __init__(self, stats: LoaderStats):
        self._stats = stats
        self.start = self.last = time.perf_counter()
        self.closed = False
        self.full = False  # every batch of the epoch handed out: the span stops growing

    def mark(self, now: float, *, full: bool = False) -> None:
        """A batch handed out at ``now`` (``full``: the epoch's last)."""
        if self.closed:
            self._stats.wall_s += max(0.0, now - self.last)
        self.last = max(self.last, now)
        self.full = self.full or full

    def close(self, now: float | None = None) -> None:
        """End the span at the last hand-out, or at ``now`` (the iterator's exhaustion)."""
        if self.closed:
            return
        if now is not None:
            self.last = max(self.last, now)
        self.closed = True
        self._stats.wall_s += self.last - self.start
        with contextlib.suppress(ValueError):
            self._stats._live.remove(self)

    def running(self, now: float) -> float:
        """The span so far, for an open clock."""
        return (self.last if self.full else now) - self.start


#: Spans kept per loader for the timeline (issue 17): the first ones after a reset.
_SPANS = 4096


def _timeline_default() -> list[tuple[float, ...]] | None:
    """A span list when ``$UNSTALL_TIMELINE`` is set (by `unstall analyze`), else None."""
    return [] if machine.timeline() else None


@dataclass
class LoaderStats:
    """Where the loader's time went, since construction or `reset`.

    ``wait``: seconds the training loop waited inside ``__next__`` per batch (the
    data stall). ``fetch``/``prep``: seconds a worker spent getting raw bytes /
    decoding, augmenting and collating per batch (fetch is 0 when the dataset
    does not separate the two). ``stage``/``stage_cpu_s``: host seconds (wall, and
    CPU in total) per batch of the device stage: starting the copy and the device
    transform, and with ``prep="gpu"`` decoding and augmenting on its own thread.
    ``wall_s``: per iterator, seconds from its ``iter()`` to the last batch it
    handed out (to its exhaustion when exhausted: the step on the last batch
    included), summed over iterators. Each wait lies inside its iterator's span,
    so ``wait <= wall`` however iterators overlap or are dropped.
    """

    wait: Series = field(default_factory=Series)
    fetch: Series = field(default_factory=Series)
    prep: Series = field(default_factory=Series)
    stage: Series = field(default_factory=Series)
    stage_cpu_s: float = 0.0
    samples: int = 0
    epochs_completed: int = 0
    wall_s: float = 0.0
    per_epoch: list[dict[str, Any]] = field(default_factory=list)
    _live: list[Clock] = field(default_factory=list)
    _epoch_mark: dict[str, Any] = field(default_factory=dict)
    #: Per-batch spans for `unstall analyze`'s timeline, kept only with $UNSTALL_TIMELINE set.
    timeline: list[tuple[float, ...]] | None = field(default_factory=_timeline_default)

    def add_task(self, timing: Any, wait_start: float, wait_s: float) -> None:
        """One batch's worker timings; with a timeline, also its span and the loop's wait."""
        fetch_s, prep_s = timing
        self.fetch.add(fetch_s)
        self.prep.add(prep_s)
        span = getattr(timing, "span", None)
        if self.timeline is not None and span is not None and len(self.timeline) < _SPANS:
            self.timeline.append((wait_start, wait_start + wait_s, *span))

    def clock(self) -> Clock:
        """A clock for one new iterator, counted in `elapsed` from now on."""
        clock = Clock(self)
        self._live.append(clock)
        return clock

    def close_epoch(self, epoch: int, sources: dict[str, Any]) -> None:
        """Record what this epoch added: samples, waits, wall time and each source's counters."""
        now = {
            "batches": self.wait.count,
            "samples": self.samples,
            "wall_s": self.elapsed(),
            "wait_s": self.wait.total,
            "fetch_s": self.fetch.total,
            "prep_s": self.prep.total,
            **({"stage_s": self.stage.total} if self.stage.count else {}),
            **sources,
        }
        record = _delta(now, self._epoch_mark)
        record["epoch"] = epoch
        self.per_epoch.append(record)
        self._epoch_mark = now

    def elapsed(self) -> float:
        """``wall_s`` plus what the iterators still open have run so far."""
        now = time.perf_counter()
        return self.wall_s + sum(clock.running(now) for clock in self._live)

    def as_dict(self) -> dict[str, object]:
        wall = self.elapsed()
        return {
            "batches": self.wait.count,
            "samples": self.samples,
            "epochs_completed": self.epochs_completed,
            "wall_s": round(wall, 6),
            "samples_per_s": round(self.samples / wall, 3) if wall > 0 else 0.0,
            "wait_s": round(self.wait.total, 6),
            "stall_fraction": round(self.wait.total / wall, 6) if wall > 0 else 0.0,
            "wait": self.wait.summary(),
            "fetch": self.fetch.summary(),
            "prep": self.prep.summary(),
            **self._stage_summary(),
            "per_epoch": self.per_epoch,
            **({"timeline": list(self.timeline)} if self.timeline is not None else {}),
        }

    def add_stage(self, wall_s: float, cpu_s: float) -> None:
        """One batch through the device stage (called from its thread when it has one)."""
        self.stage.add(wall_s)
        self.stage_cpu_s += cpu_s

    def _stage_summary(self) -> dict[str, Any]:
        if not self.stage.count:
            return {}
        return {"stage": self.stage.summary(), "stage_cpu_s": round(self.stage_cpu_s, 6)}


def loader_stats(loader: Any) -> dict[str, Any]:
    """``loader.stats()``: its `LoaderStats`, the pool, the main thread's and the GPU stage's
    CPU per batch, the prep plan, the hand-off, the epoch, the tuner and its sources' sections."""
    out = loader._stats.as_dict()
    out["num_workers"] = loader.num_workers
    cpu_s, batches = loader.main_cpu.seconds, loader.main_cpu.batches
    out["main_cpu_s"] = round(cpu_s, 6)  # the training loop's thread, in ``__next__``
    out["main_cpu_ms_per_batch"] = round(1e3 * cpu_s / batches, 4) if batches else 0.0
    if loader._gpu_prep is not None and batches:  # the GPU stage's own thread, beside it
        out["stage_cpu_ms_per_batch"] = round(1e3 * loader._stats.stage_cpu_s / batches, 4)
    plan = getattr(loader._gpu_prep, "stats", None)
    out["prep_plan"] = plan() if callable(plan) else {"mode": loader.prep}
    if loader._handoff is not None:
        out["zero_copy"] = loader._handoff.stats()
    out["epoch"] = loader._position.current_epoch
    if loader._autotune is not None:
        out["autotune"] = loader._autotune.stats()
    out.update(loader._source_stats())
    return out


def _delta(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """Counters of ``now`` minus ``before`` (nested dicts too); hit rates recomputed from deltas."""
    out: dict[str, Any] = {}
    for key, value in now.items():
        prev = before.get(key)
        if isinstance(value, dict):
            out[key] = _delta(value, prev if isinstance(prev, dict) else {})
        elif _is_counter(key, value):
            out[key] = value - (prev if isinstance(prev, (int, float)) else 0)
        else:
            out[key] = value
    if "hits" in out and "misses" in out:
        total = out["hits"] + out["misses"]
        out["hit_rate"] = out["hits"] / total if total else 0.0
    return out


#: Keys of cumulative counters: per-epoch figures are their differences.
_COUNTER_SUFFIXES = (
    "batches",
    "samples",
    "_s",
    "hits",
    "misses",
    "requests",
    "retries",
    "errors",
    "bytes",
    "_reads",
)
#: Settings and levels that end like counters but are not cumulative.
_NOT_COUNTER_PREFIXES = ("capacity", "max_", "limit")


def _is_counter(key: str, value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and key.endswith(_COUNTER_SUFFIXES)
        and not key.startswith(_NOT_COUNTER_PREFIXES)
    )
