"""One "node" of the multi-node tests: a rank under torchrun's environment with a peer cache.

Run as ``python node.py CONFIG_JSON``. Storage reads are logged per key to
``reads-<node>.log`` (one line each, from every process of the node); each
epoch's samples (sha256 per sample, in order) go to ``out-<node>.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import torch.distributed as dist

import unstall
import unstall.distributed.peers
from unstall.data.shards import TarShards
from unstall.stores.local import LocalStore


def append_lines(log: str, lines: list[str]) -> None:
    """``lines`` appended to ``log`` in one write (O_APPEND: whole lines from any process)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, "".join(f"{line}\n" for line in lines).encode())
    finally:
        os.close(fd)


class LoggedStore(LocalStore):
    """A local store that appends every key it reads to a log file (O_APPEND: one line each)."""

    def __init__(self, root: str, log: str):
        super().__init__(root)
        self.log = log

    def _get_many(self, keys: list[str]) -> list[bytes]:
        data = super()._get_many(keys)
        append_lines(self.log, keys)
        return data


class LoggedTars(TarShards):
    """`TarShards` that appends each sample it reads (``<shard>:<key>``) to a log file, one
    line each, as `LoggedStore` does for files."""

    def __init__(self, root: str, log: str):
        super().__init__(root)
        self.log = log

    def fetch(self, indices):
        data = super().fetch(indices)
        append_lines(self.log, [self.key(i) for i in indices])
        return data


def digests(batch: list[tuple[bytes, int]]) -> list[str]:
    """A batch of tar-shard samples ``(image bytes, label)``: sha256 of each, label included."""
    return [hashlib.sha256(image + b"|%d" % label).hexdigest() for image, label in batch]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out_dir = cfg["out"]
    log = os.path.join(out_dir, f"reads-{rank}.log")
    if cfg["pg"]:
        dist.init_process_group("gloo")
    collate = None
    if cfg.get("tars"):  # webdataset tar shards, read in place
        ds = LoggedTars(cfg["data"], log)
        collate = digests
    else:
        store = LoggedStore(cfg["data"], log)
        ds = unstall.FileDataset(store, sorted(store.list()))
    # a peer request's limit: 1 s where a test stops or kills a peer on purpose (its cost is
    # what it checks); elsewhere a generous one, so that a node merely slowed by a loaded
    # machine is not taken for lost (its items then read from storage twice)
    peers = unstall.Peers(timeout_s=cfg.get("peer_timeout_s", 10.0), tls=cfg.get("tls", True))
    cache = unstall.Cache(cfg["capacity"], disk=cfg.get("disk"), peers=peers)
    loader = unstall.DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        seed=11,
        num_workers=2,
        rank=rank,
        world_size=world,
        cache=cache,
        collate_fn=collate,
    )
    epochs, stats, per_epoch, tiers, total = [], [], [], [], 0
    for epoch in range(cfg["epochs"]):
        loader.set_epoch(epoch)
        if [rank, epoch] == cfg.get("freeze"):  # frozen (server too) until the test's SIGCONT
            open(os.path.join(out_dir, f"frozen-{rank}"), "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        seen = []
        for batch in loader:
            seen += batch if collate else [hashlib.sha256(raw).hexdigest() for raw in batch]
            total += len(batch)
            with open(os.path.join(out_dir, f"progress-{rank}"), "w") as f:
                f.write(str(total))  # samples so far, all epochs
            time.sleep(cfg["sleep"])
        epochs.append(seen)
        if cfg["pg"]:
            dist.barrier()
            with open(log, "a") as f:
                f.write(f"#end {epoch}\n")
            dist.barrier()
        stats.append(loader.stats().get("peers", {}))  # cumulative
        per_epoch.append(loader.stats()["per_epoch"][-1].get("peers", {}))
        tiers.append(loader.stats()["cache"])
    server = unstall.distributed.peers.running_server()
    result = {
        "epochs": epochs,
        "stats": stats,
        "per_epoch": per_epoch,
        "cache": tiers,  # cumulative
        "server": f"{server.host}:{server.port}",
        "certificate": server.certificate and server.certificate.cert_pem,  # None: plain HTTP
    }
    path = os.path.join(out_dir, f"out-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    if cfg["pg"]:
        dist.barrier()  # every node served its peers to the end
        dist.destroy_process_group()
    else:  # keep serving peers until the test says all are done (bounded)
        stop = os.path.join(out_dir, "stop")
        deadline = time.monotonic() + 60
        while not os.path.exists(stop) and time.monotonic() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
