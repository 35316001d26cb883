"""LocalStore: bytes by key, many at once, listing, clear errors, page-cache bypass."""

from __future__ import annotations

import os

import pytest

from unstall.errors import MissingKeyError, StoreError
from unstall.stores import LocalStore, open_store


@pytest.fixture
def root(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"x" * 10)
    (tmp_path / "a" / "y.bin").write_bytes(os.urandom(70_000))
    (tmp_path / "z.bin").write_bytes(b"")
    return tmp_path


def test_get_and_get_many_return_exact_bytes_in_key_order(root):
    store = LocalStore(root)
    assert store.get("a/x.bin") == b"x" * 10
    keys = ["z.bin", "a/y.bin", "a/x.bin", "a/y.bin"]
    got = store.get_many(keys)
    assert got == [(root / k).read_bytes() for k in keys]


def test_list_is_sorted_and_relative(root):
    assert LocalStore(root).list() == ["a/x.bin", "a/y.bin", "z.bin"]
    assert LocalStore(root).list("a") == ["a/x.bin", "a/y.bin"]


def test_missing_key_names_key_and_store(root):
    store = LocalStore(root)
    with pytest.raises(MissingKeyError, match=r"'a/nope\.bin' not found") as info:
        store.get_many(["a/x.bin", "a/nope.bin"])
    assert info.value.key == "a/nope.bin" and str(root) in str(info.value)
    with pytest.raises(MissingKeyError, match="invalid key"):
        store.get("")


def test_bad_root_and_scheme_are_named(tmp_path):
    with pytest.raises(StoreError, match="not a directory"):
        LocalStore(tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown storage URL scheme 'ftp'"):
        open_store("ftp://host/x")


def test_open_store_by_path_url_or_instance(root):
    store = open_store(str(root))
    assert isinstance(store, LocalStore) and store.url == str(root)
    assert open_store(f"file://{root}").url == str(root)
    assert open_store(store) is store


def test_put_writes_atomically_and_bypass_reads_same_bytes(root):
    store = LocalStore(root, bypass_page_cache=True)
    store.put("new/dir/k.bin", b"hello")
    assert store.get("new/dir/k.bin") == b"hello"
    assert not list((root / "new" / "dir").glob("*.tmp"))
    store.drop_page_cache()  # never fails, even for files it cannot open


def test_list_entries_and_versions_follow_size_mtime_and_inode(tmp_path):
    import os

    from unstall.stores import LocalStore

    (tmp_path / "d").mkdir()
    for name, data in (("a.bin", b"1"), ("d/b.bin", b"22")):
        (tmp_path / name).write_bytes(data)
    store = LocalStore(tmp_path)
    listing = store.list_entries()
    assert listing.keys == ["a.bin", "d/b.bin"] and listing.sizes.tolist() == [1, 2]
    entries = list(listing.entries())
    assert [e.key for e in entries] == listing.keys and all(e.version != 0 for e in entries)
    assert store.versions(["d/b.bin", "a.bin", "gone"]).tolist() == [
        entries[1].version, entries[0].version, 0
    ]  # fmt: skip
    before = store.versions(["a.bin"])[0]
    os.utime(tmp_path / "a.bin", ns=(1, 123))  # same size and inode, another mtime
    assert store.versions(["a.bin"])[0] not in (0, before)


def test_manifest_v2_keeps_sizes_and_etags_and_v1_still_reads(tmp_path):
    from unstall.stores import manifest

    path, url = tmp_path / "m.txt", "s3://b/p"
    rows = [("a.bin", 3, '"e1"', 10), ("x\ty.bin", 5, '"e2"', 20)]
    manifest.write_manifest(path, url, [r[0] for r in rows], rows)
    assert manifest.read_manifest(path, url) == ["a.bin", "x\ty.bin"]
    assert manifest.read_entries(path, url) == rows
    manifest.write_manifest(path, url, ["a.bin", "b.bin"])  # v1: keys only
    assert manifest.read_manifest(path, url) == ["a.bin", "b.bin"]
    assert manifest.read_entries(path, url) is None
