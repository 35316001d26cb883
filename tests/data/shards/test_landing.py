"""Training starts while the shards arrive: with each shard's index known (stored), making the
dataset reads no shard, epoch 0 is in shard-window order (windows of 1, 2, 4 ... shards, in
download order) while the shards download in the background in that order, and from epoch 1
the full permutation; every epoch exactly once (0 and 2 workers, 2 ranks), resume exact."""

from __future__ import annotations

import pytest

import unstall
from tests.data.shards.helpers import epoch_ids, ids_collate, make_tars
from unstall.data.shards import TarShards
from unstall.data.shards.shard_files import ShardFiles
from unstall.testing import DelayProxy

SHARDS, PER_SHARD = 6, 10
N = SHARDS * PER_SHARD


@pytest.fixture
def indexed(tmp_path, upload, seaweed):
    """Tars on S3 whose index this node has (from a pass that kept no copy): none local."""
    paths = make_tars(tmp_path / "shards", shards=SHARDS, per_shard=PER_SHARD)
    url = upload(f"landing-{tmp_path.name}", paths)
    opts = seaweed.store_options()
    first = TarShards(url, disk=0, **opts)  # indexes each shard, keeps none
    assert first.stats()["shards"]["read"] == "coalesced range GETs"
    first.location.close()
    return url, opts


def _loader(ds, **kw):
    kw.setdefault("num_workers", 2)
    return unstall.DataLoader(ds, batch_size=5, shuffle=True, seed=7, collate_fn=ids_collate, **kw)


def test_first_batch_needs_only_its_shard(indexed, monkeypatch):
    """No background download (only the batches' own fetches): the first batch of epoch 0
    has fetched one shard, not the dataset; epoch 0 keeps each window's samples together."""
    url, opts = indexed
    monkeypatch.setattr(
        ShardFiles, "start_background", lambda self, location, infos, then=None: None
    )
    ds = TarShards(url, **opts)
    stats = ds.stats()["shards"]
    assert stats["read"] == "whole shards on local disk"
    assert stats["requests"] == 0 and stats["local_shards"] == 0  # the index was stored
    assert stats["first_epoch"].startswith("epoch 0 in shard-window order")
    loader = _loader(ds, num_workers=0)
    it = iter(loader)
    first = next(it).tolist()
    assert ds.stats()["shards"]["local_shards"] == 1
    assert len({i // PER_SHARD for i in first}) == 1
    rest = [i for b in it for i in b.tolist()]
    epoch0 = first + rest
    assert sorted(epoch0) == list(range(N))
    windows = [1, 2, 3]  # shards per window: 1, 2, then the 3 left (window=8)
    pos = 0
    for w in windows:  # each window's samples are whole shards, read one window at a time
        part = epoch0[pos : pos + w * PER_SHARD]
        assert len({i // PER_SHARD for i in part}) == w
        pos += w * PER_SHARD
    epoch1 = epoch_ids(loader)
    assert sorted(epoch1) == list(range(N))
    assert len({i // PER_SHARD for i in epoch1[:10]}) > 1  # the full permutation
    assert ds.stats()["shards"]["requests"] == SHARDS  # one GET per shard, no more


@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_while_shards_land(indexed, seaweed, workers):
    url, opts = indexed
    with DelayProxy(seaweed.endpoint, delay=0.02) as proxy:
        ds = TarShards(url, **{**opts, "endpoint": proxy.endpoint})
        assert ds.stats()["shards"]["local_shards"] == 0
        loader = _loader(ds, num_workers=workers)
        for _ in range(3):
            assert sorted(epoch_ids(loader)) == list(range(N))
        assert ds.stats()["shards"]["local_shards"] == SHARDS
        assert ds.stats()["shards"]["requests"] == SHARDS  # each shard once for the node
        loader.close()
        ds.location.close()


def test_two_ranks_while_shards_land(indexed):
    url, opts = indexed
    ids = []
    for rank in range(2):  # two ranks of one node: the second finds the first's copies
        ds = TarShards(url, **opts)
        for epoch in range(2):
            loader = _loader(ds, rank=rank, world_size=2)
            loader.set_epoch(epoch)
            ids.append((epoch, epoch_ids(loader)))
            loader.close()
    for epoch in range(2):
        got = sorted(i for e, part in ids if e == epoch for i in part)
        assert got == list(range(N))


def test_resume_is_exact_across_landing(indexed):
    """A run stopped while shards were landing resumes exactly in a run that finds them
    local: the order of epoch 0 does not depend on which shards are local."""
    from tests.conftest import check_resume

    url, opts = indexed
    ds = TarShards(url, **opts)
    check_resume(lambda: _loader(ds), epochs=2)


def test_first_epoch_full_and_local_shards_keep_the_full_permutation(indexed, tmp_path):
    url, opts = indexed
    ds = TarShards(url, first_epoch="full", **opts)
    assert ds.epoch_order(7, 0) is None  # the loader's full permutation
    assert ds.stats()["shards"]["first_epoch"] == "as the other epochs"
    local = TarShards(make_tars(tmp_path / "local")[0].parent)
    assert local.epoch_order(7, 0) is None
    with pytest.raises(ValueError, match="first_epoch"):
        TarShards(url, first_epoch="soon", **opts)
