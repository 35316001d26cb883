"""Start 4 "nodes" as separate process trees: own shm namespace, own 127.0.0.K, torchrun env."""

from __future__ import annotations

import collections
import hashlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import unstall
from tests import forked as fork_server
from unstall.cache.shm import segment
from unstall.testing.nodes import node_address, node_env
from unstall.testing.ports import free_ports

NODE = str(Path(__file__).with_name("node.py"))
WORLD = 4


def sample_bytes(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def make_data(root: Path, n: int, size: int = 3000) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"{i:05d}.bin").write_bytes(sample_bytes(i, size + (i * 7919) % 500))
    return root


def reference(root: Path, epochs: int) -> list[list[list[str]]]:
    """Per rank, per epoch: sha256 of each sample a single-node uncached run serves."""
    ds = unstall.FileDataset(str(root), sorted(os.listdir(root)))
    out = []
    for rank in range(WORLD):
        loader = unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=11, rank=rank, world_size=WORLD
        )
        per = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            per.append([hashlib.sha256(raw).hexdigest() for b in loader for raw in b])
        out.append(per)
    return out


class ItemsLayer:
    """A cache layer for `PeerServer.register` whose RAM tier holds ``items`` (all hits)."""

    peers = None
    lock_free = True  # as a no-eviction RAM tier: served on the server's loop

    def __init__(self, items: list[bytes]):
        self.items = items
        self.ram = self

    def attach(self) -> None:
        pass

    def get_many(self, indices: list[int], versions: object = None) -> tuple[list[bytes], int]:
        return [self.items[i] for i in indices], 0


def _run(fn, out: mp.Queue) -> None:
    out.put(fn())


def forked(fn, timeout: float = 30.0):
    """``fn()`` in a forked child (a test process must never run obstore: its children fork)."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_run, args=(fn, out))
    proc.start()
    try:
        return out.get(timeout=timeout)
    finally:
        proc.join(10)


#: What each node imports, once, in the module's fork server (`tests.forked`): a node forked
#: from it starts in a fraction of a second instead of 2-3 s of CPU importing torch.
NODE_PRELOAD = (*fork_server.PRELOAD, "torch.distributed", "unstall.distributed.peers")


class Cluster:
    """Four node process trees (each in a session of its own, forked from the fork server
    ``ctx``); `wait` collects their results, `close` kills what is left."""

    def __init__(self, ctx: object, out: Path, data: Path, token: str = "", **cfg: object):
        self.out = out
        self.namespaces = [f"n{os.getpid()}x{k}x{time.monotonic_ns() % 10**6}" for k in range(4)]
        port, store_port = free_ports(2, node_address(0))
        config = json.dumps(dict(out=str(out), data=str(data), **cfg))
        self.procs = []
        for rank in range(WORLD):
            env = {
                "UNSTALL_PEER_STORE_PORT": str(store_port),
                "UNSTALL_PEER_TOKEN": token,
                "UNSTALL_CACHE_DIR": str(out / f"disk-{rank}"),  # each node its own disk
            }
            # empty token: rank 0 makes one and shares it
            full = node_env(rank, WORLD, port, self.namespaces[rank], **env)
            node = fork_server.Forked(
                ctx,
                [NODE, config],
                env=full,
                cwd=Path.cwd(),
                output=out / f"node-{rank}",
                session=True,
                text=True,
            )
            self.procs.append(node)

    def progress(self, rank: int) -> int:
        try:
            return int((self.out / f"progress-{rank}").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def failed(self) -> str:
        """stderr of the nodes that exited with an error (for assertion messages)."""
        return "\n".join(
            f"node {k}: {p.communicate()[1][-2000:]}"
            for k, p in enumerate(self.procs)
            if p.poll() not in (None, 0)
        )

    def signal(self, rank: int, sig: int) -> None:
        os.killpg(self.procs[rank].pid, sig)

    def result(self, rank: int, timeout: float) -> dict:
        """The node's output once written (it then serves peers until `close`)."""
        proc, path = self.procs[rank], self.out / f"out-{rank}.json"
        deadline = time.monotonic() + timeout
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not path.exists():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"node {rank} gave no result:\n{err[-3000:]}")
        return json.loads(path.read_text())

    def reads(self, rank: int) -> list[str]:
        path = self.out / f"reads-{rank}.log"
        return path.read_text().splitlines() if path.exists() else []

    def reads_per_epoch(self, epochs: int) -> list[collections.Counter]:
        """Per epoch, how many times each key was read from storage by all the nodes."""
        per_epoch = [collections.Counter() for _ in range(epochs)]
        for rank in range(WORLD):
            epoch = 0
            for line in self.reads(rank):
                if line.startswith("#end"):
                    epoch += 1
                else:
                    per_epoch[epoch][line] += 1
        return per_epoch

    def rereads(self, epochs: int, results: list[dict]) -> str:
        """Why a key was read from storage again after epoch 1 (an assertion's message): the
        keys per epoch, each node's peer counters per epoch, its cache's evictions and
        refusals, and its stderr's end."""
        lines = []
        for e, counts in enumerate(self.reads_per_epoch(epochs)[1:], start=2):
            if counts:
                lines.append(f"epoch {e} read again: {sorted(counts.items())}")
        for rank, r in enumerate(results):
            per = [
                {k: v for k, v in p.items() if k.startswith(("peer_", "storage_"))}
                for p in r["per_epoch"]
            ]
            tiers = r["cache"][-1] if r.get("cache") else {}
            keep = ("evictions", "too_large", "reclaims", "items_cached", "misses", "hits")
            found = {k: v for k, v in _flat(tiers).items() if k.rsplit(".", 1)[-1] in keep}
            err = (self.out / f"node-{rank}").with_suffix(".err")
            tail = err.read_text()[-600:] if err.exists() else ""
            lines.append(f"node {rank}: per epoch {per}; cache {found}; stderr end {tail!r}")
        return "\n".join(lines)

    def close(self) -> None:
        (self.out / "stop").touch()
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        for ns in self.namespaces:  # a killed node leaves its segment: reclaim it
            head = f"{segment.NAME_PREFIX}-u{os.getuid()}-{ns}-"
            for name in os.listdir(segment.shm_dir()):
                if name.startswith(head):
                    os.unlink(os.path.join(segment.shm_dir(), name))


@pytest.fixture(scope="module")
def node_server():
    """The module's fork server for its nodes (gone, with every process of it, at the end)."""
    with fork_server.server(NODE_PRELOAD) as ctx:
        yield ctx


@pytest.fixture
def cluster(tmp_path: Path, node_server):
    made: list[Cluster] = []

    def start(data: Path, token: str = "", **cfg: object) -> Cluster:
        out = tmp_path / "out"
        out.mkdir()
        made.append(Cluster(node_server, out, data, token, **cfg))
        return made[-1]

    yield start
    for c in made:
        c.close()


def _flat(tree: object, at: str = "") -> dict[str, object]:
    """A nested stats dict's numbers as ``{"a.b.c": value}`` (for `Cluster.rereads`)."""
    if isinstance(tree, dict):
        out: dict[str, object] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{at}.{k}" if at else str(k)))
        return out
    return {at: tree} if isinstance(tree, (int, float)) else {}
