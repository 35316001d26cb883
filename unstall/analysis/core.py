"""Analyse a workload: the differential runs, the rates G/P/F, stall shares, the bottleneck.

Stall shares are of the cold run's wall time (DS-Analyzer's definition): prep
stall = T_cached - T_synthetic, fetch stall = T_cold - T_cached, taken on the
timed waits of each step (`stall_shares`). The bottleneck
is what the runs show, not what the rates suggest: compute when the cold run
stalls less than ``COMPUTE_BOUND`` of its time, else the larger stall.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from unstall.analysis.model import (
    Config,
    Rates,
    fetch_seconds_per_batch,
    prep_capacity,
)
from unstall.analysis.probe import StorageProbe, probe_storage
from unstall.analysis.runs import (
    Run,
    Workload,
    evict,
    fetch_run,
    filled_cache,
    loader_run,
    step_indices,
    synthetic_run,
)

#: Below this share of stall in the cold run the job is compute-bound.
COMPUTE_BOUND = 0.10
#: Cores used by other processes below this are noise, not another job.
OTHER_CORES = 0.25
RUN_KINDS = ("synthetic", "cached", "cold")


@dataclass
class Analysis:
    """Everything measured and derived; `unstall.analysis.report` turns it into outputs."""

    workload: str
    runs: dict[str, Run]
    rates: Rates
    probe: StorageProbe | None
    num_workers: int
    batch_size: int
    num_samples: int
    split: bool
    cached_how: str
    stall: dict[str, float]
    bottleneck: str
    fetch_rate: float
    notes: list[str] = field(default_factory=list)
    cached_hit_rate: float | None = None
    #: rates that were not measured, with the reason: never guessed, never infinite
    unknown: dict[str, str] = field(default_factory=dict)
    #: more for the report as it is (script mode: loaders, oversubscription, remedies)
    extra: dict[str, Any] = field(default_factory=dict)
    #: the measured samples/s of the job as it is (default: the cold run's)
    measured: float | None = None
    #: other processes kept cores busy while the job was measured
    shared: bool = False

    @property
    def base_config(self) -> Config:
        inflight = self.probe.inflight if self.probe is not None else 1
        return Config(
            workers=self.num_workers,
            batch_size=self.batch_size,
            inflight=inflight,
            prefetch=inflight > 1 and inflight != self.batch_size,
        )

    @property
    def prep_rate(self) -> float | None:
        """Samples/s the workers used can prepare on the cores they have (None: unknown)."""
        if "prep" in self.unknown:
            return None
        return prep_capacity(self.rates, self.base_config)

    @property
    def measured_rate(self) -> float:
        return self.measured if self.measured is not None else self.runs["cold"].samples_per_s

    @property
    def prep_rate_per_worker(self) -> float | None:
        return 1.0 / self.rates.prep_cpu_s if self.rates.prep_cpu_s > 0 else None


def cores_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def analyze_workload(
    work: Workload,
    *,
    warmup: int = 10,
    steps: int = 200,
    progress: Callable[[str], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> Analysis:
    """Run the differential measurement on ``work`` and derive rates, stalls and bottleneck."""
    per_epoch = len(work.dataset) // work.batch_size
    if per_epoch < 2:
        raise ValueError(
            f"dataset of {len(work.dataset)} samples has fewer than 2 batches of "
            f"{work.batch_size}: use a smaller batch size"
        )
    # each run also skips its workers' start-up burst (`steady`): the epoch must hold it,
    # and the cache and the eviction cover it
    burst = work.num_workers * int(work.loader_kwargs.get("prefetch_factor") or 2)
    reserve = burst + (2 if work.split else 0)  # + batches kept for the storage probe
    if warmup + steps + reserve > per_epoch:
        steps = max(1, per_epoch - warmup - reserve)
        warmup = min(warmup, max(0, per_epoch - steps - reserve))
    say = progress or (lambda _msg: None)
    indices = step_indices(work, warmup + burst + steps)
    notes: list[str] = []
    runs: dict[str, Run] = {}
    probe = None
    if work.split:
        spare = step_indices(work, warmup + steps + reserve)[len(indices) :]
        say("probing storage")
        probe = probe_storage(work.dataset, spare, work.batch_size)
    say("synthetic run (the model alone)")
    runs["synthetic"] = synthetic_run(work, warmup, steps, on_step=on_step)
    hit = None
    if work.split:
        say("cached run (the steps' samples in unstall's cache)")
        assert probe is not None
        ahead = step_indices(work, warmup + burst + steps + 2 * work.num_workers + 2)  # + ahead
        with filled_cache(work.dataset, ahead, probe.sample_bytes) as cache:
            runs["cached"] = loader_run("cached", work, warmup, steps, cache=cache, on_step=on_step)
        c = runs["cached"].stats.get("cache", {})
        hit = c.get("hits", 0) / max(1, c.get("hits", 0) + c.get("misses", 0))
        cached_how = "unstall's cache, filled with exactly the steps' samples before timing"
        say("fetch-only run (workers fetch, nothing else)")
        evict(work.dataset, indices)
        runs["fetch"] = fetch_run(work, warmup, steps)
        evicted = evict(work.dataset, indices)
        say("cold run (page cache evicted, no cache)")
        runs["cold"] = loader_run("cold", work, warmup, steps, on_step=on_step)
    else:
        evicted = evict(work.dataset, indices)
        say("cold run (first pass over the steps)")
        runs["cold"] = loader_run("cold", work, warmup, steps, on_step=on_step)
        say("cached run (same steps again: the page cache holds what the cold run read)")
        runs["cached"] = loader_run("cached", work, warmup, steps, on_step=on_step)
        cached_how = "a second pass over the same steps (the page cache holds what was read)"
        notes.append(
            "the dataset does not separate fetching from preparing: each worker's time per "
            "sample is split into its CPU time (prepare) and the rest (waiting on I/O: fetch)"
        )
    if not evicted:
        notes.append("storage is not local files: the cold run reads it as it is (no eviction)")
    rates, fetch_rate = derive_rates(work, runs, probe)
    stall = stall_shares(runs, rates.ingestion)
    unknown: dict[str, str] = {}
    if not work.split:
        stall = split_by_worker_time(stall, rates)
        if not math.isfinite(fetch_rate):
            unknown["fetch"] = "no I/O wait seen: the workers were computing the whole time"
    prep_rate = prep_capacity(rates, Config(work.num_workers, work.batch_size))
    return Analysis(
        workload=work.name,
        runs=runs,
        rates=rates,
        probe=probe,
        num_workers=work.num_workers,
        batch_size=work.batch_size,
        num_samples=len(work.dataset),
        split=work.split,
        cached_how=cached_how,
        stall=stall,
        bottleneck=bottleneck_of(stall, prep_rate, fetch_rate),
        fetch_rate=fetch_rate if math.isfinite(fetch_rate) else 0.0,
        notes=notes,
        cached_hit_rate=hit,
        unknown=unknown,
        shared=runs["cold"].other_cores() >= OTHER_CORES,
    )


def derive_rates(
    work: Workload, runs: dict[str, Run], probe: StorageProbe | None
) -> tuple[Rates, float]:
    """(the model's rates, the measured fetch rate) from the runs and the storage probe."""
    # the model alone: its median step, bursts aside; the model's own steps inside the real
    # runs are measurements of G too, and on a busy machine one run may catch a slow spell
    g = max(runs["synthetic"].steady_rate, runs["cached"].compute_rate, runs["cold"].compute_rate)
    cached, cold = runs["cached"], runs["cold"]
    cpu = sum(s[6] for s in cached.spans)
    n = sum(s[7] for s in cached.spans) or 1
    prep_cpu = cpu / n
    main_cpu = cached.stats.get("main_cpu_s", 0.0) / max(1, cached.stats.get("samples", 0))
    proc_cpu = cold.proc_cpu_s / cold.samples if cold.samples else 0.0
    others = cold.other_cores()  # cores other jobs took: the workers did not have them
    cores = max(0.5, cores_available() - (others if others >= OTHER_CORES else 0.0))
    if probe is not None:
        # storage as probed (one read, one batch read); the fetch-only run, which shares the
        # CPU with everything else on the machine, is its lower bound
        fetched = runs["fetch"].samples_per_s
        bandwidth = max(probe.bandwidth, fetched * probe.sample_bytes)
        rates = Rates(
            g,
            prep_cpu,
            cores,
            probe.sample_bytes,
            bandwidth,
            probe.latency_s,
            main_cpu,
            proc_cpu_s=proc_cpu,
        )
        config = Config(work.num_workers, work.batch_size, inflight=probe.inflight)
        ceiling = min(
            bandwidth / probe.sample_bytes,
            max(1, work.num_workers) * work.batch_size / fetch_seconds_per_batch(rates, config, 0),
        )
        return rates, max(ceiling, fetched)
    # plain dataset: per sample, a worker's wall time minus its CPU and its time waiting for a
    # core is waiting on I/O
    n = max(1, sum(s[7] for s in cold.spans))
    wall = sum(s[5] - s[3] for s in cold.spans)
    runq = sum(s[8] for s in cold.spans if len(s) > 8)
    io = max(0.0, wall - sum(s[6] for s in cold.spans) - runq) / n
    prep_cpu = sum(s[6] for s in cold.spans) / n or prep_cpu
    if io <= 0.05 * (prep_cpu + runq / n + io):
        io = 0.0
    fetch_rate = max(1, work.num_workers) / io if io > 0 else float("inf")
    rates = Rates(g, prep_cpu, cores, 1.0, 1e12, io, main_cpu, proc_cpu_s=proc_cpu)
    return rates, fetch_rate


def stall_shares(runs: dict[str, Run], ingestion: float) -> dict[str, float]:
    """Compute, prep stall and fetch stall as fractions of the cold run's wall time.

    They follow from the measured rates: compute = measured / G, the rest is stall. The
    stall is split by the differential runs' waits (the model's own jitter does not blur
    them): prep = the cached run's wait per sample, fetch = the cold run's beyond it.
    """
    cached, cold = runs["cached"], runs["cold"]
    if cold.samples_per_s <= 0 or ingestion <= 0:
        return {"compute": 1.0, "prep": 0.0, "fetch": 0.0}
    compute = min(1.0, cold.samples_per_s / ingestion)
    stall = 1.0 - compute
    w_cached = cached.wait_s / cached.samples if cached.samples else 0.0
    w_cold = cold.wait_s / cold.samples
    prep_part = min(w_cached, w_cold) / w_cold if w_cold > 0 else 1.0
    return {
        "compute": round(compute, 4),
        "prep": round(stall * prep_part, 4),
        "fetch": round(stall * (1.0 - prep_part), 4),
    }


def split_by_worker_time(stall: dict[str, float], rates: Rates) -> dict[str, float]:
    """For a dataset that does not separate fetching from preparing: a warm re-run does not
    remove its I/O waits (nothing is fetched apart), so the stall is shared out in the
    proportion of the workers' time per sample: CPU time (prepare) and the rest (fetch)."""
    total = stall["prep"] + stall["fetch"]
    io, cpu = rates.latency_s, rates.prep_cpu_s  # (waiting for a core counts as prepare)
    fetch = total * io / (io + cpu) if io + cpu > 0 else 0.0
    return {"compute": stall["compute"], "prep": round(total - fetch, 4), "fetch": round(fetch, 4)}


def bottleneck_of(stall: dict[str, float], prep_rate: float, fetch_rate: float) -> str:
    """Compute-bound when the cold run hardly stalls; else the larger stall (the shares are
    what was measured; the rates only break an exact tie)."""
    prep, fetch = stall["prep"], stall["fetch"]
    if prep + fetch < COMPUTE_BOUND:
        return "compute"
    if prep != fetch:
        return "prep" if prep > fetch else "fetch"
    return "prep" if prep_rate <= fetch_rate else "fetch"


__all__ = ["Analysis", "analyze_workload", "bottleneck_of", "stall_shares"]
