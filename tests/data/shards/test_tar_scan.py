"""A tar shard indexed as its bytes stream in (`TarScan`): the same table as a read of the
file, in pieces of any size; anything unusual (pax headers, a cut shard, pieces out of
order) gives up, and the shard is indexed from the file (which names the fault)."""

from __future__ import annotations

import io
import random
import tarfile

import numpy as np
import pytest

from tests.data.shards.helpers import make_tars, sample_bytes
from unstall.data.shards import ShardFormatError
from unstall.data.shards.tar import index_tar
from unstall.data.shards.tar_scan import TarScan


def scanned(data: bytes, seed: int = 0) -> TarScan:
    rng = random.Random(seed)
    pieces, pos = [], 0
    while pos < len(data):
        n = rng.choice([1, 7, 300, 512, 513, 4096, 1 << 20])
        pieces.append((pos, data[pos : pos + n]))
        pos += n
    scan = TarScan(len(data))
    for pos, piece in pieces:
        scan.feed(pos, memoryview(piece))
    return scan


def same(a, b) -> None:
    assert list(a.keys) == list(b.keys) and a.fields == b.fields
    for name in ("spans", "first", "member_field", "member_off", "member_size"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.extra["cls"], b.extra["cls"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_index_is_the_files_index(tmp_path, seed):
    path = make_tars(tmp_path, shards=1, per_shard=25)[0]
    data = path.read_bytes()
    scan = scanned(data, seed)
    assert scan.result() is not None
    from_stream = index_tar(str(path), "s", scan)
    same(from_stream, index_tar(str(path), "s"))
    assert from_stream.extra["cls"].tolist() == list(range(25))


def test_streamed_index_reads_no_byte_of_the_file(tmp_path, monkeypatch):
    path = make_tars(tmp_path, shards=1, per_shard=5)[0]
    scan = scanned(path.read_bytes())
    want = index_tar(str(path), "s")
    path.write_bytes(b"")  # the file is not read again: the index came from the stream
    same(index_tar(str(path), "s", scan), want)


def test_unusual_or_cut_shards_fall_back_to_the_file(tmp_path):
    pax = tmp_path / "pax.tar"
    with tarfile.open(pax, "w", format=tarfile.PAX_FORMAT) as tf:
        for n in range(3):
            info = tarfile.TarInfo(f"{'d' * 120}/{n:04d}.jpg")
            data = sample_bytes(n)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert scanned(pax.read_bytes()).result() is None
    assert len(index_tar(str(pax), "pax.tar", scanned(pax.read_bytes())).keys) == 3
    path = make_tars(tmp_path / "t", shards=1, per_shard=5)[0]
    data = path.read_bytes()
    out_of_order = TarScan(len(data))
    out_of_order.feed(512, data[512:])
    out_of_order.feed(0, data[:512])
    assert out_of_order.result() is None
    with tarfile.open(path) as tf:
        cut = tf.getmember("s000003.jpg").offset_data + 10
    path.write_bytes(data[:cut])
    scan = scanned(data[:cut])
    assert scan.result() is None
    with pytest.raises(ShardFormatError, match="truncated"):
        index_tar(str(path), "s", scan)
    junk = data + b"x" * 10  # bytes after the end-of-archive blocks
    assert scanned(junk).result() is None
