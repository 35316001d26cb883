"""`bench filecache`: a plain script's own Dataset over files, with and without the node cache.

The script is an ordinary torch script (nothing of unstall in it): a map-style Dataset
over a list of paths that reads each file with ``open(path, "rb")``, 2 workers, 2
shuffled epochs, the page cache of its files dropped before each epoch
(``posix_fadvise(DONTNEED)``). It runs twice in the same bench: as it is (torch's
DataLoader) and under ``unstall run --config`` with ``{"kwargs": {"cache": 0.5}}``, a
node cache of half the dataset (the dataset is 2x the cache; DS-Analyzer's thrashing case).

Storage is made slow the same way for both: each worker sleeps for the bytes it read
from storage (``/proc/self/io`` ``read_bytes``, so bytes served from memory cost nothing)
at ``mb_per_s``, a per-worker link, plus ``latency_ms`` per file that touched storage.
The figures per epoch: samples/s and the bytes the workers read from storage. Goals:
epoch 2 under unstall reads <= 0.55x torch's bytes and runs >= 1.6x torch's samples/s.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from unstall import machine
from unstall.bench import harness
from unstall.bench.harness import BenchResult

DESCRIPTION = (
    "a plain Dataset's own file reads over slow storage, dataset 2x the cache: torch vs "
    "the same script under unstall run with cache=0.5 (goal: epoch-2 bytes <= 0.55x, "
    "samples/s >= 1.6x)"
)

SCRIPT = r"""
import hashlib, json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

root, out, mb_per_s, latency_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
paths = sorted(os.path.join(root, n) for n in os.listdir(root))


def storage_read():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes")).split()[1])


class Files(Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        before = storage_read()
        with open(self.paths[i], "rb") as f:
            raw = f.read()
        read = storage_read() - before
        if read:  # slow storage: the bytes that came from it cost time
            time.sleep(latency_s + read / (mb_per_s * 1e6))
        return i, hashlib.md5(raw[:4096]).hexdigest(), os.getpid(), storage_read()


def keep(batch):
    return batch


loader = DataLoader(Files(paths), batch_size=8, shuffle=True, num_workers=2, collate_fn=keep)
report = []
for epoch in range(2):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    t0 = time.perf_counter()
    samples = [s for batch in loader for s in batch]
    wall = time.perf_counter() - t0
    read = {}
    for _i, _d, pid, done in samples:
        read[pid] = max(read.get(pid, 0), done)
    stats = getattr(loader, "stats", None)
    report.append({
        "samples": len(samples),
        "wall_s": wall,
        "storage_bytes": sum(read.values()),
        "digests": sorted([i, d] for i, d, _p, _r in samples),
        "cache": stats().get("cache") if stats is not None else None,
    })
with open(out, "w") as f:
    json.dump(report, f)
"""


def make_files(root: Path, files: int, size: int) -> int:
    """``files`` random files of ``size`` bytes, dated a minute back (the cache does not store
    files written in its last seconds) and flushed; returns the total bytes."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(40)
    old = time.time_ns() - 60 * 10**9
    for i in range(files):
        path = root / f"{i:05d}.bin"
        path.write_bytes(rng.bytes(size))
        os.utime(path, ns=(old, old))
    os.sync()
    return files * size


def bench_dir() -> str:
    """Where the files go: ``$UNSTALL_BENCH_DIR``, else the cache directory (a real disk:
    a tmpfs has no page cache to drop, and no storage reads to count)."""
    where = machine.bench_dir() or machine.cache_dir()
    os.makedirs(where, exist_ok=True)
    return where


def run_script(
    work: Path, root: Path, cached: bool, mb_per_s: float, latency_s: float
) -> list[dict[str, Any]]:
    """The script's per-epoch report: as it is, or under ``unstall run`` with a cache."""
    script = work / "train.py"
    script.write_text(SCRIPT)
    out = work / f"out-{cached}.json"
    command = [sys.executable, str(script), str(root), str(out), str(mb_per_s), str(latency_s)]
    if cached:
        config = work / "c.json"
        config.write_text(json.dumps({"kwargs": {"cache": 0.5}}))
        command = harness.under_unstall(config, command)
    harness.run_script(command, harness.script_env(), timeout=1800)
    return json.loads(out.read_text())


def run(
    *,
    quick: bool,
    console: Any = None,
    files: int | None = None,
    file_kib: int = 256,
    mb_per_s: float = 25.0,
    latency_ms: float = 2.0,
) -> BenchResult:
    files = files or (240 if quick else 1200)
    size = file_kib * 1024
    with tempfile.TemporaryDirectory(prefix="unstall-bench-filecache-", dir=bench_dir()) as tmp:
        work = Path(tmp)
        total = make_files(work / "data", files, size)
        if console is not None:
            console.print(f"  {files} files of {file_kib} KiB ({total / 2**20:.0f} MiB)")
        plain = run_script(work, work / "data", False, mb_per_s, latency_ms / 1e3)
        cached = run_script(work, work / "data", True, mb_per_s, latency_ms / 1e3)
    same = all(a["digests"] == b["digests"] for a, b in zip(plain, cached, strict=True))
    rows, rates = [], {}
    for epoch in range(2):
        for loader, report in (("torch", plain), ("unstall cache=0.5", cached)):
            e = report[epoch]
            rate = e["samples"] / e["wall_s"] if e["wall_s"] > 0 else 0.0
            rates[(loader, epoch)] = rate
            cache = e["cache"] or {}
            hits = cache.get("hits")
            if hits is not None and epoch:  # the script's figures are cumulative
                hits -= (report[epoch - 1]["cache"] or {}).get("hits", 0)
            rows.append(
                {
                    "case": f"epoch {epoch + 1}",
                    "loader": loader,
                    "samples_per_s": round(rate, 1),
                    "storage_MiB": round(e["storage_bytes"] / 2**20, 1),
                    "cache_hits": hits,
                    "ratio": round(rate / rates[("torch", epoch)], 3)
                    if loader != "torch" and rates[("torch", epoch)]
                    else None,
                }
            )
    t2, u2 = plain[1], cached[1]
    ratio = rates[("unstall cache=0.5", 1)] / max(rates[("torch", 1)], 1e-9)
    bytes_ratio = u2["storage_bytes"] / max(t2["storage_bytes"], 1)
    cache = u2["cache"] or {}
    notes = [
        f"epoch 2: storage bytes unstall/torch {bytes_ratio:.3f} (goal <= 0.55), "
        f"samples/s {ratio:.3f}x (goal >= 1.6)",
        f"same samples and bytes with and without the cache: {same}",
        f"storage: {mb_per_s:g} MB/s per worker + {latency_ms:g} ms per file read from it "
        "(charged by /proc/self/io read_bytes); page cache dropped before each epoch",
    ]
    if t2["storage_bytes"] < 0.5 * total:
        notes.append(
            "torch's epoch 2 read little from storage: the files are not on a disk whose "
            "page cache can be dropped (tmpfs?); set $UNSTALL_BENCH_DIR to a disk path"
        )
    return BenchResult(
        name="filecache",
        ratio=ratio,
        baseline={
            "loader": "torch.utils.data.DataLoader",
            "samples_per_s": round(rates[("torch", 1)], 1),
            "storage_bytes": t2["storage_bytes"],
        },
        unstall={
            "loader": "unstall run --config {cache: 0.5}",
            "samples_per_s": round(rates[("unstall cache=0.5", 1)], 1),
            "storage_bytes": u2["storage_bytes"],
            "epoch_2_hit_rate": round(
                (cache.get("hits", 0) - (cached[0]["cache"] or {}).get("hits", 0)) / files, 4
            ),
        },
        rows=rows,
        detail={
            "bytes_ratio": round(bytes_ratio, 4),
            "same_samples": same,
            "goals": {"bytes_ratio": 0.55, "ratio": 1.6},
            "config": {
                "files": files,
                "file_bytes": size,
                "dataset_bytes": total,
                "cache": 0.5,
                "mb_per_s_per_worker": mb_per_s,
                "latency_ms": latency_ms,
                "num_workers": 2,
                "batch_size": 8,
            },
        },
        notes=notes,
    )
