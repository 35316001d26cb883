"""Rates of a workload measured in this process: G, the workers' CPU and storage per sample,
the stall shares, and what the stalls show.

Stall shares are of the cold run's wall time (DS-Analyzer's definition): prep
stall = T_cached - T_synthetic, fetch stall = T_cold - T_cached, taken on the
timed waits of each step (`stall_shares`). The bottleneck is what the runs show,
not what the rates suggest: compute when the cold run stalls less than
``COMPUTE_BOUND`` of its time, else the stall twice the other's; stalls alike are
left to the model stage, which knows the prep capacity P to set beside F.
"""

from __future__ import annotations

import math

from unstall.analysis.measure.result import Measurement, Run
from unstall.analysis.rates.result import NO_IO_WAIT, Derived, Rates

#: Below this share of stall in the cold run the job is compute-bound.
COMPUTE_BOUND = 0.10
#: Cores used by other processes below this are noise, not another job.
OTHER_CORES = 0.25
#: The fewest cores the built-in workload is priced with where other jobs hold the rest.
#: Higher than a script's (`LEAST_CORES`): the workload's runs are short, so one busy spell
#: of a neighbour reads as most of the machine taken; at 0.1 a fetch-bound test job was
#: named prep-bound at load 10.
WORKLOAD_LEAST_CORES = 0.5


def derive_workload(m: Measurement) -> Derived:
    """The rates, stall shares and (unless the stalls are alike) the bottleneck of ``m``."""
    rates, fetch_rate = derive_rates(m)
    stall = stall_shares(m.runs, rates.ingestion)
    unknown: dict[str, str] = {}
    if not m.split:
        stall = split_by_worker_time(stall, rates)
        if not math.isfinite(fetch_rate):
            unknown["fetch"] = f"{NO_IO_WAIT}: the workers were computing the whole time"
    measured = m.runs["cold"].samples_per_s
    notes = list(m.notes)
    return Derived(
        measurement=m,
        rates=rates,
        stall=stall,
        measured=measured,
        fetch_rate=fetch_rate if math.isfinite(fetch_rate) else None,
        bottleneck=stall_bottleneck(stall),
        unknown=unknown,
        shared=m.runs["cold"].other_cores() >= OTHER_CORES,
        notes=notes,
        prep_rate_per_worker=1.0 / rates.prep_cpu_s if rates.prep_cpu_s > 0 else None,
    )


def derive_rates(m: Measurement) -> tuple[Rates, float]:
    """(the model's rates, the measured fetch rate) from the runs and the storage probe."""
    runs, probe = m.runs, m.probe
    # the model alone: its median step, bursts aside; the model's own steps inside the real
    # runs are measurements of G too, and on a busy machine one run may catch a slow spell
    g = max(runs["synthetic"].steady_rate, runs["cached"].compute_rate, runs["cold"].compute_rate)
    cached, cold = runs["cached"], runs["cold"]
    cpu = sum(s[6] for s in cached.spans)
    n = sum(s[7] for s in cached.spans) or 1
    prep_cpu = cpu / n
    main_cpu = cached.stats.get("main_cpu_s", 0.0) / max(1, cached.stats.get("samples", 0))
    # the process besides its receive of each batch (the loader's __next__), which the model
    # adds back wherever workers run (`Rates.receive_cpu_s`)
    proc_cpu = max(0.0, (cold.proc_cpu_s / cold.samples if cold.samples else 0.0) - main_cpu)
    others = cold.other_cores()  # cores other jobs took: the workers did not have them
    cores = max(WORKLOAD_LEAST_CORES, m.cores - (others if others >= OTHER_CORES else 0.0))
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
            receive_cpu_s=main_cpu,
        )
        per_batch = rates.batch_fetch_s(m.batch_size, probe.inflight)
        ceiling = min(
            bandwidth / probe.sample_bytes, max(1, m.num_workers) * m.batch_size / per_batch
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
    fetch_rate = max(1, m.num_workers) / io if io > 0 else float("inf")
    rates = Rates(
        g, prep_cpu, cores, 1.0, 1e12, io, main_cpu, proc_cpu_s=proc_cpu, receive_cpu_s=main_cpu
    )
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


def stall_bottleneck(stall: dict[str, float]) -> str | None:
    """Compute-bound when the cold run hardly stalls; else the stall twice the other's; None
    when both stall alike (a worker that fetches then prepares pays both, and runs taken at
    different moments of a busy machine blur the split): the slower rate decides then."""
    prep, fetch = stall["prep"], stall["fetch"]
    if prep + fetch < COMPUTE_BOUND:
        return "compute"
    if prep >= 2 * fetch or fetch >= 2 * prep:
        return "prep" if prep > fetch else "fetch"
    return None
