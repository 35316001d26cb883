"""Items carry their source's version: a file changed since it was cached is a miss, not served."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import unstall
from tests import forked
from unstall.cache import clear_caches, list_caches
from unstall.cache.lru import lru_check, lru_get_many, lru_put_many
from unstall.cache.shm.index import Layout

from .conftest import run_epochs
from .helpers import env

N, SIZE = 8, 4096

#: A job in its own process: reads every sample once (epoch 1), reports what it got.
JOB = r"""
import json, sys
import unstall
root, n, ram, disk = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ds = unstall.FileDataset(root, [f"{i:05d}.bin" for i in range(n)])
cache = unstall.Cache(ram if ram != "-" else None, disk=disk if disk != "-" else None)
loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, cache=cache)
served = [bytes(raw).hex() for batch in loader for raw in batch]
stats = loader.stats()["per_epoch"][0]["cache"]
print(json.dumps({"served": sorted(served), "cache": stats}), flush=True)
cache.close()
"""


def content(i: int, generation: int) -> bytes:
    """Sample ``i`` of a generation: same size every time, different bytes."""
    return bytes([(i * 31 + generation * 7 + 1) % 251]) * SIZE


def write(root: Path, generation: int, which: range | list[int] = range(N)) -> None:
    """Rewrite files in place (same names, same sizes, new bytes): the directory's mtime
    does not change, only the files'."""
    time.sleep(0.02)  # past the file system's timestamp tick
    for i in which:
        with open(root / f"{i:05d}.bin", "r+b" if (root / f"{i:05d}.bin").exists() else "wb") as f:
            f.write(content(i, generation))


def expected(generations: list[int]) -> list[str]:
    return sorted(content(i, g).hex() for i, g in enumerate(generations))


@pytest.fixture(scope="module")
def jobs():
    """The module's fork server (`tests.forked`): each job, a process of its own, forked from
    one that imported torch and unstall once."""
    with forked.server() as ctx:
        yield ctx


def job(jobs, root: Path, *, ram: str = "64MiB", disk: str = "-", keep_s: float = 0) -> dict:
    """One job in its own process over ``root``; what it served and its cache's figures."""
    environ = env()
    environ["UNSTALL_CACHE_KEEP_S"] = str(keep_s)
    argv = ["-c", JOB, str(root), str(N), ram, disk]
    output = root.parent / f"job-{time.monotonic_ns()}"
    done = forked.run(jobs, argv, env=environ, output=output, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    write(path, 0)
    return path


def test_files_rewritten_while_a_job_holds_the_cache_are_not_served_to_the_next(root, jobs):
    ds = unstall.FileDataset(root, [f"{i:05d}.bin" for i in range(N)])
    with unstall.Cache("64MiB") as cache:
        loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, cache=cache)
        _first, second = run_epochs(loader, 2)
        assert sorted(bytes(r).hex() for r in second) == expected([0] * N)
        assert loader.stats()["per_epoch"][1]["cache"]["hits"] == N

        write(root, 1)  # same names, same sizes, new bytes; the first job still runs
        other = job(jobs, root)
        assert other["served"] == expected([1] * N)
        assert (other["cache"]["hits"], other["cache"]["stale"]) == (0, N)

        # the running job keeps going: each sample exactly once an epoch, bytes as on disk
        (third,) = run_epochs(loader, 1)
        assert sorted(bytes(r).hex() for r in third) == expected([1] * N)
        assert sorted(ds.fetch(range(N))) == sorted(bytes(r) for r in third)
        cache.check()
        again = job(jobs, root)  # a later job: the new bytes, cached by the second job and left
        assert again["served"] == expected([1] * N)  # alone by the first (an older listing)
        assert (again["cache"]["hits"], again["cache"]["stale"]) == (N, 0)


def test_a_file_changed_between_two_runs_with_the_disk_tier_is_fetched_again(root, jobs):
    first = job(jobs, root, ram="-", disk="64MiB")
    assert first["served"] == expected([0] * N)
    assert first["cache"]["disk"]["inserted"] == N

    write(root, 1, [3])  # one file changed between the runs, in place
    second = job(jobs, root, ram="-", disk="64MiB")
    assert second["served"] == expected([0, 0, 0, 1, 0, 0, 0, 0])
    disk = second["cache"]["disk"]
    assert (disk["hits"], disk["stale"], disk["misses"], disk["inserted"]) == (N - 1, 1, 1, 1)

    third = job(jobs, root, ram="-", disk="64MiB")  # the changed item was stored again
    assert third["served"] == expected([0, 0, 0, 1, 0, 0, 0, 0])
    assert (third["cache"]["disk"]["hits"], third["cache"]["disk"]["stale"]) == (N, 0)


def test_a_kept_segment_serves_the_next_job_from_its_first_epoch_but_no_changed_file(root, jobs):
    try:
        first = job(jobs, root, keep_s=60)
        assert first["served"] == expected([0] * N)
        (seg,) = [c for c in list_caches() if c["tier"] == "ram"]
        assert seg["users_alive"] == [] and seg["kept_until"] > time.time() + 30
        assert seg["items_cached"] == N

        second = job(jobs, root, keep_s=60)  # back to back: all hits from the first epoch
        assert second["served"] == expected([0] * N)
        assert (second["cache"]["hits"], second["cache"]["opened"]) == (N, "kept")

        write(root, 1, [5])
        third = job(jobs, root, keep_s=60)
        assert third["served"] == expected([0, 0, 0, 0, 0, 1, 0, 0])
        c = third["cache"]
        assert (c["hits"], c["stale"], c["misses"], c["inserted"]) == (N - 1, 1, 1, 1)
        assert c["stale_bytes"] == SIZE
    finally:
        removed = clear_caches()
    assert len([r for r in removed if not r.endswith("(disk)")]) == 1


def test_kept_segments_are_released_over_the_cap_when_expired_and_when_room_is_needed(
    tmp_path, monkeypatch
):
    from unstall.cache.shm import keep, segment

    def fill(sub: str) -> None:
        (tmp_path / sub).mkdir()
        for i in range(N):
            (tmp_path / sub / f"{i:05d}.bin").write_bytes(content(i, 0))
        ds = unstall.FileDataset(tmp_path / sub, [f"{i:05d}.bin" for i in range(N)])
        with unstall.Cache("64MiB", keep=60) as cache:
            run_epochs(unstall.DataLoader(ds, batch_size=4, cache=cache), 1)

    def kept() -> list[str]:
        return [k["name"] for k in keep.kept_segments()]

    fill("a")
    (a,) = kept()
    size = os.stat(segment.segment_path(a)).st_blocks * 512
    monkeypatch.setenv("UNSTALL_CACHE_KEEP_MAX", str(size + size // 2))  # room for one
    fill("b")  # kept too; over the cap together: the older one (a) is released
    (b,) = kept()
    assert b != a and not os.path.exists(segment.segment_path(a))

    assert keep.sweep(now=time.time() + 30) == []  # not yet expired
    free = segment.free_bytes(segment.shm_dir())
    assert keep.sweep(need_bytes=free + 1) == [b]  # a new segment needs the room
    fill("c")
    (c,) = kept()
    assert keep.sweep(now=time.time() + 61) == [c]  # time is up
    assert kept() == []


def test_keep_settings_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="keep=-1"):
        unstall.Cache("1MiB", keep=-1)
    monkeypatch.setenv("UNSTALL_CACHE_KEEP_S", "soon")
    with pytest.raises(ValueError, match="UNSTALL_CACHE_KEEP_S='soon'"):
        unstall.cache.shm.keep.keep_seconds()


@pytest.mark.parametrize("policy", ["noevict", "lru"])
def test_a_stale_item_is_a_miss_then_replaced_and_the_index_stays_consistent(policy, shm_namespace):
    from unstall.cache.shm import lifecycle, segment

    page = 256 if policy == "lru" else 0
    layout = Layout(n_items=4, capacity=1 << 16, policy=policy, page_size=page)
    path = segment.segment_path(segment.segment_name("ab" * 16, policy))
    cache, _slot, how = lifecycle.open_or_create(path, layout, "ab" * 16, 4096, group=1)
    try:
        assert how == "created"
        v1, v2 = np.array([11, 12, 13, 14]), np.array([11, 22, 13, 14])
        items = [(i, bytes([i]) * (100 + i)) for i in range(4)]
        lru = policy == "lru"
        put = (lambda it, v: lru_put_many(cache, it, v)) if lru else cache.put_many
        get = (lambda ix, v: lru_get_many(cache, ix, v)) if lru else cache.lookup
        assert put(items, v1) == (4, sum(len(r) for _, r in items))
        got, stale = get([0, 1, 2, 3], v2)
        assert (
            got[1] is None
            and stale == 1
            and [bytes(g) for g in got if g]
            == [
                items[0][1],
                items[2][1],
                items[3][1],
            ]
        )
        assert put(items, v2) == (1, 101)  # only the stale one is stored again
        got, stale = get([1], v2[[1]])
        assert (bytes(got[0]), stale) == (items[1][1], 0)
        assert get([1], v1[[1]]) == ([None], 1)  # an older reader: stale for it
        assert put(items[1:2], v1[[1]]) == (1, 101)  # a writer bound no later: replaces
        if lru:
            assert lru_put_many(cache, items[1:2], v2[[1]], -1) == (0, 0)
        else:
            assert cache.put_many(items[1:2], v2[[1]], -1) == (0, 0)  # bound before: leaves it
        assert get([1], v2[[1]]) == ([None], 1)
        if lru:
            lru_check(cache)
        else:
            cache.check()
    finally:
        lifecycle.release(cache, group=1)


def test_a_kept_segment_is_removed_when_its_time_is_up_with_no_job_running(root, jobs):
    from unstall.cache.shm import index as shm_cache
    from unstall.cache.shm import reaper

    assert (reaper.MAGIC, reaper.VERSION) == (shm_cache.MAGIC, shm_cache.VERSION)
    assert reaper.H_KEEP_UNTIL == shm_cache.H_KEEP_UNTIL
    first = job(jobs, root, keep_s=1)  # the job exits; its segment is kept 1 s, then reaped
    assert first["served"] == expected([0] * N)
    deadline = time.monotonic() + 15
    while [c for c in list_caches() if c["tier"] == "ram"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [c for c in list_caches() if c["tier"] == "ram"] == []


def test_files_changed_mid_epoch_leave_the_epoch_exactly_once_and_the_next_job_current(root, jobs):
    """Every sample's bytes name it (and its generation): the running epoch serves each
    sample once, old or new bytes; the next job gets only new ones."""
    names = {content(i, g): (i, g) for i in range(N) for g in (0, 1)}
    assert len(names) == 2 * N
    ds = unstall.FileDataset(root, [f"{i:05d}.bin" for i in range(N)])
    with unstall.Cache("64MiB") as cache:
        loader = unstall.DataLoader(ds, batch_size=2, shuffle=True, num_workers=2, cache=cache)
        run_epochs(loader, 1)  # all cached
        served = []
        for n, batch in enumerate(loader):
            served += [names[bytes(raw)] for raw in batch]
            if n == 1:
                write(root, 1)  # every file changes in the middle of the epoch
        assert sorted(i for i, _ in served) == list(range(N))
        cache.check()
    assert job(jobs, root)["served"] == expected([1] * N)
