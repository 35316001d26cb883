"""Mixed placement (``hold="auto"``) with a disk tier: what a small RAM size does not hold is
planned onto the disk tier, served from there bit-identical, shared by the next job, and
its files kept or removed by the disk tier's rules."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from torchvision import transforms as T

import unstall
from tests.cache.points.test_decoded import COSTS, TRAIN, N, batches, figures, make_folder
from unstall.cache import clear_caches, list_caches
from unstall.cache.disk_files import tier_dir
from unstall.cache.points.planning import plan

REPO = Path(__file__).resolve().parents[3]
#: RAM for about three decoded 120x90 images (each about 32 KB); the disk holds them all.
RAM, DISK = 120_000, "4MiB"


def tier_files() -> list[str]:
    return sorted(os.listdir(tier_dir())) if os.path.isdir(tier_dir()) else []


def test_the_plan_puts_what_ram_does_not_hold_on_disk_never_below_the_byte_cache():
    files = np.full(90, 100_000.0)
    costs = dict(COSTS, back_s=0.0005, disk_s_per_byte=1e-10)
    entry = 500_000 + 256
    for ram, disk in ((0, 10**9), (2_000_000, 0), (2_000_000, 20 * entry), (2_000_000, 10**9)):
        p = plan(files, costs, ram, disk)
        assert p.saved_s >= p.bytes_only_saved_s and p.saved_s >= p.ram_only_saved_s
        assert p.decoded_bytes + p.file_bytes <= ram
        assert p.disk_decoded_bytes + p.disk_file_bytes <= disk
        assert not (p.decoded & p.as_bytes).any()
    alone = plan(files, costs, 2_000_000, 0)
    assert not alone.on_disk.any() and alone.decoded.sum() == 3  # RAM holds 3 decoded
    most = plan(files, costs, 2_000_000, 10**9)  # the disk holds the other 87, decoded
    assert most.decoded.all() and (most.decoded & most.on_disk).sum() == 87
    assert most.saved_s > 10 * alone.saved_s
    some = plan(files, costs, 2_000_000, 20 * entry)
    assert (some.decoded & some.on_disk).sum() == 20
    # reading back from disk dearer than decoding: nothing decoded goes there
    dear = plan(files, dict(costs, disk_s_per_byte=1e-7), 2_000_000, 10**9)
    assert not (dear.decoded & dear.on_disk).any()


def test_samples_planned_onto_disk_are_served_from_it_and_shared(tmp_path):
    root = make_folder(tmp_path / "img")
    ds = torchvision.datasets.ImageFolder(root, transform=TRAIN)
    plain = unstall.DataLoader(ds, batch_size=4, shuffle=True, seed=7, num_workers=2)
    with unstall.Cache(RAM, disk=DISK, hold="auto") as cache:
        loader = unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=7, num_workers=2, cache=cache
        )
        for epoch in range(3):
            got, want = batches(loader, epoch), batches(plain, epoch)
            assert len(got) == N // 4
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        s = figures(loader)
        on_disk = s["decoded_on_disk"]
        assert s["decoded_samples"] == N and 0 < N - on_disk <= 3 < on_disk  # RAM: 3 at most
        assert (s["hits"], s["misses"]) == (2 * N, N)
        assert (s["ram_hits"], s["disk_hits"]) == (2 * (N - on_disk), 2 * on_disk)
        assert s["planned_saved_s"] > s["ram_only_saved_s"] >= 0
        assert s["planned_saved_s"] >= s["bytes_only_saved_s"]
        with unstall.Cache(RAM, disk=DISK, hold="auto") as again:
            second = unstall.DataLoader(
                ds, batch_size=4, shuffle=True, seed=7, num_workers=0, cache=again
            )
            got = batches(second, 0)
            assert all(torch.equal(a, b) for a, b in zip(got, batches(plain, 0), strict=True))
            t = figures(second)
            assert t["name"] == s["name"] and (t["hits"], t["misses"]) == (N, 0)
        rows = [r for r in list_caches() if r["name"] == s["name"]]
        assert sorted(r["tier"] for r in rows) == ["disk", "ram"]
        assert all(r["holds"] == "decoded" for r in rows)
        disk_row = next(r for r in rows if r["tier"] == "disk")
        assert disk_row["items_cached"] == on_disk
        loader.close()
    kept = tier_files()  # the disk tier outlives the job; nothing else is left there
    assert kept and all(f.endswith((".idx", ".data")) for f in kept)
    assert not any(f.startswith(".measure") for f in kept)
    assert any(s["name"] in r for r in clear_caches())
    assert tier_files() == []


SCRIPT = r"""
import hashlib, json, sys
import torch, torchvision
from torch.utils.data import DataLoader
from torchvision import transforms as T

root, out = sys.argv[1], sys.argv[2]
val = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor()])
loader = DataLoader(torchvision.datasets.ImageFolder(root, transform=val), batch_size=4,
                    num_workers=2)
report = {"epochs": [], "stats": []}
for _ in range(2):
    report["epochs"].append([hashlib.sha256(x.numpy().tobytes()).hexdigest() for x, _ in loader])
    stats = getattr(loader, "stats", None)
    report["stats"].append(stats().get("cache") if stats is not None else None)
json.dump(report, open(out, "w"))
"""


def run_script(tmp_path: Path, root: Path, cache: dict, tag: str) -> dict:
    script = tmp_path / "val.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out-{tag}.json"
    config = tmp_path / f"c-{tag}.json"
    config.write_text(json.dumps({"kwargs": {"cache": cache}}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--"]
    command += [sys.executable, str(script), str(root), str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "UNSTALL_CACHE_KEEP_S": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def own_output(root: Path) -> dict:
    """What the script gives run as it is (the same loop, in this process, no workers)."""
    val = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor()])
    loader = torch.utils.data.DataLoader(
        torchvision.datasets.ImageFolder(root, transform=val), batch_size=4
    )
    digests = [hashlib.sha256(x.numpy().tobytes()).hexdigest() for x, _ in loader]
    return {"epochs": [digests, digests]}


@pytest.mark.timeout(600)
def test_an_unchanged_script_and_the_next_job_read_the_disk_tier(tmp_path):
    root = make_folder(tmp_path / "img")
    plain = own_output(root)
    assert len(plain["epochs"][0]) == N // 4
    config = {"size": 30_000, "disk": "2MiB", "hold": "auto"}  # RAM: two 64x64 crops
    first = run_script(tmp_path, root, config, "first")
    assert first["epochs"] == plain["epochs"]  # bit-identical to the script's own
    s1, s2 = first["stats"]
    on_disk = s2["decoded_on_disk"]
    assert s2["decoded_samples"] == N and 0 < N - on_disk <= 2
    assert (s1["hits"], s1["misses"]) == (0, N)
    assert (s2["ram_hits"], s2["disk_hits"]) == (N - on_disk, on_disk)
    assert [r["name"] for r in list_caches() if r["tier"] == "ram"] == []  # left with the job
    second = run_script(tmp_path, root, config, "second")  # the next job: RAM empty, disk kept
    assert second["epochs"] == plain["epochs"]
    t1 = second["stats"][0]
    assert (t1["disk_hits"], t1["misses"]) == (on_disk, N - on_disk)
    rows = [r for r in list_caches() if r["name"] == s2["name"]]
    assert [(r["tier"], r["holds"], r["items_cached"]) for r in rows] == [
        ("disk", "decoded", on_disk)
    ]
    clear_caches()
    assert tier_files() == []
