"""Lookups cost microseconds at most: negligible next to any storage fetch."""

from __future__ import annotations

import time

import unstall


def test_lookup_is_cheap(make_dataset):
    n = 2000
    ds = make_dataset(n, 256)
    with unstall.Cache(0.5) as cache:
        layer = cache.bind(ds)
        for start in range(0, n, 100):
            layer.fetch(ds, list(range(start, start + 100)))
        hits = list(range(n // 2))[:500]
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            got = layer.fetch(ds, hits)
            best = min(best, (time.perf_counter() - t0) / len(hits))
        assert got == ds.fetch(hits)
        assert best < 20e-6, f"{best * 1e9:.0f} ns per cached item"
