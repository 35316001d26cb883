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
  (`hit_seconds`), as a worker's hits do, in a forked process that has not read the
  segment yet, as a worker has not (`fresh_round`: the page faults of a fresh mapping);
  thread CPU, the median of `ROUNDS` processes (one that other processes slowed does not
  set the price); and how much one hit's wall time varies (``read_cv``: the spread of the
  batch times that torch's in-order delivery idles the workers by). Timed on 3 samples left
  in the CPU's cache, a 320 KB clip's hit read 0.21-0.25 ms against the 0.47-0.53 ms a
  worker spent per sample;
- what a worker still does per sample besides ``dataset[i]``: a batch of `COLLATED`
  decoded samples collated into a slot as the loader's hand-off does (`collate_into`,
  `pack`: the batch's one copy), timed the same way; and, given the loader's batch size,
  what its worker spends around each task (taking it, sending the batch on, dropping its
  samples), on the real loader over these samples
  (`unstall.analysis.measure.script.handoff`).

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
from unstall.analysis.measure.script.handoff import handoff_seconds
from unstall.cache.capacity import entry_bytes
from unstall.cache.files import file_version, tier_put
from unstall.cache.points import codec
from unstall.cache.points.determinism import Verdict, verdict_for
from unstall.cache.points.samples import (
    Refused,
    SampleCache,
    bind_segment,
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


def sample_cache_facts(
    dataset: Any,
    batch_size: int | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> dict[str, Any]:
    """``{"applies": True, "samples", "bytes_per_sample", "read_s", "read_cv", "collate_s",
    "handoff_s", "prep_s", "how"}`` or ``{"applies": False, "check", "why"}`` for
    ``dataset`` (module notes), batched by ``batch_size`` with ``collate_fn`` (its loader's:
    the hand-off is timed only with a batch size)."""
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
        read_s, how, hit_cv, here_s = hit_seconds(paths, where, encoded, verdict)
        data = list(encoded.values())
        collate_s = collate_seconds(data)
        handoff_s = (
            handoff_seconds(lambda k: codec.decode(data[k]), len(data), batch_size, collate_fn)
            if batch_size
            else None
        )
    finally:
        torch.set_num_threads(threads)
    return {
        "applies": True,
        "samples": len(dataset),
        "bytes_per_sample": int(mean_bytes),
        "read_s": round(read_s, 7),
        "read_timed": how,
        "read_cv": round(hit_cv, 4),
        "read_s_in_process": round(here_s, 7),
        "collate_s": round(collate_s, 7),
        **({"handoff_s": round(handoff_s, 7)} if handoff_s is not None else {}),
        "prep_s": round(statistics.median(prep), 6),  # the first call may import, warm up
        "how": verdict.how,
    }


def loader_sample_cache_facts(loader: Any) -> dict[str, Any]:
    """`sample_cache_facts` of ``loader``'s dataset, batched as ``loader`` batches it."""
    size = getattr(loader, "batch_size", None)
    return sample_cache_facts(
        getattr(loader, "dataset", None),
        size if isinstance(size, int) else None,
        getattr(loader, "collate_fn", None),
    )


def hit_seconds(
    paths: list[str], where: str, encoded: dict[int, bytes], verdict: Verdict
) -> tuple[float, str, float, float]:
    """Thread CPU seconds per sample-cache hit of the ``encoded`` samples (index: bytes), how
    it was timed: ``"hit"`` (`SampleCache.get` from a RAM segment of their own, made and
    removed here, in forked processes: `fresh_round`) or, where no segment could be made
    (no shared memory), ``"decode"`` (their stored bytes decoded: the lookup and copy left
    out); the coefficient of variation of one hit's wall time (0.0 where not timed); and
    the same hits timed in this process, whose page tables hold the segment already (what
    the price was before the forks, shown beside it: the fresh mapping's share).

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
        warm = min(COLLATED, n - 1)  # a worker's first batch: its one-offs apart
        timed = n - warm

        def get(i: int) -> Any:
            return held.get(i, _not_held)

        per_round, cv = fresh_round(get, range(warm), range(warm, n))
        here = _median_round(lambda: batched(get, range(warm, n)))
        return per_round / timed, "hit", cv, here / timed
    except (OSError, _NotHeld):
        per_round = _median_round(lambda: [codec.decode(d) for d in data])
        return per_round / len(data), "decode", 0.0, per_round / len(data)
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


def fresh_round(each: Callable[[int], Any], warm: range, items: range) -> tuple[float, float]:
    """Thread CPU seconds of ``each(i)`` for every ``i`` of ``items`` (`batched`), the median
    of `ROUNDS` forked processes, each after the same over ``warm`` (untimed: what a worker
    pays once, not per sample); and the coefficient of variation of one call's wall time
    over all of them. In this process (and 0.0 for the variation) where none can be forked
    or one does not answer.

    A loader worker maps the segment afresh and reads each sample once an epoch: every hit
    faults the entry's pages into the worker's page tables. A fork has the segment mapped
    but not its page tables (Linux copies none for shared memory), so its first pass pays
    those faults as a worker does; rounds in this one process, whose tables the writes
    filled, do not. Measured on the audio example's 320 KB clips (load 5.6): 0.43-0.48 ms a
    hit in this process, 0.50 ms in a fork's first pass, 12 more page faults a hit (0.43-0.45
    ms in its second pass)."""
    times: list[float] = []
    walls: list[float] = []
    for _ in range(ROUNDS):
        took = _in_fork(each, warm, items)
        if took is None:
            return _median_round(lambda: batched(each, items)), 0.0
        times.append(took[0])
        walls.extend(took[1])
    mean = statistics.fmean(walls)
    return statistics.median(times), statistics.pstdev(walls) / mean if mean > 0 else 0.0


#: Seconds a forked timing may take before it is stopped (and timed in this process).
FORK_WAIT_S = 10.0


def _in_fork(
    each: Callable[[int], Any], warm: range, items: range
) -> tuple[float, list[float]] | None:
    """Thread CPU seconds of ``each`` over ``items`` after ``warm`` in a forked process (a
    pool of one, as `prefill_samples` forks its fillers), and each call's wall seconds;
    None where it cannot be timed so."""
    _timing[:] = [each, warm, items]  # inherited by the forked process
    try:
        pool = multiprocessing.get_context("fork").Pool(1)
    except (OSError, ValueError):  # no fork here
        _timing.clear()
        return None
    try:
        return pool.apply_async(_time_in_fork).get(timeout=FORK_WAIT_S)
    except Exception:  # it did not answer in time, or failed: timed in this process instead
        return None
    finally:
        _timing.clear()
        pool.terminate()
        pool.join()


#: What `_in_fork` times, for its forked process: the call, the untimed and the timed items.
_timing: list[Any] = []


def _time_in_fork() -> tuple[float, list[float]]:
    each, warm, items = _timing
    batched(each, warm)
    t0 = time.thread_time()
    walls = batched(each, items)
    return time.thread_time() - t0, walls


def batched(each: Callable[[int], Any], items: range) -> list[float]:
    """``each(i)`` over ``items``, every result held until the last (each hit writes into
    memory of its own, never a buffer the one before freed); each call's wall seconds.

    What is held matters. A worker's hits land in fresh memory: it spent 0.50-0.53 ms a
    320 KB clip (with the batch's collate) where hits held all round timed 0.50-0.56 ms and
    hits dropped at once, each reusing the buffer the one before freed, warm in the CPU's
    caches, 0.37-0.40 ms (the audio example, three runs at load 6-11)."""
    walls, held = [], []
    for i in items:
        w0 = time.perf_counter()
        held.append(each(i))
        walls.append(time.perf_counter() - w0)
    return walls


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
