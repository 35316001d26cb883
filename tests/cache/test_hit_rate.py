"""Per-epoch hit rates under per-epoch shuffling: no-eviction reaches C/N, LRU falls below."""

from __future__ import annotations

import pytest

import unstall
from tests.cache.conftest import run_epochs, sample_bytes

N, SIZE = 240, 512


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_noevict_hit_rate_is_c_over_n_from_epoch_2(make_dataset, fraction):
    ds = make_dataset(N, SIZE)
    with unstall.Cache(fraction) as cache:
        loader = unstall.DataLoader(
            ds, batch_size=16, shuffle=True, num_workers=2, persistent_workers=True, cache=cache
        )
        epochs = run_epochs(loader, 4)
        stats = loader.stats()
        cache.check()
    for served in epochs:  # every sample, intact, each epoch in a fresh order
        assert sorted(served) == sorted(sample_bytes(i, SIZE) for i in range(N))
    assert epochs[1] != epochs[2]
    per_epoch = [e["cache"] for e in stats["per_epoch"]]
    assert [(e["hits"], e["misses"]) for e in per_epoch[:1]] == [(0, N)]
    for e in per_epoch[1:]:
        assert e["hits"] == int(fraction * N)  # the limit C/N, exactly
        assert abs(e["hit_rate"] - fraction) <= 0.02 * fraction
    total = stats["cache"]
    assert total["items_cached"] == int(fraction * N)
    assert total["cached_bytes"] == int(fraction * N) * SIZE
    assert total["capacity_bytes"] == int(fraction * N) * SIZE
    assert total["fill_fraction"] == 1.0
    assert total["policy"] == "noevict" and total["evictions"] == 0


def test_lru_at_the_same_capacity_hits_less(make_dataset):
    ds = make_dataset(N, SIZE)
    rates = {}
    for policy in ("noevict", "lru"):
        with unstall.Cache(0.5, policy=policy) as cache:
            loader = unstall.DataLoader(ds, batch_size=16, shuffle=True, seed=3, cache=cache)
            epochs = run_epochs(loader, 4)
            assert all(sorted(s) == sorted(epochs[0]) for s in epochs)
            rates[policy] = [e["cache"]["hit_rate"] for e in loader.stats()["per_epoch"][1:]]
            cache.check()
    assert rates["noevict"] == [0.5, 0.5, 0.5]
    # simulation of uniform permutations: LRU ~15 % at C/N = 0.5 (DESIGN.md section 2)
    assert all(0.0 < r < 0.35 for r in rates["lru"]), rates
