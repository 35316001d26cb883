"""MDS shards (Mosaic's layout) read in place, local and on S3: same samples as Mosaic's own
reader, exactly once, resume, truncation named."""

from __future__ import annotations

import pytest

import unstall
from tests.conftest import check_resume
from tests.data.shards.helpers import epoch_ids, ids_collate, sample_bytes, write_mds
from unstall.data.shards import MDSShards, ShardFormatError

GROUPS = [list(range(0, 10)), list(range(10, 25)), list(range(25, 33))]
N = 33


@pytest.fixture
def mds_dir(tmp_path):
    write_mds(tmp_path / "mds", GROUPS)
    return tmp_path / "mds"


def test_samples_labels_and_fields(mds_dir):
    ds = MDSShards(str(mds_dir))
    assert len(ds) == N
    for i in range(N):
        x, y = ds[i]
        assert (bytes(x), y) == (sample_bytes(i), i)
    raw = ds.fetch([12])[0]
    assert ds.fields(12, raw) == {"image": sample_bytes(12), "key": "s000012", "label": 12}
    assert MDSShards(str(mds_dir / "index.json"), image=None)[3]["key"] == "s000003"


def test_same_as_mosaic_reader_when_installed(tmp_path):
    try:
        from unstall.bench.shards_rig import import_streaming
        from unstall.bench.shards_rig import write_mds as mosaic_write

        streaming = import_streaming()
    except Exception as exc:  # streaming is an optional extra
        pytest.skip(f"mosaicml-streaming not importable: {exc}")
    images = [(f"k{n}", sample_bytes(n), n % 5) for n in range(40)]
    mosaic_write(images, tmp_path / "m")
    ours = MDSShards(str(tmp_path / "m"), image="image", label="label")
    ref = streaming.StreamingDataset(local=str(tmp_path / "m"))
    assert len(ours) == len(ref) == 40
    for i in range(40):
        assert ours[i] == (ref[i]["image"], ref[i]["label"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exactly_once_and_two_ranks(mds_dir, num_workers):
    ds = MDSShards(mds_dir, shuffle="window", window=2)
    loader = unstall.DataLoader(
        ds, batch_size=4, shuffle=True, seed=2, num_workers=num_workers, collate_fn=ids_collate
    )
    assert sorted(epoch_ids(loader)) == list(range(N))
    ids = []
    for rank in range(2):
        ranked = unstall.DataLoader(
            MDSShards(mds_dir), batch_size=4, shuffle=True, seed=2, rank=rank, world_size=2,
            num_workers=num_workers, collate_fn=ids_collate,
        )  # fmt: skip
        ids += epoch_ids(ranked)
    # 33 samples over 2 ranks pad to 34 (as DistributedSampler does): one sample twice
    assert set(ids) == set(range(N)) and len(ids) == 34


def test_resume_is_exact(mds_dir):
    ds = MDSShards(mds_dir)
    check_resume(
        lambda: unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=9, num_workers=2, collate_fn=ids_collate
        )
    )


def test_truncated_shard_is_named(mds_dir):
    shard = mds_dir / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ShardFormatError, match=r"shard\.00001\.mds.*truncated"):
        MDSShards(mds_dir)


def test_on_s3_whole_shards_and_ranges(tmp_path, upload, seaweed):
    files = write_mds(tmp_path / "mds", GROUPS)
    url = upload(f"mds-{tmp_path.name}", files)
    opts = seaweed.store_options()
    for disk in ("auto", 0):
        ds = MDSShards(url, disk=disk, **opts)
        loader = unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=1, num_workers=2, collate_fn=ids_collate
        )
        assert sorted(epoch_ids(loader)) == list(range(N))
        assert loader.stats()["shards"]["requests"] < N  # index.json, headers, shards/ranges
