"""The ``remote`` remedy: N remote CPUs (Ray actors, `unstall.Remote`) for a prep-bound job.

Priced from the job's measured rates (issue 45): each remote worker prepares batches on a
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

from unstall.analysis.model.predict import Config, fetch_seconds_per_batch, predict
from unstall.analysis.rates.result import Rates

#: Remote workers priced at most (a job that needs more is said to, with this many priced).
MAX_WORKERS = 1024
#: `unstall.Remote`'s defaults the price rests on: batches sent to one actor at a time, and
#: the cap on bytes in flight (1 GiB).
TASKS_PER_WORKER = 2
DEFAULT_BYTES_IN_FLIGHT = 2**30


def remote_row(
    rates: Rates,
    base: Config,
    measured: float,
    wire: dict[str, Any] | None,
    *,
    cluster: str | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The ``remote`` row: how many remote workers (1 CPU each) bring the job to the lowest
    cap they cannot lift, and the rate predicted with them (``wire``: the job's batch as
    `unstall.analysis.measure.wire.wire_probe` measured it, None where no batch was seen;
    ``cluster``: the Ray cluster named where analyze ran, ``$RAY_ADDRESS``; ``workers``:
    the local workers the recommendation runs, which fill first, where not the job's)."""
    local_workers = base.workers if workers is None else workers
    base = replace(base, workers=local_workers)
    what = "prepare batches on other machines too: N remote CPUs as Ray actors beside the "
    what += "local workers (DataLoader(remote=unstall.Remote(workers=N)))"
    b = base.batch_size
    prep_batch = b * rates.prep_cpu_s  # a remote worker's own CPU: no core shared
    fetch_batch = fetch_seconds_per_batch(rates, base, 0.0)
    per_batch = max(prep_batch, fetch_batch) if base.prefetch else prep_batch + fetch_batch
    if per_batch <= 0:
        return _unpriced(what, measured, "the job's measured time per sample is zero")
    per_worker = b / per_batch
    receive = wire["receive_cpu_s_per_sample"] if wire else 0.0
    trainer = replace(
        rates,
        main_cpu_s=rates.main_cpu_s + receive,
        proc_cpu_s=rates.proc_cpu_s + receive,
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
        return _unpriced(
            what,
            measured,
            f"no remote worker pays: the local workers already reach the {_CAPS[bound]}",
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
    row = {
        "remedy": "remote",
        "what": what.replace("N remote", f"{n} remote").replace("=N", f"={n}"),
        "predicted_samples_per_s": round(predicted, 1),
        "predicted_speedup": round(predicted / measured, 2) if measured else None,
        "remote_workers": n,
        "per_worker_samples_per_s": round(per_worker, 1),
        "local_samples_per_s": round(local, 1),
        "bound": bound,
        "caps": {k: round(v, 1) for k, v in caps.items()},
        "transfer": _transfer(wire, remote_share),
        "assumed": "each remote CPU as fast as this node's (the job's measured CPU per sample "
        "and storage time per batch); the network carries the bytes/s given; Ray's own cost "
        "per object is not included",
        "config": {"kwargs": {"num_workers": local_workers, "remote": settings}},
        "applies": _applies(cluster, n),
        "cluster": cluster,
        "recommended": False,
        "why_not_recommended": "remote CPUs are a Ray cluster's: the analysis cannot see "
        "whether it has them free, so the remedy is priced, not chosen",
    }
    if wanted > MAX_WORKERS:
        row["not_enough"] = f"{wanted} workers would reach the cap; priced at {MAX_WORKERS}"
    return row


#: What each cap the remote workers cannot lift is, in words.
_CAPS = {
    "compute": "model's own rate (G)",
    "fetch": "storage's bandwidth",
    "main": "training loop's own thread (hand-off and receive)",
    "process": "cores the training process itself uses",
}


def _transfer(wire: dict[str, Any] | None, remote_share: float) -> dict[str, Any]:
    """The transfer the price includes: measured on one of the job's batches, or said not."""
    if not wire:
        return {
            "measured": False,
            "why": "no batch of the job was seen to time the transfer on: priced without the "
            "trainer's receive cost (an upper bound)",
        }
    return {
        "measured": True,
        "bytes_per_sample": round(wire["bytes_per_sample"], 1),
        "receive_cpu_ms_per_sample": round(wire["receive_cpu_s_per_sample"] * 1e3, 4),
        "network_mb_per_s": round(remote_share * wire["bytes_per_sample"] / 1e6, 1),
        "how": f"one of the job's batches ({wire['samples']} samples, {wire['batch_bytes']:,} "
        f"bytes as unstall.remote ships it), its receive (the copy out of the object store) "
        f"timed {wire['repeats']} times on this machine, the median",
    }


def _applies(cluster: str | None, n: int) -> str:
    where = (
        f"the Ray cluster at RAY_ADDRESS={cluster}"
        if cluster
        else 'a Ray cluster, named by RAY_ADDRESS or "address" in the remote entry (none was '
        "named where analyze ran)"
    )
    return (
        f"unstall run --config FILE, FILE holding the config's remote entry (no edit of the "
        f"script); needs {where} with {n} free CPUs, and pip install 'unstall[ray]' on the "
        "trainer and the cluster's nodes"
    )


def _unpriced(what: str, measured: float, why: str) -> dict[str, Any]:
    return {
        "remedy": "remote",
        "what": what,
        "predicted_samples_per_s": None,
        "predicted_speedup": None,
        "not_applicable": why,
        "recommended": False,
    }


def _mib(nbytes: float) -> str:
    return f"{math.ceil(nbytes / 2**20)}MiB"
