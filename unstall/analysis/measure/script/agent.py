"""Inside a script run by ``unstall analyze -- python train.py``: measure one run, then stop it.

Started by the launcher when ``$UNSTALL_ANALYZE_MODE`` is set. Every loader the
script makes is watched through the loader's observer hook (frameworks make,
replace and wrap loaders: the one measured is the one that carries the training
loop, known only when its batches keep coming). Each batch handed out is timed
(the wait for it, and the training step until the next request), with this
process's CPU and the machine's busy time. A loader's window is its steady state
(`unstall.analysis.measure.steady`: each iterator's start-up burst skipped); the first
loader whose window is long enough in steps *and* seconds is measured. Then the
results go to ``$UNSTALL_ANALYZE_OUT`` and the script is stopped with `SystemExit`,
so its workers and shared memory are released as at any normal exit. Under DDP the
first rank to finish names the batch at which every rank stops (a file in the
output folder), so no rank is left waiting in a collective.

Modes: ``synthetic`` (each loader hands out its first batch again and again, as
many times per epoch as it has batches), ``cold`` (the first batches' files
evicted from the page cache first, when the dataset names its files: unstall's datasets
through their store, a dataset that opens the files it lists all of them) and
``cached`` (run right after the cold one: the page cache holds what it read).

With ``$UNSTALL_ANALYZE_THEN=synthetic`` the cold run goes on, once its window is written,
as the synthetic one in the same process: the epoch running keeps its length, each batch
of it (and of each epoch after) the loader's last real one again, so the model alone is
timed without a second start of the script (its imports, its dataset, its workers).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from unstall import machine
from unstall.analysis.measure.lean import job_samples, lean_probe
from unstall.analysis.measure.machine import cuda_usable
from unstall.analysis.measure.procstat import snapshot, wait_idle, workers_cpu
from unstall.analysis.measure.script import files, hang
from unstall.analysis.measure.script.detection import detection_probe
from unstall.analysis.measure.script.files import evict_first, evict_listed, prefill
from unstall.analysis.measure.script.loaders import loader_rows
from unstall.analysis.measure.script.ranks import claim_stop, read_stop
from unstall.analysis.measure.script.runner import SYNTHETIC_SHARE
from unstall.analysis.measure.script.samples import loader_sample_cache_facts
from unstall.analysis.measure.steady import (
    Handout,
    Window,
    burst_depth,
    enough,
    loader_worker_pids,
    steady_window,
)
from unstall.loader import hooks, schedclock

MODES = ("synthetic", "cold", "cached")


@dataclass
class Watch:
    """One loader of the script and the batches it handed out."""

    loader: Any
    index: int
    burst: int
    handed: list[Handout] = field(default_factory=list)
    segs: dict[int, int] = field(default_factory=dict)  # segment per iterator
    last: Any = None  # the current iterator's position list, held (its id is never reused)
    replaced: int | None = None  # the segment of the running epoch's batches after a switch
    batch: Any = None  # the synthetic run's one real batch, handed out again and again
    n: int | None = None  # its samples (None: no batch held yet)

    def seg_of(self) -> int:
        """The segment (one per iterator) of the batch just handed out: a new ``iter()``
        makes a new position list; identity, not ``id()``, which a freed list's successor
        may share."""
        position = getattr(getattr(self.loader, "position", None), "running", None)
        if position is not self.last or not self.segs:
            self.last = position
            self.segs[len(self.segs)] = len(self.segs)
        return len(self.segs) - 1


class Agent:
    """Times every loader's batches; writes the measured one's and stops the script."""

    def __init__(
        self,
        mode: str,
        warmup: int,
        min_steps: int,
        min_s: float,
        max_s: float,
        out: str,
        then: str = "",
    ):
        self.mode, self.warmup, self.out = mode, warmup, out
        self.then = then if then in MODES else ""  # measured next, in this process
        self.after = ""  # the mode measured before this one in this process
        self.settled_s = 0.0  # waited at the switch for the workers' batches in hand
        self.min_steps, self.min_s, self.max_s = min_steps, min_s, max_s
        self.watches: dict[int, Watch] = {}
        self.started = time.perf_counter()
        self.written = False
        self.stop_at: tuple[int, int] | None = None  # (loader index, batches) from any rank
        self._stop_file = os.path.join(out, f"stop-{mode}.json")
        self._fetching = False  # the synthetic run taking its one real batch
        self.evicted = False  # the cold run dropped some files from the page cache
        self.prefilled: dict[str, Any] | None = None  # the verification's file cache, filled

    # hooks.Observer ------------------------------------------------------------
    def created(self, loader: Any) -> None:
        if id(loader) in self.watches:
            return
        watch = Watch(loader, len(self.watches), burst_depth(loader))
        self.watches[id(loader)] = watch
        batches = self.warmup + 4 * (watch.burst + self.min_steps)
        if self.mode == "cold" and evict_first(loader, batches):
            self.evicted = True
        elif self.mode == "cold" and evict_listed(getattr(loader, "dataset", None)):
            self.evicted = True  # a dataset that opens the files it lists (issue 40)
        if self.mode == "cold":  # under a cache setting (the verification): as epoch 2 finds it
            self.prefilled = prefill(loader) or self.prefilled

    def batch(self, loader: Any, wait_s: float, samples: int | None = None) -> None:
        watch = self.watches.get(id(loader))
        if watch is not None and not self._fetching:
            if samples is None:  # counted from the batch by the loader; else its batch size
                samples = int(getattr(loader, "batch_size", None) or 1)
            self.record(watch, wait_s, samples)

    def finished(self, loader: Any) -> None:
        pass

    def iterate(self, loader: Any) -> Iterator[Any] | None:
        """The synthetic run's iteration: the loader's first batch, ``len(loader)`` times."""
        watch = self.watches.get(id(loader))
        if self.mode != "synthetic" or watch is None or self._fetching:
            return None
        try:
            length: int | None = len(loader)
        except TypeError:  # an iterable dataset without a length: as many as asked for
            length = None
        return _Sized(self._repeat(watch, length), length)

    def replaces_next(self, loader: Any) -> bool:
        """After the switch to synthetic: the running epoch's batches are handed out here."""
        switched = self.after != "" and self.mode == "synthetic"
        return switched and not self._fetching and id(loader) in self.watches

    def next_batch(self, loader: Any, pull: Any) -> Any:
        """The running epoch's next batch, after the switch: the loader's one real batch
        (pulled once, by ``pull``) again."""
        watch = self.watches[id(loader)]
        self._hold(watch, pull)
        if watch.replaced is None:
            watch.replaced = len(watch.segs)
            watch.segs[watch.replaced] = watch.replaced
        return self._again(watch, watch.replaced)

    # ---------------------------------------------------------------------------
    def _repeat(self, watch: Watch, length: int | None) -> Iterator[Any]:
        # a fresh iterator's first batch: its workers stop as it goes, the model alone after
        self._hold(watch, lambda: next(iter(watch.loader)))
        seg = len(watch.segs)
        watch.segs[seg] = seg
        for _ in range(length) if length is not None else itertools.count():
            yield self._again(watch, seg)

    def _hold(self, watch: Watch, pull: Any) -> None:
        """Take the loader's one real batch with ``pull`` (its handout not recorded), once."""
        if watch.n is not None:
            return
        self._fetching = True
        try:
            watch.batch = pull()
        finally:
            self._fetching = False
        watch.n = _batch_len(watch.batch)

    def _again(self, watch: Watch, seg: int) -> Any:
        """The held batch handed out once more, recorded in segment ``seg``."""
        watch.handed.append(_handout(0.0, watch.n or 0, seg))
        self._check(watch)
        return watch.batch

    def record(self, watch: Watch, wait_s: float, samples: int) -> None:
        watch.handed.append(_handout(wait_s, samples, watch.seg_of(), watch.loader))
        self._check(watch)

    def _check(self, watch: Watch) -> None:
        count = len(watch.handed)
        if self.stop_at is None and os.path.exists(self._stop_file):
            self.stop_at = read_stop(self._stop_file)
        if self.stop_at is not None:
            if self.stop_at[0] == watch.index and count >= self.stop_at[1]:
                self.finish(watch)
            return
        if count <= self._skips(watch)[0] + self.min_steps:
            return
        timed_out = time.perf_counter() - self.started > self.max_s
        if count % 4 and not timed_out:  # the window is looked at every few batches
            return
        if timed_out or enough(self.window(watch), min_steps=self.min_steps, min_s=self.least_s):
            self.stop_at = claim_stop(self._stop_file, watch.index, count + 1)
            if self.stop_at[0] == watch.index and count >= self.stop_at[1]:
                self.finish(watch)

    @property
    def least_s(self) -> float:
        """The window's least seconds: half for the model alone, whose steps vary least (no
        loading in them: a GPU's kernels, the simulated accelerator's sleeps)."""
        return self.min_s * (SYNTHETIC_SHARE if self.mode == "synthetic" else 1.0)

    def window(self, watch: Watch) -> Window:
        first, each = self._skips(watch)
        return steady_window(watch.handed, skip_first=first, skip_each=each)

    def _skips(self, watch: Watch) -> tuple[int, int]:
        """Batches skipped at the first iterator and at each after: the start-up burst (and
        the warm-up); after a switch only the warm-up: no worker works, the model is warm."""
        if self.after:
            return self.warmup, 0
        return watch.burst + self.warmup, watch.burst

    def finish(self, watch: Watch) -> None:
        self.write(watch)
        if self.then:
            self.settled_s = wait_idle(loader_worker_pids(watch.loader))  # batches in hand
            self._switch()
            return
        raise SystemExit(0)  # the script ends as at a normal exit: workers and shm freed

    def _switch(self) -> None:
        """The window written: measure the ``then`` mode from here on, as a run of its own
        would (its own window, stop batch and document), in the epoch already running."""
        self.after, self.mode, self.then = self.mode, self.then, ""
        self.written = False
        self.stop_at = None
        self._stop_file = os.path.join(self.out, f"stop-{self.mode}.json")
        self.started = time.perf_counter()
        for watch in self.watches.values():
            watch.handed, watch.segs, watch.last, watch.replaced = [], {}, None, None

    def write(self, watch: Watch | None = None) -> None:
        """The measured loader's window and every loader's summary, as JSON for the launcher."""
        if self.written or not self.watches:
            return
        self.written = True
        if watch is None and self.stop_at is not None:  # ended before the named batch
            watch = next((w for w in self.watches.values() if w.index == self.stop_at[0]), None)
        if watch is None:  # the script ended first: the loader with the most batches
            watch = max(self.watches.values(), key=lambda w: (len(w.handed), -w.index))
        window = self.window(watch)
        complete = enough(window, min_steps=self.min_steps, min_s=self.least_s)
        loader = watch.loader
        samples = job_samples(getattr(loader, "dataset", None))
        stats = loader.stats() if self.mode != "synthetic" else {}
        cold = self.mode == "cold"
        facts = loader_sample_cache_facts(loader) if cold else None
        timeline = stats.pop("timeline", [])
        doc = {
            "mode": self.mode,
            "after": self.after,
            "settled_s": round(self.settled_s, 3),
            "pid": os.getpid(),
            "rank": machine.rank(),
            "complete": complete,
            "evicted": self.evicted,
            "loader": watch.index,
            "steps": window.steps,
            "start": window.bounds[0][0] if window.bounds else 0.0,
            "window_s": round(window.wall_s, 6),
            "skipped": window.skipped,
            "iterators": window.iterators,
            "burst": watch.burst,
            "skip_each": self._skips(watch)[1],  # each iterator's after the first: 0 after a switch
            "batches": len(watch.handed),
            "main_cpu_s": window.main_cpu_s,
            "passthrough": bool(getattr(loader, "passthrough", False)),
            "workers_cpu_s": window.workers_cpu_s,
            "workers_runq_s": window.workers_runq_s,
            "loop_runq_s": window.loop_runq_s,
            "receive_cpu_s": window.receive_cpu_s,
            "machine_busy_s": window.machine_busy_s,
            "num_workers": getattr(loader, "num_workers", 0),
            "prefetch_factor": getattr(loader, "prefetch_factor", None),
            "pin_memory": bool(getattr(loader, "pin_memory", False)),
            "cuda": cuda_usable() if self.mode == "cold" else None,
            "batch_size": getattr(loader, "batch_size", None),
            "dataset": type(getattr(loader, "dataset", None)).__name__,
            "files": [path for path, _ in samples],
            "lean_probe": lean_probe(loader.dataset, samples) if self.mode == "cold" else None,
            "detection_probe": detection_probe(loader.dataset) if self.mode == "cold" else None,
            "file_cache": files.file_cache_facts(loader.dataset) if self.mode == "cold" else None,
            "sample_cache": facts,
            "prefilled": self.prefilled,
            "wire": _wire(watch) if self.mode == "synthetic" else None,
            "timeline": [s for s in timeline if window.covers(s[1])],
            "stats": {k: v for k, v in stats.items() if k != "per_epoch"},
            "epochs": [[e["samples"], e["wall_s"]] for e in stats.get("per_epoch", [])[:64]],
            "loaders": loader_rows(
                self.watches.values(),
                watch,
                check=cold and not machine.config_path(),  # the job as it is
                measured_facts=facts,
            ),
        }
        path = os.path.join(self.out, f"{self.mode}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)


class _Sized:
    """A generator with the epoch's length (frameworks ask ``len`` of what they iterate)."""

    def __init__(self, gen: Iterator[Any], length: int | None):
        self._gen, self._length = gen, length

    def __iter__(self) -> _Sized:
        return self

    def __next__(self) -> Any:
        return next(self._gen)

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("the loader's dataset has no length")
        return self._length


def _handout(wait_s: float, samples: int, seg: int, loader: Any = None) -> Handout:
    snap = snapshot()
    # the workers' processes from /proc: all their threads' CPU (the spans hold only the
    # preparing thread's), and for an iterable dataset's workers (no timed batches) all there is
    pids = loader_worker_pids(loader) if loader is not None else None
    meter = getattr(loader, "main_cpu", None)  # the loop thread's CPU in its __next__ so far
    w_cpu, w_runq = workers_cpu(pids) if pids else (0.0, 0.0)
    return Handout(
        time.perf_counter(),
        wait_s,
        samples,
        seg,
        snap.self_cpu_s,
        snap.machine_busy_s,
        w_cpu,
        w_runq,
        max(0.0, schedclock.runq_s()),  # on the loop's thread: the hook runs in its __next__
        meter.receive_s if meter is not None else 0.0,  # the batches' receive, waits aside
    )


def _wire(watch: Watch) -> dict[str, Any] | None:
    """The synthetic run's batch, as a remote worker would ship it (the remote remedy's
    transfer cost)."""
    from unstall.analysis.measure.wire import wire_probe

    return wire_probe(watch.batch) if watch.n is not None else None


def _batch_len(batch: Any) -> int:
    from unstall.loader.stats import batch_size_of

    return batch_size_of(batch)


_agent: Agent | None = None


def install() -> None:
    """Watch this process's loaders per ``$UNSTALL_ANALYZE_*`` (called at start-up)."""
    global _agent
    env = machine.analyze_env()
    if _agent is not None or env.mode not in MODES:
        return
    _agent = Agent(
        env.mode,
        warmup=env.warmup,
        min_steps=env.steps,
        min_s=env.min_s,
        max_s=env.max_s,
        out=env.out,
        then=env.then,
    )
    hooks.add_observer(_agent)
    hang.arm(_agent.out)  # a run past its time is asked where it is
    atexit.register(_agent.write)  # a script that ends before the window is complete
