"""A fresh remote tar dataset (no index anywhere): training starts after its first shard.

Making the dataset indexes the first shard; the others download in the background in key
order, each indexed as it lands. The sample count is then not known: a plain loop streams
epoch 0 window by window, ``len()`` waits for every shard (what Lightning and HF Trainer
ask first). Every epoch gives each sample once (0 and 2 workers, 2 ranks), and resume is
exact whether the run that saved or the run that loads was still landing shards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import unstall
from tests.data.shards.helpers import epoch_ids, ids_collate, make_tars
from tests.data.shards.test_index import shard_gets
from unstall.data.shards import TarShards
from unstall.data.shards.shard_files import ShardFiles
from unstall.loader.sampling import OrderSpec, streamed_batches
from unstall.testing import DelayProxy

SHARDS, PER_SHARD = 6, 10
N = SHARDS * PER_SHARD


@pytest.fixture
def fresh(tmp_path, upload, seaweed, monkeypatch):
    """Tars on S3 that this node has never indexed; ``fresh.node()`` a new node's cache."""
    paths = make_tars(tmp_path / "shards", shards=SHARDS, per_shard=PER_SHARD)
    url = upload(f"fresh-{tmp_path.name}", paths)
    nodes = iter(range(1000))

    class Fresh:
        def __init__(self):
            self.url, self.opts = url, seaweed.store_options()

        def node(self) -> str:
            """A new empty UNSTALL_CACHE_DIR (a node that has seen nothing)."""
            path = str(tmp_path / f"node{next(nodes)}")
            monkeypatch.setenv("UNSTALL_CACHE_DIR", path)
            return path

    out = Fresh()
    out.node()
    return out


def _loader(ds, **kw):
    kw.setdefault("num_workers", 2)
    return unstall.DataLoader(ds, batch_size=7, shuffle=True, seed=5, collate_fn=ids_collate, **kw)


def tar_gets(proxy: DelayProxy) -> dict[str, int]:
    return {k: v for k, v in shard_gets(proxy).items() if k.endswith(".tar")}


def test_a_plain_loop_reaches_its_first_batch_after_the_first_shard(fresh, seaweed, monkeypatch):
    """No background download: the first batch has read one shard; len() then indexes the
    rest (each shard read once: kept for training), and the epoch goes on exactly once."""
    monkeypatch.setattr(ShardFiles, "start_background", lambda *a, **k: None)
    with DelayProxy(seaweed.endpoint) as proxy:
        ds = TarShards(fresh.url, **{**fresh.opts, "endpoint": proxy.endpoint})
        assert not ds.length_known
        stats = ds.stats()["shards"]
        assert stats["samples"] is None and stats["length"].startswith("not known yet: 1 of 6")
        assert tar_gets(proxy) == {"train-000000.tar": 1}  # the first shard only
        loader = _loader(ds, num_workers=0)
        it = iter(loader)
        first = next(it).tolist()
        assert tar_gets(proxy) == {"train-000000.tar": 1}
        assert {i // PER_SHARD for i in first} == {0}
        assert not ds.length_known
        assert len(loader) == -(-N // 7)  # len(): every shard indexed now
        assert ds.length_known and ds.stats()["shards"]["length"] == "known"
        assert tar_gets(proxy) == {f"train-{s:06d}.tar": 1 for s in range(SHARDS)}
        rest = [i for b in it for i in b.tolist()]
        assert sorted(first + rest) == list(range(N))
        assert sorted(epoch_ids(loader)) == list(range(N))  # epoch 1: the full permutation
        assert tar_gets(proxy) == {f"train-{s:06d}.tar": 1 for s in range(SHARDS)}
        assert ds.stats()["shards"]["index"] == {"local": 0, "beside": 0, "built": SHARDS}
        ds.location.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_while_a_fresh_dataset_lands(fresh, seaweed, workers):
    with DelayProxy(seaweed.endpoint, delay=0.02) as proxy:
        ds = TarShards(fresh.url, **{**fresh.opts, "endpoint": proxy.endpoint})
        assert not ds.length_known
        loader = _loader(ds, num_workers=workers)
        epoch0 = epoch_ids(loader)
        assert sorted(epoch0) == list(range(N))
        # key-order windows of 1, 2 and 3 shards, each window's samples permuted together
        assert {i // PER_SHARD for i in epoch0[:PER_SHARD]} == {0}
        assert {i // PER_SHARD for i in epoch0[PER_SHARD : 3 * PER_SHARD]} == {1, 2}
        for _ in range(2):
            assert sorted(epoch_ids(loader)) == list(range(N))
        assert tar_gets(proxy) == {f"train-{s:06d}.tar": 1 for s in range(SHARDS)}
        loader.close()
        ds.location.close()


def test_two_ranks_while_a_fresh_dataset_lands(fresh, seaweed, monkeypatch):
    """Both ranks made before either reads: both stream epoch 0; together exactly once.

    The background downloads start once both ranks are made (held until then): else, on a
    loaded machine, the first rank's lands every shard before the second is made."""
    proxy = DelayProxy(seaweed.endpoint, delay=0.1).__enter__()
    opts = {**fresh.opts, "endpoint": proxy.endpoint}
    start, held = ShardFiles.start_background, []
    monkeypatch.setattr(ShardFiles, "start_background", lambda *a, **k: held.append((a, k)))
    datasets = [TarShards(fresh.url, **opts) for _ in range(2)]
    monkeypatch.setattr(ShardFiles, "start_background", start)
    assert len(held) == 2 and not any(ds.length_known for ds in datasets)
    for a, k in held:  # the shards land now, while the ranks read
        start(*a, **k)
    got = {}
    for epoch in range(2):
        for rank, ds in enumerate(datasets):
            loader = _loader(ds, rank=rank, world_size=2)
            loader.set_epoch(epoch)
            got[epoch, rank] = epoch_ids(loader)
            loader.close()
        assert sorted(got[epoch, 0] + got[epoch, 1]) == list(range(N))
        assert len(got[epoch, 0]) == len(got[epoch, 1]) == N // 2
    proxy.__exit__(None, None, None)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_while_shards_land(fresh, workers):
    """Each loader on a new node (nothing indexed): the reference streams epoch 0; a cut
    run's state_dict (asks len()) and the resumed run give the same batches."""
    from tests.conftest import check_resume

    def make():
        fresh.node()
        ds = TarShards(fresh.url, **fresh.opts)
        assert not ds.length_known
        return _loader(ds, num_workers=workers)

    check_resume(make, epochs=2)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_streamed_batches_are_the_batches_of_the_whole_order(world, drop_last):
    rng = np.random.default_rng(0)
    for n in (1, 2, 17, 40):
        order = rng.permutation(n)
        cuts = np.sort(rng.integers(0, n + 1, 4))
        chunks = np.split(order, cuts)
        for rank in range(world):
            spec = OrderSpec(n, 3, True, drop_last, 0, rank, world, permute=lambda s, e, o=order: o)
            want = list(spec.batches(0))
            for start in (0, 1, 2):
                assert list(streamed_batches(iter(chunks), spec, start)) == want[start:]


def _child(url: str, opts: dict, cache: str, script: str) -> subprocess.Popen:
    code = (
        "import json, sys\n"
        "from unstall.data.shards import TarShards\n"
        f"url, opts = {url!r}, json.loads({json.dumps(opts)!r})\n" + script
    )
    env = {**os.environ, "UNSTALL_CACHE_DIR": cache}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_killed_survey_resumes_without_rereading_finished_shards(fresh, seaweed, tmp_path):
    """A process indexing the shards (disk=0: read, indexed, deleted) is SIGKILLed part way;
    the next run on the node reads only the shards without a saved index."""
    from unstall.data.shards.index import index_dir, index_file

    cache = str(tmp_path / "killed")
    with DelayProxy(seaweed.endpoint, delay=0.4) as proxy:
        opts = {**fresh.opts, "endpoint": proxy.endpoint}
        child = _child(fresh.url, opts, cache, "len(TarShards(url, disk=0, **opts))\n")
        os.environ["UNSTALL_CACHE_DIR"] = cache
        directory = index_dir(fresh.url.rstrip("/"), "tar")
        ds_infos = None
        deadline = time.time() + 60
        while time.time() < deadline:
            done = [n for n in os.listdir(directory) if n.endswith(".npz")]
            if done:
                break
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert done, child.stderr.read()
        before = tar_gets(proxy)
    with DelayProxy(seaweed.endpoint) as proxy:
        ds = TarShards(fresh.url, disk=0, **{**fresh.opts, "endpoint": proxy.endpoint})
        ds_infos = ds.index.shards
        saved = [i.key for i in ds_infos if i.key not in tar_gets(proxy)]
        finished = ds.stats()["shards"]["index"]["local"]
        assert 1 <= finished < SHARDS, before  # killed part way
        assert set(tar_gets(proxy)) == {i.key for i in ds_infos} - set(saved)
        assert all(v == 1 for v in tar_gets(proxy).values())
        assert len(saved) == finished
        assert all(os.path.exists(index_file(directory, i)) for i in ds_infos)
        assert [ds[i][1] for i in range(N)] == list(range(N))
        ds.location.close()


def test_a_second_node_process_reads_no_shard_before_its_first_batch(fresh, seaweed, tmp_path):
    """`unstall index` on one node; a separate process with its own cache directory makes
    the dataset (GETs: the manifest only), then its first batch reads that batch's shard."""
    first = TarShards(fresh.url, disk=0, **fresh.opts)
    assert first.publish_index() == SHARDS + 1
    first.location.close()
    with DelayProxy(seaweed.endpoint) as proxy:
        opts = {**fresh.opts, "endpoint": proxy.endpoint}
        script = (
            "import unstall\n"
            "from tests.data.shards.helpers import ids_collate\n"
            "ds = TarShards(url, **opts)\n"
            "print(json.dumps(ds.stats()['shards']['index']), flush=True)\n"
            "sys.stdin.readline()\n"
            "loader = unstall.DataLoader(ds, batch_size=7, shuffle=True, seed=5, "
            "collate_fn=ids_collate)\n"
            "print(json.dumps(next(iter(loader)).tolist()), flush=True)\n"
        )
        child = _child(fresh.url, opts, str(tmp_path / "node-b"), script)
        sources = json.loads(child.stdout.readline() or "null")
        made = shard_gets(proxy)
        child.stdin.write("go\n")
        child.stdin.flush()
        batch = json.loads(child.stdout.readline() or "null")
        child.wait(timeout=60)
        assert child.returncode == 0, child.stderr.read()
    assert sources == {"local": 0, "beside": SHARDS, "built": 0}
    assert {k: v for k, v in made.items() if k.endswith((".tar", ".npz"))} == {
        "tar.manifest.npz": 1
    }
    assert len(batch) == 7 and {i // PER_SHARD for i in batch} == {0}  # epoch 0: first window


def test_each_shard_is_indexed_as_its_bytes_stream_in(fresh, monkeypatch):
    """No shard file is read to index it (the header reader is never called, in the store's
    helper process either): each index comes from the download's own stream."""
    from unstall.data.shards import tar

    def no_second_pass(*args, **kwargs):
        raise AssertionError("a shard was read again to index it")

    monkeypatch.setattr(tar, "_members_fast", no_second_pass)
    monkeypatch.setattr(tar, "_members_tarfile", no_second_pass)
    ds = TarShards(fresh.url, **fresh.opts)  # the store's helper starts (forks) here
    assert len(ds) == N
    assert ds.stats()["shards"]["index"] == {"local": 0, "beside": 0, "built": SHARDS}
    assert [ds[i][1] for i in range(N)] == list(range(N))
    ds.location.close()


def test_len_first_as_lightning_does_waits_for_every_shard_then_runs_as_indexed(fresh, seaweed):
    """len(loader) before the first batch (Lightning, HF Trainer): every shard downloaded
    and indexed (once each, kept for training), then the epochs as with a stored index:
    epoch 0 in the same key-order windows, each sample once."""
    with DelayProxy(seaweed.endpoint) as proxy:
        ds = TarShards(fresh.url, **{**fresh.opts, "endpoint": proxy.endpoint})
        loader = _loader(ds)
        assert not ds.length_known
        assert len(loader) == -(-N // 7) and len(ds) == N and ds.length_known
        assert tar_gets(proxy) == {f"train-{s:06d}.tar": 1 for s in range(SHARDS)}
        epoch0 = epoch_ids(loader)
        assert sorted(epoch0) == list(range(N))
        assert {i // PER_SHARD for i in epoch0[:PER_SHARD]} == {0}
        assert sorted(epoch_ids(loader)) == list(range(N))
        assert tar_gets(proxy) == {f"train-{s:06d}.tar": 1 for s in range(SHARDS)}
        loader.close()
        ds.location.close()


def test_len_shows_a_progress_bar_on_a_terminal(fresh, seaweed, monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with DelayProxy(seaweed.endpoint, delay=0.1) as proxy:
        ds = TarShards(fresh.url, **{**fresh.opts, "endpoint": proxy.endpoint})
        assert not ds.length_known
        assert len(ds) == N
        ds.location.close()
    assert "indexing the shards of" in capsys.readouterr().err


def test_two_ranks_one_made_after_every_shard_landed(fresh, seaweed, monkeypatch):
    """What a loaded machine gave the test above: rank 0 made while the shards land (length
    not known), rank 1 after they all landed (known). Their epochs still split exactly once:
    epoch 0 goes in the same key-order windows either way."""
    start, held = ShardFiles.start_background, []
    monkeypatch.setattr(ShardFiles, "start_background", lambda *a, **k: held.append((a, k)))
    streaming = TarShards(fresh.url, **fresh.opts)
    monkeypatch.setattr(ShardFiles, "start_background", start)
    assert not streaming.length_known
    indexed = TarShards(fresh.url, **fresh.opts)  # its own download lands (and indexes) all
    indexed.complete()
    assert indexed.length_known and not streaming.length_known
    for epoch in range(2):
        got = []
        for rank, ds in enumerate([streaming, indexed]):
            loader = _loader(ds, rank=rank, world_size=2)
            loader.set_epoch(epoch)
            got.append(epoch_ids(loader))
            loader.close()
        assert sorted(got[0] + got[1]) == list(range(N))
        assert len(got[0]) == len(got[1]) == N // 2
