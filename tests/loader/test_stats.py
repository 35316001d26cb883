"""loader.stats(): per-batch waits, worker fetch and prep times, per-epoch records."""

from __future__ import annotations

import time

import unstall
from tests.conftest import IdDataset


class Slow(IdDataset):
    def __getitem__(self, index: int) -> int:
        time.sleep(0.002)
        return index


def test_stats_count_batches_samples_and_waits():
    loader = unstall.DataLoader(Slow(24), batch_size=4, num_workers=1)
    for _ in range(2):
        for _batch in loader:
            pass
    s = loader.stats()
    assert s["batches"] == 12 and s["samples"] == 48 and s["epochs_completed"] == 2
    assert [e["epoch"] for e in s["per_epoch"]] == [0, 1]
    assert [e["samples"] for e in s["per_epoch"]] == [24, 24]
    # 24 samples x 2 ms of work per epoch happen in the worker: prep time shows it
    assert s["prep"]["total_s"] >= 2 * 24 * 0.002 * 0.9
    assert s["wait"]["count"] == 12 and s["wait_s"] > 0
    assert 0 < s["stall_fraction"] <= 1
    loader.reset_stats()
    assert loader.stats()["batches"] == 0


def test_fetch_and_prep_are_timed_apart_for_split_datasets(tmp_path):
    for i in range(8):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]) * 1000)

    def prepare(raw: bytes) -> int:
        time.sleep(0.003)
        return raw[0]

    ds = unstall.FileDataset(tmp_path, [f"{i}.bin" for i in range(8)], transform=prepare)
    loader = unstall.DataLoader(ds, batch_size=4)
    assert sorted(int(x) for b in loader for x in b) == list(range(8))
    s = loader.stats()
    assert s["fetch"]["count"] == 2 and s["fetch"]["total_s"] > 0
    assert s["prep"]["total_s"] >= 8 * 0.003 * 0.9
