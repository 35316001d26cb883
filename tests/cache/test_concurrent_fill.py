"""Processes filling the same items at once: no torn item, no item stored twice."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

import unstall
from tests.cache.conftest import run_epochs
from unstall.cache import list_caches

N, SIZE, VARY = 120, 3000, 2500


class SlowFiles(unstall.FileDataset):
    """Fetches take a while, so every filler misses the same items and races to store them."""

    def fetch(self, indices):
        time.sleep(0.002)
        return super().fetch(indices)


class NoStorage(unstall.FileDataset):
    """Fails any fetch: what it serves must come from the cache."""

    def fetch(self, indices):
        raise AssertionError(f"cache miss for {list(indices)}")


def _fill(layer, dataset, barrier, offset) -> None:
    barrier.wait()
    order = list(range(N))
    order = order[offset:] + order[:offset]
    for start in range(0, N, 8):
        got = layer.fetch(dataset, order[start : start + 8])
        want = dataset.fetch(order[start : start + 8])
        if got != want:
            raise SystemExit(3)


@pytest.mark.parametrize("policy", ["noevict", "lru"])
def test_four_processes_fill_the_same_items(make_dataset, policy):
    base = make_dataset(N, SIZE, vary=VARY)
    ds = SlowFiles(base.store, base.keys)
    truth = base.fetch(range(N))
    with unstall.Cache(1.0 if policy == "noevict" else 0.5, policy=policy) as cache:
        layer = cache.bind(ds)
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_fill, args=(layer, ds, barrier, k % 2)) for k in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]  # each got storage's bytes
        layer.check()  # no overlapping or lost space in the index
        stats = layer.stats()["cache"]
        assert stats["hits"] + stats["misses"] == 4 * N
        if policy == "lru":
            assert 0 < stats["cached_bytes"] <= stats["capacity_bytes"]
            assert stats["evictions"] > 0
            return
        # each item stored once: the allocator advanced by exactly the dataset's bytes
        assert stats["items_cached"] == N
        assert stats["cached_bytes"] == stats["used_bytes"] == sum(map(len, truth))
        assert stats["inserted"] == N
        # several processes missed the same items at once, yet each was stored once
        assert stats["misses"] > N, stats
        reader, nostorage = unstall.Cache(1.0), NoStorage(base.store, base.keys)
        check = reader.bind(nostorage)
        assert check.fetch(nostorage, list(range(N))) == truth  # byte-identical to storage
        reader.close()
    assert list_caches() == []


def test_loader_with_four_workers_caches_exact_bytes(make_dataset):
    ds = make_dataset(N, SIZE, vary=VARY)
    truth = ds.fetch(range(N))
    with unstall.Cache(1.0) as cache:
        loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, num_workers=4, cache=cache)
        first, second = run_epochs(loader, 2)
        assert sorted(first) == sorted(second) == sorted(truth)
        per_epoch = [e["cache"] for e in loader.stats()["per_epoch"]]
        assert [(e["hits"], e["misses"]) for e in per_epoch] == [(0, N), (N, 0)]
        cache.check()
        check, nostorage = unstall.Cache(1.0), NoStorage(ds.store, ds.keys)
        layer = check.bind(nostorage)
        assert layer.fetch(nostorage, list(range(N))) == truth
        check.close()


def test_threads_of_one_process_fill_the_same_items(make_dataset):
    import threading

    base = make_dataset(N, SIZE, vary=VARY)
    ds = SlowFiles(base.store, base.keys)
    with unstall.Cache(1.0) as cache:
        layer = cache.bind(ds)
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def fill(offset: int) -> None:
            try:
                _fill(layer, ds, barrier, offset)
            except BaseException as exc:  # SystemExit from a mismatch, too
                errors.append(exc)

        threads = [threading.Thread(target=fill, args=(k % 2,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        cache.check()
        stats = layer.stats()["cache"]
        assert (stats["items_cached"], stats["inserted"]) == (N, N)
        assert stats["hits"] + stats["misses"] == 4 * N
