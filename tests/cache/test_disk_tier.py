"""The local-disk tier under the RAM tier: hit rate, no item in both, jobs, kills, a full disk."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import warnings
from pathlib import Path

import pytest

import unstall
from tests import forked
from unstall.cache import DiskFullWarning, clear_caches, disk_tier, list_caches
from unstall.cache.shm import lifecycle
from unstall.cache.shm.index import CLAIMED, READY

from .conftest import run_epochs
from .helpers import env

N, SIZE = 400, 512

# A job: 2 workers, RAM 30 % and disk 50 % of the dataset, 3 epochs, every epoch checked
# byte for byte against storage; reports the cache stats of each epoch.
JOB = r"""
import json, os, sys, time
import unstall
root, n, meet = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rendezvous(tag):  # both jobs hold the caches at once (bounded wait)
    open(os.path.join(meet, f"{tag}-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 60
    while sum(f.startswith(tag) for f in os.listdir(meet)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
ds = unstall.FileDataset(root, [f"{i:05d}.bin" for i in range(n)])
truth = sorted(ds.fetch(range(n)))
cache = unstall.Cache(ram=0.3, disk=0.5)
loader = unstall.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, cache=cache)
rendezvous("open")
intact = []
for _ in range(3):
    intact.append(sorted(raw for batch in loader for raw in batch) == truth)
cache.check()  # consistent indexes, no item READY in both tiers
print(json.dumps({"intact": intact, "epochs": [r["cache"] for r in loader.stats()["per_epoch"]]}))
rendezvous("done")
cache.close()
"""

# A job that dies in the middle of writing its 5th disk item (half its bytes written).
DIES = r"""
import os, sys, time
import unstall
from unstall.cache import disk_tier
root, n = sys.argv[1], int(sys.argv[2])
ds = unstall.FileDataset(root, [f"{i:05d}.bin" for i in range(n)])
real, count = disk_tier._pwrite_all, [0]
def pwrite(fd, raw, offset):
    count[0] += 1
    if count[0] == 5:
        os.pwrite(fd, b"\xee" * (len(raw) // 2), offset)
        print("mid-write", flush=True)
        time.sleep(600)
    real(fd, raw, offset)
disk_tier._pwrite_all = pwrite
cache = unstall.Cache(disk=0.5)
loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, num_workers=0, cache=cache)
for batch in loader:
    pass
"""


def _write(root: Path, n: int, size: int) -> list[bytes]:
    root.mkdir(exist_ok=True)
    out = []
    for i in range(n):
        raw = (i.to_bytes(4, "little") * (size // 4 + 1))[:size]
        (root / f"{i:05d}.bin").write_bytes(raw)
        out.append(raw)
    return out


@pytest.fixture(scope="module")
def jobs_server():
    """The jobs (three processes in this module) forked from a fork server that imported
    torch and unstall once (`tests.forked`): each its own process, started in a fraction of a
    second instead of 2-3 s of CPU importing torch."""
    with forked.server() as ctx:
        yield ctx


def test_two_jobs_four_workers_hit_080_from_epoch_2_and_never_store_twice(tmp_path, jobs_server):
    _write(tmp_path / "data", N, SIZE)
    (tmp_path / "meet").mkdir()
    argv = ["-c", JOB, str(tmp_path / "data"), str(N), str(tmp_path / "meet")]
    jobs = [
        forked.Forked(
            jobs_server, argv, env=env(), cwd=tmp_path, output=tmp_path / f"job{i}", text=True
        )
        for i in range(2)
    ]
    reports = []
    for job in jobs:
        try:
            out, err = job.communicate(timeout=120)
        finally:
            job.kill()  # (ended already, unless it ran past its time)
        assert job.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for report in reports:
        assert report["intact"] == [True, True, True]
        for epoch in report["epochs"][1:]:
            assert epoch["hit_rate"] == pytest.approx(0.80, abs=0.02)
            assert epoch["hits"] + epoch["misses"] == N
            assert epoch["ram_hits"] == pytest.approx(0.3 * N, abs=0.02 * N)
            assert epoch["disk_hits"] == pytest.approx(0.5 * N, abs=0.02 * N)
    # between them, the two jobs stored every item once: 30 % in RAM, 50 % on disk
    ram_stored = sum(r["epochs"][0]["ram"]["inserted"] for r in reports)
    disk_stored = sum(r["epochs"][0]["disk"]["inserted"] for r in reports)
    assert (ram_stored, disk_stored) == (int(0.3 * N), int(0.5 * N))
    (disk,) = [c for c in list_caches() if c["tier"] == "disk"]
    assert disk["items_cached"] == int(0.5 * N) and disk["used_bytes"] == int(0.5 * N) * SIZE


def test_disk_tier_outlives_the_job_and_serves_the_next_from_disk(tmp_path):
    truth = _write(tmp_path / "data", 100, 300)
    ds = unstall.FileDataset(tmp_path / "data", [f"{i:05d}.bin" for i in range(100)])
    for job in range(2):
        with unstall.Cache(disk=1.0) as cache:
            loader = unstall.DataLoader(ds, batch_size=10, shuffle=True, cache=cache)
            (served,) = run_epochs(loader, 1)
            assert sorted(served) == sorted(truth)
            stats = loader.stats()["cache"]
            assert (stats["disk_hits"], stats["misses"]) == ((0, 100) if job == 0 else (100, 0))
    out = clear_caches()
    assert len(out) == 1 and out[0].endswith("(disk)")
    assert os.listdir(disk_tier.tier_dir()) == []


def test_job_killed_mid_write_leaves_nothing_served_wrong(tmp_path, jobs_server):
    truth = _write(tmp_path / "data", 200, 256)
    argv = ["-c", DIES, str(tmp_path / "data"), "200"]
    proc = forked.Forked(jobs_server, argv, env=env(), cwd=tmp_path, output=tmp_path / "dies")
    try:
        line = proc.first_line(timeout=120)
        assert line.strip() == "mid-write", proc.output()[1].decode()[-3000:]
    finally:
        proc.kill()  # SIGKILL
        assert proc.wait(timeout=10) == -signal.SIGKILL
    (tier,) = [c for c in list_caches() if c["tier"] == "disk"]
    name = tier["name"]
    with contextlib.closing(lifecycle.map_file(disk_tier.index_path(name))) as index:
        # the item half written and the rest of its batch (claimed, not yet written)
        assert int((index.state == CLAIMED).sum()) == 4
        published = int((index.state == READY).sum())
    gone = subprocess.Popen(["true"])
    gone.wait()
    half_created = Path(f"{disk_tier.index_path(name)}.{gone.pid}.tmp")  # by a dead process
    half_created.write_bytes(b"\0" * 100)
    ds = unstall.FileDataset(tmp_path / "data", [f"{i:05d}.bin" for i in range(200)])
    with unstall.Cache(disk=0.5) as cache:
        loader = unstall.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, cache=cache)
        epochs = run_epochs(loader, 2)
        assert [sorted(e) for e in epochs] == [sorted(truth)] * 2
        stats = loader.stats()
        assert stats["cache"]["disk"]["opened"] == "reclaimed"
        assert stats["per_epoch"][0]["cache"]["disk_hits"] == published
        assert stats["per_epoch"][1]["cache"]["disk_hits"] == 100
        cache.check()
    (tier,) = [c for c in list_caches() if c["tier"] == "disk"]
    assert os.path.getsize(tier["path"]) == tier["used_bytes"] == 100 * 256
    assert not half_created.exists()


@contextlib.contextmanager
def _small_disk(path: Path, size: str):
    """A tmpfs of ``size`` at ``path`` (root only); yields False where it cannot be mounted."""
    path.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, timeout=20).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):  # no mount(8) here
        done = False
    try:
        yield done
    finally:
        if done:
            subprocess.run(["umount", "-l", str(path)], check=False, timeout=20)


def test_full_disk_warns_once_and_serves_correct_bytes(tmp_path, monkeypatch):
    truth = _write(tmp_path / "data", 200, 1024)
    ds = unstall.FileDataset(tmp_path / "data", [f"{i:05d}.bin" for i in range(200)])
    with _small_disk(tmp_path / "small", "64k") as mounted:
        monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "small"))
        if not mounted:  # not root: a disk that fails with ENOSPC past 40 KiB
            real = disk_tier._pwrite_all

            def pwrite(fd, raw, offset):
                if offset + len(raw) > 40 << 10:
                    raise OSError(28, "No space left on device")
                real(fd, raw, offset)

            monkeypatch.setattr(disk_tier, "_pwrite_all", pwrite)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with unstall.Cache(disk=1.0) as cache:  # asks for 200 KiB on a 64 KiB disk
                loader = unstall.DataLoader(ds, batch_size=10, shuffle=True, cache=cache)
                epochs = run_epochs(loader, 3)
                stats = loader.stats()
                cache.check()
        full = [w for w in caught if issubclass(w.category, DiskFullWarning)]
        assert len(full) == 1 and "is full" in str(full[0].message)
        assert [sorted(e) for e in epochs] == [sorted(truth)] * 3
        held = stats["cache"]["disk"]["items_cached"]
        assert 10 < held < 64 and stats["cache"]["disk"]["full"] is True
        for epoch in stats["per_epoch"][1:]:
            assert (epoch["cache"]["disk_hits"], epoch["cache"]["misses"]) == (held, 200 - held)


def test_cache_arguments(tmp_path):
    with pytest.raises(ValueError, match="capacity is the RAM tier"):
        unstall.Cache("1MiB", ram="2MiB")
    with pytest.raises(ValueError, match="needs a size"):
        unstall.Cache()
    with pytest.raises(ValueError, match="needs policy='noevict'"):
        unstall.Cache(ram="1MiB", disk="1MiB", policy="lru")
    assert unstall.Cache(disk="auto").disk == "auto"
