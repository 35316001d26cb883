"""The ``remote`` remedy: N remote CPUs (Ray actors, `unstall.Remote`) for a prep-bound job.

Priced from the job's measured rates: each remote worker prepares batches on a
CPU of its own at the job's measured CPU per sample (``prep_cpu_s``) plus its storage time
per batch, as one local worker's serial path does; the job's local workers keep what they
give now; the training process pays a receive for every sample (the batch's bytes copied
out of the object store, timed on one of the job's own batches: `unstall.analysis.measure.
wire`), which takes from its own thread and the cores the local workers share with it. Remote
workers relieve the preparation only: the model's rate G, storage's bandwidth and the
training process itself still cap the job, and N is the fewest workers that bring it to
the lowest of those caps.

What one machine cannot measure is said, never guessed: the network between the nodes (the
row gives the bytes/s it must carry), Ray's own cost per object, and whether the remote CPUs
are as fast as this node's (assumed). The row is priced, never chosen automatically: the
CPUs are a cluster's, which the analysis cannot see or reserve.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from unstall.analysis.model.predict import fetch_seconds_per_batch, predict
from unstall.analysis.recommend.option import CLUSTER, Job, Option, option

#: Remote workers priced at most (a job that needs more is said to, with this many priced).
MAX_WORKERS = 1024
#: `unstall.Remote`'s defaults the price rests on: batches sent to one actor at a time, and
#: the cap on bytes in flight (1 GiB).
TASKS_PER_WORKER = 2
DEFAULT_BYTES_IN_FLIGHT = 2**30


def remote_row(
    job: Job,
    wire: dict[str, Any] | None,
    *,
    cluster: str | None = None,
    workers: int | None = None,
) -> Option:
    """The ``remote`` row: how many remote workers (1 CPU each) bring the job to the lowest
    cap they cannot lift, and the rate predicted with them (``wire``: the job's batch as
    `unstall.analysis.measure.wire.wire_probe` measured it, None where no batch was seen;
    ``cluster``: the Ray cluster named where analyze ran, ``$RAY_ADDRESS``; ``workers``:
    the local workers the recommendation runs, which fill first, where not the job's)."""
    rates, measured = job.rates, job.measured
    local_workers = job.base.workers if workers is None else workers
    base = replace(job.base, workers=local_workers)
    b = base.batch_size
    prep_batch = b * rates.prep_cpu_s  # a remote worker's own CPU: no core shared
    fetch_batch = fetch_seconds_per_batch(rates, base, 0.0)
    per_batch = max(prep_batch, fetch_batch) if base.prefetch else prep_batch + fetch_batch
    if per_batch <= 0:
        return option("remote", measured, unpriced="zero_time", needs=CLUSTER, cluster=cluster)
    per_worker = b / per_batch
    receive = wire["receive_cpu_s_per_sample"] if wire else 0.0
    trainer = replace(  # the whole process in one term: the local batches' receive too
        rates,
        main_cpu_s=rates.main_cpu_s + receive,
        proc_cpu_s=rates.process_cpu_s + receive,
        receive_cpu_s=0.0,
    )
    caps = {k: v for k, v in predict(trainer, base).caps.items() if k in ("compute", "fetch")}
    if trainer.main_cpu_s > 0:
        caps["main"] = 1.0 / trainer.main_cpu_s
    if trainer.proc_cpu_s > 0 and rates.cores > 0:
        caps["process"] = rates.cores / trainer.proc_cpu_s
    bound = min(caps, key=lambda k: caps[k])
    cap = caps[bound]
    # the local workers as they are, all caps but the cores they share with the process
    free = predict(replace(trainer, ingestion=math.inf, proc_cpu_s=0.0), base).samples_per_s
    shared = trainer.proc_cpu_s > 0 and rates.prep_cpu_s > 0 and rates.cores > 0

    def local_part(total: float) -> float:
        """Samples/s the local workers give while the process runs at ``total``: the
        cores left to them after the process's own CPU (its receive included)."""
        if not shared:
            return free
        return min(free, (rates.cores - trainer.proc_cpu_s * total) / rates.prep_cpu_s)

    def total_at(extra: float) -> float:
        """Samples/s with ``extra`` samples/s from remote workers: the fixed point of
        ``total = local_part(total) + extra``, capped."""
        total = free + extra
        if shared:  # local_part falls as the process's own CPU grows with the total
            total = min(
                total,
                (rates.cores + extra * rates.prep_cpu_s) / (rates.prep_cpu_s + trainer.proc_cpu_s),
            )
        return min(cap, total)

    local = total_at(0.0)
    if local >= cap * (1 - 1e-9):
        return option(
            "remote", measured, unpriced="local_reach", needs=CLUSTER, cluster=cluster, cap=bound
        )
    need = cap - free  # remote samples/s that bring the job to the cap
    if shared:  # ... and make up for the local workers' cores the process's receive takes
        need = max(
            need,
            (cap * (rates.prep_cpu_s + trainer.proc_cpu_s) - rates.cores) / rates.prep_cpu_s,
        )
    wanted = math.ceil(need / per_worker - 1e-9)
    n = max(1, min(wanted, MAX_WORKERS))
    predicted = total_at(n * per_worker)
    remote_share = predicted - local_part(predicted)
    settings: dict[str, Any] = {"workers": n}
    if wire:
        in_flight = n * TASKS_PER_WORKER * wire["bytes_per_sample"] * b
        if in_flight > DEFAULT_BYTES_IN_FLIGHT:
            settings["max_bytes_in_flight"] = _mib(in_flight)
    return option(
        "remote",
        measured,
        predicted,
        config={"kwargs": {"num_workers": local_workers, "remote": settings}},
        needs=CLUSTER,
        bound=bound,
        remote_workers=n,
        per_worker_samples_per_s=round(per_worker, 1),
        local_samples_per_s=round(local, 1),
        caps={k: round(v, 1) for k, v in caps.items()},
        transfer=_transfer(wire, remote_share),
        cluster=cluster,
        **({"wanted": wanted} if wanted > MAX_WORKERS else {}),
    )


def _transfer(wire: dict[str, Any] | None, remote_share: float) -> dict[str, Any]:
    """The transfer the price includes: measured on one of the job's batches (its receive,
    the copy out of the object store, timed ``repeats`` times here, the median), or not
    (then the price leaves the trainer's receive out: an upper bound)."""
    if not wire:
        return {"measured": False}
    return {
        "measured": True,
        "bytes_per_sample": round(wire["bytes_per_sample"], 1),
        "receive_cpu_ms_per_sample": round(wire["receive_cpu_s_per_sample"] * 1e3, 4),
        "network_mb_per_s": round(remote_share * wire["bytes_per_sample"] / 1e6, 1),
        **{k: wire[k] for k in ("samples", "batch_bytes", "repeats")},
    }


def _mib(nbytes: float) -> str:
    return f"{math.ceil(nbytes / 2**20)}MiB"
