"""The ``samples`` option: the whole prepared sample kept on the node, priced for this job.

Under ``unstall run --config`` with ``{"kwargs": {"cache": {"size": ..., "hold":
"samples"}}}`` (`unstall.cache.points`), a deterministic dataset's samples are prepared
once: from the second epoch a worker's CPU per sample is a cache hit timed on the job's own
samples (the worker's path: lookup, copy, decode), their collate into a batch and what
the worker spends around each batch's task (`unstall.analysis.measure.script.samples`),
and its file is not read; the training
process's CPU per sample is its loop's at the model's rate (the synthetic run's: the job
as it is spreads the process's CPU per second over a few samples) and its receive of each
batch from the workers, timed in the real run (`Rates.receive_cpu_s`: the cached samples
are the script's, so its batches are received alike; the synthetic run, which hands out
one batch again, never pays it). The price is the model's
(`unstall.analysis.model.predict`) at the job's own workers with that CPU per sample, for
the share of the samples the node's room holds (the rest prepared as now); from epoch 2
on, the steady state the verification measures. Its batches' spread (`batch_cv`: the hits'
own, timed with them, and the mix of hits and misses) prices what torch's in-order
delivery idles the workers by (`unstall.analysis.model.predict.in_order_share`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from unstall.analysis.model.predict import predict
from unstall.analysis.recommend.option import Job, Option, option
from unstall.cache.capacity import entry_bytes

#: The least share of the samples the room must hold for the option to be priced.
LEAST_SHARE = 0.05
#: The size the config asks for rounds up to this many bytes.
SIZE_STEP = 64 << 20


def sample_cache_row(job: Job, facts: dict[str, Any], room: float | None) -> Option:
    """The sample cache for ``job`` from the agent's ``facts``, in ``room`` bytes (None:
    not measured, priced as if all fit), or why it does not apply (the failed check)."""
    if not facts.get("applies"):
        return option(
            "samples",
            job.measured,
            unpriced="not_deterministic",
            check=facts.get("check", ""),
            why=facts.get("why", ""),
        )
    n = int(facts["samples"])
    need = entry_bytes(facts["bytes_per_sample"]) * n
    share = 1.0 if room is None or need <= 0 else min(1.0, room / need)
    if share < LEAST_SHARE:
        why = f"the node's room holds {share:.0%} of the {n} samples"
        return option("samples", job.measured, unpriced="no_room", check="room", why=why)
    rates = job.rates
    cached = hit_s(facts)
    prep = share * cached + (1.0 - share) * rates.prep_cpu_s
    rest = 1.0 - share
    # the training process per sample at the cached rate: its loop's, measured at the
    # model's rate, not the slow job's CPU per second over its few samples; the model adds
    # its receive of each batch (the same batches: the cached samples are the script's)
    loop = facts.get("loop_s")
    proc = rates.proc_cpu_s if loop is None else share * loop + rest * rates.proc_cpu_s
    spread = batch_cv(facts, share, rates.prep_cpu_s, job.base.batch_size)
    rates = replace(
        rates,
        prep_cpu_s=prep,
        proc_cpu_s=proc,
        latency_s=rates.latency_s * rest,
        sample_bytes=max(1.0, rates.sample_bytes * rest),
        batch_cv=spread,
    )
    price = predict(rates, job.base)
    size = math.ceil(min(need, room or need) / SIZE_STEP) * SIZE_STEP
    cache = {"size": f"{size >> 20}MiB", "hold": "samples"}
    config = {"kwargs": {"num_workers": job.base.workers, "cache": cache}}
    per = {
        "now": round(job.rates.prep_cpu_s * 1e3, 3),
        "cached": round(prep * 1e3, 3),
        "dataset": round(facts["prep_s"] * 1e3, 3),
        "read": round(facts["read_s"] * 1e3, 3),
        "read_in_process": round(facts.get("read_s_in_process", facts["read_s"]) * 1e3, 3),
        "collate": round(facts.get("collate_s", 0.0) * 1e3, 3),
        "handoff": round(facts.get("handoff_s", 0.0) * 1e3, 3),
        "process": round((proc + rates.receive_cpu_s) * 1e3, 3),
        "receive": round(rates.receive_cpu_s * 1e3, 3),
    }
    return option(
        "samples",
        job.measured,
        price,
        config=config,
        share=round(share, 3),
        bytes_per_sample=facts["bytes_per_sample"],
        worker_cpu_ms_per_sample=per,
        determinism=facts.get("how"),
        from_epoch=2,
        batch_cv=round(spread, 3),
    )


def hit_s(facts: dict[str, Any]) -> float:
    """A worker's CPU seconds per cached sample: read back, collated and handed off with its
    batch; its file neither read nor prepared (the sample cache's facts, timed on the job's
    own samples). One figure for every loader priced under the cache."""
    return facts["read_s"] + facts.get("collate_s", 0.0) + facts.get("handoff_s", 0.0)


def batch_cv(facts: dict[str, Any], share: float, prep_s: float, batch_size: int) -> float:
    """The coefficient of variation of a worker's time per batch under the cache: ``share``
    of its samples hits (each of mean ``read_s`` and variation ``read_cv``, timed on the
    job's samples), the rest prepared (``prep_s``), the batch's collate fixed. A batch sums
    ``batch_size`` samples drawn independently: its variance is theirs times the count."""
    hit, miss = facts["read_s"], prep_s
    var_hit = (facts.get("read_cv", 0.0) * hit) ** 2
    mean = share * hit + (1.0 - share) * miss
    var = share * var_hit + share * (1.0 - share) * (miss - hit) ** 2
    b = max(1, int(batch_size))
    per_batch = b * mean + b * (facts.get("collate_s", 0.0) + facts.get("handoff_s", 0.0))
    return math.sqrt(b * var) / per_batch if per_batch > 0 else 0.0
