"""The differential measurement of a workload in this process: the storage probe, then
the synthetic, cached, fetch-only and cold runs over the same steps of the known order.

Only measuring happens here; the rates, stall shares and bottleneck are the rates
stage's (`unstall.analysis.rates.workload`).
"""

from __future__ import annotations

from collections.abc import Callable

from unstall.analysis.measure.lean import job_samples, lean_probe
from unstall.analysis.measure.machine import read_machine
from unstall.analysis.measure.probe import probe_storage
from unstall.analysis.measure.result import Measurement, Run
from unstall.analysis.measure.runs import fetch_run, loader_run, synthetic_run
from unstall.analysis.measure.storage import evict, filled_cache
from unstall.analysis.measure.workload import Workload, step_indices


def measure_workload(
    work: Workload,
    *,
    warmup: int = 10,
    steps: int = 200,
    progress: Callable[[str], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> Measurement:
    """Run ``work`` synthetic, cached and cold (and fetch-only when storage can be probed)."""
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
    return Measurement(
        workload=work.name,
        mode="workload",
        runs=runs,
        probe=probe,
        num_workers=work.num_workers,
        batch_size=work.batch_size,
        num_samples=len(work.dataset),
        machine=read_machine(),
        split=work.split,
        cached_how=cached_how,
        notes=notes,
        cached_hit_rate=hit,
        extra={
            "wire": runs["synthetic"].stats.get("wire"),
            "lean_probe": lean_probe(work.dataset, job_samples(work.dataset)),
        },
    )
