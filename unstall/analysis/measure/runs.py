"""The differential runs: one training loop over the same steps of the same known order.

``synthetic`` hands the model one real batch again and again (its own rate G);
``cached`` first puts exactly the samples those steps read into unstall's cache
(the order is known in advance), so nothing is fetched; ``cold`` evicts those
files from the page cache (``posix_fadvise(DONTNEED)``, no root) and runs
without the cache; ``fetch`` has the workers only fetch (no prepare, no model).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from unstall.analysis.measure.procstat import machine_busy_s, workers_cpu
from unstall.analysis.measure.result import Run
from unstall.analysis.measure.steady import burst_depth, loader_worker_pids
from unstall.analysis.measure.wire import wire_probe
from unstall.analysis.measure.workload import Workload
from unstall.loader import DataLoader


def train_loop(
    kind: str,
    batches: Iterator[Any],
    step: Callable[[Any], None],
    *,
    warmup: int,
    steps: int,
    on_step: Callable[[], None] | None = None,
    workers: Callable[[], list[int]] | None = None,
) -> Run:
    """Time ``steps`` steps after ``warmup``: per step the wait for data, then the model.

    ``workers``: the loader's worker processes, whose whole CPU (all threads) is read
    around the window, so other processes' use of the cores is told apart from ours.
    """
    for _ in range(warmup):
        batch = next(batches, None)
        if batch is None:
            raise RuntimeError(f"{kind} run: the data ended during warm-up ({warmup} steps)")
        step(batch)
    wait = compute = 0.0
    samples = done = 0
    step_s: list[float] = []
    compute_steps: list[float] = []
    pids = workers() if workers is not None else []
    w0 = workers_cpu(pids)[0] if pids else 0.0
    cpu0, busy0 = os.times(), machine_busy_s()
    start = time.perf_counter()
    t0 = start
    while done < steps:
        batch = next(batches, None)
        t1 = time.perf_counter()
        if batch is None:
            break
        step(batch)
        t2 = time.perf_counter()
        wait, compute = wait + t1 - t0, compute + t2 - t1
        step_s.append(t2 - t0)
        compute_steps.append(t2 - t1)
        samples += _batch_len(batch)
        done += 1
        t0 = t2
        if on_step is not None:
            on_step()
    cpu1 = os.times()
    return Run(
        kind,
        samples,
        t0 - start,
        wait,
        compute,
        done,
        start,
        step_s=step_s,
        compute_steps=compute_steps,
        proc_cpu_s=(cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        machine_busy_s=machine_busy_s() - busy0,
        workers_cpu_s=workers_cpu(pids)[0] - w0 if pids else 0.0,
    )


def synthetic_run(work: Workload, warmup: int, steps: int, **kw: Any) -> Run:
    """One real batch, on the device, handed to the model again and again: G."""
    loader = work.loader(num_workers=0, zero_copy=False)
    it = iter(loader)
    batch = next(it)
    del it
    wire = wire_probe(batch)  # what the batch would cost to ship from a remote worker
    if work.to_device is not None:
        batch = work.to_device(batch)

    def repeat() -> Iterator[Any]:
        while True:
            yield batch

    run = train_loop("synthetic", repeat(), work.step, warmup=warmup, steps=steps, **kw)
    if wire is not None:
        run.stats["wire"] = wire
    return run


def loader_run(
    kind: str, work: Workload, warmup: int, steps: int, *, cache: Any = None, **kw: Any
) -> Run:
    """The real loader over the known order; workers stopped and slots freed at the end."""
    loader = work.loader(cache=cache)
    it = iter(loader)
    try:
        batches = (work.to_device(b) for b in it) if work.to_device is not None else it
        # the workers' start-up burst is never timed: it runs at the model's speed
        warm = warmup + burst_depth(loader)
        pids = lambda: loader_worker_pids(loader)  # noqa: E731
        run = train_loop(kind, batches, work.step, warmup=warm, steps=steps, workers=pids, **kw)
        stats = loader.stats()
    finally:
        del it
        loader.close()
    run.spans = [s for s in stats.pop("timeline", []) if s[0] >= run.start]
    run.stats = stats
    return run


class FetchOnly(torch.utils.data.Dataset):
    """The dataset with preparation taken out: workers fetch raw bytes and hand back sizes."""

    def __init__(self, dataset: Any):
        self.inner = dataset
        self.store = getattr(dataset, "store", None)

    def __len__(self) -> int:
        return len(self.inner)

    def key(self, index: int) -> str:
        return self.inner.key(index)

    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        return self.inner.fetch(indices)

    def prefetch(self, indices: Sequence[int]) -> None:
        if hasattr(self.inner, "prefetch"):
            self.inner.prefetch(indices)

    def prepare(self, index: int, raw: bytes) -> int:
        return len(raw)

    def __getitem__(self, index: int) -> int:
        return self.prepare(index, self.fetch([index])[0])


def fetch_run(work: Workload, warmup: int, steps: int) -> Run:
    """Workers only fetch (no prepare, no model): the loader's fetch rate as configured."""
    unused = ("collate_fn", "device", "prep", "device_transform")  # nothing is prepared
    keep = {k: v for k, v in work.loader_kwargs.items() if k not in unused}
    loader = DataLoader(
        FetchOnly(work.dataset),
        batch_size=work.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=work.num_workers,
        seed=work.seed,
        collate_fn=torch.tensor,  # sizes only: the bytes stay in the workers
        cache=False,  # storage as it is: no default disk tier
        **keep,
    )
    it = iter(loader)
    try:
        warm = warmup + burst_depth(loader)  # as in the other runs: the burst is not timed
        return train_loop("fetch", it, _no_step, warmup=warm, steps=steps)
    finally:
        del it
        loader.close()


def _no_step(batch: Any) -> None:
    return None


def _batch_len(batch: Any) -> int:
    from unstall.loader.stats import batch_size_of

    return batch_size_of(batch)
