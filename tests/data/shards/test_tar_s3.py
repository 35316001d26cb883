"""Tar shards on S3 (SeaweedFS): whole shards fetched once to local disk, or coalesced
range GETs; exactly once across workers and ranks, few requests, re-index, errors."""

from __future__ import annotations

import pytest

import unstall
from tests.data.shards.helpers import (
    PER_SHARD,
    SHARDS,
    epoch_ids,
    ids_collate,
    make_tars,
    sample_bytes,
    write_tar,
)
from unstall.data.shards import ShardFormatError, TarShards
from unstall.errors import SampleError

N = SHARDS * PER_SHARD


@pytest.fixture
def s3_tars(tmp_path, upload, seaweed):
    paths = make_tars(tmp_path / "shards")
    url = upload(f"tars-{tmp_path.name}", paths)
    return url, paths, seaweed.store_options()


def _loader(ds, **kw):
    kw.setdefault("num_workers", 2)
    return unstall.DataLoader(ds, batch_size=5, shuffle=True, seed=1, collate_fn=ids_collate, **kw)


def test_whole_shards_once_then_local(s3_tars):
    url, _paths, opts = s3_tars
    ds = TarShards(url + "/train-{000000..000003}.tar", **opts)
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
        TarShards(url, **opts)


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


@pytest.mark.parametrize("disk", ["auto", 0])
def test_resume_on_s3_is_exact(s3_tars, disk):
    from tests.conftest import check_resume

    url, _paths, opts = s3_tars
    ds = TarShards(url, disk=disk, shuffle="window", window=2, **opts)
    check_resume(lambda: _loader(ds), epochs=2)
