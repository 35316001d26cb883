"""Four "nodes" share one partitioned cache: each item read from storage once, shards exact."""

from __future__ import annotations

import collections
import signal
import time

from tests.distributed.conftest import WORLD, make_data, reference

N = 96  # 24 samples per rank, 6 batches of 4


def test_each_item_read_once_and_shards_match_single_node(cluster, tmp_path):
    data = make_data(tmp_path / "data", N)
    epochs = 3
    c = cluster(data, pg=True, epochs=epochs, sleep=0.0, capacity="1MiB")  # 4 MiB >= 330 kB
    results = [c.result(rank, timeout=120) for rank in range(WORLD)]
    want = reference(data, epochs)
    for rank in range(WORLD):
        assert results[rank]["epochs"] == want[rank], f"rank {rank} differs from one node"
    per_epoch: list[collections.Counter] = [collections.Counter() for _ in range(epochs)]
    for rank in range(WORLD):
        epoch = 0
        for line in c.reads(rank):
            if line.startswith("#end"):
                epoch += 1
            else:
                per_epoch[epoch][line] += 1
    assert per_epoch[0] == collections.Counter({f"{i:05d}.bin": 1 for i in range(N)})
    assert [sum(e.values()) for e in per_epoch[1:]] == [0] * (epochs - 1)
    # epoch 2 on: a quarter of the data local, the rest from peers, nothing from storage
    peer_hits = [r["stats"][-1]["peer_hits"] - r["stats"][0]["peer_hits"] for r in results]
    assert sum(peer_hits) > N  # (epochs - 1) x ~3/4 of N in all
    assert all(r["stats"][-1]["peer_errors"] == 0 for r in results)


def test_killed_and_frozen_peers_cost_a_timeout_then_storage(cluster, tmp_path):
    data = make_data(tmp_path / "data", N)
    c = cluster(data, pg=False, epochs=2, sleep=0.05, capacity="1MiB")
    deadline = time.monotonic() + 60
    while min(c.progress(r) for r in range(WORLD)) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert min(c.progress(r) for r in range(WORLD)) >= 4, "nodes did not start"
    c.signal(2, signal.SIGKILL)
    c.signal(3, signal.SIGSTOP)
    t0 = time.monotonic()
    survivors = {rank: c.result(rank, timeout=60) for rank in (0, 1)}
    took = time.monotonic() - t0
    want = reference(data, 2)
    for rank, got in survivors.items():
        assert got["epochs"] == want[rank], f"rank {rank} lost or duplicated samples"
        assert got["stats"][-1]["peer_errors"] >= 1  # it did try the dead or frozen peer
    # two epochs of 6 batches, 0.05 s each, plus at most a few 1 s timeouts per peer
    assert took < 30, f"survivors took {took:.1f} s"
    reads = collections.Counter(line for rank in (0, 1) for line in c.reads(rank))
    assert reads, "the failed peers' items were not read from storage"
