"""The what-if model: each cap, the binding one, cache hit rates, the --what-if parser."""

from __future__ import annotations

from dataclasses import replace

import pytest

from unstall.analysis.measure.machine import read_machine
from unstall.analysis.model.predict import (
    Config,
    hit_rate,
    in_order_share,
    loop_cap,
    predict,
    prep_capacity,
)
from unstall.analysis.model.whatif import grid, parse_what_if
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend.search import recommend

RATES = Rates(
    ingestion=1000.0,
    prep_cpu_s=0.004,
    cores=4.0,
    sample_bytes=100_000.0,
    bandwidth=20e6,
    latency_s=0.01,
)


def test_each_cap_and_the_binding_one():
    # 2 workers fetching a batch of 16 in one request: 10 ms + 80 ms, then prepare 64 ms
    p = predict(RATES, Config(workers=2, batch_size=16, inflight=16))
    assert p.caps["compute"] == 1000
    assert p.caps["prep"] == pytest.approx(500)  # 2 workers / 4 ms
    assert p.caps["fetch"] == pytest.approx(200)  # 20 MB/s / 100 KB
    assert p.caps["workers"] == pytest.approx(2 * 16 / (0.01 + 0.08 + 0.064))
    assert p.bound == "fetch" and p.samples_per_s == pytest.approx(200)
    # the whole dataset cached: storage drops out, prep binds at min(workers, cores) / cpu
    fast_model = replace(RATES, ingestion=5000.0)
    p = predict(fast_model, Config(workers=8, batch_size=16, cache=1.0, inflight=16))
    assert p.bound == "prep" and p.samples_per_s == pytest.approx(1000, rel=1e-6)
    # half cached with no eviction: storage serves half the samples
    p = predict(RATES, Config(workers=8, batch_size=16, cache=0.5, inflight=16, prefetch=True))
    assert p.caps["fetch"] == pytest.approx(400)


def test_the_loops_wait_for_a_core_grows_with_the_workers_load():
    # the file cache's job on one core: G 390/s, 1 ms of worker CPU a sample, 15.5 ms a file
    # from storage; its loop waited 0.1 ms a sample for the core while the workers kept
    # 0.24 of it busy (240/s measured)
    job = Rates(390.0, 0.001, 1.0, 32_500.0, 1e12, 0.0155)
    timed = replace(job, loop_runq_s=0.0001, loop_runq_load=0.24)
    cached = Config(workers=4, batch_size=8, cache=0.75)
    assert predict(job, cached).caps["compute"] == 390.0  # not measured: G as it was
    assert loop_cap(timed, 240.0) == pytest.approx(1 / (1 / 390 + 0.0001))  # as measured
    p = predict(timed, cached)
    g = p.caps["compute"]
    assert p.bound == "compute" and 340 < g < 1 / (1 / 390 + 0.0001)  # busier cores: longer
    assert g == pytest.approx(loop_cap(timed, g), rel=1e-3)  # the rate it prices at
    assert loop_cap(timed, 2000.0) == pytest.approx(1 / (1 / 390 + 4 * 0.0001))  # at most 4x
    # preparing elsewhere (a GPU, remote workers) leaves the loop's core alone; P ignores it
    assert predict(replace(timed, prep_cpu_s=0.0), cached).caps["compute"] == 390.0
    assert prep_capacity(timed, cached) == prep_capacity(job, cached)


def test_latency_bound_store_follows_littles_law():
    slow = Rates(1e4, 1e-4, 8.0, 75_000.0, 1e11, 0.05)
    for workers, inflight in ((1, 2), (2, 2), (4, 8)):
        p = predict(slow, Config(workers, 8, inflight=inflight, prefetch=True))
        assert p.samples_per_s == pytest.approx(workers * inflight / 0.05, rel=0.01)
        assert p.bound == "fetch"


def test_page_cache_hits_far_less_than_no_eviction():
    assert hit_rate(0.5, noevict=True) == 0.5
    assert hit_rate(0.5, noevict=False) == pytest.approx(0.154)
    assert hit_rate(1.0, noevict=False) == 1.0
    on = predict(RATES, Config(2, 16, cache=0.5, inflight=16))
    off = predict(RATES, Config(2, 16, cache=0.5, noevict=False, inflight=16))
    assert on.samples_per_s > off.samples_per_s


def test_what_if_parser():
    base = Config(workers=2, batch_size=16, inflight=16, prefetch=True)
    c = parse_what_if("cache=0.5, workers=8, bandwidth=200MB/s, latency=20ms", base)
    assert (c.cache, c.workers, c.bandwidth, c.latency_s) == (0.5, 8, 200e6, 0.02)
    off = parse_what_if("remedies=off", base)
    assert (off.noevict, off.prefetch, off.inflight) == (False, False, 1)
    with pytest.raises(ValueError, match="speed"):
        parse_what_if("speed=3", base)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_what_if("workers", base)
    with pytest.raises(ValueError, match="cache"):
        parse_what_if("cache=2", base)


def test_grid_and_recommendation():
    base = Config(workers=2, batch_size=16, inflight=16)
    rows = grid(RATES, base, 10_000)
    assert len(rows) >= 8 and {r["cache"] for r in rows} >= {0.0, 0.5, 1.0}
    room = read_machine().cache_room_bytes  # this node's shared memory, as the analyzer reads it
    rec = recommend(RATES, base, 10_000, measured=200.0, cache_room_bytes=room)
    assert rec["predicted_samples_per_s"] > 200 and rec["predicted_speedup"] > 1
    assert rec["kwargs"]["num_workers"] >= 1
    assert rec["kwargs"].get("cache", 0) <= rec["limits"]["max_cache_fraction"]


def test_in_order_delivery_idles_workers_by_the_spread_of_their_batches():
    # steady batches lose nothing; one worker is never held by another's late batch
    assert in_order_share(2, 2, 0.0, 0.3) == 1.0 and in_order_share(1, 2, 0.8, 0.3) == 1.0
    kept = [in_order_share(2, 2, cv, 0.15) for cv in (0.1, 0.3, 0.62, 1.0)]
    assert kept == sorted(kept, reverse=True) and kept[0] > 0.99
    assert 0.95 < kept[1] < 0.99 and 0.85 < kept[2] < 0.93 and kept[3] < 0.87
    # a deeper prefetch holds less; more workers, each a share of the order, hold more
    assert in_order_share(2, 4, 0.62, 0.15) > kept[2] > in_order_share(4, 2, 0.62, 0.15)
    # the model's price: the workers' caps scaled by it, the model's and storage's not
    rates = replace(RATES, ingestion=20000.0, bandwidth=1e12, latency_s=0.0)
    steady = predict(rates, Config(workers=2, batch_size=16))
    spread = predict(replace(rates, batch_cv=0.62), Config(workers=2, batch_size=16))
    step = (16 / 20000.0) / (16 * 0.004)  # the loop's step, in a worker's batch time
    share = in_order_share(2, 2, 0.62, step)
    assert spread.caps["prep"] == pytest.approx(steady.caps["prep"] * share)
    assert spread.caps["workers"] == pytest.approx(steady.caps["workers"] * share)
    assert spread.caps["compute"] == steady.caps["compute"]
    assert spread.caps["fetch"] == steady.caps["fetch"]
    deep = predict(
        replace(rates, batch_cv=0.62), Config(workers=2, batch_size=16, prefetch_factor=8)
    )
    assert spread.samples_per_s < deep.samples_per_s < steady.samples_per_s
