"""Requests in flight as a knob: `S3Store.set_inflight` in the parent bounds every forked
worker's requests (on real SeaweedFS, behind a delay proxy), and ``num_workers="auto"``
turns it for a fetch-bound loop, visible in ``stats()["autotune"]``."""

from __future__ import annotations

import collections
import hashlib
import time

import pytest

import unstall
from unstall.loader.autotune import resources, rule
from unstall.stores.s3 import S3Store
from unstall.testing import DelayProxy


def as_list(batch):
    return list(batch)


def _connections_per_pid(proxy: DelayProxy) -> dict[int, int]:
    """Connections the proxy saw per client process (the pid ends each User-Agent)."""
    per_pid: collections.Counter[int] = collections.Counter()
    for agents in proxy.stats.agents.values():
        per_pid[int(next(iter(agents)).rsplit("/", 1)[1])] += 1
    return dict(per_pid)


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def test_the_parent_sets_the_requests_in_flight_of_every_worker(seaweed, s3_data):
    keys = s3_data.keys[:256]
    with DelayProxy(seaweed.endpoint, delay=0.02) as proxy:
        store = S3Store(s3_data.url, **seaweed.store_options(endpoint=proxy.endpoint))
        assert store.inflight() is None  # nothing set, nothing probed yet
        store.set_inflight(3)
        assert store.inflight() == 3
        dataset = unstall.FileDataset(store, keys, transform=_digest)
        loader = unstall.DataLoader(
            dataset, batch_size=32, num_workers=2, collate_fn=as_list, cache=False
        )
        t0 = time.perf_counter()
        got = [d for batch in loader for d in batch]
        took = time.perf_counter() - t0
        assert got == [s3_data.digests[k] for k in keys]
        # 256 requests of >= 20 ms, at most 2 workers x 3 at once: no faster than this
        assert took >= len(keys) * 0.020 / (2 * 3), took
        low = _connections_per_pid(proxy)
        assert max(low.values()) <= 4, low  # (a cancelled look-ahead may drop a connection)
        assert store.stats()["store"]["max_inflight"] == 3
        assert store.stats()["store"]["inflight_limit"] == 3
        assert store.queued() > 0  # the limit bound: requests waited for a slot
        store.set_inflight(32)  # the next pool's workers take it before their first batch
        got = [d for batch in loader for d in batch]
        assert got == [s3_data.digests[k] for k in keys]
        high = {pid: n for pid, n in _connections_per_pid(proxy).items() if pid not in low}
        assert len(high) == 2 and max(high.values()) > 3, high  # the new pool's workers
        assert store.stats()["store"]["max_inflight"] == 32
    loader.close()
    store.close()
    with pytest.raises(ValueError, match="in flight"):
        store.set_inflight(0)


def test_auto_raises_the_requests_in_flight_of_a_fetch_bound_loop(seaweed, s3_data, monkeypatch):
    monkeypatch.setattr(rule, "MAX_WORKERS", 1)  # no room for more workers: requests instead
    monkeypatch.setattr(resources.IdleMeter, "idle_cores", lambda self: 2.0)  # a quiet node
    keys = s3_data.keys[:384]
    with DelayProxy(seaweed.endpoint, delay=0.02) as proxy:
        opts = seaweed.store_options(endpoint=proxy.endpoint)
        store = S3Store(s3_data.url, **opts, max_inflight=4)  # a batch: 8 rounds of requests
        dataset = unstall.FileDataset(store, keys, transform=_digest)
        loader = unstall.DataLoader(
            dataset, batch_size=32, seed=0, num_workers="auto", collate_fn=as_list, cache=False
        )
        stats = loader.stats()["autotune"]
        for _ in range(4):
            got = [d for batch in loader for d in batch]
            assert got == [s3_data.digests[k] for k in keys]  # every sample once, in order
            stats = loader.stats()["autotune"]
            if stats["max_inflight"] > 4:
                break
    assert "max_inflight" in stats["tuning"]
    changes = [h for h in stats["history"] if h["max_inflight"][0] != h["max_inflight"][1]]
    assert changes, stats["history"]
    first = changes[0]
    assert first["max_inflight"] == [4, 8] and first["why"] == "loop waits on requests"
    assert first["num_workers"][0] == first["num_workers"][1]  # no new pool for it
    assert stats["max_inflight"] >= 8
    assert store.stats()["store"]["max_inflight"] == stats["max_inflight"]
    loader.close()
    store.close()
