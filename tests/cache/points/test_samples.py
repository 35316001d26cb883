"""The whole-sample cache on a script's own dataset: served exactly from epoch 2, versioned
by its files, shared by jobs with the same preparation, refused when not deterministic.

The datasets read WAV files with soundfile, which opens them in C (the file hook never
sees those reads): the sample, not the file, is what is cached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

import unstall
from unstall.cache import list_caches

REPO = Path(__file__).resolve().parents[3]
N = 24
RATE = 8000


def make_clips(root: Path, n: int = N, seconds: float = 0.25) -> list[str]:
    """``n`` stereo 16-bit WAV clips, dated back past the cache's recent-write rule."""
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(58)
    paths = []
    for i in range(n):
        path = root / f"{i:03d}.wav"
        pcm = rng.integers(-20000, 20000, (int(RATE * seconds), 2), dtype=np.int16)
        soundfile.write(path, pcm, RATE, subtype="PCM_16")
        paths.append(str(path))
    age(paths)
    return paths


def age(paths: list[str]) -> None:
    old = time.time_ns() - 60 * 10**9
    for p in paths:
        os.utime(p, ns=(old, old))


class Clips(torch.utils.data.Dataset):
    """Decode (in C), keep the left channel, scale: deterministic; ``gain`` is part of its
    preparation."""

    def __init__(self, paths: list[str], gain: float = 1.0):
        self.files, self.gain = list(paths), gain

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        pcm, _ = soundfile.read(self.files[i], dtype="int16")
        mono = torch.from_numpy(pcm[:, 0].astype(np.float32) / 32768) * self.gain
        return mono, i


class Jittered(Clips):
    def __getitem__(self, i: int):
        mono, label = super().__getitem__(i)
        return mono + 1e-3 * float(np.random.rand()), label


def epoch(loader) -> list[tuple[int, bytes]]:
    out = []
    for x, y in loader:
        out += [(int(j), row.numpy().tobytes()) for j, row in zip(y, x, strict=True)]
    return out


def figures(loader) -> dict:
    return loader.stats()["cache"]


def test_served_exactly_from_epoch_two(tmp_path):
    paths = make_clips(tmp_path / "clips")
    ds = Clips(paths)
    plain = sorted(epoch(torch.utils.data.DataLoader(ds, batch_size=4)))
    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, cache=cache)
        first = epoch(loader)
        s1 = dict(figures(loader))
        second = epoch(loader)
        s2 = figures(loader)
        assert sorted(first) == plain and sorted(second) == plain  # exactly once, bit-identical
        assert [i for i, _ in first] != [i for i, _ in second]  # reshuffled
        assert (s1["hits"], s1["misses"], s1["inserted"]) == (0, N, N)
        assert (s2["hits"] - s1["hits"], s2["misses"] - s1["misses"]) == (N, 0)
        assert s2["holds"] == "samples" and s2["determinism"] == "checked"
        # 2 000 float32 values a clip, each k/32768: stored as int16, half the bytes
        assert N * 2000 * 2 < s2["inserted_bytes"] < N * 2000 * 2 + N * 400
        rows = [r for r in list_caches() if r["name"] == s2["name"]]
        assert rows and rows[0]["holds"] == "samples" and rows[0]["items_cached"] == N
        shown = subprocess.run(
            [sys.executable, "-m", "unstall", "cache", "list"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        ).stdout
        line = next(x for x in shown.splitlines() if s2["name"] in x)
        assert f"{N} / {N}" in line
        assert "samples, " in shown.split(s2["name"])[1].splitlines()[1]  # what it holds
        loader.close()


def test_a_changed_file_is_a_new_entry_never_the_old_sample(tmp_path):
    paths = make_clips(tmp_path / "clips")
    ds = Clips(paths)
    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(ds, batch_size=4, num_workers=0, cache=cache)
        epoch(loader)
        rng = np.random.default_rng(1)
        changed = rng.integers(-9000, 9000, (2000, 2), dtype=np.int16)
        soundfile.write(paths[5], changed, RATE, subtype="PCM_16")
        age([paths[5]])
        got = dict(epoch(loader))
        want = dict(epoch(torch.utils.data.DataLoader(ds, batch_size=4)))
        assert got == want
        assert got[5] == (changed[:, 0].astype(np.float32) / 32768).tobytes()
        s = figures(loader)
        assert s["stale"] == 1 and s["hits"] == N - 1


def test_jobs_with_the_same_preparation_share_others_do_not(tmp_path):
    paths = make_clips(tmp_path / "clips")
    with unstall.Cache("4MiB", hold="samples") as a, unstall.Cache("4MiB", hold="samples") as b:
        first = unstall.DataLoader(Clips(paths), batch_size=6, cache=a)
        epoch(first)
        same = unstall.DataLoader(Clips(paths), batch_size=6, cache=b)
        epoch(same)
        assert figures(same)["name"] == figures(first)["name"]
        assert (figures(same)["hits"], figures(same)["misses"]) == (N, 0)
        with unstall.Cache("4MiB", hold="samples") as c:
            other = unstall.DataLoader(Clips(paths, gain=0.5), batch_size=6, cache=c)
            got = dict(epoch(other))
            assert figures(other)["name"] != figures(first)["name"]
            assert (figures(other)["hits"], figures(other)["misses"]) == (0, N)
            want = dict(epoch(torch.utils.data.DataLoader(Clips(paths, gain=0.5), batch_size=6)))
            assert got == want


def test_exact_resume_through_the_cache(tmp_path):
    paths = make_clips(tmp_path / "clips")
    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(Clips(paths), batch_size=4, shuffle=True, seed=3, cache=cache)
        epoch(loader)  # fills the cache
        loader.set_epoch(1)
        whole = [[int(j) for j in y] for _x, y in loader]
        loader.set_epoch(1)
        it = iter(loader)
        head = [[int(j) for j in next(it)[1]] for _ in range(2)]
        state = loader.state_dict()
        other = unstall.DataLoader(Clips(paths), batch_size=4, shuffle=True, seed=3, cache=cache)
        other.load_state_dict(state)
        rest = [[int(j) for j in y] for _x, y in other]
        assert head + rest == whole
        assert figures(other)["misses"] == 0


def test_a_hidden_draw_is_refused_and_its_bytes_cached_instead(tmp_path, capfd, caplog):
    caplog.set_level("INFO", logger="unstall")
    paths = make_clips(tmp_path / "clips")
    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(Jittered(paths), batch_size=4, cache=cache)
        epoch(loader)
        s = figures(loader)
        assert s["level"] == "file" and s["asked"] == "samples"
        assert s["failed_check"] == "generator untouched"
        assert "numpy's global generator" in s["reason"]
        said = capfd.readouterr().err + caplog.text
        assert "'generator untouched' check failed" in said
        loader.close()


def test_a_subset_picks_its_files_by_its_indices(tmp_path):
    paths = make_clips(tmp_path / "clips")
    _train, val = torch.utils.data.random_split(
        Clips(paths), [16, 8], generator=torch.Generator().manual_seed(0)
    )
    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(val, batch_size=4, cache=cache)
        first, second = dict(epoch(loader)), dict(epoch(loader))
        want = dict(epoch(torch.utils.data.DataLoader(val, batch_size=4)))
        assert first == second == want and sorted(want) == sorted(val.indices)
        s = figures(loader)
        assert (s["hits"], s["misses"], s["holds"]) == (8, 8, "samples")
        assert s["listed"] == "dataset.files[indices]"
        loader.close()


def test_a_dataset_with_no_file_per_sample_is_refused(tmp_path):
    class Tensors(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.full((3,), float(i))

    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(Tensors(), batch_size=4, cache=cache)
        assert next(b.tolist() for b in loader)[1] == [1.0, 1.0, 1.0]
        assert loader.stats().get("cache") is None  # nothing to cache: runs uncached


SCRIPT = r"""
import json, sys
import numpy as np, soundfile, torch
from torch.utils.data import DataLoader, Dataset

root, out, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
import os
files = sorted(os.path.join(root, n) for n in os.listdir(root))


class Clips(Dataset):
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        pcm, _ = soundfile.read(self.files[i], dtype="int16")
        return torch.from_numpy(pcm.astype(np.float32).mean(axis=1) / 32768), i


loader = DataLoader(Clips(files), batch_size=4, shuffle=True, num_workers=2)
report = {"epochs": [], "stats": []}
for e in range(epochs):
    report["epochs"].append(sorted([int(j), row.numpy().tobytes().hex()]
                                   for x, y in loader for j, row in zip(y, x)))
    stats = getattr(loader, "stats", None)
    report["stats"].append(stats().get("cache") if stats is not None else None)
json.dump(report, open(out, "w"))
"""


def run_script(tmp_path: Path, root: Path, cache: object, tag: str) -> tuple[dict, str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out-{tag}.json"
    command = [sys.executable, str(script), str(root), str(out), "2"]
    if cache is not None:
        config = tmp_path / f"c-{tag}.json"
        config.write_text(json.dumps({"kwargs": {"cache": cache}}))
        command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--", *command]
    env = {**os.environ, "PYTHONPATH": str(REPO), "UNSTALL_CACHE_KEEP_S": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text()), done.stderr


@pytest.mark.timeout(600)
def test_an_unchanged_script_under_a_config_file(tmp_path):
    root = tmp_path / "clips"
    make_clips(root)
    plain, _ = run_script(tmp_path, root, None, "plain")
    cached, err = run_script(tmp_path, root, {"size": "8MiB", "hold": "samples"}, "cached")
    assert cached["epochs"] == plain["epochs"] == [plain["epochs"][0]] * 2
    s1, s2 = cached["stats"]
    assert (s1["hits"], s1["misses"]) == (0, N)
    assert (s2["hits"], s2["misses"]) == (N, N)
    assert s2["holds"] == "samples"
    assert "caching Clips's 24 prepared samples" in err
