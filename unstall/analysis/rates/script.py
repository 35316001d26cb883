"""Rates of an unchanged script from its measured windows (``unstall analyze -- CMD``).

Reads the measure stage's documents (`unstall.analysis.measure.script`), one per run.

Per sample, each worker's time on a batch is split three ways from the OS's own
clocks: CPU (prepare), runnable but waiting for a core (oversubscription: more busy
threads than cores), and the rest (waiting on I/O: fetch). The training process's CPU
and the machine's busy time over the same window say how many cores the workers
really had. Stall shares follow from the measured rate (compute share = measured / G);
what was not measured is unknown (None, with the reason), never infinite.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from unstall.analysis.measure.result import Measurement
from unstall.analysis.rates.result import LEAST_CORES, NO_IO_WAIT, Derived, Rates

#: I/O wait below this share of a worker's time per sample is no evidence of a fetch limit.
IO_FLOOR = 0.05
#: Cores used by other processes below this are noise, not another job.
OTHER_FLOOR = 0.25
#: Below this share of stall the job is compute-bound.
COMPUTE_BOUND = 0.10
#: The model's rate in the job below this fraction of its rate alone: it was slowed.
MODEL_SLOWED = 0.85


@dataclass
class WindowFigures:
    """One run's steady window, per sample [Unit: second, samples/s, cores]."""

    samples: int
    wall_s: float
    wait_s: float
    compute_s: float
    steps: int
    rate: float
    steady_rate: float
    compute_rate: float
    worker_cpu_s: float | None = None
    worker_runq_s: float | None = None
    worker_io_s: float | None = None
    proc_cpu_s: float = 0.0
    receive_cpu_s: float = 0.0
    loop_runq_s: float = 0.0
    other_cores: float = 0.0
    spans: int = 0
    notes: list[str] = field(default_factory=list)


def figures(doc: dict[str, Any]) -> WindowFigures:
    """The window of one run's document (written by the in-process agent)."""
    steps = doc["steps"]
    samples = sum(s[2] for s in steps)
    wait = sum(s[0] for s in steps)
    compute = sum(s[1] for s in steps)
    wall = wait + compute
    per_step = samples / len(steps) if steps else 0
    med_step = statistics.median(s[0] + s[1] for s in steps) if steps else 0.0
    med_compute = statistics.median(s[1] for s in steps) if steps else 0.0
    out = WindowFigures(
        samples=samples,
        wall_s=wall,
        wait_s=wait,
        compute_s=compute,
        steps=len(steps),
        rate=samples / wall if wall > 0 else 0.0,
        steady_rate=per_step / med_step if med_step > 0 else 0.0,
        compute_rate=per_step / med_compute if med_compute > 0 else 0.0,
    )
    spans = [s for s in doc.get("timeline", []) if len(s) >= 8]
    n = sum(s[7] for s in spans)
    if n:
        cpu = sum(s[6] for s in spans)
        runq = sum(s[8] for s in spans if len(s) > 8)
        task_wall = sum(s[5] - s[3] for s in spans)
        out.worker_cpu_s = cpu / n
        out.worker_runq_s = runq / n
        out.worker_io_s = max(0.0, task_wall - cpu - runq) / n
        out.spans = len(spans)
    elif samples and doc.get("workers_cpu_s", 0.0) > 0 and doc.get("passthrough"):
        # an iterable dataset's workers, from /proc over the window: a worker's time that is
        # neither CPU nor waiting for a core is I/O (or idle, when the loop does not wait)
        workers = int(doc.get("num_workers") or 0)
        cpu, runq = doc["workers_cpu_s"], doc.get("workers_runq_s", 0.0)
        out.worker_cpu_s = cpu / samples
        out.worker_runq_s = runq / samples
        out.worker_io_s = max(0.0, workers * wall - cpu - runq) / samples
        out.notes.append(
            "iterable dataset: its workers' CPU and run-queue time read from /proc over the "
            "window (a worker's idle time counts as I/O)"
        )
    if samples:
        out.proc_cpu_s = max(0.0, float(doc.get("main_cpu_s", 0.0))) / samples
        out.loop_runq_s = max(0.0, float(doc.get("loop_runq_s", 0.0))) / samples
        out.receive_cpu_s = _receive(doc, samples)
        if wall > 0 and out.worker_cpu_s is not None:
            # the workers' whole CPU (all threads, fetching too) when /proc gave it
            workers = doc.get("workers_cpu_s", 0.0) or out.worker_cpu_s * samples
            ours = doc.get("main_cpu_s", 0.0) + workers
            out.other_cores = max(0.0, (doc.get("machine_busy_s", 0.0) - ours) / wall)
    return out


def _receive(doc: dict[str, Any], samples: int) -> float:
    """The training process's CPU per sample to take its batches from the workers: the loop
    thread's CPU in the loader's ``__next__`` over the window's steps (the loader's whole run
    where the document has no window figure); 0 in the synthetic run, which takes none."""
    if "receive_cpu_s" in doc:
        return max(0.0, float(doc["receive_cpu_s"])) / samples
    stats = doc.get("stats") or {}
    if stats.get("samples"):
        return float(stats.get("main_cpu_s", 0.0)) / stats["samples"]
    return 0.0


@dataclass
class ScriptRates:
    """The rates, the stall shares and what could not be known."""

    rates: Rates
    measured: float
    stall: dict[str, float]
    bottleneck: str
    fetch_rate: float | None
    unknown: dict[str, str]
    cores_used_by_others: float
    oversubscribed: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    ingestion_alone: float = 0.0


def derive(runs: dict[str, WindowFigures], *, cores: int, workers: int) -> ScriptRates:
    """G, the workers' CPU and I/O per sample, cores left to them; stall shares that add up."""
    syn, cold, cached = runs["synthetic"], runs["cold"], runs["cached"]
    # the model alone: its median step, bursts aside
    g = syn.steady_rate
    notes: list[str] = []
    slowed = 0 < cold.compute_rate < MODEL_SLOWED * g
    if slowed:
        # the model itself ran slower beside the loader (a model on the CPU shares the cores
        # with the workers, or other jobs took them): its rate in the job is what binds
        # the figures as the report rounds them (to 0.01), so the note reads the same
        beside, alone = round(cold.compute_rate, 2), round(g, 2)
        notes.append(
            f"the model ran at {beside:,.0f} samples/s beside the loader against "
            f"{alone:,.0f}/s alone: it shares the CPU with the workers (or other jobs); the "
            "analysis uses its rate in the job"
        )
        g = cold.compute_rate
    unknown: dict[str, str] = {}
    src = cold if cold.worker_cpu_s is not None else cached
    if src.worker_cpu_s is None:
        why = (
            "no worker timings: the loader ran on torch's own iterator (an iterable "
            "dataset), so neither preparing nor fetching was timed per sample"
        )
        unknown["prep"] = unknown["fetch"] = why
        c, q, io = 0.0, 0.0, 0.0
    else:
        c, q, io = src.worker_cpu_s, src.worker_runq_s or 0.0, src.worker_io_s or 0.0
        notes += src.notes
    others = src.other_cores if src.other_cores >= OTHER_FLOOR else 0.0
    free = max(LEAST_CORES, cores - others)
    fetch_rate: float | None = None
    if "fetch" not in unknown:
        if io <= IO_FLOOR * (c + q + io):
            unknown["fetch"] = (
                f"{NO_IO_WAIT}: the workers were computing or waiting for a core "
                f"{1 - io / (c + q + io) if c + q + io > 0 else 1:.0%} of their time"
            )
        else:
            fetch_rate = max(1, workers) / io
    rates = Rates(
        ingestion=g,
        prep_cpu_s=c,
        cores=float(free),
        sample_bytes=1.0,
        bandwidth=1e12,
        latency_s=io,
        main_cpu_s=src.receive_cpu_s,
        # the process besides the receive, which the model adds back wherever workers run
        proc_cpu_s=max(0.0, src.proc_cpu_s - src.receive_cpu_s),
        receive_cpu_s=src.receive_cpu_s,
        # G in the job already holds the loop's waits for a core when it was slowed there
        loop_runq_s=0.0 if slowed else src.loop_runq_s,
        loop_runq_load=src.rate * c,
    )
    measured = cold.rate
    compute = min(1.0, measured / g) if g > 0 else 1.0
    stall_total = 1.0 - compute
    busy = c + q + io
    prep_part = (c + q) / busy if busy > 0 else 1.0
    stall = {
        "compute": round(compute, 4),
        "prep": round(stall_total * prep_part, 4),
        "fetch": round(stall_total * (1.0 - prep_part), 4),
    }
    if stall_total < COMPUTE_BOUND:
        bottleneck = "compute"
    else:
        bottleneck = "prep" if stall["prep"] >= stall["fetch"] else "fetch"
    oversubscribed = {
        "workers": workers,
        "cores": cores,
        "cores_used_by_others": round(others, 2),
        "worker_runq_share": round(q / busy, 4) if busy > 0 else None,
        "oversubscribed": workers > cores or (busy > 0 and q / busy > 0.1),
    }
    return ScriptRates(
        rates,
        measured,
        stall,
        bottleneck,
        fetch_rate,
        unknown,
        others,
        oversubscribed,
        notes,
        syn.steady_rate,
    )


def derive_script(m: Measurement) -> Derived:
    """The rates, stall shares and bottleneck of a script's runs, with the notes that say
    how they were found (the measurement's first)."""
    figs = {mode: figures(doc) for mode, doc in m.docs.items()}
    workers, cores = m.num_workers, m.cores
    d = derive(figs, cores=cores, workers=workers)
    notes = [*m.notes, *d.notes]
    if d.oversubscribed["oversubscribed"]:
        share = d.oversubscribed["worker_runq_share"]
        notes.append(
            f"oversubscribed: {workers} workers on {cores} cores"
            + (f"; workers waited for a core {share:.0%} of their time" if share else "")
        )
    if d.cores_used_by_others:
        notes.append(
            f"other processes used {d.cores_used_by_others:.1f} of {cores} cores during "
            "the measurement: the what-if prices the cores left"
        )
    rates = d.rates  # P no lower than the delivered rate: the model stage's floor
    files = m.extra.get("file_cache") or {}
    if files.get("applies") and files.get("files"):
        # the files the dataset lists: the file cache (issue 40) holds a fraction of their bytes
        rates = replace(rates, sample_bytes=max(1.0 + 1e-9, files["bytes"] / files["files"]))
    return Derived(
        measurement=m,
        rates=rates,
        stall=d.stall,
        measured=d.measured,
        fetch_rate=d.fetch_rate,
        bottleneck=d.bottleneck,
        unknown=d.unknown,
        shared=d.cores_used_by_others > 0,
        notes=notes,
        prep_rate_per_worker=1.0 / rates.prep_cpu_s if rates.prep_cpu_s > 0 else None,
        extra={
            "oversubscription": d.oversubscribed,
            "ingestion_rate_alone": round(d.ingestion_alone, 2),
            **({"file_cache": files} if files else {}),
        },
    )
