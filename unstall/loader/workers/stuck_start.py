"""A worker stuck at start (issue 46): restart the epoch's pool at the same batch.

A worker forked while another thread of the parent held a lock (gloo threads, queue feeder
threads) can block before it runs a line of its own: alive, no CPU, no batch, while the loop
waits for a batch that torch gave it. The watchdog (`unstall.loader.workers.watchdog`) calls `check`
between its reads; once the batch waited for is such a worker's `START_S` seconds after it
started, it stops the pool and raises `StuckAtStart` out of torch's wait. The
epoch's iterator (`unstall.loader.workers.iterate`) catches it and calls `StuckAtStart.restart`:
`DataLoader.start_epoch` with ``continues=`` (the resume mechanism the autotuner's pool
change uses) continues the epoch from its next batch on a new pool; the batches the old
pool had made are made again, with ``seed=`` from the same draws: none lost or repeated.
One log line says so. At most `RESTARTS` times an epoch; then the watchdog's bound stands.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from unstall.loader.workers import torch_iter

#: A worker this old [s] that made no batch and used under `START_CPU_S` is stuck at start.
START_S = 15.0
#: CPU seconds under which a worker that made no batch has not really started.
START_CPU_S = 0.05
#: Restarts of an epoch's pool for workers stuck at start; past them the bound stands.
RESTARTS = 2

log = logging.getLogger("unstall")

#: Each epoch iterator's restarts so far.
_restarts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


class StuckAtStart(Exception):  # not an error: the epoch goes on
    """A worker of the epoch's pool is stuck at start; the pool is stopped already."""

    def __init__(self, loader: Any, worker: int, pid: int, age: float, cpu: float):
        super().__init__(f"worker {worker} (pid {pid}) stuck at start")
        self.loader, self.worker, self.pid, self.age, self.cpu = loader, worker, pid, age, cpu

    def restart(self, epoch_iter: Any) -> None:
        """Continue ``epoch_iter``'s epoch from its next batch on a new pool (one log line)."""
        log.warning(
            "unstall: worker %d (pid %d) stuck at start (%.0f s, cpu %.2f s, no batch): restarting "
            "the workers at batch %d of epoch %d (restart %d of at most %d)",
            self.worker,
            self.pid,
            self.age,
            self.cpu,
            epoch_iter.pulled,
            epoch_iter.cursor.epoch,
            _restarts.get(epoch_iter, 0),
            RESTARTS,
        )
        self.loader.start_epoch(continues=epoch_iter)


def check(
    loader: Any, it: Any, made: set[int], proc: Callable[..., Any], stop: Callable[[Any], None]
) -> None:
    """Stop ``it``'s workers (``stop``) and raise `StuckAtStart` if the batch torch's iterator
    ``it`` waits for is a worker's that is stuck at start (``made``: the workers a batch came
    from; ``proc``: the watchdog's /proc reader) and ``loader``'s epoch may still restart its
    pool (counted here). Raised, never bound to a name: no cycle keeps the loader alive."""
    info = torch_iter.task_info(it).get(torch_iter.waiting_for(it), ())  # type: ignore[arg-type]
    if len(info) != 1 or info[0] in made:
        return
    pid = torch_iter.workers(it)[info[0]].pid
    letter, cpu, age = proc(pid, with_age=True)
    if letter in (None, "Z", "X") or cpu >= START_CPU_S or age < START_S:
        return
    current = getattr(loader, "_current", None)
    epoch_iter = current() if current is not None else None
    if getattr(epoch_iter, "workers_iter", None) is not it:
        return  # no epoch to continue here (e.g. an iterable dataset's)
    done = _restarts.get(epoch_iter, 0)
    if done >= RESTARTS:
        return
    _restarts[epoch_iter] = done + 1
    stop(it)
    raise StuckAtStart(loader, info[0], pid, age, cpu)
