"""What a loader worker spends per batch besides its timed task: the hand-off, on the real loader.

A worker's timed task (its span in the timeline: `unstall.loader.fetch.Timing`) covers
loading and collating a batch. Around it the worker also takes the task from its index
queue, seeds the batch's generators, drops the batch's samples once collated, and its queue's
feeder thread sends the batch on. Where a sample costs little (a cache hit, 0.5 ms a 320 KB
clip) that is no longer small: on the audio example it was 1.2 ms a batch of 32, 7-9 % of
the worker's CPU, that neither the price nor the spans counted, and the verified rate came
out 10-16 % under the price.

`handoff_seconds` times it as it happens: `unstall.DataLoader` (the loader
``unstall run --config`` applies) with one worker, over the job's own samples at the job's
batch size and collate, the worker's CPU over all its threads (``/proc``) less its tasks'
CPU, per sample. Its loader is made and iterated unseen by the process's observers
(`unstall.loader.hooks.unobserved`): the analyzer's own measurement, not one of the job's
loaders. It needs the timeline (``$UNSTALL_TIMELINE``, set in `unstall analyze`'s runs).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from unstall import machine
from unstall.analysis.measure.procstat import threads_on_cpu_s, wait_idle
from unstall.loader import DataLoader, hooks

#: Batches an epoch: the first epoch untimed (the worker's start and one-offs), then
#: `EPOCHS` timed, the median taken.
BATCHES = 8
EPOCHS = 3


class _Samples:
    """``n`` samples, each ``make(k)`` for the ``k``-th held one, in turn."""

    def __init__(self, make: Callable[[int], Any], held: int, n: int):
        self.make, self.held, self.n = make, held, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.make(index % self.held)


def handoff_seconds(
    make: Callable[[int], Any],
    held: int,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> float | None:
    """CPU seconds per sample a loader worker spends outside its timed tasks, batching
    ``make(k)`` for ``k`` below ``held`` by ``batch_size`` with ``collate_fn`` (None:
    torch's default); None where it cannot be timed (no timeline, no worker process, or the
    loader failed: the price then goes without it, the measurement on)."""
    if not machine.timeline() or held < 1 or batch_size < 1:
        return None
    try:
        return _timed(make, held, batch_size, collate_fn)
    except Exception:  # a dataset's samples this loader cannot batch: not the job's failure
        return None


def _timed(
    make: Callable[[int], Any],
    held: int,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None,
) -> float | None:
    n = batch_size * BATCHES
    with hooks.unobserved():
        loader = DataLoader(
            _Samples(make, held, n),
            batch_size=batch_size,
            num_workers=1,
            collate_fn=collate_fn,
            persistent_workers=True,
        )
        try:
            pids: list[int] = []
            for _ in loader:  # the first epoch: the worker's start and one-offs, untimed
                pids = pids or loader.worker_pids()
            if not pids:
                return None
            per = [_timed_epoch(loader, pids[0]) for _ in range(EPOCHS)]
        finally:
            loader.close()  # its worker ended here, not whenever the loader is collected
    got = [p for p in per if p is not None]
    return statistics.median(got) if got else None


def _timed_epoch(loader: Any, pid: int) -> float | None:
    """One epoch of ``loader``: its worker ``pid``'s CPU outside its tasks, per sample."""
    wait_idle([pid])
    c0, spans0 = threads_on_cpu_s(pid), len(loader.stats().get("timeline") or [])
    for _ in loader:  # every task sent, taken and handed over
        pass
    wait_idle([pid])  # the last batch's samples dropped after it was sent
    c1 = threads_on_cpu_s(pid)
    spans = (loader.stats().get("timeline") or [])[spans0:]
    samples = sum(s[7] for s in spans if len(s) >= 8)
    if c0 is None or c1 is None or not samples:
        return None
    return max(0.0, (c1 - c0) - sum(s[6] for s in spans)) / samples
