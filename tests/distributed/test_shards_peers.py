"""Four "nodes" share one partitioned cache over webdataset tar shards read in place: each
sample read from the shards once for the cluster, every rank's samples exactly those of one
node, and from epoch 2 the other nodes' samples come from peers (issue 32: peers unchanged
for shard datasets)."""

from __future__ import annotations

import collections

import unstall
from tests.data.shards.helpers import make_tars
from tests.distributed.conftest import WORLD
from tests.distributed.node import digests
from unstall.data.shards import TarShards

SHARDS, PER_SHARD = 8, 12
N = SHARDS * PER_SHARD  # 24 samples per rank, 6 batches of 4


def reference(root: str, epochs: int) -> list[list[list[str]]]:
    """Per rank, per epoch: the digests a single-node uncached run over the tars serves."""
    ds = TarShards(root)
    out = []
    for rank in range(WORLD):
        loader = unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=11, rank=rank, world_size=WORLD, collate_fn=digests
        )
        per = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            per.append([d for b in loader for d in b])
        out.append(per)
    return out


def test_tar_shards_each_sample_read_once_and_ranks_match_one_node(cluster, tmp_path, monkeypatch):
    data = tmp_path / "tars"
    make_tars(data, shards=SHARDS, per_shard=PER_SHARD)
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "reference-index"))
    epochs = 3
    want = reference(str(data), epochs)
    c = cluster(data, pg=True, epochs=epochs, sleep=0.0, capacity="1MiB", tars=True)
    results = [c.result(rank, timeout=120) for rank in range(WORLD)]
    for rank in range(WORLD):
        assert results[rank]["epochs"] == want[rank], f"rank {rank} differs from one node"
    keys = [f"train-{n // PER_SHARD:06d}.tar:s{n:06d}" for n in range(N)]
    per_epoch = c.reads_per_epoch(epochs)
    # every sample read from its shard once by the whole cluster (by a rank or by its owner's
    # server; the caches size themselves from the index, reading none), then never again:
    # epochs 2 and 3 come from the nodes' RAM and their peers
    assert per_epoch[0] == collections.Counter(dict.fromkeys(keys, 1))
    assert [sum(e.values()) for e in per_epoch[1:]] == [0] * (epochs - 1), c.rereads(
        epochs, results
    )
    for e in range(1, epochs):
        hits = sum(r["per_epoch"][e]["peer_hits"] for r in results)
        assert sum(r["per_epoch"][e]["storage_reads"] for r in results) == 0
        assert sum(r["per_epoch"][e]["peer_errors"] for r in results) == 0
        assert N // 2 < hits < N  # ~3/4 of the samples live on another node
