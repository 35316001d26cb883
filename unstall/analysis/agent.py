"""Inside a script run by ``unstall analyze -- python train.py``: measure one run, then stop it.

Started by the launcher when ``$UNSTALL_ANALYZE_MODE`` is set. The first loader the
script makes is watched through the loader's observer hook: each batch handed out
is timed (the wait for it, and the training step from the hand-out to the next
request). After warm-up + the measured steps the results go to
``$UNSTALL_ANALYZE_OUT`` and the script is stopped with `SystemExit`, so its
loaders' workers and shared memory are released as at any normal exit. Modes:
``synthetic`` (the first batch handed out again and again), ``cold`` (the steps'
files evicted from the page cache first, when the dataset names its files) and
``cached`` (run right after the cold one: the page cache holds what it read).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import time
from typing import Any

from unstall.loader import hooks

MODES = ("synthetic", "cold", "cached")


class Agent:
    """Times one loader's batches; writes the results and stops the script when done."""

    def __init__(self, mode: str, warmup: int, steps: int, out: str):
        self.mode, self.warmup, self.steps, self.out = mode, warmup, steps, out
        self.loader: Any = None
        self.handed: list[tuple[float, float, int]] = []  # (hand-out time, wait, samples)
        self.written = False

    # hooks.Observer ------------------------------------------------------------
    def created(self, loader: Any) -> None:
        if self.loader is not None:
            return
        self.loader = loader
        if self.mode == "synthetic":
            loader.__class__ = _repeating(type(loader), self)
        elif self.mode == "cold":
            _evict_steps(loader, self.warmup + self.steps)

    def batch(self, loader: Any, wait_s: float) -> None:
        if loader is self.loader:
            self.record(wait_s, _samples_of(loader))

    def finished(self, loader: Any) -> None:
        pass

    # ---------------------------------------------------------------------------
    def record(self, wait_s: float, samples: int) -> None:
        self.handed.append((time.perf_counter(), wait_s, samples))
        if len(self.handed) >= self.warmup + self.steps + 1:
            self.write()
            raise SystemExit(0)  # the script ends as at a normal exit: workers and shm freed

    def write(self) -> None:
        if self.written or self.loader is None:
            return
        self.written = True
        measured = self.handed[self.warmup :]
        steps = []  # per step: the wait for its batch, then the model until the next request
        for (t0, wait, n), (t1, next_wait, _) in itertools.pairwise(measured):
            steps.append((wait, t1 - next_wait - t0, n))
        stats = self.loader.stats() if self.mode != "synthetic" else {}
        start = measured[0][0] - measured[0][1] if measured else 0.0
        doc = {
            "mode": self.mode,
            "pid": os.getpid(),
            "rank": int(os.environ.get("RANK", "0")),
            "steps": steps,
            "start": start,
            "num_workers": getattr(self.loader, "num_workers", 0),
            "batch_size": getattr(self.loader, "batch_size", None),
            "dataset": type(getattr(self.loader, "dataset", None)).__name__,
            "timeline": [s for s in stats.pop("timeline", []) if s[0] >= start],
            "stats": {k: v for k, v in stats.items() if k != "per_epoch"},
        }
        path = os.path.join(self.out, f"{self.mode}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)


def _samples_of(loader: Any) -> int:
    size = getattr(loader, "batch_size", None)
    return int(size) if size else 1


def _repeating(cls: type, agent: Agent) -> type:
    """``cls`` whose iteration hands out its first batch again and again (the synthetic run)."""

    class Synthetic(cls):  # type: ignore[misc,valid-type]
        def __iter__(self) -> Any:
            it = super().__iter__()
            batch = next(iter(it))
            del it  # workers stop: from here on the model alone

            def again() -> Any:
                while True:
                    t0 = time.perf_counter()
                    agent.record(time.perf_counter() - t0, _samples_of(self))
                    yield batch

            return again()

    Synthetic.__name__ = cls.__name__
    return Synthetic


def _evict_steps(loader: Any, batches: int) -> None:
    """Drop the files the first ``batches`` batches read from the page cache, if it can tell."""
    from unstall.analysis.runs import evict

    order = getattr(loader, "order", None)
    if order is None:
        return
    indices: list[int] = []
    for b, batch in enumerate(order.batches(getattr(loader, "epoch", 0))):
        if b >= batches:
            break
        indices.extend(batch)
    evict(loader.dataset, indices)


_agent: Agent | None = None


def install() -> None:
    """Watch this process's first loader per ``$UNSTALL_ANALYZE_*`` (called at start-up)."""
    global _agent
    mode = os.environ.get("UNSTALL_ANALYZE_MODE", "")
    if _agent is not None or mode not in MODES:
        return
    _agent = Agent(
        mode,
        int(os.environ.get("UNSTALL_ANALYZE_WARMUP", "10")),
        int(os.environ.get("UNSTALL_ANALYZE_STEPS", "200")),
        os.environ["UNSTALL_ANALYZE_OUT"],
    )
    hooks.add_observer(_agent)
    atexit.register(_agent.write)  # a script that ends before the steps are done
