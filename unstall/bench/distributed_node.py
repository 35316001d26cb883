"""One node of `bench distributed`: a rank under torchrun's environment, timed per epoch.

Run as ``python -m unstall.bench.distributed_node CONFIG_JSON`` by `unstall.bench.distributed`.
Writes ``<out>/node-<rank>.json``: per epoch the measurement, this node's storage
bytes (its `ThrottledStore` link, the peer server's reads included) and peer bytes.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

import torch.distributed as dist

from unstall.bench.harness import measure
from unstall.cache import Cache
from unstall.data import FileDataset
from unstall.loader import DataLoader
from unstall.stores.local import LocalStore
from unstall.testing.throttle import ThrottledStore


def main(cfg: dict[str, Any]) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = LocalStore(cfg["root"], bypass_page_cache=True)
    store = ThrottledStore(local, bytes_per_s=cfg["bytes_per_s"])
    dataset = FileDataset(store, cfg["keys"])
    variant = cfg["variant"]
    peers = None
    if variant in ("partitioned", "plain_http"):
        from unstall.distributed import Peers

        peers = Peers(timeout_s=2.0, tls=variant == "partitioned")
    capacity = cfg["dataset_bytes"] * 2 if variant == "local" else cfg["capacity"]
    cache = Cache(capacity, peers=peers, name=f"bench-{variant}", keep=0)
    loader = DataLoader(
        dataset,
        batch_size=cfg["batch_size"],
        shuffle=True,
        seed=0,
        num_workers=cfg["workers"],
        persistent_workers=cfg.get("persistent_workers", False),
        rank=rank,
        world_size=world,
        cache=cache,
    )
    if variant == "local":  # the ceiling: every node holds the whole dataset before timing
        warm = FileDataset(local, cfg["keys"])  # same fingerprint, same segment, no throttle
        for _ in DataLoader(warm, batch_size=cfg["batch_size"], cache=cache):
            pass
    epochs, storage, peer = [], [], []
    last_storage, last_peer = 0, 0
    try:
        for epoch in range(cfg["epochs"]):
            loader.set_epoch(epoch)
            dist.barrier()
            cpu0 = _cpu_s()
            epochs.append(measure(loader, rate=cfg["rate"]).as_dict())
            epochs[-1]["cpu_s"] = round(_cpu_s() - cpu0, 3)  # this node's processes
            dist.barrier()  # every node's reads of this epoch are done (its server's too)
            now_storage = store.stats()["storage"]["bytes"]
            now_peer = loader.stats().get("peers", {}).get("peer_bytes", 0)
            storage.append(now_storage - last_storage)
            peer.append(now_peer - last_peer)
            last_storage, last_peer = now_storage, now_peer
        tls = loader.stats().get("peers", {}).get("tls", False)  # what the peers really used
        out = {"epochs": epochs, "storage_bytes": storage, "peer_bytes": peer, "tls": tls}
        path = os.path.join(cfg["out"], f"node-{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)
        dist.barrier()  # serve peers until every node is done
    finally:
        cache.close()
        store.close()
        dist.destroy_process_group()


def _cpu_s() -> float:
    """CPU seconds of this process and its joined children (the epoch's workers)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
