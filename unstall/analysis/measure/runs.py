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
from dataclasses import dataclass, field
from typing import Any

import torch

from unstall.analysis.measure.procstat import machine_busy_s, workers_cpu
from unstall.analysis.measure.steady import burst_depth, loader_worker_pids
from unstall.analysis.measure.wire import wire_probe
from unstall.analysis.measure.workload import Workload
from unstall.loader import DataLoader


@dataclass
class Run:
    """One measured run [Unit: second]: the steps after warm-up only.

    ``spans``: the loader's per-batch spans inside the measured window
    (wait start, wait end, worker, start, fetch end, end, prepare CPU, samples).
    """

    kind: str
    samples: int
    wall_s: float
    wait_s: float
    compute_s: float
    steps: int
    start: float
    spans: list[tuple[float, ...]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    step_s: list[float] = field(default_factory=list)
    compute_steps: list[float] = field(default_factory=list)
    #: CPU seconds of the training process (all its threads) over the measured steps
    proc_cpu_s: float = 0.0
    #: CPU seconds the whole machine was busy over the measured steps (other jobs included)
    machine_busy_s: float = 0.0
    #: CPU seconds of the loader's worker processes (all threads) over the measured steps
    workers_cpu_s: float = 0.0

    def other_cores(self) -> float:
        """Cores other processes kept busy during the run: the machine's busy time less this
        process's and its workers' (their CPU per batch, from the spans)."""
        if self.wall_s <= 0 or not self.spans:
            return 0.0
        workers = self.workers_cpu_s or sum(s[6] for s in self.spans)
        return max(0.0, (self.machine_busy_s - self.proc_cpu_s - workers) / self.wall_s)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def compute_rate(self) -> float:
        """Samples/s of the model alone in this run: at its median time inside a step."""
        if not self.compute_steps or not self.samples:
            return 0.0
        median = sorted(self.compute_steps)[len(self.compute_steps) // 2]
        return self.samples / self.steps / median if median > 0 else 0.0

    @property
    def steady_rate(self) -> float:
        """Samples/s at the median step time: the rate without the machine's bursts."""
        if not self.step_s or not self.samples:
            return self.samples_per_s
        median = sorted(self.step_s)[len(self.step_s) // 2]
        return self.samples / self.steps / median if median > 0 else self.samples_per_s

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "steps": self.steps,
            "wall_s": round(self.wall_s, 4),
            "wait_s": round(self.wait_s, 4),
            "compute_s": round(self.compute_s, 4),
            "samples_per_s": round(self.samples_per_s, 2),
        }


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
