"""Byte ranges and whole-object downloads as operations of the store (S3 and local): exact
bytes, checked against the version read (never stale), one retry rule, each download once per
node (two processes asking for the same file: one GET), resumed after cut streams."""

from __future__ import annotations

import itertools
import multiprocessing
import os

import pytest

from unstall.errors import StoreError
from unstall.stores.local import LocalStore
from unstall.stores.s3 import S3Store
from unstall.stores.s3_ranges import ObjectChangedError, chunks
from unstall.testing import DelayProxy


@pytest.fixture
def big(seaweed, s3_data, tmp_path):
    """One 3 MB object with known bytes, under its own prefix; its ETag from the listing."""
    data = os.urandom(3 << 20)
    url = f"s3://{s3_data.bucket}/ranges-{tmp_path.name}"
    store = S3Store(url, **seaweed.store_options())
    store.put("big.bin", data)
    etag = store.list_entries().etags[0]
    return store, data, etag


def test_read_ranges_exact_and_checked(big, seaweed, s3_data, tmp_path):
    store, data, etag = big
    ranges = [(0, 10), (5, 5), (1 << 20, (1 << 20) + 4096), (len(data) - 7, len(data))]
    got = store.read_ranges([("big.bin", ranges, etag), ("big.bin", [(100, 200)], None)])
    assert got[0] == [data[a:b] for a, b in ranges]
    assert got[1] == [data[100:200]]
    with pytest.raises(ObjectChangedError, match=r"big\.bin.*changed since it was indexed"):
        store.read_ranges([("big.bin", [(0, 10)], '"not-the-etag"')])
    assert store.stats()["store"]["errors"] == 0  # a changed object is not a failed request


def test_download_exact_then_and_once(big, tmp_path):
    store, data, etag = big
    dest = str(tmp_path / "copy")
    got = store.download([("big.bin", dest, len(data), etag)], then=_size_of)
    assert (tmp_path / "copy").read_bytes() == data
    assert got == [("big.bin", len(data))]
    before = store.stats()["store"]["requests"]
    assert store.download([("big.bin", dest, len(data), etag)]) == [None]  # present: no GET
    assert store.stats()["store"]["requests"] == before
    assert not [p for p in os.listdir(tmp_path) if ".part" in p]


def _size_of(path: str, key: str) -> tuple[str, int]:
    return key, os.path.getsize(path)


def _download_in_child(store: S3Store, dest: str, size: int, etag: str, go, done) -> None:
    go.wait()
    store.download([("big.bin", dest, size, etag)])
    done.put(os.path.getsize(dest))


def test_two_processes_download_a_file_once(big, tmp_path):
    """Two forked processes (each builds its own client) ask for the same destination at once:
    the lock beside it makes one GET for the node; both find the whole file."""
    store, data, etag = big
    dest = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("fork")
    go, done = ctx.Event(), ctx.Queue()
    before = store.stats()["store"]["requests"]  # the upload's
    procs = [
        ctx.Process(target=_download_in_child, args=(store, dest, len(data), etag, go, done))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    go.set()
    sizes = [done.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert sizes == [len(data)] * 2
    assert (tmp_path / "shared").read_bytes() == data
    assert store.stats()["store"]["requests"] - before == 1


def test_cut_streams_resume_where_they_stopped(big, seaweed, s3_data, tmp_path, monkeypatch):
    from unstall.stores import s3_ranges

    _store, data, _etag = big
    monkeypatch.setattr(s3_ranges, "STREAM_PIECE", 4096)
    cut = {"faults": ("truncate",), "truncate_after": 200_000}
    with DelayProxy(seaweed.endpoint, fail_rate=0.5, seed=2, **cut) as proxy:
        url = _store.url
        store = S3Store(url, **seaweed.store_options(endpoint=proxy.endpoint))
        store.download([("big.bin", str(tmp_path / "d"), len(data), None)])
        stats = store.stats()["store"]
        assert proxy.stats.faults["truncate"] > 0 and stats["retries"] > 0
        assert stats["bytes"] == len(data)  # no byte fetched twice
        store.close()
    assert (tmp_path / "d").read_bytes() == data


def test_giving_up_names_the_key(big, seaweed, tmp_path):
    store, _data, _etag = big
    with DelayProxy(seaweed.endpoint, fail_rate=1.0, faults=("503",)) as proxy:
        bad = S3Store(store.url, retries=1, **seaweed.store_options(endpoint=proxy.endpoint))
        with pytest.raises(StoreError, match=r"giving up on key 'big\.bin'.*after 2 attempts"):
            bad.read_ranges([("big.bin", [(0, 10)], None)])
        bad.close()


def test_chunks_cover_the_object():
    assert chunks(0) == []
    assert chunks(10) == [(0, 10)]
    size = (64 << 20) + 4096  # a shard a little over one chunk: one GET
    assert chunks(size) == [(0, size)]
    parts = chunks(200 << 20)
    assert parts[0][0] == 0 and parts[-1][1] == 200 << 20 and len(parts) == 3
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))


def test_local_read_range_in_place_and_checked(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"0123456789")
    store = LocalStore(tmp_path)
    st = os.stat(tmp_path / "f.bin")
    assert store.read_range("f.bin", 2, 5, size=10, version=str(st.st_mtime_ns)) == b"234"
    assert store.read_ranges([("f.bin", [(0, 1), (9, 10)], None)]) == [[b"0", b"9"]]
    (tmp_path / "f.bin").write_bytes(b"abcdefghijkl")  # rewritten in place: same inode
    with pytest.raises(StoreError, match=r"f\.bin.*changed since it was indexed"):
        store.read_range("f.bin", 2, 5, size=10, version=str(st.st_mtime_ns))
    store.close()
