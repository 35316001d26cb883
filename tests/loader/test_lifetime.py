"""A loader's lifetime: freed as soon as the last reference goes, workers gone at once."""

from __future__ import annotations

import gc
import multiprocessing.queues
import threading
import time
import weakref

import psutil
import pytest

import unstall
from tests.conftest import IdDataset, write_jpegs
from unstall.cache import list_caches


def workers_left(before: set[int]) -> list[int]:
    """This process's children that were not there ``before`` and still run."""
    return [
        c.pid
        for c in psutil.Process().children()
        if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE
    ]


@pytest.mark.parametrize("seed", [None, 0])
def test_loader_with_persistent_workers_deleted_mid_epoch_exits_at_once(seed):
    # A known order (seed) once made the loader part of a reference cycle: only the garbage
    # collector freed it, after stopping its queues' threads, so each persistent worker
    # waited for torch's 5 s timeout (10 s to delete a loader with 2 workers).
    before = {c.pid for c in psutil.Process().children()}
    gc.disable()
    try:
        loader = unstall.DataLoader(
            IdDataset(37), batch_size=3, shuffle=True, num_workers=2, persistent_workers=True,
            seed=seed, rank=1, world_size=2,
        )  # fmt: skip
        it = iter(loader)
        got = next(it).tolist() + next(it).tolist()
        assert got == loader.order.indices(0)[:6].tolist()
        assert len(workers_left(before)) == 2
        alive = weakref.ref(loader)
        t0 = time.monotonic()
        del it, loader
        assert alive() is None  # freed by its reference count, no collector needed
        assert time.monotonic() - t0 < 3.0
    finally:
        gc.enable()
    assert workers_left(before) == []


def _cache_names() -> set[tuple[str, str]]:
    return {(c.get("tier", "disk"), c["name"]) for c in list_caches()}


def test_cache_given_as_a_size(tmp_path):
    root = write_jpegs(tmp_path, 24, classes=3, seed=2)
    others = _cache_names()  # other jobs' kept segments and disk tiers: not this test's
    loader = unstall.DataLoader(
        unstall.ImageFolder(root), batch_size=4, shuffle=True, seed=1, num_workers=2,
        cache="8MiB",
    )  # fmt: skip
    for epoch in range(2):
        labels = sorted(int(y) for _x, ys in loader for y in ys)
        assert labels == sorted(i % 3 for i in range(24)), epoch
    caches = [e["cache"] for e in loader.stats()["per_epoch"]]
    assert [(c["hits"], c["misses"]) for c in caches] == [(0, 24), (24, 0)]
    # this loader's segment, listed while it lives (a parallel test's new segments are not
    # this test's: compare by name, not by what appeared meanwhile)
    own = ("ram", loader.stats()["cache"]["name"])
    assert own in _cache_names() - others
    del loader
    gc.collect()
    assert own not in _cache_names()  # the loader made the cache: it goes with it


def test_cache_of_the_wrong_kind_names_the_setting(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    with pytest.raises(TypeError, match=r"cache=\[1\]: pass unstall.Cache"):
        unstall.DataLoader(unstall.FileDataset(tmp_path, ["a"]), cache=[1])


def test_a_dataset_error_leaves_no_reference_cycle(tmp_path):
    # torch's re-raise holds the exception in a local of a finished frame: a cycle through
    # the traceback that kept the iterator and its workers until the garbage collector ran
    # (then 5 s per worker). The error is caught, the loader dropped: all of it goes at once.
    root = write_jpegs(tmp_path, 30, classes=3, seed=1)
    dataset = unstall.ImageFolder(root)
    (root / "c1" / "004.jpg").unlink()
    before = {c.pid for c in psutil.Process().children()}
    gc.disable()
    try:
        loader = unstall.DataLoader(dataset, batch_size=5, num_workers=2)
        alive = weakref.ref(loader)
        with pytest.raises(unstall.SampleError, match=r"c1/004\.jpg") as info:
            list(loader)
        error = info.value
        assert error.key == dataset.key(error.index) == "c1/004.jpg"
        assert f"dataset index {error.index}" in "".join(error.__notes__)
        del info, error, loader
        assert alive() is None
    finally:
        gc.enable()
    assert workers_left(before) == []


@pytest.mark.parametrize("persistent", [False, True])
def test_an_iterator_left_in_a_reference_cycle_stops_its_workers_at_once(persistent):
    # Freed by the garbage collector (a cycle: here a dict that holds itself; in real code
    # often a kept exception's traceback), torch's iterator stops its workers only after the
    # collector stopped its queues' threads: each worker then waits out torch's 5 s timeout
    # (torch's own loader: 10.1 s in gc.collect() here). unstall's finalizer stops them first.
    before = {c.pid for c in psutil.Process().children()}
    gc.collect()
    gc.disable()
    try:
        loader = unstall.DataLoader(
            IdDataset(64), batch_size=4, num_workers=2, persistent_workers=persistent
        )
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        assert len(workers_left(before)) == 2
        cycle: dict = {"it": it, "loader": loader}
        cycle["self"] = cycle
        alive = weakref.ref(loader)
        del it, loader, cycle
        assert alive() is not None  # only the collector can free it
    finally:
        gc.enable()
    t0 = time.monotonic()
    gc.collect()
    assert alive() is None
    assert time.monotonic() - t0 < 2.0
    deadline = time.monotonic() + 5
    while workers_left(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers_left(before) == []


@pytest.mark.parametrize("persistent", [False, True])
def test_a_loader_freed_mid_epoch_leaves_no_queue_thread_running(monkeypatch, persistent):
    # torch closes its index queues without joining their feeder threads: each ends a
    # moment later on its own, so a thread count taken right after the loader went once
    # saw a QueueFeederThread (tests/gpu/test_hybrid.py's shutdown test, 1 run in 7). The
    # feeder's end is slowed here by 0.3 s, so the race goes the same way every time.
    real_feed = multiprocessing.queues.Queue._feed

    def slow_feed(*args: object) -> None:
        real_feed(*args)
        time.sleep(0.3)

    monkeypatch.setattr(multiprocessing.queues.Queue, "_feed", staticmethod(slow_feed))
    threads_before = set(threading.enumerate())
    loader = unstall.DataLoader(
        IdDataset(64), batch_size=4, num_workers=2, persistent_workers=persistent
    )
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    # one per worker's index queue, in this process (an earlier test's loader, not yet
    # collected, may still have its own)
    new = set(threading.enumerate()) - threads_before
    assert [t.name for t in new] == ["QueueFeederThread"] * 2
    del it, loader
    gc.collect()
    assert [t.name for t in set(threading.enumerate()) - threads_before] == []
