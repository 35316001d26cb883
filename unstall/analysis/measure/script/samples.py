"""The whole-sample cache, as the agent sees it in the script's process.

A map-style dataset with one file per sample whose preparation is deterministic can take
``Cache(size, hold="samples")`` under ``unstall run --config`` (`unstall.cache.points`):
from the second epoch a sample costs a read and a decode of its stored bytes instead of
its whole preparation. `sample_cache_facts` takes what the rates and recommend stages price
that from, on the job's own samples, in the job's process:

- whether it applies: the dataset lists a file per sample (`sample_files`) and the cache's
  own determinism verdict (`verdict_for`: recognized ops, then each checked sample prepared
  twice under two seeds); else which check failed and why;
- the bytes per sample, as the cache would store them (`codec.encode` of those samples);
- the read cost per sample: the stored bytes decoded (`codec.decode`), timed on this
  thread's CPU (the script's other threads run meanwhile), plus the tier's lookup and copy
  (`TIER_READ_S_PER_BYTE`, a constant measured once);
- what a worker still does per sample besides ``dataset[i]``: the decoded samples collated
  into a batch (torch's ``default_collate``, the copy the hand-off makes), timed the same way.

`prefill_samples` fills the cache before the verification's timed window, as the first
epoch leaves it, so the verified rate is the steady state the option was priced for.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.utils.data import default_collate

from unstall.cache.points import codec
from unstall.cache.points.determinism import verdict_for
from unstall.cache.points.samples import Refused, sample_files

#: CPU seconds per stored byte a tier's lookup, version check and copy add to a decode:
#: measured once on this repo's 2-core machine (`SampleCache.get` of 1,000 MP3 clips' 320 KB
#: samples from /dev/shm, thread CPU: 420 us per get, 70 us of it the decode), not per job.
TIER_READ_S_PER_BYTE = 1.1e-9
#: Times each encoded sample is decoded to time the read.
DECODES = 5
#: Samples per timed collate (a batch of the decoded samples, repeated).
COLLATED = 16
#: Seconds the verification's fill may take at most (a share of the samples beyond).
FILL_MAX_S = 90.0


def sample_cache_facts(dataset: Any) -> dict[str, Any]:
    """``{"applies": True, "samples", "bytes_per_sample", "read_s", "prep_s", "how"}`` or
    ``{"applies": False, "check", "why"}`` for ``dataset`` (module notes)."""
    name = type(dataset).__name__
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return {"applies": False, "check": "map-style", "why": f"{name} is not map-style"}
    try:
        sample_files(dataset)
    except Refused as exc:
        return {"applies": False, "check": exc.stats["failed_check"], "why": exc.stats["reason"]}
    encoded: list[bytes] = []
    prep: list[float] = []

    def prepared(i: int) -> bytes:
        t0 = time.thread_time()
        out = codec.encode(dataset[i])
        prep.append(time.thread_time() - t0)
        encoded.append(out)
        return out

    try:
        verdict = verdict_for(dataset, prepared, None)
    except Exception as exc:  # a dataset's odd sample must not end the measurement
        return {"applies": False, "check": "error", "why": f"{type(exc).__name__}: {exc}"}
    if not verdict.ok:
        return {"applies": False, "check": verdict.check, "why": verdict.reason}
    t0 = time.thread_time()
    for _ in range(DECODES):
        decoded = [codec.decode(data) for data in encoded]
    mean_bytes = sum(map(len, encoded)) / len(encoded)
    read_s = (time.thread_time() - t0) / (DECODES * len(encoded))
    read_s += TIER_READ_S_PER_BYTE * mean_bytes
    batch = decoded * (COLLATED // len(decoded) + 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker
    try:
        t0 = time.thread_time()
        for _ in range(DECODES):
            default_collate(batch)
        collate_s = (time.thread_time() - t0) / (DECODES * len(batch))
    finally:
        torch.set_num_threads(threads)
    return {
        "applies": True,
        "samples": len(dataset),
        "bytes_per_sample": int(mean_bytes),
        "read_s": round(read_s, 7),
        "collate_s": round(collate_s, 7),
        "prep_s": round(statistics.median(prep), 6),  # the first call may import, warm up
        "how": verdict.how,
    }


def prefill_samples(binding: Any, dataset: Any) -> dict[str, Any] | None:
    """Fill the sample cache ``binding`` binds for ``dataset`` (as the loader bound it: the
    same node segment), every sample prepared once, at most `FILL_MAX_S`; None when it binds
    no sample cache (a refused dataset gets the byte cache)."""
    layer = binding.bind(dataset)
    get = getattr(layer, "get", None)
    if layer is None or getattr(layer, "hold", "") != "samples" or get is None:
        return None
    n, stored, complete = len(dataset), 0, True
    end = time.monotonic() + FILL_MAX_S
    try:
        for i in range(n):
            get(i, dataset.__getitem__)
            stored += 1
            if time.monotonic() > end:
                complete = False
                break
    finally:
        close = getattr(layer, "close", None)
        if close is not None:
            close()
    return {"stored": stored, "files": n, "complete": complete, "hold": "samples"}
