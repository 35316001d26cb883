"""One segment per node: a second process hits from its first epoch; memory is used once."""

from __future__ import annotations

import os

import unstall
from tests.cache.conftest import run_epochs
from tests.cache.helpers import run_job
from unstall.cache import list_caches
from unstall.cache.shm import segment
from unstall.cache.shm.index import Layout

N, SIZE = 200, 1024


def test_second_process_hits_from_its_first_epoch(make_dataset, shm_namespace):
    ds = make_dataset(N, SIZE)
    with unstall.Cache(0.5) as cache:
        loader = unstall.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, cache=cache)
        run_epochs(loader, 1)
        assert loader.stats()["cache"]["items_cached"] == N // 2

        other = run_job(ds.store.root, N, 0.5)  # a separate job on the same dataset

        assert other["intact"] is True
        assert (other["epoch1"]["hits"], other["epoch1"]["misses"]) == (N // 2, N // 2)
        assert other["epoch1"]["opened"] == "attached"
        # one segment, of one cache's size, seen by both processes while both ran
        (seg,) = other["segments"]
        assert os.getpid() in seg["users_alive"] and len(seg["users_alive"]) == 2
        expected = Layout(n_items=N, capacity=N // 2 * SIZE).file_size
        assert seg["file_bytes"] == expected
        # header, 128 process slots, index (offset, length, version, stored_by, state)
        assert expected - N // 2 * SIZE <= 20 << 10
        shm = [n for n in os.listdir(segment.shm_dir()) if n.startswith(shm_namespace)]
        assert shm == [seg["name"]]
        assert os.stat(os.path.join(segment.shm_dir(), seg["name"])).st_blocks * 512 >= expected
        # the other job has exited; this one still uses the segment
        assert [s["users_alive"] for s in list_caches()] == [[os.getpid()]]
    assert list_caches() == []  # the last user removed it


def test_last_user_in_a_process_removes_the_segment(make_dataset):
    ds = make_dataset(20, 100)
    first, second = unstall.Cache(1.0), unstall.Cache(1.0)
    layer_a, layer_b = first.bind(ds), second.bind(ds)
    layer_a.fetch(ds, list(range(20)))
    assert layer_b.fetch(ds, [3, 4]) == ds.fetch([3, 4])
    assert layer_b.stats()["cache"]["hits"] == 2 and layer_a.stats()["cache"]["hits"] == 0
    first.close()
    first.close()  # idempotent
    assert len(list_caches()) == 1
    second.close()
    assert list_caches() == []


def test_spawned_workers_attach_and_count(make_dataset):
    ds = make_dataset(64, 256)
    with unstall.Cache(0.5) as cache:
        loader = unstall.DataLoader(
            ds,
            batch_size=8,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            multiprocessing_context="spawn",
            cache=cache,
        )
        epochs = run_epochs(loader, 2)
        assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(ds.fetch(range(64)))
        per_epoch = [e["cache"] for e in loader.stats()["per_epoch"]]
        assert [(e["hits"], e["misses"]) for e in per_epoch] == [(0, 64), (32, 32)]
