"""The tuner of one loader: measures each batch, decides between batches, changes the pool.

`AutoTuner` collects the loop's wait and the workers' task times batch by batch into
windows; after each window it asks the walk (`policy.step`: the rule, `rule.decide`,
with judging, undoing and the window lengths) under the current budget (`resources`,
`share`) and applies a decision at the next ``next()`` (`pool.restart_pool`), so an
error while the pool changes surfaces there, like any pull's. The batches right after
a change (the new pool filling up) are not measured; the tuner keeps watching (costs
that change, cores that other processes take). Where the dataset's store lets its
requests in flight be turned (`S3Store.set_inflight`), a fetch-bound loop whose requests
queue at the limit gets more requests per worker once the workers cannot grow; that
change needs no new pool. With ``remote=`` (issue 45) the walk also decides how many of the
loader's remote workers get new batches (local ones first, remote ones the overflow); that
change needs no new pool either: the remote side (`extensions.Remote.use`) sends to that
many from its next batch. ``schedule`` (tests) replaces the rule with fixed steps.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

from unstall import machine
from unstall.loader import schedclock
from unstall.loader.autotune import policy, resources
from unstall.loader.autotune.policy import AUTO, START_PREFETCH, START_WORKERS, warmup_batches
from unstall.loader.autotune.pool import TunedLoader, can_restart, restart_pool
from unstall.loader.autotune.rule import GROW_WAIT, Budget, Decision, Window
from unstall.loader.autotune.share import NodeShare, job_key

log = logging.getLogger("unstall")


def wants_auto(num_workers: Any, prefetch_factor: Any) -> bool:
    """Whether a loader's ``num_workers`` or ``prefetch_factor`` asks for ``"auto"``."""
    return num_workers == AUTO or prefetch_factor == AUTO


@dataclass(frozen=True)
class AutoStart:
    """What `take_auto` decides: the pool a loader starts with and the tuner that changes it
    (None: no tuning, the values as given or, for an iterable dataset, the starting ones)."""

    num_workers: Any
    prefetch_factor: Any
    tuner: AutoTuner | None = None


def take_auto(num_workers: Any, prefetch_factor: Any, *, map_style: bool) -> AutoStart:
    """The starting pool for a loader's ``num_workers``/``prefetch_factor``, ``"auto"``
    replaced by starting values, and its tuner.

    ``num_workers="auto"`` starts at `START_WORKERS` (at most the cores),
    ``prefetch_factor="auto"`` at 2. An
    iterable dataset (run by torch's own machinery, which cannot change its pool
    mid-epoch) keeps the starting values: no tuner is returned for it.
    """
    if not wants_auto(num_workers, prefetch_factor):
        return AutoStart(num_workers, prefetch_factor)
    tune_workers = num_workers == AUTO
    tune_prefetch = prefetch_factor == AUTO
    for key, v in (("num_workers", num_workers), ("prefetch_factor", prefetch_factor)):
        if v != AUTO and v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise ValueError(f"{key}={v!r} must be an int or 'auto'")
    if tune_workers:
        num_workers = min(START_WORKERS, resources.node_cores())
    tuner = None
    if map_style:  # claims its start in the node's share (ranks of one job split the cores)
        tuner = AutoTuner(tune_workers, tune_prefetch, num_workers, START_PREFETCH)
        num_workers = tuner.workers
    if num_workers == 0:
        raise ValueError("prefetch_factor='auto' needs num_workers > 0 (or num_workers='auto')")
    if tune_prefetch:
        prefetch_factor = START_PREFETCH
    if tuner is None:
        log.info("unstall autotune: an iterable dataset keeps %d workers", num_workers)
        return AutoStart(num_workers, prefetch_factor)
    tuner.prefetch = prefetch_factor or START_PREFETCH
    return AutoStart(num_workers, prefetch_factor, tuner)


class AutoTuner:
    """One loader's tuner (see the module's docstring)."""

    def __init__(self, tune_workers: bool, tune_prefetch: bool, workers: int, prefetch: int):
        self.tune_workers, self.tune_prefetch = tune_workers, tune_prefetch
        self.workers, self.prefetch = workers, prefetch
        self.history: list[dict[str, Any]] = []
        self.restart_s = 0.0
        self.enabled = True  # False: pinned (e.g. coordinated preparation)
        self._loader: weakref.ref[TunedLoader] | None = None
        self._it: weakref.ref[Any] | None = None
        self._raw: Any = None
        self._t0 = time.perf_counter()
        self._cores = resources.node_cores()
        self._idle = resources.IdleMeter()
        self._per_worker: tuple[Any, float | None] | None = None  # (pool, bytes per worker)
        self._share = NodeShare(job_key())
        self._schedule: list[tuple[int, int, int | None]] = []
        self._pending: Decision | None = None
        self._skip = 0  # batches not measured (a new pool filling up)
        self._walk = policy.State()  # judging, votes, bounds held (`policy.step`)
        self._store: Any = None  # the dataset's store, where its requests in flight turn
        self._queued = 0
        self._remote: Any = None  # the loader's remote workers (issue 45), where tuned
        self.remote = 0  # of which in use
        self._budget = Budget(self._cores)
        if tune_workers:  # ranks of one job on this node start within their share
            others = self._share.claim(workers, False)
            start = policy.start_workers(self._cores, machine.local_world_size(), others.workers)
            self.workers = min(workers, start)
            self._share.claim(self.workers, False)
        self._reset_window()
        schedclock.enable()  # workers measure their time waiting for a core

    # Wiring ------------------------------------------------------------------
    def attach(self, loader: TunedLoader, it: Any, raw: Any) -> None:
        """Tune ``it`` (the loader's new epoch iterator), whose torch iterator is ``raw``."""
        self._loader = weakref.ref(loader)
        self._it = weakref.ref(it)
        self._raw = weakref.ref(raw)
        if self.tune_workers and self._store is None:
            self._store = resources.inflight_store(loader)
        self._skip = warmup_batches(self.workers, self.prefetch)  # the pool starts up
        self._reset_window()

    def bind_remote(self, remote: Any) -> None:
        """Size the loader's remote workers (`extensions.Remote`) too; none in use until the
        local ones cannot grow (called before the first epoch sends them anything)."""
        if self.tune_workers and self.enabled:
            self._remote = remote
            remote.use(self.remote)

    def schedule(self, steps: list[tuple[int, int] | tuple[int, int, int]]) -> None:
        """Test hook: instead of the rule, switch to ``workers`` (and ``prefetch``) once
        batch ``at`` of an epoch has been handed out, for each ``(at, workers[, prefetch])``."""
        self._schedule = [(s[0], s[1], s[2] if len(s) > 2 else None) for s in steps]  # type: ignore[misc]

    @property
    def inflight(self) -> int | None:
        """Requests in flight per worker, where the store lets them be turned (else None)."""
        return self._walk.inflight

    @property
    def raw(self) -> Any:
        """The torch iterator now running (tests kill its workers)."""
        return self._raw() if self._raw is not None else None

    # Per batch ---------------------------------------------------------------
    def observe(self, it: Any, wait: float, timing: Any) -> None:
        """One batch handed out after ``wait`` s; ``timing`` its worker's task timing."""
        if not self.enabled or self._it is None or it is not self._it():
            return
        if self._schedule:
            self._follow_schedule(it)
            return
        if self._skip > 0:
            self._skip -= 1
            if self._skip == 0:
                self._reset_window()
            return
        self._batches += 1
        self._wait += wait
        span = getattr(timing, "span", None)
        if getattr(timing, "remote", False):  # a remote worker's: its own task time
            self._remote_busy += timing.fetch_s + timing.prep_s
        elif span is not None:
            self._busy += span[3] - span[1]
            self._cpu += span[4]
            self._runq += span[6]
        elif timing is not None:
            self._busy += sum(timing)
        now = time.perf_counter()
        if self._walk.window_done(now - self._w0, self._wait, self._batches):
            self._close_window(now)

    def apply(self, it: Any) -> None:
        """Before ``it`` pulls its next batch: make a decided change (errors raise here)."""
        decision, self._pending = self._pending, None
        if decision is None or self._it is None or it is not self._it() or not can_restart(it):
            return
        loader = self._loader() if self._loader is not None else None
        raw = self.raw
        if loader is None or raw is None:
            return
        t0 = time.perf_counter()
        if self._store is not None and self.inflight:  # new workers take it: no probes
            self._store.set_inflight(self.inflight)
        new_raw = restart_pool(loader, it, decision.workers, decision.prefetch)
        self.restart_s += time.perf_counter() - t0
        self._raw = weakref.ref(new_raw)
        self.workers, self.prefetch = decision.workers, decision.prefetch
        self._skip = warmup_batches(decision.workers, decision.prefetch)
        self._reset_window()

    # Deciding ----------------------------------------------------------------
    def _follow_schedule(self, it: Any) -> None:
        at, workers, prefetch = self._schedule[0]
        if it.cursor.handed >= at:
            self._schedule.pop(0)
            d = Decision(workers, prefetch or self.prefetch, "schedule")
            self._made(*policy.scheduled(self._walk, d, self.workers, self.prefetch), None)

    def _close_window(self, now: float) -> None:
        wall = now - self._w0
        main_cpu = time.process_time() - self._c0
        w = Window(
            self._batches,
            wall,
            self._wait,
            self._busy,
            self._cpu,
            self._runq,
            self.workers,
            self.prefetch,
            self.remote,
            self._remote_busy,
        )
        budget = self._measure_budget(w, main_cpu)
        self._reset_window()
        queued = False
        if self._store is not None:  # the store's choice (probed by the workers) until set
            inflight = self._walk.inflight or self._store.inflight()
            self._walk = replace(self._walk, inflight=inflight)
            count = self._store.queued()  # requests that waited at the limit, so far
            queued, self._queued = count > self._queued, count
        d, walk = policy.step(
            self._walk,
            w,
            budget,
            now=now,
            tune_workers=self.tune_workers,
            tune_prefetch=self.tune_prefetch,
            queued=queued,
        )
        log.debug(
            "unstall autotune: window %s, budget %s, inflight %s: %s", w, budget, self.inflight, d
        )
        self._made(d, walk, w)

    def _measure_budget(self, w: Window, main_cpu: float) -> Budget:
        training = resources.training_cores(main_cpu, w.wall_s)
        o = self._share.claim(self.workers, w.wait > GROW_WAIT)
        left = resources.cores_left(self._cores, training, o.workers, o.ranks, o.waiting)
        per_worker = self._worker_bytes()
        memory = resources.memory_ceiling(self.workers, per_worker, resources.available_bytes())
        remote_cap = self._remote.workers if self._remote is not None else 0
        self._budget = Budget(left, memory, self._idle.idle_cores(), remote_cap)
        return self._budget

    def _worker_bytes(self) -> float | None:
        """Bytes per worker (proportional set size, plus its share of slots): read once per
        pool (reading ``smaps_rollup`` takes milliseconds per process)."""
        if self._per_worker is None or self._per_worker[0] is not self._raw:
            loader = self._loader() if self._loader is not None else None
            size = resources.worker_bytes(self.raw, loader, self.prefetch)
            self._per_worker = (self._raw, size)
        return self._per_worker[1]

    def _made(self, d: Decision | None, walk: policy.State, w: Window | None) -> None:
        """Make the walk's decision ``d`` (its new state ``walk``), decided on ``w``."""
        was, self._walk = self._walk.inflight, walk
        if d is None:
            return
        inflight = walk.inflight
        entry = {
            "t_s": round(time.perf_counter() - self._t0, 3),
            "epoch": getattr(self._cursor(), "epoch", None),
            "batch": getattr(self._cursor(), "handed", None),
            "num_workers": [self.workers, d.workers],
            "prefetch_factor": [self.prefetch, d.prefetch],
            "why": d.why,
        }
        if self._store is not None:
            entry["max_inflight"] = [was, inflight]
        remote = self.remote if d.remote is None or self._remote is None else d.remote
        if self._remote is not None:
            entry["remote_workers"] = [self.remote, remote]
        if w is not None:
            entry.update(
                batches_per_s=round(w.rate, 2),
                loop_wait=round(w.wait, 3),
                worker_busy=round(w.util, 3),
                core_wait=round(w.contention, 3),
                cores_left=self._budget.cores,
                idle_cores=None if self._budget.idle is None else round(self._budget.idle, 2),
                memory_workers=min(self._budget.memory_workers, 1 << 16),
            )
        self.history.append(entry)
        what = [
            f"{name} {old} -> {new}"
            for name, old, new in (
                ("num_workers", self.workers, d.workers),
                ("prefetch_factor", self.prefetch, d.prefetch),
                ("requests in flight", was, inflight),
                ("remote workers", self.remote, remote),
            )
            if old != new
        ]
        rates = (
            ""
            if w is None
            else f" ({w.rate:.1f} batches/s, loop waits {w.wait:.0%}, workers busy "
            f"{w.util:.0%}, waiting for a core {w.contention:.0%}, cores left "
            f"{self._budget.cores}, idle {self._budget.idle or 0:.1f})"
        )
        log.info("unstall autotune: %s: %s%s", ", ".join(what), d.why, rates)
        if inflight != was and inflight is not None and self._store is not None:
            self._store.set_inflight(inflight)  # workers take it before their next batch
        if d.workers != self.workers or d.prefetch != self.prefetch:
            self._pending = d
        elif remote != self.remote:  # no new pool: the remote side sends to that many now
            self._skip = warmup_batches(self.workers + remote, self.prefetch)
            self._reset_window()
        else:  # the same pool: the batches already asked for run at the old limit
            self._skip = self.workers * self.prefetch
            self._reset_window()
        if remote != self.remote:
            self._remote.use(remote)
            self.remote = remote

    def _cursor(self) -> Any:
        it = self._it() if self._it is not None else None
        return it.cursor if it is not None else None

    def _reset_window(self) -> None:
        self._w0, self._c0 = time.perf_counter(), time.process_time()
        self._batches = 0
        self._wait = self._busy = self._cpu = self._runq = self._remote_busy = 0.0

    # Reporting ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """``stats()["autotune"]``: what is tuned, the pool now, every change and why."""
        return {
            "tuning": [k for k, on in self._tuned() if on],
            "enabled": self.enabled,
            "num_workers": self.workers,
            "prefetch_factor": self.prefetch,
            "max_inflight": self.inflight,
            "remote_workers": self.remote if self._remote is not None else None,
            "changes": len(self.history),
            "restart_s": round(self.restart_s, 4),
            "cores": self._cores,
            "budget": {
                "cores": self._budget.cores,
                "memory_workers": min(self._budget.memory_workers, 1 << 16),
            },
            "history": list(self.history),
            "pid": os.getpid(),
        }

    def _tuned(self) -> tuple[tuple[str, bool], ...]:
        on = (self.tune_workers, self.tune_prefetch, self._store is not None)
        return tuple(zip(("num_workers", "prefetch_factor", "max_inflight"), on, strict=True))

    def close(self) -> None:
        """Leave the node's share file."""
        self._share.leave()
