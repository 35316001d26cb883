"""Tar shards on S3 (SeaweedFS): whole shards fetched once to local disk, or coalesced
range GETs; exactly once across workers and ranks, few requests, re-index, errors."""

from __future__ import annotations

import os

import pytest

import unstall
from tests.data.shards.helpers import (
    PER_SHARD,
    SHARDS,
    epoch_ids,
    ids_collate,
    sample_bytes,
    write_tar,
)
from unstall.data.shards import ShardFormatError, TarShards
from unstall.errors import SampleError

N = SHARDS * PER_SHARD


def _loader(ds, **kw):
    kw.setdefault("num_workers", 2)
    return unstall.DataLoader(ds, batch_size=5, shuffle=True, seed=1, collate_fn=ids_collate, **kw)


def test_whole_shards_once_then_local(s3_tars):
    url, _paths, opts = s3_tars
    ds = TarShards(url + "/train-{000000..000003}.tar", **opts)
    assert ds.stats()["shards"]["local_shards"] >= 1  # the first now, the others landing
    assert len(ds) == N  # waits for every shard, each indexed as it landed
    built = ds.stats()["shards"]
    assert built["read"] == "whole shards on local disk"
    assert built["requests"] == SHARDS  # the first full read: one GET per shard, no extra pass
    loader = _loader(ds)
    for _ in range(2):
        assert sorted(epoch_ids(loader)) == list(range(N))
    stats = loader.stats()["shards"]
    assert stats["requests"] == SHARDS  # epochs read the local copies: no more GETs
    assert stats["list_requests"] == 1
    again = TarShards(url, **opts)  # a restart: index and copies reused, one LIST only
    assert again.stats()["shards"]["requests"] == 0
    assert [again[i][1] for i in range(N)] == list(range(N))


@pytest.mark.parametrize("shuffle", ["full", "window"])
def test_range_reads_when_shards_do_not_fit(s3_tars, shuffle):
    url, _paths, opts = s3_tars
    ds = TarShards(url, disk=0, shuffle=shuffle, window=2, **opts)
    assert ds.stats()["shards"]["read"] == "coalesced range GETs"
    before = ds.stats()["shards"]["requests"]
    loader = _loader(ds)
    assert sorted(epoch_ids(loader)) == list(range(N))
    gets = loader.stats()["shards"]["requests"] - before
    assert 0 < gets <= N // 5 * SHARDS  # at most one GET per shard and batch, not per sample


def test_two_ranks_exactly_once(s3_tars):
    url, _paths, opts = s3_tars
    ds = TarShards(url, **opts)
    ids = []
    for rank in range(2):
        ids += epoch_ids(_loader(ds, rank=rank, world_size=2))
    assert sorted(ids) == list(range(N))


def test_rewritten_shard_on_s3_is_reindexed(s3_tars, upload, tmp_path):
    url, paths, opts = s3_tars
    old = TarShards(url, disk=0, **opts)
    assert old[PER_SHARD][1] == PER_SHARD
    write_tar(paths[1], list(range(1000, 1000 + PER_SHARD + 2)), seed=4)
    upload(url.split("/", 3)[3], [paths[1]])
    with pytest.raises(SampleError, match=r"train-000001\.tar.*changed since it was indexed"):
        _ = [b for b in _loader(old, num_workers=0)]
    new = TarShards(url, **opts)
    assert len(new) == N + 2
    x, y = new[PER_SHARD]
    assert y == 1000 and bytes(x) == sample_bytes(1000, seed=4)


def test_truncated_shard_on_s3_names_shard_and_member(s3_tars, upload):
    import tarfile

    url, paths, opts = s3_tars
    with tarfile.open(paths[3]) as tf:
        cut = tf.getmember("s000040.jpg").offset_data + 10
    paths[3].write_bytes(paths[3].read_bytes()[:cut])
    upload(url.split("/", 3)[3], [paths[3]])
    with pytest.raises(ShardFormatError, match=r"train-000003\.tar.*truncated.*s000040\.jpg"):
        len(TarShards(url, **opts))  # shard 3 is indexed in the background; len() waits for it


@pytest.mark.timed  # background downloads and eviction race a busy neighbour on 2 cores
def test_window_mode_keeps_only_the_window_on_disk(s3_tars):
    url, paths, opts = s3_tars
    biggest = max(p.stat().st_size for p in paths)
    ds = TarShards(url, shuffle="window", window=1, disk=2 * biggest + 100, **opts)
    assert ds.stats()["shards"]["read"].startswith("whole shards of the current window")
    before = ds.stats()["shards"]["requests"]
    loader = _loader(ds)
    for _ in range(2):
        assert sorted(epoch_ids(loader)) == list(range(N))
        assert ds.files.held_bytes() <= 2 * biggest + 100  # evicted as windows pass
    gets = loader.stats()["shards"]["requests"] - before
    assert gets <= 2 * SHARDS * 2  # each shard fetched about once per epoch (one GET each)


def test_a_prefetch_landing_after_the_reads_keeps_the_window_budget(s3_tars):
    """Window mode, the late prefetch forced: a worker's next-batch prefetch lands after its
    reads have evicted down to the budget (the last batch of an epoch, a slow thread on a
    busy machine). The landing evicts too: the disk holds the budget, not one shard over
    (was: 3 shards held against a budget of 2, seen under load)."""
    import threading

    url, paths, opts = s3_tars
    biggest = max(p.stat().st_size for p in paths)
    ds = TarShards(url, shuffle="window", window=1, disk=2 * biggest + 100, **opts)
    first = [ds.index.shards[s] for s in range(2)]
    ds.files.ensure(ds.location, first)  # the budget full: two shards
    assert ds.files.held_bytes() > biggest
    later = [i for i in range(N) if int(ds.index.sample_shard[i]) == SHARDS - 1]
    ds.prefetch(later[:4])  # a third shard, in the prefetch thread
    for thread in threading.enumerate():
        if thread.name == "unstall-shard-prefetch":
            thread.join(timeout=30)
    assert ds.files.have(ds.index.shards[SHARDS - 1])  # it landed, and is kept
    assert ds.files.held_bytes() <= 2 * biggest + 100


def test_a_copy_evicted_before_it_was_opened_is_downloaded_again(s3_tars, monkeypatch):
    """Window mode, the race of two workers forced: right after this worker made a shard
    present (``ensure``), another worker's ``evict`` deletes it, before this one opened it.
    The read downloads it again and gives the exact bytes (was: FileNotFoundError). A copy
    this worker holds open is read from its descriptor even once deleted (no download), and
    its descriptors of deleted copies are closed once it reads other shards."""
    from unstall.data.shards.shard_files import ShardFiles

    url, paths, opts = s3_tars
    biggest = max(p.stat().st_size for p in paths)
    ds = TarShards(url, shuffle="window", window=1, disk=2 * biggest + 100, **opts)
    assert ds.windowed
    other = ShardFiles(ds.location.url, ds.files.dir)  # another worker's view of the copies
    ensure, evicted = ShardFiles.ensure, set()

    def ensure_then_evicted_by_another(self, location, infos, then=None):
        out = ensure(self, location, infos, then)
        first = [i for i in infos if i.key not in evicted]
        if self is ds.files and first:  # each shard's first copy, once
            assert all(self.have(i) for i in infos)
            assert other.evict(0, keep=[]) >= len(first)  # its keep: shards this one skips
            assert not any(self.have(i) for i in infos)
            evicted.update(i.key for i in first)
        return out

    monkeypatch.setattr(ShardFiles, "ensure", ensure_then_evicted_by_another)
    before = ds.files.downloaded
    for s in range(SHARDS):
        for i in (s * PER_SHARD, s * PER_SHARD + PER_SHARD - 1):
            x, y = ds[i]
            assert y == i and bytes(x) == sample_bytes(i)
        assert len(ds.files._fds) == 1  # only the shard being read: deleted copies closed
    assert evicted == {i.key for i in ds.index.shards}
    assert ds.files.downloaded - before == 2 * SHARDS  # once, then again after the eviction


@pytest.mark.parametrize("disk", ["auto", 0])
def test_resume_on_s3_is_exact(s3_tars, disk):
    from tests.conftest import check_resume

    url, _paths, opts = s3_tars
    ds = TarShards(url, disk=disk, shuffle="window", window=2, **opts)
    check_resume(lambda: _loader(ds), epochs=2)


def test_downloads_survive_cut_and_reset_responses(s3_tars, seaweed):
    """Whole-shard streams through a proxy that cuts or drops a third of the answers: every
    sample's bytes still exact, each failed stream retried (counted)."""
    from unstall.testing import DelayProxy

    url, _paths, opts = s3_tars
    faults = ("truncate", "reset")
    with DelayProxy(seaweed.endpoint, fail_rate=0.35, faults=faults, seed=3) as proxy:
        ds = TarShards(url, **{**opts, "endpoint": proxy.endpoint})
        assert [ds[i][1] for i in range(N)] == list(range(N))
        assert all(bytes(ds[i][0]) == sample_bytes(i) for i in range(N))
        stats = ds.stats()["shards"]
        assert sum(proxy.stats.faults.values()) > 0
        assert stats["retries"] >= sum(proxy.stats.faults.values()) - 1  # the LIST may fail too
        assert stats["requests"] >= SHARDS


def test_named_cache_never_serves_a_rewritten_shard(s3_tars, upload):
    """A cache that outlives a rewrite (named, so the new dataset maps the same segment):
    the rewritten shard's samples are stale misses, the others hits."""
    url, paths, opts = s3_tars
    name = f"shards-{paths[0].parent.parent.name}"
    with unstall.Cache("64MiB", name=name) as cache:
        loader = _loader(TarShards(url, **opts), cache=cache)
        assert sorted(epoch_ids(loader)) == list(range(N))
        loader.close()
        write_tar(paths[2], list(range(2 * PER_SHARD, 3 * PER_SHARD)), seed=9)
        upload(url.split("/", 3)[3], [paths[2]])
        ds = TarShards(url, **opts)
        loader = unstall.DataLoader(ds, batch_size=5, shuffle=True, seed=1, num_workers=2,
                                    collate_fn=_pairs, cache=cache)  # fmt: skip
        got = {y: x for batch in loader for x, y in batch}
        assert sorted(got) == list(range(N))
        for n, x in got.items():  # the rewritten shard's new bytes, the others' as they were
            assert x == sample_bytes(n, seed=9 if n // PER_SHARD == 2 else 0), n
        per_epoch = loader.stats()["per_epoch"][-1]["cache"]
        assert per_epoch["stale"] == PER_SHARD
        assert per_epoch["hits"] == N - PER_SHARD
        x, y = ds[2 * PER_SHARD]
        assert y == 2 * PER_SHARD and bytes(x) == sample_bytes(2 * PER_SHARD, seed=9)
        loader.close()


def _pairs(batch):
    return [(bytes(x), y) for x, y in batch]


def test_cache_list_and_clear_show_shard_copies(s3_tars, capsys, monkeypatch):
    """`unstall cache list` shows the local copies of remote shards (location, count, bytes);
    `unstall cache clear URL` removes them; the next dataset fetches them again."""
    from unstall.cli import main

    monkeypatch.setenv("COLUMNS", "250")
    url, paths, opts = s3_tars
    ds = TarShards(url, **opts)
    assert len(ds) == N  # every shard landed
    total = sum(p.stat().st_size for p in paths)
    assert main(["cache", "list"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if url in line]
    assert len(rows) == 1 and "shards" in rows[0] and f"{SHARDS} shards" in rows[0]
    from unstall.cache.capacity import format_bytes

    assert format_bytes(total) in rows[0]
    assert main(["cache", "clear", url]) == 0
    assert f"removed {url} (shard copies)" in capsys.readouterr().out
    assert not os.path.exists(ds.files.dir)
    again = TarShards(url, **opts)  # copies and index cleared: fetched (and indexed) again
    assert [again[i][1] for i in range(N)] == list(range(N))
    assert again.stats()["shards"]["requests"] == SHARDS


def test_a_cut_download_resumes_where_it_stopped(s3_tars, seaweed, monkeypatch):
    """A shard stream cut part way is resumed from its first missing byte, not fetched again:
    the bytes received add up to the shards' sizes exactly, though streams were cut."""
    from unstall.stores import s3_ranges
    from unstall.testing import DelayProxy

    monkeypatch.setattr(s3_ranges, "STREAM_PIECE", 64)  # pieces land before the proxy's cut
    url, paths, opts = s3_tars
    cut = {"faults": ("truncate",), "truncate_after": 3000}  # the head, then part of the body
    with DelayProxy(seaweed.endpoint, fail_rate=0.5, seed=5, **cut) as proxy:
        ds = TarShards(url, **{**opts, "endpoint": proxy.endpoint})
        assert len(ds) == N
        stats = ds.stats()["shards"]
        assert proxy.stats.faults["truncate"] > 0 and stats["retries"] > 0
        assert stats["bytes"] == sum(p.stat().st_size for p in paths)
        assert all(bytes(ds[i][0]) == sample_bytes(i) for i in range(N))
