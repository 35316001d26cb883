"""FileDataset, ImageFolder listing and labels, KeyTable."""

from __future__ import annotations

import pickle

import pytest

import unstall
from unstall.data import FileDataset, ImageFolder, KeyTable
from unstall.errors import EmptyDatasetError, SampleError


def test_key_table_is_a_compact_sequence():
    keys = [f"class_{i % 3}/img_{i:05d}.jpg" for i in range(1000)] + ["ünïcode/ß.jpg"]
    table = KeyTable(keys)
    assert len(table) == 1001 and list(table) == keys
    assert table[0] == keys[0] and table[-1] == keys[-1] and table[5:8] == keys[5:8]
    with pytest.raises(IndexError, match="1001"):
        table[1001]
    assert KeyTable(keys).fingerprint() == table.fingerprint()
    assert KeyTable(keys[::-1]).fingerprint() != table.fingerprint()
    assert list(pickle.loads(pickle.dumps(table))) == keys


def test_file_dataset_fetch_prepare_and_labels(tmp_path):
    for i in range(5):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
    keys = [f"{i}.bin" for i in range(5)]
    ds = FileDataset(tmp_path, keys, labels=[4, 3, 2, 1, 0], transform=len)
    assert len(ds) == 5 and ds.key(2) == "2.bin"
    assert ds.fetch([3, 0]) == [b"\x03" * 4, b"\x00"]
    assert ds[3] == (4, 1)
    assert ds.__getitems__([0, 4]) == [(1, 4), (5, 0)]
    raw = FileDataset(tmp_path, keys)
    assert raw[1] == b"\x01\x01"
    assert ds.fingerprint() == FileDataset(tmp_path, keys).fingerprint()
    assert ds.fingerprint() != FileDataset(tmp_path, keys[:4]).fingerprint()


def test_file_dataset_errors_name_the_problem(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a")
    with pytest.raises(EmptyDatasetError, match="no keys"):
        FileDataset(tmp_path, [])
    with pytest.raises(ValueError, match=r"labels has shape \(2,\), expected \(1,\)"):
        FileDataset(tmp_path, ["a.bin"], labels=[0, 1])

    def broken(raw: bytes) -> None:
        raise OSError("cannot identify image")

    ds = FileDataset(tmp_path, ["a.bin"], transform=broken)
    with pytest.raises(SampleError, match=r"sample 0 \(key 'a\.bin'\).*cannot identify") as info:
        ds[0]
    assert info.value.key == "a.bin" and info.value.index == 0


def test_image_folder_lists_classes_and_labels(tmp_path):
    for cls, n in (("b_dog", 2), ("a_cat", 3)):
        (tmp_path / cls).mkdir()
        for i in range(n):
            (tmp_path / cls / f"{i}.JPG").write_bytes(b"raw")
    (tmp_path / "a_cat" / "notes.txt").write_text("not an image")
    (tmp_path / "top.jpg").write_bytes(b"outside any class")
    ds = ImageFolder(tmp_path, raw=True)
    assert ds.classes == ["a_cat", "b_dog"]
    assert list(ds.keys) == [
        "a_cat/0.JPG",
        "a_cat/1.JPG",
        "a_cat/2.JPG",
        "b_dog/0.JPG",
        "b_dog/1.JPG",
    ]
    assert ds.labels.tolist() == [0, 0, 0, 1, 1]
    assert ds[4] == (b"raw", 1)
    loader = unstall.DataLoader(ds, batch_size=2, collate_fn=list)
    assert [label for batch in loader for _, label in batch] == [0, 0, 0, 1, 1]


def test_image_folder_without_images_is_a_clear_error(tmp_path):
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(EmptyDatasetError, match="no images found"):
        ImageFolder(tmp_path)
