"""Issue 40: `unstall analyze` on an unedited script whose Dataset opens its own files.

The script (tests/analysis/scripts/files_train.py) reads each file with ``open(path, "rb")``
over storage made slow in the script itself (each worker sleeps for the bytes it read from
storage, ``/proc/self/io``; the page cache of its files dropped before each epoch), so the
job is fetch-bound by construction: 4 workers at ~15 ms per file give ~250 samples/s against
a model of 400/s. A node cache of half the files halves the storage time per batch (a hit
rate of C/N under shuffling), enough for the model's rate: the analyzer must recommend it
(``{"cache": 0.5}``, the size in bytes of the listed files) and its verification, the script
re-run under ``unstall run --config``'s settings, must land within 15 % of the prediction.
A dataset that names no files is told why the cache cannot apply, and nothing fails.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.analysis.conftest import run_analyze

SCRIPT = Path(__file__).resolve().parent / "scripts" / "files_train.py"
FILES = 1200
SIDE = 104
#: A 24-bit BMP: header and pixels (rows of 312 bytes, no padding). Not 8-bit grayscale:
#: PIL maps such raw images with mmap of the file by name, which no cache can serve.
SIZE = 54 + SIDE * SIDE * 3


@pytest.fixture(scope="module")
def files_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FILES images of random pixels (BMP: SIZE bytes each, read whole by ``open`` or by PIL)
    on a real disk (a tmpfs has no page cache to drop), dated a minute back (the cache
    stores no file written in its last seconds), synced."""
    from PIL import Image

    root = tmp_path_factory.mktemp("files")
    old = time.time_ns() - 60 * 10**9
    for i in range(FILES):
        path = root / f"{i:05d}.bmp"
        Image.frombytes("RGB", (SIDE, SIDE), os.urandom(SIZE - 54)).save(path, "BMP")
        assert path.stat().st_size == SIZE
        os.utime(path, ns=(old, old))
    os.sync()
    return root


OPTIONS = ["--steps", "30", "--warmup", "3", "--min-seconds", "3"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "where"), [("open", "Files.paths"), ("folder", "Folder.samples")])
def test_fetch_bound_script_gets_the_file_cache_verified(tmp_path, files_root, kind, where):
    """Paths read with ``open(path, "rb")``; torchvision-style ``samples`` read with PIL."""
    report = run_analyze(
        tmp_path,
        # --quick: the cold run stands for the cached one (the workers' clocks split the time)
        [*OPTIONS, "--quick", "--verify"],
        [sys.executable, str(SCRIPT), str(files_root), "--kind", kind],
    )
    assert report["bottleneck"] == "fetch", (report["stall"], report["runs"])
    rec = report["recommendation"]
    fraction = rec["kwargs"].get("cache")
    assert rec["changed"] and fraction is not None and 0 < fraction <= 1, rec
    assert rec["kwargs"]["num_workers"] == 4, rec
    listed = report["file_cache"]
    assert listed["applies"] and listed["files"] == FILES and listed["where"] == where
    assert listed["bytes"] == FILES * SIZE
    assert rec["cache_bytes"] == int(fraction * FILES * SIZE)
    assert where in rec["cache_files"]
    v = report["verified"]
    assert v["kwargs"] == rec["kwargs"]
    # the cache was filled as the first epoch leaves it, and served hits in the window
    assert v["cache"]["prefilled"]["stored"] > 0, v
    assert v["cache"]["stats"]["level"] == "file", v
    assert v["error"] is not None and v["error"] <= 0.15, (v, rec, report["runs"])
    assert v["measured_samples_per_s"] > 1.3 * report["measured_samples_per_s"], v


@pytest.mark.timeout(200)
def test_a_dataset_without_files_is_told_why_no_cache(tmp_path, files_root):
    report = run_analyze(
        tmp_path,
        [*OPTIONS, "--quick", "--no-verify"],
        [sys.executable, str(SCRIPT), str(files_root), "--kind", "nofiles"],
    )
    rec = report["recommendation"]
    assert "cache" not in rec["kwargs"], rec
    assert rec["cache_not_applied"].startswith(
        "the node cache cannot apply: Made lists no files"
    ), rec
    assert report["file_cache"]["applies"] is False
    # as slow as the files are read: fetch-bound, and the cache remedy says why it cannot apply
    assert report["bottleneck"] == "fetch", (report["stall"], report["runs"])
    (row,) = [r for r in report["remedies"] if r["remedy"] == "cache"]
    assert row["predicted_samples_per_s"] is None and "Made lists no files" in row["not_applicable"]
    page = (tmp_path / "html" / "index.html").read_text()
    assert "Cache: the node cache cannot apply: Made lists no files" in page


@pytest.mark.timeout(200)
def test_an_iterable_dataset_over_files_is_analyzed(tmp_path, files_root):
    report = run_analyze(
        tmp_path,
        [*OPTIONS, "--quick", "--verify"],
        [sys.executable, str(SCRIPT), str(files_root), "--kind", "stream"],
    )
    listed = report["file_cache"]
    assert listed == {
        "applies": True,
        "files": FILES,
        "bytes": FILES * SIZE,
        "where": "Stream.paths",
    }
    rec = report["recommendation"]
    if report["bottleneck"] != "fetch" or not rec["changed"]:
        return  # an iterable's workers are timed from /proc: nothing may be advised, said so
    fraction = rec["kwargs"]["cache"]
    assert rec["cache_bytes"] == int(fraction * FILES * SIZE), rec
    v = report["verified"]
    # the iterable's files were served from the node cache at C/N (its rates, read from
    # /proc over the window, are looser than a map-style dataset's per-sample timings)
    stats = v["cache"]["stats"]
    assert stats["hits"] / (stats["hits"] + stats["misses"]) == pytest.approx(fraction, abs=0.05)
    assert v["measured_samples_per_s"] > 1.2 * report["measured_samples_per_s"], v


@pytest.mark.timeout(120)
def test_unstall_run_json_shows_the_file_cache_per_loader(tmp_path, files_root):
    """The recommendation applied by hand: ``unstall run --config`` with the cache, and the
    per-loader row of ``--json`` says the files were cached and at what hit rate."""
    import json
    import subprocess

    config, out = tmp_path / "c.json", tmp_path / "run.json"
    config.write_text(json.dumps({"kwargs": {"cache": 0.5}}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config)]
    command += ["--json", str(out), "--", sys.executable, str(SCRIPT), str(files_root)]
    command += ["--epochs", "2", "--rate", "100000", "--mb-per-s", "50", "--latency-ms", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [r for p in json.loads(out.read_text())["processes"] for r in p["loaders"]]
    cache = row["cache"]
    assert row["samples"] == 2 * FILES and cache["level"] == "file", row
    assert cache["items_cached"] == FILES // 2 and cache["hits"] + cache["misses"] == 2 * FILES
    assert cache["hit_rate"] == pytest.approx(cache["hits"] / (2 * FILES))
    # epoch 1 filled half the files (none kept from before: UNSTALL_CACHE_KEEP_S=0 in the
    # tests), epoch 2 read each once: exactly C/N of its reads were hits
    assert cache["hits"] == FILES // 2, cache
