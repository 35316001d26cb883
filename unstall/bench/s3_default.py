"""`bench s3`'s ``default_epoch2`` case: `unstall.DataLoader` over ``s3://`` with defaults only.

No ``cache=`` argument: the loader's default local-disk tier fills in epoch 1,
and later epochs (fetch-only, timed) come from it. Side by side, alternating
epoch by epoch, the same loader over the same files on local disk with a warm
page cache. Reports the storage requests of every epoch after the first (the
goal: 0) and the median rate of each, and their ratio (the goal: >= 0.9).
The disk tier lives in a temporary ``$UNSTALL_CACHE_DIR``, removed afterwards.
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from unstall import machine
from unstall.bench.harness import Measurement, measure, median_of


@contextmanager
def temporary_cache_dir() -> Iterator[str]:
    """A fresh ``$UNSTALL_CACHE_DIR`` for the block (so no earlier run's cache is found)."""
    with (
        tempfile.TemporaryDirectory(prefix="unstall-bench-cache-") as path,
        machine.environment({"UNSTALL_CACHE_DIR": path}),
    ):
        yield path


def default_epoch2(
    make_s3_dataset: Callable[[], Any],
    local_root: Any,
    keys: list[str],
    common: dict[str, Any],
    repeats: int,
) -> dict[str, Any]:
    """Fill epoch, then ``repeats`` timed epochs of each loader, alternating; figures as a dict."""
    import unstall

    labels = [i % 10 for i in range(len(keys))]
    with temporary_cache_dir() as cache_dir:
        s3_loader = unstall.DataLoader(make_s3_dataset(), shuffle=True, **common)
        local = unstall.FileDataset(local_root, keys, labels=labels)
        local_loader = unstall.DataLoader(local, shuffle=True, **common)
        fill = measure(s3_loader)  # epoch 1: from S3, filling the disk tier
        measure(local_loader)  # warms the page cache
        s3_runs: list[Measurement] = []
        local_runs: list[Measurement] = []
        for _ in range(repeats):
            s3_runs.append(measure(s3_loader))
            local_runs.append(measure(local_loader))
        epochs = s3_loader.stats()["per_epoch"]
        disk = epochs[-1].get("cache", {}).get("disk", {})
        used = sum(
            os.stat(os.path.join(root, f)).st_blocks * 512
            for root, _, files in os.walk(cache_dir)
            for f in files
        )
        s3_loader.close()
        del s3_loader  # its cache's finalizer leaves the disk tier before the directory goes
        gc.collect()
    ours, base = median_of(s3_runs), median_of(local_runs)
    return {
        "requests": int(max(e.get("store", {}).get("requests", -1) for e in epochs[1:])),
        "epoch1_requests": int(epochs[0].get("store", {}).get("requests", -1)),
        "samples_per_s": round(ours.samples_per_s, 1),
        "local_per_s": round(base.samples_per_s, 1),
        "local_ratio": round(ours.samples_per_s / max(base.samples_per_s, 1e-9), 3),
        "epoch1_per_s": round(fill.samples_per_s, 1),
        "disk_hit_rate": disk.get("hit_rate"),
        "disk_bytes": used,
        "repeats": repeats,
        "runs_per_s": [round(m.samples_per_s, 1) for m in s3_runs],
        "local_runs_per_s": [round(m.samples_per_s, 1) for m in local_runs],
        "_measurements": (fill, ours, base),
    }
