"""`bench whatif`: the analyzer's predictions against measurements, in the same run.

One configuration is analysed (2 workers, no cache, storage at the lower
throughput): the differential runs give G, the prep CPU per sample and the
storage. From those alone the model predicts a grid (workers 1 and 2 x cache
0, 0.5, 1.0 x two storage throughputs), plus a latency-bound S3 case on SeaweedFS
behind a delaying proxy (there the storage is probed, the rest is the
analysis'), and each cell is then measured with the same steps. Last, the
recommended configuration is applied and measured. Errors are fractions of the
measured rate.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from unstall import machine
from unstall.analysis.measure.probe import probe_storage
from unstall.analysis.measure.runs import loader_run
from unstall.analysis.measure.workload import Workload, step_indices
from unstall.analysis.model.predict import Config, predict
from unstall.analysis.pipeline import analyze_workload
from unstall.analysis.recommend.search import recommend
from unstall.bench.harness import BenchResult
from unstall.cache import Cache
from unstall.data import FileDataset
from unstall.models.simulated import SimulatedAccelerator
from unstall.stores.local import LocalStore
from unstall.testing.throttle import ThrottledStore

DESCRIPTION = "what-if model: predicted vs measured samples/s over a grid, and the recommendation"
RATE = 150.0  # the simulated model [samples/s]
BATCH = 8
THROUGHPUTS = (3e6, 6e6)  # storage [byte/s]: ~40 and ~80 JPEGs/s
S3_LATENCY_S, S3_INFLIGHT = 0.05, 2


class MemoryFiles(LocalStore):
    """Files kept in the page cache (never evicted, never read around): the throttled link
    in front is then the storage's only cost, as the model's bandwidth and latency say."""

    @property  # type: ignore[override]
    def bypass_page_cache(self) -> bool:
        return False

    @bypass_page_cache.setter
    def bypass_page_cache(self, value: bool) -> None:
        pass

    def drop_page_cache(self, keys: list[str] | None = None) -> None:
        pass


@dataclass(frozen=True)
class Bed:
    """What every cell runs on: the files (in the page cache), the images and their labels,
    the steps each run skips and times, and where progress is said."""

    local: MemoryFiles
    keys: list[str]
    labels: list[int]
    warmup: int
    steps: int
    say: Any


def _workload(
    store: Any, bed: Bed, workers: int, prefetch: int | None = None, rate: float = RATE
) -> Workload:
    from unstall.pipeline import ImagePipeline

    dataset = FileDataset(store, bed.keys, labels=bed.labels, transform=ImagePipeline())
    accel = SimulatedAccelerator(rate)
    extra = {"prefetch_factor": prefetch} if prefetch else {}
    return Workload(
        dataset,
        accel.step,
        batch_size=BATCH,
        num_workers=workers,
        name="whatif",
        loader_kwargs=extra,
    )


@contextlib.contextmanager
def _cache_holding(dataset: Any, order: Sequence[int], fraction: float) -> Iterator[Any]:
    """A `Cache` holding ``fraction`` of the samples, spread evenly over the order read."""
    if fraction <= 0:
        yield None
        return
    chosen = [i for k, i in enumerate(order) if int((k + 1) * fraction) > int(k * fraction)]
    sizes = [os.path.getsize(dataset.store.path(dataset.key(i))) for i in chosen]
    name = f"whatif-{random.getrandbits(32):08x}"
    cache = Cache(int(sum(sizes) * 1.2) + (4 << 20), name=name, keep=0)
    try:
        fill = FileDataset(dataset.store.inner, dataset.keys)  # same segment, unthrottled
        layer = cache.bind(fill)
        for i in range(0, len(chosen), 64):
            layer.fetch(fill, chosen[i : i + 64])
        yield cache
    finally:
        cache.close()


@contextlib.contextmanager
def _link(local: MemoryFiles, bytes_per_s: float) -> Iterator[ThrottledStore]:
    store = ThrottledStore(local, bytes_per_s=bytes_per_s)
    try:
        yield store
    finally:
        store.close()


def _measure(work: Workload, cache_fraction: float, warmup: int, steps: int) -> float:
    # the cache holds what the run reads: its burst (skipped, not timed) and read-ahead too
    burst = work.num_workers * int(work.loader_kwargs.get("prefetch_factor") or 2)
    order = step_indices(work, warmup + burst + steps + 2 * work.num_workers + 2)
    with _cache_holding(work.dataset, order, cache_fraction) as cache:
        run = loader_run("cell", work, warmup, steps, cache=cache)
    return run.samples_per_s


def run(*, quick: bool, console: Any = None) -> BenchResult:
    from unstall.data.synthetic import ensure_demo_dataset

    say = console.print if console is not None else print
    warmup, steps, images = (3, 20, 512) if quick else (5, 40, 1024)
    root = str(ensure_demo_dataset(images=2048, classes=10, seed=0, progress=False))
    local = MemoryFiles(root)
    all_keys = sorted(k for k in local.list() if k.endswith(".jpg"))[:HARD_IMAGES]
    for key in all_keys:  # into the page cache once
        local.get(key)
    all_labels = [int(k.split("/")[0].split("_")[-1]) for k in all_keys]
    bed = Bed(local, all_keys[:images], all_labels[:images], warmup, steps, say)
    stores = {THROUGHPUTS[0]: ThrottledStore(local, bytes_per_s=THROUGHPUTS[0])}
    rows: list[dict[str, Any]] = []
    try:
        base = _workload(stores[THROUGHPUTS[0]], bed, 2)
        say("analysing the base configuration (2 workers, no cache, 3 MB/s)")
        a = analyze_workload(base, warmup=warmup, steps=steps)
        rates, base_config = a.rates, a.base_config
        say(
            f"  G {rates.ingestion:.0f}/s, prep {1 / rates.prep_cpu_s:.0f}/s per worker, "
            f"storage {rates.bandwidth / 1e6:.2f} MB/s, bottleneck {a.bottleneck}"
        )
        for b in THROUGHPUTS:
            for workers in (1, 2):
                for cache in (0.0, 0.5, 1.0):
                    config = replace(base_config, workers=workers, cache=cache, bandwidth=b)
                    with _link(local, b) as store:  # a fresh link per cell: nothing queued on it
                        rows.append(_cell(config, rates, _workload(store, bed, workers), bed))
        # the prep-bound cells run fast: more steps (and images, for the burst) to time them
        hard = replace(bed, keys=all_keys, labels=all_labels, steps=max(steps, HARD_STEPS))
        rows += _hard_cells(base_config, rates, hard)
        rows += _s3_cells(rates, bed)
        rec = recommend(
            rates,
            base_config,
            len(bed.keys),
            a.runs["cold"].samples_per_s,
            cache_room_bytes=a.measurement.machine.cache_room_bytes,
        )
        w, c = rec["kwargs"]["num_workers"], rec["kwargs"].get("cache", 0.0)
        say(f"recommended: {rec['kwargs']} predicted {rec['predicted_samples_per_s']}/s")
        rec_config = replace(base_config, workers=w, cache=c)
        with _link(local, THROUGHPUTS[0]) as store:
            applied = _cell(rec_config, rates, _workload(store, bed, w), bed)
    finally:
        for store in stores.values():
            store.close()
    base_rate = round(a.runs["cold"].samples_per_s, 1)
    errors = [r["error"] for r in rows]
    median_error, max_error = statistics.median(errors), max(errors)
    rec_error = applied["error"]
    say(f"median error {median_error:.1%}, worst {max_error:.1%}; recommendation {rec_error:.1%}")
    return BenchResult(
        name="whatif",
        ratio=round(applied["measured"] / base_rate, 4),
        baseline={
            "config": "workers=2,cache=0 at 3 MB/s",
            "samples_per_s": a.runs["cold"].samples_per_s,
        },
        unstall={"config": rec["config"], "samples_per_s": applied["measured"]},
        rows=[*rows, {**applied, "case": "recommended"}],
        detail={
            "median_error": round(median_error, 4),
            "max_error": round(max_error, 4),
            "cells": len(rows),
            "recommendation": {
                **rec,
                "measured_samples_per_s": applied["measured"],
                "error": round(rec_error, 4),
            },
            "analysis": {"rates": rates.as_dict(), "stall": a.stall, "bottleneck": a.bottleneck},
            "config": {
                "rate": RATE,
                "batch_size": BATCH,
                "images": len(bed.keys),
                "hard_cells": {"images": len(all_keys), "steps": max(steps, HARD_STEPS)},
                "steps": steps,
                "throughputs": list(THROUGHPUTS),
            },
        },
        notes=[
            "predictions from the base configuration's analysis only (S3: storage probed);",
            "error = |predicted - measured| / measured; ratio: recommended over the base config",
        ],
    )


def _cell(config: Config, rates: Any, work: Workload, bed: Bed) -> dict:
    predicted = predict(rates, config).samples_per_s
    measured = _measure(work, config.cache, bed.warmup, bed.steps)
    error = abs(predicted - measured) / measured if measured else 1.0
    bed.say(
        f"  {config.label():45s} predicted {predicted:7.1f}/s measured {measured:7.1f}/s"
        f" ({error:.1%})"
    )
    return {
        "case": config.label(),
        "predicted": round(predicted, 1),
        "measured": round(measured, 1),
        "error": round(error, 4),
        "bound": predict(rates, config).bound,
    }


def _hard_cells(base: Config, rates: Any, bed: Bed) -> list[dict]:
    """Cells the analyzer used to get wrong (issue 26), prep-bound: a model faster than the
    cores can prepare for (the analysed prep CPU per sample, the model's rate as the
    question), with more workers than cores (the cores, not the workers, bound
    preparation), and with a start-up burst of more batches than the old window timed
    (``workers x prefetch_factor`` ready at once: steady state must be timed)."""
    cores = machine.cores_available()
    out = []
    b = THROUGHPUTS[1]
    fast = replace(rates, ingestion=FAST_RATE)
    for case, workers, prefetch in (
        ("workers > cores", 2 * cores, None),
        (f"burst of {2 * BURST_PREFETCH} batches", 2, BURST_PREFETCH),
    ):
        config = replace(base, workers=workers, cache=1.0, bandwidth=b)
        with _link(bed.local, b) as store:
            work = _workload(store, bed, workers, prefetch, rate=FAST_RATE)
            row = _cell(config, fast, work, bed)
        row["case"] = f"{case}, model {FAST_RATE:g}/s: {row['case']}"
        out.append(row)
    return out


#: Batches per worker ready at the start of the burst cell: 2 x 16 > the old 3 + 30 steps.
BURST_PREFETCH = 16
#: The prep-bound cells' model [samples/s]: faster than 2 cores prepare these JPEGs.
FAST_RATE = 4000.0
#: Steps and images of the prep-bound cells (at ~1,000 samples/s, 20 steps last 0.15 s).
HARD_STEPS, HARD_IMAGES = 60, 1024


def _s3_cells(rates: Any, bed: Bed) -> list[dict]:
    """Workers 1 and 2 against S3 with 50 ms latency and 2 requests in flight per worker."""
    from unstall.bench.s3_rig import BUCKET, ProxyProcess
    from unstall.stores.s3 import S3Store
    from unstall.testing import SeaweedServer

    out = []
    with SeaweedServer([BUCKET]) as server:
        up = S3Store(f"s3://{BUCKET}/train", **server.store_options())  # via its helper process
        for i in range(0, len(bed.keys), 128):
            up.put_many([(k, bed.local.get(k)) for k in bed.keys[i : i + 128]])
        up.close()
        with ProxyProcess(server.endpoint, S3_LATENCY_S) as endpoint:
            opts = server.store_options(endpoint=endpoint)
            store = S3Store(f"s3://{BUCKET}/train", **opts, max_inflight=S3_INFLIGHT)
            try:
                work = _workload(store, bed, 1)
                spare = step_indices(work, len(bed.keys) // BATCH)[-2 * BATCH :]
                probe = probe_storage(work.dataset, spare, BATCH)
                bed.say(
                    f"  S3 probe: {probe.latency_s * 1e3:.1f} ms, {probe.inflight} in flight/worker"
                )
                s3_rates = replace(
                    rates,
                    bandwidth=probe.bandwidth,
                    latency_s=probe.latency_s,
                    sample_bytes=probe.sample_bytes,
                )
                for workers in (1, 2):
                    config = Config(workers, BATCH, inflight=probe.inflight, prefetch=True)
                    row = _cell(config, s3_rates, _workload(store, bed, workers), bed)
                    row["case"] = f"s3 {S3_LATENCY_S * 1e3:.0f}ms, {row['case']}"
                    out.append(row)
            finally:
                store.close()
    return out
