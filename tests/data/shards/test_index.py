"""Indexes that outlive the machine: saved per shard as each completes (a survey stopped part
way resumes without re-reading the shards it finished), kept beside the shards by `unstall
index URL` (a second node reads no shard to index it), re-built for a rewritten shard."""

from __future__ import annotations

import collections

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
from unstall.data.shards import TarShards
from unstall.errors import StoreError
from unstall.testing import DelayProxy

N = SHARDS * PER_SHARD


def shard_gets(proxy: DelayProxy) -> collections.Counter:
    """GETs per object name (the last path component) the proxy saw."""
    out: collections.Counter = collections.Counter()
    for line, n in proxy.stats.request_lines.items():
        method, path = line.split(" ")[:2]
        if method == "GET" and "list-type" not in path and "?" not in path.split("/")[-1][:1]:
            out[path.split("?")[0].rsplit("/", 1)[-1]] += n
    return out


class FailOne(DelayProxy):
    """Resets every request for one object: its download never completes."""

    def __init__(self, *args, failing: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.failing = failing

    def choose_fault(self, request_line: bytes) -> str | None:
        return "reset" if self.failing.encode() in request_line else None


@pytest.mark.parametrize("disk", [0, "auto"])
def test_a_stopped_survey_resumes_without_rereading_finished_shards(s3_tars, seaweed, disk):
    url, _paths, opts = s3_tars
    failing = FailOne(seaweed.endpoint, failing="train-000002.tar")
    with failing as proxy, pytest.raises(StoreError, match="train-000002"):
        # disk=0: the survey runs as the dataset is made; "auto" (shards kept): the first
        # shard then, the others in the background, and len() waits for them
        len(TarShards(url, disk=disk, **{**opts, "endpoint": proxy.endpoint, "retries": 1}))
    with DelayProxy(seaweed.endpoint) as proxy:
        ds = TarShards(url, disk=disk, **{**opts, "endpoint": proxy.endpoint})
        assert len(ds) == N
        gets = shard_gets(proxy)
        assert ds.stats()["shards"]["index"] == {"local": 3, "beside": 0, "built": 1}
        assert {k: v for k, v in gets.items() if k.endswith(".tar")} == {"train-000002.tar": 1}
        assert [ds[i][1] for i in range(N)] == list(range(N))
        assert all(bytes(ds[i][0]) == sample_bytes(i) for i in range(N))
        ds.location.close()


def _index_command(url: str, seaweed, *extra: str) -> str:
    """`unstall index URL`, with the server's credentials in the environment as a user's."""
    import io
    from contextlib import redirect_stdout

    from unstall.cli import main

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in seaweed.env().items():
            mp.setenv(name, value)
        with redirect_stdout(out):
            assert main(["index", url, "--endpoint", seaweed.endpoint, *extra]) == 0
    return out.getvalue()


def test_index_beside_the_shards_second_node_reads_no_shard(
    s3_tars, seaweed, tmp_path, monkeypatch
):
    """`unstall index URL` on one node; another node (its own cache directory) makes the
    dataset and its loader, asks len(loader) as Lightning does, and has read no shard, only
    the dataset's index manifest (one GET); its epochs give every sample once."""
    url, _paths, opts = s3_tars
    text = _index_command(url, seaweed)
    assert f"{SHARDS} tar shards, {N} samples indexed" in text
    assert f"{SHARDS + 1} index objects written" in text  # each shard's, and the manifest
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "node2"))
    with DelayProxy(seaweed.endpoint) as proxy:
        ds = TarShards(url, **{**opts, "endpoint": proxy.endpoint})
        loader = unstall.DataLoader(
            ds, batch_size=5, shuffle=True, seed=3, num_workers=2, collate_fn=ids_collate
        )
        assert len(ds) == N and len(loader) == -(-N // 5)
        before = shard_gets(proxy)
        assert not [k for k in before if k.endswith(".tar")], before  # no shard read
        assert sorted(k for k in before if k.endswith(".npz")) == ["tar.manifest.npz"]
        assert ds.stats()["shards"]["index"] == {"local": 0, "beside": SHARDS, "built": 0}
        for _ in range(2):
            assert sorted(epoch_ids(loader)) == list(range(N))
        loader.close()
        per_shard = shard_gets(proxy)
    assert all(per_shard[f"train-{s:06d}.tar"] == 1 for s in range(SHARDS))  # once per node


def test_a_shard_rewritten_after_its_index_was_stored_is_indexed_again(
    s3_tars, seaweed, upload, tmp_path, monkeypatch
):
    url, paths, opts = s3_tars
    _index_command(url, seaweed)
    write_tar(paths[1], list(range(1000, 1000 + PER_SHARD + 2)), seed=4)
    upload(url.split("/", 3)[3], [paths[1]])
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "node2"))
    ds = TarShards(url, **opts)
    assert len(ds) == N + 2  # shard 1 indexed again (as it lands, or by len())
    assert ds.stats()["shards"]["index"] == {"local": 0, "beside": SHARDS - 1, "built": 1}
    ids = [ds[i][1] for i in range(len(ds))]
    new = list(range(1000, 1000 + PER_SHARD + 2))
    assert ids == list(range(PER_SHARD)) + new + list(range(2 * PER_SHARD, N))
    assert bytes(ds[PER_SHARD][0]) == sample_bytes(1000, seed=4)


def test_index_of_a_local_directory_beside_its_shards(tmp_path, monkeypatch):
    """The same for shards on a local disk: the index files written beside them serve a
    fresh cache directory (no shard read to index it: the tars' mtimes are unchanged)."""
    from unstall.cli import main

    paths = make_tars(tmp_path / "shards")
    assert main(["index", str(tmp_path / "shards")]) == 0
    assert sorted(p.name for p in (tmp_path / "shards/_unstall_index/tar").iterdir()) == [
        f"{p.name}.npz" for p in paths
    ]
    assert (tmp_path / "shards/_unstall_index/tar.manifest.npz").is_file()
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "node2"))
    ds = TarShards(tmp_path / "shards")
    assert ds.stats()["shards"]["index"] == {"local": 0, "beside": SHARDS, "built": 0}
    assert [ds[i][1] for i in range(N)] == list(range(N))


def test_cache_list_and_clear_cover_index_files(tmp_path, capsys, monkeypatch):
    """Shards read in place keep only their index on this node: `unstall cache list` shows
    it (0 copies, N indexed), `unstall cache clear DIR` removes it, and the next dataset
    indexes the shards again."""
    from unstall.cli import main

    monkeypatch.setenv("COLUMNS", "250")
    paths = make_tars(tmp_path / "shards")
    root = str(paths[0].parent)
    TarShards(root)
    assert main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [k for k, line in enumerate(lines) if root in line]
    assert len(rows) == 1 and "0 shards" in lines[rows[0]], lines
    assert f"{SHARDS} indexed" in lines[rows[0] + 1], lines
    assert main(["cache", "clear", root]) == 0
    assert f"removed {root} (shard index)" in capsys.readouterr().out
    again = TarShards(root)
    assert again.stats()["shards"]["index"] == {"local": 0, "beside": 0, "built": SHARDS}


def test_manifest_holds_every_table_and_skips_a_rewritten_shard(tmp_path):
    """The manifest gives back each shard's table exactly (keys, spans, members, labels);
    a shard at another size or version than the manifest's is left out (to be indexed)."""
    import numpy as np

    from unstall.data.shards.index import ShardInfo
    from unstall.data.shards.manifest import from_manifest, to_manifest
    from unstall.data.shards.tar import index_tar

    paths = make_tars(tmp_path / "shards")
    infos = [ShardInfo(p.name, p.stat().st_size, f"v{n}") for n, p in enumerate(paths)]
    tables = [index_tar(str(p), p.name) for p in paths]
    data = to_manifest(infos, tables)
    changed = [*infos[:2], ShardInfo(infos[2].key, infos[2].size, "v-new"), infos[3]]
    got = from_manifest(data, changed)
    assert sorted(got) == [infos[k].key for k in (0, 1, 3)]
    for k in (0, 1, 3):
        want, have = tables[k], got[infos[k].key]
        assert list(have.keys) == list(want.keys)
        assert np.array_equal(have.spans, want.spans)
        assert np.array_equal(have.first, want.first)
        assert [have.fields[f] for f in have.member_field] == [
            want.fields[f] for f in want.member_field
        ]
        assert np.array_equal(have.member_off, want.member_off)
        assert np.array_equal(have.extra["cls"], want.extra["cls"])
    assert from_manifest(b"not a manifest", infos) == {}


def test_index_command_keeping_copies_indexes_every_shard(s3_tars, seaweed):
    """`unstall index URL --keep-copies`: the shards land (and are indexed) in the background;
    the command waits for every one; training on this node then reads nothing."""
    url, _paths, opts = s3_tars
    text = _index_command(url, seaweed, "--keep-copies", "--local-only")
    assert f"{SHARDS} tar shards, {N} samples indexed" in text
    ds = TarShards(url, **opts)
    stats = ds.stats()["shards"]
    assert ds.length_known and stats["local_shards"] == SHARDS and stats["requests"] == 0
    assert [ds[i][1] for i in range(N)] == list(range(N))
