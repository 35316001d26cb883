"""`bench remote`: local workers alone against local + 2 and + 4 remote workers (Ray actors).

The job is prep-bound and its per-sample cost is *waiting* (`SLEEP_S` of sleep, as a slow
disk or a remote store would cost), so that the 2 cores of a small machine can show scale:
a worker prepares ``1 / SLEEP_S`` samples a second whatever its core does, and the rate the
worker count allows is ``workers / SLEEP_S``. A CPU-bound job cannot scale on one machine
(the "remote" nodes share its cores): that needs real machines.

The cluster is this bench's own: a head with 0 CPUs (the trainer's node) and `NODES` nodes
of 1 CPU on 127.0.0.1, started and stopped here. Each case keeps one loader for a warm-up
epoch and `REPEATS` measured ones (median): its actors start once, as in training.

Figures per case: samples/s and its share of what the worker count allows; the ratio to
2 local workers alone (goal: 2 local + 4 remote >= `GOAL` x); the training process's CPU
per batch (the loader's own, and the whole process's, Ray's threads included); the bytes
moved from the remote nodes; the batches they prepared.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Any

import torch

from unstall.bench.harness import BenchResult

DESCRIPTION = "local workers alone vs local + 2 and + 4 Ray actors on a sleep-bound job"
#: Seconds each sample waits (its preparation cost).
SLEEP_S = 0.005
#: Samples a batch, and image size (uint8, 3 x SIZE x SIZE: the bytes moved).
BATCH, SIZE = 16, 64
LOCAL = 2
NODES = 4
GOAL = 2.4
REPEATS = 3


class Sleepy(torch.utils.data.Dataset):
    """Sample ``i`` waits `SLEEP_S`, then is a uint8 image and its label."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(SLEEP_S)
        return torch.full((3, SIZE, SIZE), i % 251, dtype=torch.uint8), i


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _case(n: int, remote: Any, repeats: int) -> dict[str, Any]:
    """One loader: a warm-up epoch, then ``repeats`` measured ones (median rate)."""
    import unstall

    loader = unstall.DataLoader(
        Sleepy(n), batch_size=BATCH, shuffle=True, seed=0, num_workers=LOCAL, remote=remote
    )
    rates, cpus = [], []
    try:
        for epoch in range(repeats + 1):
            c0, t0, batches = _cpu_s(), time.perf_counter(), 0
            for _ in loader:
                batches += 1
            if epoch:
                rates.append(n / (time.perf_counter() - t0))
                cpus.append(1e3 * (_cpu_s() - c0) / batches)
        s = loader.stats()
    finally:
        loader.close()
    workers = LOCAL + (remote.workers if remote is not None else 0)
    rate = statistics.median(rates)
    r = s.get("remote", {})
    return {
        "case": f"{LOCAL} local" + (f" + {remote.workers} remote" if remote else ""),
        "workers": workers,
        "samples_per_s": round(rate, 1),
        "of_allowed": round(rate * SLEEP_S / workers, 3),
        "main_cpu_ms_per_batch": s["main_cpu_ms_per_batch"],
        "process_cpu_ms_per_batch": round(statistics.median(cpus), 3),
        "remote_batches": r.get("batches", 0),
        # the actors' own time per batch (fetch + prepare, in the task): against the
        # nominal BATCH x SLEEP_S, what the machine's load adds to the job's own cost
        "remote_ms_per_batch": _remote_ms(r),
        "bytes_moved": r.get("bytes", 0),
        "rates": [round(x, 1) for x in rates],
    }


def _remote_ms(r: dict[str, Any]) -> float | None:
    nodes = r.get("nodes") or {}
    batches = sum(n["batches"] for n in nodes.values())
    return round(1e3 * sum(n["prep_s"] for n in nodes.values()) / batches, 2) if batches else None


def run(*, quick: bool, console: Any = None, repeats: int | None = None) -> BenchResult:
    say = console.print if console is not None else print
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing sent off this machine
    import ray
    from ray.cluster_utils import Cluster

    from unstall.remote import Remote

    repeats = repeats or (2 if quick else REPEATS)
    n = (1536 if quick else 4096) // BATCH * BATCH
    say(f"starting a local Ray cluster: a head with 0 CPUs + {NODES} nodes of 1 CPU")
    store = 100 * 2**20
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": store, "include_dashboard": False},
    )
    rows = []
    try:
        for _ in range(NODES):
            cluster.add_node(num_cpus=1, object_store_memory=store)
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        for extra in (0, 2, NODES):
            remote = None
            if extra:
                remote = Remote(address=cluster.address, workers=extra, wait_up_s=300)
            rows.append(_case(n, remote, repeats))
            say(f"  {rows[-1]['case']}: {rows[-1]['samples_per_s']:.0f} samples/s")
    finally:
        ray.shutdown()
        cluster.shutdown()
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["ratio"] = round(r["samples_per_s"] / base, 3)
    ratio = rows[-1]["ratio"]
    notes = [
        f"per-sample cost: {SLEEP_S * 1e3:g} ms of waiting; batches of {BATCH} uint8 "
        f"3x{SIZE}x{SIZE} images; {n} samples an epoch, median of {repeats} epochs",
        f"goal: {LOCAL} local + {NODES} remote >= {GOAL}x {LOCAL} local alone: "
        f"{ratio:.2f}x ({'met' if ratio >= GOAL else 'NOT met'})",
        "the remote nodes are processes on this machine: waiting scales here, CPU-bound "
        "preparation needs real machines",
        f"remote batches and bytes moved: over all {repeats + 1} epochs of a case (warm-up "
        "included); CPU per batch: the measured epochs",
        "remote ms per batch: the actors' own time preparing one (nominal "
        f"{BATCH * SLEEP_S * 1e3:g} ms: the sleep's overshoot and the batch's CPU on this "
        "loaded machine add to it, for local workers too)",
    ]
    return BenchResult(
        name="remote",
        ratio=ratio,
        baseline=rows[0],
        unstall=rows[-1],
        rows=rows,
        detail={"goal": GOAL, "sleep_s": SLEEP_S, "batch": BATCH},
        notes=notes,
    )
