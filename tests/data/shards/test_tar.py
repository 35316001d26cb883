"""WebDataset tar shards on local disk: exact samples, exactly once, resume, re-index, errors."""

from __future__ import annotations

import os
import time

import pytest

import unstall
from tests.conftest import check_resume
from tests.data.shards.helpers import (
    PER_SHARD,
    SHARDS,
    epoch_ids,
    ids_collate,
    make_tars,
    sample_bytes,
    unpack,
    write_tar,
)
from unstall.data.shards import ShardFormatError, TarShards
from unstall.errors import StoreError

N = SHARDS * PER_SHARD


@pytest.fixture
def tars(tmp_path):
    return make_tars(tmp_path / "shards")


def test_same_samples_and_labels_as_the_unpacked_files(tars, tmp_path):
    files = unpack(tars, tmp_path / "unpacked")
    ds = TarShards(str(tmp_path / "shards" / "train-{000000..000003}.tar"))
    assert len(ds) == N
    for i in range(N):
        x, y = ds[i]
        key = ds.index.keys[i]
        assert bytes(x) == files[f"{key}.jpg"] == sample_bytes(i)
        assert y == int(files[f"{key}.cls"]) == i
        assert ds.key(i) == f"train-{i // PER_SHARD:06d}.tar:{key}"
    assert ds.direct and ds.fetch([5])[0] == sample_bytes(5)  # the image alone is read
    whole = TarShards(tmp_path / "shards", image=None)
    assert not whole.direct and whole.fingerprint() != ds.fingerprint()
    fields = whole.fields(5, whole.fetch([5])[0])
    assert sorted(fields) == ["cls", "jpg", "json"] and fields["json"] == b'{"n": 5}'
    # what fetch gives, sized from the index: a cache's capacity with no sample read
    from unstall.cache.capacity import estimate_dataset_bytes

    for d in (ds, whole):
        sizes = [len(raw) for raw in d.fetch(list(range(N)))]
        assert d.raw_sizes(range(N)).tolist() == sizes
        assert estimate_dataset_bytes(d) == sum(sizes)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", ["full", "window"])
def test_every_sample_exactly_once_per_epoch(tars, num_workers, shuffle):
    ds = TarShards(tars[0].parent, shuffle=shuffle, window=2)
    loader = unstall.DataLoader(
        ds, batch_size=5, shuffle=True, seed=3, num_workers=num_workers, collate_fn=ids_collate
    )
    orders = [epoch_ids(loader) for _ in range(2)]
    for ids in orders:
        assert sorted(ids) == list(range(N))
    assert orders[0] != orders[1]
    if shuffle == "window":  # the first window's 2 shards come first, whole
        first_shards = {i // PER_SHARD for i in orders[0][: 2 * PER_SHARD]}
        assert len(first_shards) == 2
    assert loader.stats()["shards"]["shuffle"].startswith(shuffle)


@pytest.mark.parametrize("shuffle", ["full", "window"])
def test_two_ranks_split_each_epoch_exactly(tars, shuffle):
    ds = TarShards(tars[0].parent, shuffle=shuffle, window=2)
    ids = []
    for rank in range(2):
        loader = unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=5, rank=rank, world_size=2,
            num_workers=2, collate_fn=ids_collate,
        )  # fmt: skip
        ids.extend(epoch_ids(loader))
    assert sorted(ids) == list(range(N))


@pytest.mark.parametrize("shuffle", ["full", "window"])
def test_resume_mid_epoch_is_exact(tars, shuffle):
    ds = TarShards(tars[0].parent, shuffle=shuffle, window=2)
    check_resume(
        lambda: unstall.DataLoader(
            ds, batch_size=5, shuffle=True, seed=7, num_workers=2, collate_fn=ids_collate
        )
    )


def test_rewritten_shard_is_reindexed_never_read_stale(tars):
    old = TarShards(tars[0].parent)
    assert old[PER_SHARD][1] == PER_SHARD
    time.sleep(0.01)
    # shard 1 rewritten with other samples (and sizes): numbers 1000.. instead of 12..
    write_tar(tars[1], list(range(1000, 1000 + PER_SHARD + 3)), seed=9)
    os.utime(tars[1], ns=(time.time_ns(), time.time_ns()))
    with pytest.raises(StoreError, match=r"train-000001\.tar.*changed since it was indexed"):
        old[PER_SHARD]
    new = TarShards(tars[0].parent)
    assert len(new) == N + 3
    x, y = new[PER_SHARD]
    assert y == 1000 and bytes(x) == sample_bytes(1000, seed=9)
    assert new.fingerprint() != old.fingerprint()


def test_truncated_shard_names_shard_and_member(tars):
    data = tars[2].read_bytes()
    member = _member(tars[2], "s000026.jpg")
    tars[2].write_bytes(data[: member.offset_data + 100])  # inside that member's data
    with pytest.raises(ShardFormatError, match=r"train-000002\.tar.*truncated.*s000026"):
        TarShards(tars[0].parent)


def test_cut_header_is_not_silently_dropped(tars):
    data = bytearray(tars[3].read_bytes())
    at = _member(tars[3], "s000038.json").offset
    data[at + 150 : at + 160] = b"\xff" * 10  # corrupt that member's header (its checksum)
    tars[3].write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=r"train-000003\.tar.*after member 's000038.cls'"):
        TarShards(tars[0].parent)


def test_missing_field_named_at_construction(tars):
    with pytest.raises(ValueError, match=r"label='txt'.*fields: cls, jpg, json"):
        TarShards(tars[0].parent, label="txt")


def test_with_cache_and_image_pipeline(tmp_path):
    from tests.conftest import write_jpegs
    from unstall.pipeline import ImagePipeline

    (tmp_path / "imgs").mkdir()
    src = write_jpegs(tmp_path / "imgs", 12, classes=3, seed=0)
    import io
    import tarfile

    files = sorted(src.rglob("*.jpg"))
    with tarfile.open(tmp_path / "imgs.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, f in enumerate(files):
            for ext, data in (("jpg", f.read_bytes()), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    ds = TarShards(str(tmp_path / "imgs.tar"), transform=ImagePipeline(size=32, output="uint8"))
    with unstall.Cache(1.0) as cache:
        loader = unstall.DataLoader(ds, batch_size=4, num_workers=2, cache=cache)
        for _ in range(2):
            labels = [y for _, ys in loader for y in ys.tolist()]
            assert labels == [i % 3 for i in range(12)]
        per_epoch = loader.stats()["per_epoch"]
        assert per_epoch[-1]["cache"]["hits"] == 12
        loader.close()


def _member(path, name):
    import tarfile

    with tarfile.open(path) as tf:
        return tf.getmember(name)


def test_fast_header_reader_matches_tarfile_and_pax_falls_back(tars, tmp_path):
    import io
    import tarfile

    from unstall.data.shards.tar import _members_fast, _members_tarfile, index_tar

    size = tars[0].stat().st_size
    assert _members_fast(str(tars[0]), "s", size) == _members_tarfile(str(tars[0]), "s", size)
    pax = tmp_path / "pax.tar"
    long_dir = "d" * 120  # longer than a ustar name: a pax header
    with tarfile.open(pax, "w", format=tarfile.PAX_FORMAT) as tf:
        for n in range(3):
            for ext, data in (("jpg", sample_bytes(n)), ("cls", str(n).encode())):
                info = tarfile.TarInfo(f"{long_dir}/{n:04d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    table = index_tar(str(pax), "pax.tar")
    assert table.keys == [f"{long_dir}/{n:04d}" for n in range(3)]
    ds = TarShards(str(pax))
    assert [(bytes(x), y) for x, y in (ds[i] for i in range(3))] == [
        (sample_bytes(n), n) for n in range(3)
    ]


@pytest.mark.parametrize("shuffle", ["full", "window"])
def test_unseeded_order_follows_torchs_seed(tars, shuffle):
    """Without ``seed=``, the order comes from torch's seed as torch's own shuffle does: the
    same after the same ``torch.manual_seed``, another after another (never a fixed 0)."""
    import torch

    ds = TarShards(tars[0].parent, shuffle=shuffle, window=2)

    def first_epoch(seed: int) -> list[int]:
        torch.manual_seed(seed)
        loader = unstall.DataLoader(ds, batch_size=5, shuffle=True, collate_fn=ids_collate)
        return epoch_ids(loader)

    a, again, other = first_epoch(1), first_epoch(1), first_epoch(2)
    assert a == again and sorted(a) == list(range(N))
    assert other != a and sorted(other) == list(range(N))
    seeded0 = epoch_ids(
        unstall.DataLoader(ds, batch_size=5, shuffle=True, seed=0, collate_fn=ids_collate)
    )
    assert a != seeded0
