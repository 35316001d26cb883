"""Parquet files read in place (pyarrow), local and on S3: rows by index, exactly once,
resume, missing column and corrupt row group named."""

from __future__ import annotations

import pytest

import unstall
from tests.conftest import check_resume
from tests.data.shards.helpers import epoch_ids, ids_collate, sample_bytes
from unstall.data.shards import ParquetShards
from unstall.errors import SampleError

FILES, ROWS = 3, 25
N = FILES * ROWS


def write_parquet(root):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(FILES):
        rows = range(f * ROWS, (f + 1) * ROWS)
        table = pa.table({
            "image": [{"bytes": sample_bytes(i), "path": f"{i}.jpg"} for i in rows],
            "label": list(rows),
            "caption": [f"caption {i}" for i in rows],
        })  # fmt: skip
        path = root / f"train-{f:05d}.parquet"
        pq.write_table(table, path, row_group_size=10)  # row groups of 10, 10, 5
        paths.append(path)
    return paths


@pytest.fixture
def pq_dir(tmp_path):
    write_parquet(tmp_path / "pq")
    return tmp_path / "pq"


def test_rows_columns_and_hf_image_struct(pq_dir):
    ds = ParquetShards(str(pq_dir / "train-{00000..00002}.parquet"))
    assert len(ds) == N
    assert [(bytes(x), y) for x, y in (ds[i] for i in range(N))] == [
        (sample_bytes(i), i) for i in range(N)
    ]
    assert ds.key(13) == "train-00000.parquet:1:3"  # file, row group, row
    row = ParquetShards(pq_dir, image=None)[31]
    assert row == {"image": sample_bytes(31), "label": 31, "caption": "caption 31"}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exactly_once_full_and_window(pq_dir, num_workers):
    for shuffle in ("full", "window"):
        ds = ParquetShards(pq_dir, shuffle=shuffle, window=1)
        loader = unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=4, num_workers=num_workers,
            collate_fn=ids_collate,
        )  # fmt: skip
        assert sorted(epoch_ids(loader)) == list(range(N))


def test_resume_is_exact(pq_dir):
    ds = ParquetShards(pq_dir)
    check_resume(
        lambda: unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=9, num_workers=2, collate_fn=ids_collate
        )
    )


def test_missing_column_is_named(pq_dir):
    with pytest.raises(ValueError, match=r"label='y'.*fields: caption, image, label"):
        ParquetShards(pq_dir, label="y")


def test_corrupt_row_group_names_file_and_group(pq_dir):
    import pyarrow.parquet as pq

    path = pq_dir / "train-00001.parquet"
    col = pq.read_metadata(path).row_group(1).column(0)
    data = bytearray(path.read_bytes())
    at = col.data_page_offset + 20
    data[at : at + 200] = b"\x13" * 200  # garble row group 1's image pages
    path.write_bytes(bytes(data))
    ds = ParquetShards(pq_dir)
    with pytest.raises(SampleError, match=r"row group 1 of Parquet file 'train-00001\.parquet'"):
        ds.fetch([ROWS + 12])


def test_on_s3_local_copies_and_range_reads(tmp_path, upload, seaweed):
    paths = write_parquet(tmp_path / "pq")
    url = upload(f"pq-{tmp_path.name}", paths)
    opts = seaweed.store_options()
    for disk in ("auto", 0):
        ds = ParquetShards(url, disk=disk, shuffle="window", window=1, **opts)
        loader = unstall.DataLoader(
            ds, batch_size=5, shuffle=True, seed=1, num_workers=2, collate_fn=ids_collate
        )
        assert sorted(epoch_ids(loader)) == list(range(N))
        gets = loader.stats()["shards"]["requests"]
        assert gets < N // 2, gets  # footers + whole files, or a GET per row group and batch
