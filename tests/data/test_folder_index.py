"""A local ImageFolder's index: listed once by scandir, saved, reused while no directory changed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from unstall.data import ImageFolder, folder_index

EXT = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def settle(root: Path) -> None:
    """Date every directory a minute back, as a dataset that was written a while ago."""
    past = time.time() - 60
    for dirpath, _dirs, _files in os.walk(root):
        os.utime(dirpath, (past, past))


def reference(root: Path) -> tuple[list[str], list[int], list[str]]:
    """What ImageFolder listed before (os.walk, sort, filters), written out plainly."""
    keys = []
    for dirpath, _dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        keys += [n if rel == "." else f"{rel}/{n}" for n in files]
    keys = [k for k in sorted(keys) if k.lower().endswith(EXT) and "/" in k]
    classes = sorted({k.split("/", 1)[0] for k in keys})
    return keys, [classes.index(k.split("/", 1)[0]) for k in keys], classes


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for rel in ["a/1.jpg", "a/2.PNG", "a/notes.txt", "a-b/3.jpeg", "a/sub/4.jpg", "b/5.webp",
                "top.jpg", "zz/ünï.jpg"]:  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "6.jpg").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", root / "linked")  # not entered, as os.walk
    return root


def test_same_keys_labels_and_classes_as_before(tree):
    ds = ImageFolder(tree, raw=True)
    keys, labels, classes = reference(tree)
    assert list(ds.keys) == keys == [
        "a-b/3.jpeg", "a/1.jpg", "a/2.PNG", "a/sub/4.jpg", "b/5.webp", "zz/ünï.jpg"
    ]  # fmt: skip
    assert ds.labels.tolist() == labels and ds.classes == classes == ["a", "a-b", "b", "zz"]
    assert ds.fetch([5]) == [b"x"]


def test_a_settled_folder_is_listed_once_then_loaded(tree, monkeypatch):
    settle(tree)
    first = ImageFolder(tree, raw=True)
    (saved,) = folder_index.listings_dir().iterdir()

    def no_scan(*args):
        raise AssertionError("listed again")

    monkeypatch.setattr(folder_index, "_scan", no_scan)
    again = ImageFolder(tree, raw=True)
    assert list(again.keys) == list(first.keys) and again.classes == first.classes
    assert np.array_equal(again.labels, first.labels)
    assert again.fingerprint() == first.fingerprint()
    monkeypatch.undo()

    (tree / "a" / "sub" / "7.jpg").write_bytes(b"y")  # a new file: its folder's mtime moves
    grown = ImageFolder(tree, raw=True)
    assert list(grown.keys) == reference(tree)[0] and "a/sub/7.jpg" in list(grown.keys)
    os.rename(tree / "b", tree / "c")  # a renamed class folder
    renamed = ImageFolder(tree, raw=True)
    assert renamed.classes == reference(tree)[2] == ["a", "a-b", "c", "zz"]
    assert saved.exists() or list(folder_index.listings_dir().iterdir())


def test_a_folder_changed_just_now_is_not_saved(tree):
    ImageFolder(tree, raw=True)
    assert not folder_index.listings_dir().exists() or not list(
        folder_index.listings_dir().iterdir()
    )
