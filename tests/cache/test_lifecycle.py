"""Segments outlive no one: killed jobs' segments are reclaimed; too little shm never crashes."""

from __future__ import annotations

import errno
import os
import signal
import time

import pytest

import unstall
from tests import forked
from tests.cache.conftest import run_epochs, sample_bytes
from tests.cache.helpers import start_job
from unstall.cache import SharedMemoryWarning, clear_caches, list_caches
from unstall.cache.shm import segment

N, SIZE = 160, 1024


@pytest.fixture(scope="module")
def server():
    """The killed jobs start forked from here (`tests.forked`): torch imported once."""
    with forked.server() as ctx:
        yield ctx


def _kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def test_killed_jobs_segment_is_reclaimed_and_reused(make_dataset, server):
    ds = make_dataset(N, SIZE)
    proc, _report = start_job(server, ds.store.root, N, 0.5)
    _kill(proc)  # SIGKILL: no cleanup ran
    (seg,) = list_caches()
    assert seg["users_alive"] == [] and seg["items_cached"] == N // 2
    with unstall.Cache(0.5) as cache:
        loader = unstall.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, cache=cache)
        (served,) = run_epochs(loader, 1)
        stats = loader.stats()
        assert sorted(served) == sorted(sample_bytes(i, SIZE) for i in range(N))
        assert stats["cache"]["opened"] == "reclaimed" and stats["cache"]["reclaims"] == 1
        # the dead job's items are kept: this job hits from its first epoch
        assert (stats["per_epoch"][0]["cache"]["hits"], stats["cache"]["items_cached"]) == (
            N // 2,
            N // 2,
        )
        assert [s["users_alive"] for s in list_caches()] == [[os.getpid()]]
        cache.check()
    assert list_caches() == []


def test_killed_jobs_segment_with_another_capacity_is_replaced(make_dataset, server):
    ds = make_dataset(N, SIZE)
    proc, _report = start_job(server, ds.store.root, N, 0.25)
    _kill(proc)
    with unstall.Cache(0.5) as cache:
        layer = cache.bind(ds)
        stats = layer.stats()["cache"]
        assert (stats["opened"], stats["capacity_bytes"], stats["items_cached"]) == (
            "created",
            N // 2 * SIZE,
            0,
        )


def test_clear_removes_stale_segments_only(make_dataset, shm_namespace, server):
    ds = make_dataset(N, SIZE)
    proc, report = start_job(server, ds.store.root, N, 0.5)
    stale = report["segments"][0]["name"]
    _kill(proc)
    with unstall.Cache(0.5, name="live") as live:
        live.bind(ds)
        assert clear_caches() == [stale]
        assert [s["name"] for s in list_caches()] == [f"{shm_namespace}live"]
        assert clear_caches(f"{shm_namespace}live") == []  # in use: kept
    assert list_caches() == []


def test_a_killed_jobs_segment_is_released_first_when_the_kept_limits_are_crossed(
    make_dataset, monkeypatch, server
):
    """A killed job (the OOM killer's SIGKILL) ran no release: its segment has no keep time.
    It is not left holding RAM for good: the sweep takes it before any kept segment."""
    from unstall.cache.shm import keep

    killed = make_dataset(N, SIZE, sub="killed")
    proc, report = start_job(server, killed.store.root, N, 0.5)
    dead = report["segments"][0]["name"]
    _kill(proc)
    kept_ds = make_dataset(N, SIZE, sub="kept")
    with unstall.Cache(1.0, keep=60) as cache:  # released with a keep time: kept
        run_epochs(unstall.DataLoader(kept_ds, batch_size=16, cache=cache), 1)
    idle = {k["name"]: k["abandoned"] for k in keep.idle_segments()}
    (kept,) = [name for name, abandoned in idle.items() if not abandoned]
    assert idle == {dead: True, kept: False}
    assert [k["name"] for k in keep.kept_segments()] == [kept]
    assert keep.sweep() == []  # within the limits: both stay (the next job may reclaim it)
    size = {k["name"]: k["size"] for k in keep.idle_segments()}
    monkeypatch.setenv("UNSTALL_CACHE_KEEP_MAX", str(size[kept] + size[dead] // 2))
    assert keep.sweep() == [dead]  # over the cap: the killed job's goes, the kept one stays
    assert [s["name"] for s in list_caches()] == [kept]
    assert keep.sweep(now=time.time() + 61) == [kept]  # the kept one at its time
    assert list_caches() == []


def test_too_little_shared_memory_warns_and_caches_what_fits(make_dataset, monkeypatch):
    from unstall.cache import MIN_CAPACITY, SHM_MARGIN

    free = SHM_MARGIN + MIN_CAPACITY + 64 * 1024  # room for a small cache only
    monkeypatch.setattr(segment, "free_bytes", lambda directory: free)
    with pytest.warns(
        SharedMemoryWarning, match=rf"has [0-9.]+ MiB \({free} bytes\) free: caching"
    ):
        cache = unstall.Cache(100 * 2**20)  # more than the dataset; clamped, still too big
        big = make_dataset(1200, SIZE, sub="big")
        loader = unstall.DataLoader(big, batch_size=32, shuffle=True, cache=cache)
    epochs = run_epochs(loader, 2)
    assert all(sorted(e) == sorted(sample_bytes(i, SIZE) for i in range(1200)) for e in epochs)
    stats = loader.stats()["cache"]
    assert stats["enabled"] and 0 < stats["items_cached"] < 1200
    assert stats["capacity_bytes"] < 1200 * SIZE and "reason" in stats
    second = loader.stats()["per_epoch"][1]["cache"]
    assert second["hits"] == stats["items_cached"]  # what fits, hit every later epoch
    cache.close()


@pytest.mark.parametrize("how", ["probe", "fallocate"])
def test_no_shared_memory_runs_uncached(make_dataset, monkeypatch, how):
    ds = make_dataset(N, SIZE)
    if how == "probe":
        monkeypatch.setattr(segment, "free_bytes", lambda directory: 0)
        pattern = r"needs .* but .* has 0 B \(0 bytes\) free: running uncached"
    else:

        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
        pattern = r"cannot reserve .* No space left on device; running uncached"
    with pytest.warns(SharedMemoryWarning, match=pattern), unstall.Cache(0.5) as cache:
        loader = unstall.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, cache=cache)
        epochs = run_epochs(loader, 2)
        stats = loader.stats()
    assert all(sorted(e) == sorted(sample_bytes(i, SIZE) for i in range(N)) for e in epochs)
    assert stats["cache"]["enabled"] is False and stats["cache"]["hits"] == 0
    assert ds.store.bypass_page_cache is False  # uncached: the page cache still helps
    assert os.listdir(segment.shm_dir()) == [
        n for n in os.listdir(segment.shm_dir()) if not n.startswith(segment.name_prefix())
    ]


def test_bind_reads_local_files_around_the_page_cache(make_dataset):
    ds = make_dataset(8, 100)
    assert ds.store.bypass_page_cache is False
    with unstall.Cache(1.0) as cache:
        cache.bind(ds)
        assert ds.store.bypass_page_cache is True


def test_clear_removes_half_created_segments_of_dead_processes(shm_namespace):
    dead = f"{shm_namespace}abc.999999999.tmp"  # no such pid
    mine = f"{shm_namespace}abc.{os.getpid()}.tmp"
    for name in (dead, mine):
        open(os.path.join(segment.shm_dir(), name), "wb").close()
    assert clear_caches() == [dead]
    os.unlink(os.path.join(segment.shm_dir(), mine))


def test_second_cache_with_another_capacity_shares_the_first(make_dataset):
    ds = make_dataset(N, SIZE)
    with unstall.Cache(0.5) as first, unstall.Cache(0.25) as second:
        first.bind(ds)
        with pytest.warns(
            SharedMemoryWarning, match=r"already open with capacity 80.0 KiB \(81920 "
        ):
            layer = second.bind(ds)
        assert layer.stats()["cache"]["capacity_bytes"] == N // 2 * SIZE
