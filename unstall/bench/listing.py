"""`bench listing`: building an `ImageFolder` over many small local files, and the cost of the
per-read version check, each against the code it replaced, in the same run.

- listing: the former construction (``os.walk`` with a ``relpath`` per directory, the
  extension and class filters over Python strings, a `KeyTable` from the list), against
  `unstall.data.folder_index` cold (one ``os.scandir`` pass, saved) and warm (the saved
  index, checked by one ``stat`` per directory). Wall time (median of repeats) and peak
  Python memory (``tracemalloc``, a separate pass).
- version check: a `TieredLayer` (RAM tier) serving a fully cached dataset, batch after batch, with
  each item's version compared (now), against the former lock-free read loop (no
  versions), per sample.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from unstall import machine
from unstall.bench.harness import BenchResult

DESCRIPTION = "ImageFolder listing (before vs saved index) and the per-read version check cost"
EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def _make_folder(root: Path, n: int, classes: int = 100) -> None:
    for c in range(classes):
        (root / f"c{c:03d}").mkdir(parents=True, exist_ok=True)
    payload = b"x" * 100
    for i in range(n):
        with open(root / f"c{i % classes:03d}" / f"{i:07d}.jpg", "wb") as f:
            f.write(payload)
    past = time.time() - 60  # settled: the saved index may be kept (folder_index.SETTLE_S)
    for c in range(classes):
        os.utime(root / f"c{c:03d}", (past, past))
    os.utime(root, (past, past))


def _before(root: Path) -> tuple[Any, np.ndarray, list[str]]:
    """The former `ImageFolder` listing, as it was."""
    from unstall.data.keys import KeyTable

    keys = []
    for dirpath, _dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in files:
            keys.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    keys = sorted(keys)
    keys = [k for k in keys if k.lower().endswith(EXTENSIONS)]
    keys = [k for k in keys if "/" in k]
    classes = sorted({k.split("/", 1)[0] for k in keys})
    index = {name: i for i, name in enumerate(classes)}
    labels = np.fromiter((index[k.split("/", 1)[0]] for k in keys), dtype=np.int64)
    encoded = [k.encode("utf-8") for k in keys]  # the former KeyTable: one bytes per key
    table = KeyTable.from_arrays(
        b"".join(encoded),
        np.concatenate([[0], np.cumsum([len(e) for e in encoded], dtype=np.int64)]),
    )
    return table, labels, classes


def _timed(fn: Callable[[], Any], repeats: int, setup: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _peak(fn: Callable[[], Any], setup: Callable[[], None] | None = None) -> int:
    if setup is not None:
        setup()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _listing(root: Path, repeats: int) -> dict[str, Any]:
    from unstall.data import folder_index

    def forget() -> None:
        shutil.rmtree(folder_index.listings_dir(), ignore_errors=True)

    def after() -> Any:
        return folder_index.folder_index(root, EXTENSIONS)

    old, new = _before(root), after()
    assert list(old[0]) == list(new[0]) and (old[1] == new[1]).all() and old[2] == new[2]
    out = {
        "before_s": _timed(lambda: _before(root), repeats),
        "cold_s": _timed(after, repeats, setup=forget),
        "warm_s": _timed(after, repeats),
        "before_peak_mb": _peak(lambda: _before(root)) / 1e6,
        "cold_peak_mb": _peak(after, setup=forget) / 1e6,
    }
    out["warm_peak_mb"] = _peak(after) / 1e6
    return out


def _version_check(root: Path, batch: int, repeats: int) -> dict[str, Any]:
    """Per-sample cost of serving cached items: the former read loop vs `ShmCache.lookup`."""
    from unstall.cache import Cache
    from unstall.cache.items import versions_of
    from unstall.cache.shm.index import READY
    from unstall.data import ImageFolder

    ds = ImageFolder(root, raw=True)
    n = len(ds)
    with Cache("1GiB", keep=0) as cache:
        layer = cache.bind(ds)
        batches = [list(range(s, min(s + batch, n))) for s in range(0, n, batch)]
        for b in batches:  # fill
            layer.fetch(ds, b)
        shm = layer.ram.mapped()
        assert shm is not None and int((shm.state == READY).sum()) == n

        def former(indices: list[int]) -> list[Any]:  # the lock-free loop before versions
            states = shm.state[indices].tolist()
            out: list[Any] = [None] * len(indices)
            base, mm, offset, length = shm.data_off, shm.mm, shm.offset, shm.length
            for k, st in enumerate(states):
                if st == READY:
                    i = indices[k]
                    start = base + int(offset[i])
                    out[k] = mm[start : start + int(length[i])]
            return out

        def now(indices: list[int]) -> list[Any]:
            return shm.lookup(indices, versions_of(ds, indices))[0]

        readers = {"before": former, "after": now, "layer": lambda b: layer.fetch(ds, b)}
        times: dict[str, list[float]] = {name: [] for name in readers}
        for _ in range(repeats * 3):  # interleaved, so load on the machine hits all alike
            for name, read in readers.items():
                t0 = time.perf_counter()
                for b in batches:
                    read(b)
                times[name].append((time.perf_counter() - t0) / n * 1e6)
        before, after, through_layer = (statistics.median(times[k]) for k in readers)
    return {
        "items": n,
        "batch": batch,
        "before_us": before,
        "after_us": after,
        "layer_fetch_us": through_layer,
        "ratio": after / before,
    }


def run(*, quick: bool = False, console: Any = None) -> BenchResult:
    """Both measurements on a fresh folder of 100-byte files (200k, or 50k with ``quick``)."""
    n = 50_000 if quick else 200_000
    repeats = 3 if quick else 5
    tmp = Path(tempfile.mkdtemp(prefix="unstall-bench-listing-"))
    try:
        with machine.environment({"UNSTALL_CACHE_DIR": str(tmp / "cache")}):
            root = tmp / "folder"
            _make_folder(root, n)
            listing = _listing(root, repeats)
            check = _version_check(root, batch=256, repeats=repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        {"case": "ImageFolder listing", "loader": "before",
         "seconds": round(listing["before_s"], 3), "peak_mb": round(listing["before_peak_mb"], 1)},
        {"case": "ImageFolder listing", "loader": "scandir (cold)",
         "seconds": round(listing["cold_s"], 3), "peak_mb": round(listing["cold_peak_mb"], 1)},
        {"case": "ImageFolder listing", "loader": "saved index (warm)",
         "seconds": round(listing["warm_s"], 3), "peak_mb": round(listing["warm_peak_mb"], 1)},
        {"case": "cached read, per sample", "loader": "before (no versions)",
         "us": round(check["before_us"], 3)},
        {"case": "cached read, per sample", "loader": "version checked",
         "us": round(check["after_us"], 3), "ratio": round(check["ratio"], 3)},
        {"case": "cached read, per sample", "loader": "TieredLayer.fetch",
         "us": round(check["layer_fetch_us"], 3)},
    ]  # fmt: skip
    return BenchResult(
        name="listing",
        ratio=listing["before_s"] / listing["warm_s"],
        baseline={"listing_s": listing["before_s"], "read_us": check["before_us"]},
        unstall={
            "listing_cold_s": listing["cold_s"],
            "listing_warm_s": listing["warm_s"],
            "read_us": check["after_us"],
        },
        rows=rows,
        detail={"files": n, "listing": listing, "version_check": check},
        notes=[
            f"{n} files of 100 B in 100 folders; median of {repeats}; peaks by tracemalloc",
            "ratio: former listing time / saved-index listing time; "
            f"version check costs x{check['ratio']:.3f} of the former cached read",
        ],
    )
