"""S3Store against a real SeaweedFS: exact samples through the loader, errors, manifest, stats."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from typing import Any

import pytest

import unstall
from unstall.errors import AccessDeniedError, EmptyDatasetError, MissingKeyError, SampleError
from unstall.stores import open_store
from unstall.stores.s3 import S3Store
from unstall.testing import DelayProxy


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def run_epoch(s3_data, *, num_workers: int = 4, epochs: int = 1, store: Any = None) -> Any:
    """Load every sample as (sha256, index); check each index once per epoch, bytes exact."""
    keys = s3_data.keys
    dataset = unstall.FileDataset(
        store or s3_data.url, keys, labels=list(range(len(keys))), transform=sha256
    )
    loader = unstall.DataLoader(
        dataset,
        batch_size=32,
        shuffle=True,
        num_workers=num_workers,
        collate_fn=as_list,
        cache=False,  # every epoch from the store (a remote dataset's disk tier is on by default)
    )
    for _ in range(epochs):
        got = [sample for batch in loader for sample in batch]
        indices = sorted(i for _, i in got)
        assert indices == list(range(len(keys))), "a sample was lost or duplicated"
        for digest, i in got:
            assert digest == s3_data.digests[keys[i]], f"bytes of {keys[i]!r} differ"
    return loader


def test_every_sample_once_and_identical_4_workers_x_32(s3_data, s3_env):
    s3_env(max_inflight=32)
    loader = run_epoch(s3_data, epochs=2)
    stats = loader.stats()["store"]
    assert stats["max_inflight"] == 32
    assert stats["requests"] == 2 * len(s3_data.keys)  # counted in all 4 workers
    # each worker fetched every batch but its first ahead of time: the guess of its next batch
    # was always right, and no look-ahead request was wasted (requests above are exact)
    assert stats["prefetched"] == 2 * (len(s3_data.keys) - 4 * 32)
    assert stats["bytes"] > 0 and stats["retries"] == 0 and stats["errors"] == 0


def test_listing_matches_upload_and_image_folder_uses_it(s3_data, s3_env):
    folder = unstall.ImageFolder(s3_data.url, raw=True)
    assert list(folder.keys) == s3_data.keys
    assert folder.classes == ["class_0", "class_1", "class_2", "class_3"]
    # like LocalStore: keys under a sub-prefix are still relative to the store's root
    assert open_store(s3_data.url).list("class_1") == [
        k for k in s3_data.keys if k.startswith("class_1/")
    ]


def test_each_worker_makes_its_own_client(s3_data, s3_env, seaweed):
    """No connection carries requests of two processes; every worker's client is its own."""
    with DelayProxy(seaweed.endpoint) as proxy:
        s3_env(proxy.endpoint, max_inflight=8)
        store = S3Store(s3_data.url)
        store.get(s3_data.keys[0])  # the parent's own client exists before the fork
        parent = store.client_info()

        def probe(raw: bytes) -> tuple[int, Any]:
            info = store.client_info()  # runs in the worker, on the worker's copy
            return info["pid"], info["client_pid"]

        dataset = unstall.FileDataset(store, s3_data.keys, transform=probe)
        loader = unstall.DataLoader(dataset, batch_size=32, num_workers=4, collate_fn=as_list)
        seen = {sample for batch in loader for sample in batch}
    worker_pids = {pid for pid, _ in seen}
    assert len(worker_pids) == 4 and os.getpid() not in worker_pids
    assert all(pid == client_pid for pid, client_pid in seen), seen
    assert parent["kind"] == "_HelperBackend" and parent["client_pid"] == os.getpid()
    agents = proxy.stats.agents
    assert agents and all(len(on_conn) == 1 for on_conn in agents.values()), agents
    pids_on_wire = {int(next(iter(a)).rsplit("/", 1)[1]) for a in agents.values()}
    assert worker_pids <= pids_on_wire and os.getpid() not in pids_on_wire


def test_missing_key_names_key_and_bucket(s3_data, s3_env):
    bucket = s3_data.bucket
    store = open_store(s3_data.url)
    with pytest.raises(MissingKeyError) as info:
        store.get("class_0/nope.jpg")
    assert "'class_0/nope.jpg'" in str(info.value) and f"'{bucket}'" in str(info.value)
    assert info.value.key == "class_0/nope.jpg"
    assert store.stats()["store"]["retries"] == 0  # 404 is never retried


def test_missing_key_reaches_training_loop(s3_data, s3_env):
    keys = [*s3_data.keys[:40], "class_9/missing.jpg", *s3_data.keys[40:63]]
    loader = unstall.DataLoader(
        unstall.FileDataset(s3_data.url, keys), batch_size=16, num_workers=2, collate_fn=as_list
    )
    with pytest.raises(SampleError) as info:
        list(loader)
    message = str(info.value)  # torch re-raises worker errors from their message
    assert "sample 40 (key 'class_9/missing.jpg')" in message, message
    assert f"not found in bucket '{s3_data.bucket}'" in message, message


def test_access_denied_names_key_and_bucket_not_retried(s3_data, s3_env):
    s3_env(denied=True)
    bucket = s3_data.bucket
    store = open_store(s3_data.url)
    with pytest.raises(AccessDeniedError) as info:
        store.get(s3_data.keys[3])
    assert f"'{s3_data.keys[3]}'" in str(info.value) and f"'{bucket}'" in str(info.value)
    stats = store.stats()["store"]
    assert stats["requests"] == 1 and stats["retries"] == 0 and stats["errors"] == 1


def test_empty_listing_is_a_clear_error(s3_data, s3_env):
    bucket, empty = s3_data.bucket, s3_data.empty_bucket
    with pytest.raises(EmptyDatasetError, match=f"s3://{empty}"):
        open_store(f"s3://{empty}").list_cached()
    with pytest.raises(EmptyDatasetError, match=f"s3://{bucket}/no-such-prefix"):
        unstall.ImageFolder(f"s3://{bucket}/no-such-prefix", raw=True)


def test_manifest_is_reused_without_listing_again(s3_data, s3_env, seaweed, tmp_path):
    with DelayProxy(seaweed.endpoint) as proxy:
        opts = {"endpoint": proxy.endpoint, "manifest_dir": tmp_path}
        assert S3Store(s3_data.url, **opts).list_cached() == s3_data.keys
        assert S3Store(s3_data.url, **opts).list_cached() == s3_data.keys
        lists = sum(n for line, n in proxy.stats.request_lines.items() if "list-type=2" in line)
        assert lists == 1
        assert len(list(tmp_path.glob("*.txt"))) == 1
        assert S3Store(s3_data.url, **opts).list_cached(refresh=True) == s3_data.keys
        lists = sum(n for line, n in proxy.stats.request_lines.items() if "list-type=2" in line)
        assert lists == 2


def test_default_max_inflight_from_measured_latency(s3_data, s3_env, seaweed):
    with DelayProxy(seaweed.endpoint, delay=0.02) as proxy:
        store = S3Store(s3_data.url, endpoint=proxy.endpoint, target_rate=2000)
        data = store.get_many(s3_data.keys[:40])
    assert [sha256(d) for d in data] == [s3_data.digests[k] for k in s3_data.keys[:40]]
    stats = store.stats()["store"]
    assert stats["latency_ms"] >= 20
    assert 40 <= stats["max_inflight"] <= 256  # 2000/s x >= 20 ms


def test_put_and_pickle(s3_data, s3_env):
    bucket = s3_data.bucket
    store = open_store(f"s3://{bucket}/put-test")
    store.put("a/b.bin", b"\x00payload\xff")
    assert store.get("a/b.bin") == b"\x00payload\xff"
    copy = pickle.loads(pickle.dumps(store))
    assert copy.url == f"s3://{bucket}/put-test" and copy.client_info()["kind"] is None
    store.close()
    store.close()  # idempotent


def test_whole_object_gets_empty_objects_and_servers_without_ranges(s3_data, s3_env, seaweed):
    """One ranged GET per object; an empty object (416) and a server that ignores ``Range``
    (200 instead of 206) fall back to plain GETs, with the exact bytes and request counts."""
    url = f"s3://{s3_data.bucket}/ranges"
    items = [("empty", b""), ("one", b"z"), ("big", bytes(range(256)) * 700)]
    S3Store(url, **seaweed.store_options()).put_many(items)
    keys = [k for k, _ in items]
    want = [d for _, d in items]
    for ignore_range, requests in ((False, [1, 2, 1]), (True, [2, 1, 1])):
        with DelayProxy(seaweed.endpoint, ignore_range=ignore_range) as proxy:
            store = S3Store(url, **seaweed.store_options(endpoint=proxy.endpoint), max_inflight=4)
            counts = []
            for key in ("one", "empty", "big"):  # one at a time: exact counts per key
                before = store.stats()["store"]["requests"]
                assert store.get_many([key]) == [dict(items)[key]]
                counts.append(store.stats()["store"]["requests"] - before)
            assert store.get_many(keys) == want
            store.close()
        # with ranges: 416 for the empty object costs it a second GET; without: the first
        # object pays (so GETs are ranged), then plain GETs for all (the store remembers)
        assert counts == requests, (ignore_range, counts)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="max_inflight=0"):
        S3Store("s3://bucket/prefix", max_inflight=0)
    with pytest.raises(ValueError, match="no bucket"):
        S3Store("s3:///x")


def test_truncated_or_foreign_manifest_is_ignored(tmp_path):
    from unstall.stores import manifest

    path = manifest.manifest_path("s3://b/p", "http://x", tmp_path)
    manifest.write_manifest(path, "s3://b/p", ["a/1.jpg", "a/2.jpg"])
    assert manifest.read_manifest(path, "s3://b/p") == ["a/1.jpg", "a/2.jpg"]
    assert manifest.read_manifest(path, "s3://b/other") is None
    path.write_text(path.read_text().rsplit("a/2.jpg", 1)[0])  # cut short
    assert manifest.read_manifest(path, "s3://b/p") is None
    assert manifest.manifest_path("s3://b/p", "http://y", tmp_path) != path


def test_server_stops_and_leaves_nothing_behind():
    from unstall.testing import SeaweedServer

    server = SeaweedServer(["unstall-stop-test"]).start()
    proc, directory = server.proc, server.dir
    assert proc is not None and proc.poll() is None and directory and os.path.isdir(directory)
    # weed's unix socket per gRPC server, at a fixed /tmp path keyed by the server's port
    ours = _weed_grpc_sockets(proc.pid)
    assert len(ours) == 4, ours  # master, volume, filer, s3
    server.stop()
    server.stop()  # idempotent
    assert proc.poll() is not None and not os.path.exists(directory)
    assert not any(os.path.exists(p) for p in ours), ours


def _weed_grpc_sockets(pid: int) -> set[str]:
    """The unix sockets process ``pid`` listens on under /tmp (``/proc/net/unix`` by inode,
    matched to the process's open sockets)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return {
        r[7] for r in rows if len(r) >= 8 and r[6] in inodes and r[7].startswith("/tmp/seaweedfs-")
    }


LOOKAHEAD_CHILD = r"""
import hashlib, json, sys, time
from unstall.stores.s3 import S3Store

url, keys = sys.argv[1], json.loads(sys.argv[2])
store = S3Store(url, max_inflight=8, in_process=True)  # this process's own client
fetcher = store._client()
for i in range(0, 40, 4):  # hints that are never claimed: the oldest are cancelled
    store.prefetch(keys[i : i + 4])
store.prefetch(["missing/key.jpg"] + keys[40:44])  # a failing hint raises nowhere
store.prefetch(keys[:2])  # the latest hint: its keys are not "fetched ahead" yet
time.sleep(0.5)
kept = len(fetcher._ahead)
data = store.get_many(keys[40:44] + keys[:2])  # claimed ahead, and fetched anew
time.sleep(0.2)
print(json.dumps({"kept": kept, "left": len(fetcher._ahead), "stats": store.stats()["store"],
                  "digests": [hashlib.sha256(d).hexdigest() for d in data]}))
"""


def test_prefetch_is_bounded_and_claimed_exactly(s3_data, s3_env):
    """Look-ahead keeps at most 2x the largest hint, serves claimed keys' exact bytes, and an
    unclaimed failing hint raises nowhere (run in a child: its obstore client must not fork)."""
    import json
    import subprocess
    import sys

    s3_env()
    keys = s3_data.keys[:44]
    out = subprocess.run(
        [sys.executable, "-c", LOOKAHEAD_CHILD, s3_data.url, json.dumps(keys)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout)
    assert got["kept"] == 2 * 5 and got["left"] == got["kept"] - 6
    assert got["digests"] == [s3_data.digests[k] for k in keys[40:44] + keys[:2]]
    assert got["stats"]["prefetched"] == 4  # hinted by an earlier call: 40..43, not 0 and 1
    assert "Traceback" not in out.stderr and "never retrieved" not in out.stderr
