"""`bench distributed`: 4 nodes on this machine, dataset 2x a node's cache, slow storage.

Each "node" is a process tree of its own (own shared-memory namespace, own
loopback address 127.0.0.2..5, torchrun's environment, a gloo process group)
with its own `ThrottledStore` link. Four variants, same run, same loaders:

- ``alone``: each node caches alone (``Cache(C)``): half its shard hits at best.
- ``partitioned``: ``Cache(C, peers=Peers())``: each item cached by its owner,
  the nodes' caches together hold the dataset, misses served by peers over TLS
  (the default).
- ``plain_http``: the same with ``Peers(tls=False)``: what TLS costs.
- ``local``: every node caches the whole dataset (the ceiling: all local hits).

``ratio`` = partitioned / local and ``vs_alone`` = partitioned / alone, both on
the cluster's samples/s from epoch 2 (each epoch's wall time is the slowest
node's); ``plain_http`` holds the same two figures without TLS. Goals: storage
bytes 0 from epoch 2, ratio >= 0.9, vs_alone >= 1.8, TLS within 5 % of plain HTTP.
Each node's workers persist across epochs (``persistent_workers=True``, the way to use
peers: TLS's per-process costs, its first connection and handshakes, are paid once);
``run(persistent_workers=False)`` starts fresh workers every epoch, which pays them each
epoch (TLS / plain 0.92 there).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from unstall.bench.harness import BenchResult, Measurement, row
from unstall.stores.local import LocalStore
from unstall.testing.nodes import node_address, start_node
from unstall.testing.ports import free_port

DESCRIPTION = "4 nodes: a cache partitioned across nodes vs each caching alone, slow storage"
VARIANTS = ("alone", "partitioned", "plain_http", "local")
WORLD = 4
EPOCHS = 3


def _run_variant(variant: str, cfg: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    """Start the 4 nodes of one variant and return their results (by rank)."""
    out = tempfile.mkdtemp(prefix=f"unstall-bench-dist-{variant}-")
    port = free_port(node_address(0))
    config = json.dumps(dict(cfg, variant=variant, out=out))
    procs = []
    try:
        for rank in range(WORLD):
            argv = [sys.executable, "-m", "unstall.bench.distributed_node", config]
            namespace = f"bench{os.getpid()}n{rank}"
            procs.append(start_node(argv, rank, WORLD, port, namespace))
        deadline = time.monotonic() + timeout_s
        for rank, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                msg = f"bench node {rank} ({variant}) ran past {timeout_s} s"
                raise RuntimeError(msg) from None
            if proc.returncode != 0:
                raise RuntimeError(f"bench node {rank} ({variant}) failed:\n{err[-3000:]}")
        results = []
        for rank in range(WORLD):
            with open(os.path.join(out, f"node-{rank}.json")) as f:
                results.append(json.load(f))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
        shutil.rmtree(out, ignore_errors=True)


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Cluster figures per epoch: samples, slowest node's wall, storage and peer bytes."""
    epochs = []
    for e in range(EPOCHS):
        ms = [r["epochs"][e] for r in results]
        epochs.append(
            Measurement(
                samples=sum(m["samples"] for m in ms),
                wall_s=max(m["wall_s"] for m in ms),
                wait_s=max(m["wait_s"] for m in ms),
                compute_s=max(m["compute_s"] for m in ms),
                batches=sum(m["batches"] for m in ms),
            )
        )
    later = epochs[1:]
    return {
        "epochs": [m.as_dict() for m in epochs],
        "samples_per_s": [round(m.samples_per_s, 1) for m in epochs],
        "samples_per_s_from_epoch2": round(
            sum(m.samples for m in later) / sum(m.wall_s for m in later), 1
        ),
        "storage_bytes": [sum(r["storage_bytes"][e] for r in results) for e in range(EPOCHS)],
        "peer_bytes": [sum(r["peer_bytes"][e] for r in results) for e in range(EPOCHS)],
        "tls": all(r["tls"] for r in results),
        # CPU seconds of the 4 nodes' processes (loader, workers, peer server) per epoch
        "cpu_s": [round(sum(r["epochs"][e]["cpu_s"] for r in results), 2) for e in range(EPOCHS)],
    }


def run(
    *,
    quick: bool,
    console: Any = None,
    repeats: int | None = None,
    persistent_workers: bool = True,
) -> BenchResult:
    # 32 batches per node and epoch (--quick): with 8, one batch's start-up latency at each
    # epoch (fresh workers) was an eighth of the figure, not what a real epoch pays
    n, size = (4096, 64 << 10) if quick else (8192, 64 << 10)
    repeats = repeats or (1 if quick else 3)
    dataset_bytes = n * size
    node_items = n // WORLD
    rate = 400.0  # simulated accelerator per node [samples/s]
    cfg: dict[str, Any] = {
        "capacity": dataset_bytes // 2,  # dataset = 2x a node's cache <= the aggregate 4x
        "dataset_bytes": dataset_bytes,
        # a node's link moves half its shard (alone's misses) in 2.5x the compute time
        "bytes_per_s": node_items * size / 2 / (2.5 * node_items / rate),
        "rate": rate,
        "batch_size": 32,
        "workers": 2,
        # fresh workers each epoch (the default) pay TLS's per-process costs every epoch
        "persistent_workers": persistent_workers,
        "epochs": EPOCHS,
    }
    root = tempfile.mkdtemp(prefix="unstall-bench-dist-data-")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        store = LocalStore(root)
        keys = [f"{i:06d}.bin" for i in range(n)]
        for i, key in enumerate(keys):
            store.put(key, os.urandom(16) + i.to_bytes(8, "little") * ((size - 16) // 8))
        cfg.update(root=root, keys=keys)
        for r in range(repeats):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                res = _summary(_run_variant(variant, cfg, timeout_s=300.0))
                runs[variant].append(res)
                if console is not None:
                    console.print(
                        f"  run {r + 1}/{repeats} {variant:11s} samples/s {res['samples_per_s']} "
                        f"storage bytes {res['storage_bytes']} peer bytes {res['peer_bytes']} "
                        f"tls {res['tls']} cpu s {res['cpu_s']}"
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _result(runs, cfg, n, size, repeats)


def _result(
    runs: dict[str, list[dict[str, Any]]], cfg: dict[str, Any], n: int, size: int, repeats: int
) -> BenchResult:
    speed = {
        v: statistics.median(r["samples_per_s_from_epoch2"] for r in runs[v]) for v in VARIANTS
    }
    ordered = sorted(runs["partitioned"], key=lambda r: r["samples_per_s_from_epoch2"])
    part = ordered[len(ordered) // 2]
    ratio = speed["partitioned"] / speed["local"]
    vs_alone = speed["partitioned"] / speed["alone"]
    plain = {
        "ratio": round(speed["plain_http"] / speed["local"], 4),
        "vs_alone": round(speed["plain_http"] / speed["alone"], 4),
    }
    tls_vs_plain = speed["partitioned"] / speed["plain_http"]
    rows = []
    for v in VARIANTS:
        med = sorted(runs[v], key=lambda r: r["samples_per_s_from_epoch2"])[len(runs[v]) // 2]
        for e in range(EPOCHS):
            m = Measurement(**{k: med["epochs"][e][k] for k in Measurement.__dataclass_fields__})
            rows.append(
                row(
                    f"epoch {e + 1}",
                    v,
                    m,
                    storage_mb=round(med["storage_bytes"][e] / 1e6, 2),
                    peer_mb=round(med["peer_bytes"][e] / 1e6, 2),
                )
            )
    notes = [
        f"{WORLD} nodes, {n} samples of {size >> 10} KiB (dataset {n * size / 1e6:.0f} MB), "
        f"node cache {cfg['capacity'] / 1e6:.0f} MB, node link "
        f"{cfg['bytes_per_s'] / 1e6:.1f} MB/s, simulated accelerator {cfg['rate']:.0f} "
        f"samples/s per node, {cfg['workers']} workers per node"
        f"{' (persistent)' if cfg['persistent_workers'] else ''}; median of {repeats} run(s)",
        f"ratio = partitioned / fully local from epoch 2: {ratio:.3f} (goal >= 0.9)",
        f"vs_alone = partitioned / caching alone from epoch 2: {vs_alone:.3f} (goal >= 1.8)",
        f"peers over TLS (the default); plain HTTP (Peers(tls=False)): ratio "
        f"{plain['ratio']:.3f}, vs_alone {plain['vs_alone']:.3f}; TLS / plain "
        f"{tls_vs_plain:.3f} (goal >= 0.95)",
    ]
    return BenchResult(
        name="distributed",
        ratio=ratio,
        baseline={"local": speed["local"], "alone": speed["alone"]},
        unstall={"partitioned": speed["partitioned"], "plain_http": speed["plain_http"]},
        rows=rows,
        detail={
            "vs_alone": round(vs_alone, 4),
            "tls": all(r["tls"] for r in runs["partitioned"]),  # as the nodes reported
            "plain_http": plain,
            "tls_vs_plain": round(tls_vs_plain, 4),
            "persistent_workers": cfg["persistent_workers"],
            "storage_bytes": part["storage_bytes"],
            "peer_bytes": part["peer_bytes"],
            "samples_per_s_from_epoch2": speed,
            "runs": runs,
        },
        notes=notes,
    )
