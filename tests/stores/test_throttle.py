"""ThrottledStore: one throughput limit shared by every process reading through it."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from unstall.cache.shm import segment
from unstall.stores import LocalStore
from unstall.testing.throttle import ThrottledStore


def _read(store, keys) -> None:
    assert store.get_many(keys) == [bytes([int(k)]) * 10_000 for k in keys]


def test_limit_is_shared_across_processes(tmp_path, monkeypatch):
    # its own segment names: a timed test on the other core may hold a throttle of its own
    # (tests/cache's bench: one was seen here, its namespace and pid another test's)
    monkeypatch.setenv("UNSTALL_SHM_NAMESPACE", f"throttle{os.getpid()}")
    local = LocalStore(tmp_path)
    keys = [str(i) for i in range(20)]
    for k in keys:
        local.put(k, bytes([int(k)]) * 10_000)
    store = ThrottledStore(local, bytes_per_s=1_000_000)  # 200 kB in all: 0.2 s at best
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_read, args=(store, keys[k::2])) for k in range(2)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    elapsed = time.perf_counter() - t0
    assert [p.exitcode for p in procs] == [0, 0]
    assert 0.2 <= elapsed < 2.0
    assert store.stats()["storage"]["requests"] == 20
    assert store.stats()["storage"]["bytes"] == 200_000
    assert store.url == local.url and store.get("3") == b"\x03" * 10_000
    store.close()
    assert segment.name_prefix().endswith(f"throttle{os.getpid()}-")
    assert not [
        n
        for n in os.listdir(segment.shm_dir())
        if n.endswith("-throttle") and n.startswith(segment.name_prefix())
    ]


def test_rate_errors_name_the_value(tmp_path):
    with pytest.raises(ValueError, match=r"bytes_per_s=0 must be > 0"):
        ThrottledStore(LocalStore(tmp_path), bytes_per_s=0)
