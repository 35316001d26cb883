"""The whole-sample cache, as the agent sees it in the script's process.

A map-style dataset with one file per sample whose preparation is deterministic can take
``Cache(size, hold="samples")`` under ``unstall run --config`` (`unstall.cache.points`):
from the second epoch a sample costs a cache hit instead of its whole preparation.
`sample_cache_facts` takes what the rates and recommend stages price that from, on the
job's own samples, in the job's process:

- whether it applies: the dataset lists a file per sample (`sample_files`) and the cache's
  own determinism verdict (`verdict_for`: recognized ops, then each checked sample prepared
  twice under two seeds); else which check failed and why;
- the bytes per sample, as the cache would store them (`codec.encode` of those samples);
- the read cost per sample: a hit as a loader worker takes it, the path itself
  (`SampleCache.get`: the file's ``stat`` and version, the tier's lookup and copy, the
  decode) on the checked samples, held in a RAM segment of their own for the timing and
  removed after; each round reads more stored bytes than the CPU's caches hold
  (`hit_seconds`), as a worker's hits do; thread CPU (the script's other threads run
  meanwhile), the median of `ROUNDS` rounds (a round that other processes slowed does not
  set the price). Timed on 3 samples left in the CPU's cache, a 320 KB clip's hit read
  0.21-0.25 ms against the 0.47-0.53 ms a worker spent per sample;
- what a worker still does per sample besides ``dataset[i]``: a batch of `COLLATED`
  decoded samples collated into a slot as the loader's hand-off does (`collate_into`,
  `pack`: the batch's one copy), timed the same way.

`prefill_samples` fills the cache before the verification's timed window, as the first
epoch leaves it, so the verified rate is the steady state the option was priced for.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from unstall import machine
from unstall.cache.files import file_version, tier_put
from unstall.cache.points import codec
from unstall.cache.points.determinism import Verdict, verdict_for
from unstall.cache.points.samples import (
    Refused,
    SampleCache,
    bind_segment,
    entry_bytes,
    sample_files,
)
from unstall.loader.handoff import Arena, collate_into, pack

#: Timed rounds of the hit path and of the collate (each over every checked sample).
ROUNDS = 5
#: Samples per timed collate (decoded afresh from the checked ones: a batch of their own).
COLLATED = 32
#: Bytes of stored samples one timed round of hits reads: more than the CPU's caches hold.
SPREAD_BYTES = 32 << 20
#: Entries one timed round reads at most (small samples: their cost is not the bytes).
SPREAD_MAX = 256
#: Seconds the verification's fill may take at most (a share of the samples beyond).
FILL_MAX_S = 150.0


def sample_cache_facts(dataset: Any) -> dict[str, Any]:
    """``{"applies": True, "samples", "bytes_per_sample", "read_s", "collate_s", "prep_s",
    "how"}`` or ``{"applies": False, "check", "why"}`` for ``dataset`` (module notes)."""
    name = type(dataset).__name__
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return {"applies": False, "check": "map-style", "why": f"{name} is not map-style"}
    try:
        paths, where = sample_files(dataset)
    except Refused as exc:
        return {"applies": False, "check": exc.stats["failed_check"], "why": exc.stats["reason"]}
    encoded: dict[int, bytes] = {}
    prep: list[float] = []

    def prepared(i: int) -> bytes:
        t0 = time.thread_time()
        out = codec.encode(dataset[i])
        prep.append(time.thread_time() - t0)
        encoded[i] = out
        return out

    try:
        verdict = verdict_for(dataset, prepared, None)
    except Exception as exc:  # a dataset's odd sample must not end the measurement
        return {"applies": False, "check": "error", "why": f"{type(exc).__name__}: {exc}"}
    if not verdict.ok:
        return {"applies": False, "check": verdict.check, "why": verdict.reason}
    mean_bytes = sum(map(len, encoded.values())) / len(encoded)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker
    try:
        read_s, how = hit_seconds(paths, where, encoded, verdict)
        collate_s = collate_seconds(list(encoded.values()))
    finally:
        torch.set_num_threads(threads)
    return {
        "applies": True,
        "samples": len(dataset),
        "bytes_per_sample": int(mean_bytes),
        "read_s": round(read_s, 7),
        "read_timed": how,
        "collate_s": round(collate_s, 7),
        "prep_s": round(statistics.median(prep), 6),  # the first call may import, warm up
        "how": verdict.how,
    }


def hit_seconds(
    paths: list[str], where: str, encoded: dict[int, bytes], verdict: Verdict
) -> tuple[float, str]:
    """Thread CPU seconds per sample-cache hit of the ``encoded`` samples (index: bytes), and
    how it was timed: ``"hit"`` (`SampleCache.get` from a RAM segment of their own, made
    and removed here) or, where no segment could be made (no shared memory), ``"decode"``
    (their stored bytes decoded: the lookup and copy left out).

    The segment holds the checked samples again and again under the first `spread` indices
    (each under its own file's version), so a round of hits reads more bytes than the
    CPU's caches hold, each entry last read a round ago: a worker's hits, whose samples it
    last read an epoch ago."""
    from unstall.cache.cache import Cache

    data = list(encoded.values())
    mean = sum(map(len, data)) / len(data)
    n = spread(len(paths), mean, len(data))
    cache = Cache(entry_bytes(mean) * n + (1 << 20), keep=0, name=f"price-{uuid.uuid4().hex}")
    try:
        layer, _ = bind_segment(cache, "samples", "price", len(paths), mean)
        for i in range(n):
            version = np.array([file_version(os.stat(paths[i]))], dtype=np.int64)
            tier_put(layer, i, data[i % len(data)], version, len(layer.tiers))
        held = SampleCache(
            layer,
            paths,
            hold="samples",
            where=where,
            dataset_name="price",
            fingerprint="price",
            verdict=verdict,
        )
        per_round = _median_round(lambda: [held.get(i, _not_held) for i in range(n)])
        return per_round / n, "hit"
    except (OSError, _NotHeld):
        per_round = _median_round(lambda: [codec.decode(d) for d in data])
        return per_round / len(data), "decode"
    finally:
        cache.close()


def spread(samples: int, mean_bytes: float, least: int) -> int:
    """Entries the hit timing reads per round: `SPREAD_BYTES` of them, at least ``least``
    (the checked samples) and at most `SPREAD_MAX` and the dataset's ``samples``."""
    want = int(SPREAD_BYTES // max(1.0, mean_bytes))
    return max(least, min(want, SPREAD_MAX, samples))


class _NotHeld(Exception):
    """A timed hit found its sample missing (the segment could not store it)."""


def _not_held(index: int) -> Any:
    raise _NotHeld(f"sample {index} is not in the timing segment")


def collate_seconds(encoded: list[bytes]) -> float:
    """Thread CPU seconds per sample of collating `COLLATED` samples decoded from
    ``encoded`` into a slot of shared memory, as a worker hands a batch off."""
    batch = [codec.decode(encoded[k % len(encoded)]) for k in range(COLLATED)]
    base = torch.zeros(COLLATED * max(map(len, encoded)) * 2 + (1 << 20), dtype=torch.uint8)
    return _median_round(lambda: pack(collate_into(batch, Arena(base)))) / COLLATED


def _median_round(work: Callable[[], Any]) -> float:
    """The median thread CPU seconds of `ROUNDS` calls of ``work``."""
    times = []
    for _ in range(ROUNDS):
        t0 = time.thread_time()
        work()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def prefill_samples(binding: Any, dataset: Any, workers: int = 1) -> dict[str, Any] | None:
    """Fill the sample cache ``binding`` binds for ``dataset`` (as the loader bound it: the
    same node segment), every sample prepared once, at most `FILL_MAX_S`; None when it binds
    no sample cache (a refused dataset gets the byte cache).

    As the job's first epoch does, by ``workers`` processes (the loader's, at most the
    cores): forked, each prepares every ``workers``-th sample; alone, a loaded machine
    left a fifth of 1,000 clips unfilled at the limit, and the verification then timed
    their misses."""
    layer = binding.bind(dataset)
    get = getattr(layer, "get", None)
    if layer is None or getattr(layer, "hold", "") != "samples" or get is None:
        close = getattr(layer, "close", None)
        if close is not None:  # the byte cache a refused dataset got: not left open
            close()
        return None
    n = len(dataset)
    end = time.monotonic() + FILL_MAX_S
    procs = max(1, min(int(workers or 1), machine.cores_available(), n))
    try:
        _filling[:] = [layer, dataset, procs, end]  # inherited by the forked processes
        if procs == 1:
            stored = _fill(0)
        else:
            pool = multiprocessing.get_context("fork").Pool(procs)
            try:
                stored = sum(pool.map(_fill, range(procs), chunksize=1))
            finally:
                pool.close()  # each has returned: nothing is left half-written
                pool.join()
    finally:
        _filling.clear()
        close = getattr(layer, "close", None)
        if close is not None:
            close()
    complete = stored == n
    return {"stored": stored, "files": n, "complete": complete, "hold": "samples"}


#: What `prefill_samples` fills, for its forked processes: layer, dataset, processes, deadline.
_filling: list[Any] = []


def _fill(k: int) -> int:
    """Prepare (and store) every ``procs``-th sample from ``k`` through the layer, until the
    deadline; the samples filled."""
    layer, dataset, procs, end = _filling
    if procs > 1:  # a forked process, as a loader worker
        torch.set_num_threads(1)
    stored = 0
    for i in range(k, len(dataset), procs):
        layer.get(i, dataset.__getitem__)
        stored += 1
        if time.monotonic() > end:
            break
    return stored
