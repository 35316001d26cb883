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


def test_worker_timings_survive_torchs_pin_memory_thread():
    """On a CUDA machine with ``pin_memory=True`` torch's pin thread rebuilds every tuple it
    is handed: the task timing must come through with its span (the analyzer's timeline),
    as first seen on an H100 where `unstall analyze` found no worker timings."""
    import pickle

    from torch.utils.data._utils.pin_memory import pin_memory

    from unstall.loader.fetch import Timing

    timing = Timing.of(time.perf_counter() - 0.01, time.perf_counter(), time.thread_time(), 4)
    timing = pickle.loads(pickle.dumps(timing))  # as it crosses the worker's result queue
    pinned = pin_memory(([7, 8], timing))  # the (batch, timing) pair a worker hands back
    batch, out = pinned
    assert batch == [7, 8] and out is timing
    fetch_s, prep_s = out
    assert fetch_s >= 0.009 and prep_s >= 0
    assert out.span[0] == -1 and out.span[5] == 4 and len(out.span) == 7
