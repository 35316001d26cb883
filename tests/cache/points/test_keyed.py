"""unstall's own keyed datasets (`unstall.FileDataset` over a store) under ``hold="samples"``:
versioned by the store's item versions, as the byte cache keys them, served exactly from
epoch 2; a random transform still gets the byte cache, with the reason."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

import unstall

N, SIZE = 16, 3000


def write_items(root: Path) -> list[str]:
    """``N`` files of ``SIZE`` random bytes, dated back a minute."""
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(58)
    keys = [f"{i:03d}.bin" for i in range(N)]
    for key in keys:
        (root / key).write_bytes(rng.integers(0, 256, SIZE, dtype=np.uint8).tobytes())
        age(root / key, 60)
    return keys


def age(path: Path, seconds: int) -> None:
    old = time.time_ns() - seconds * 10**9
    os.utime(path, ns=(old, old))


def scale(raw: bytes) -> torch.Tensor:
    """A deterministic preparation: bytes to floats in [0, 1]."""
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.float32) / 255)


def jitter(raw: bytes) -> torch.Tensor:
    """A random one: noise from numpy's global generator."""
    return scale(raw) + float(np.random.rand())


def dataset(root: Path, keys: list[str], transform=scale) -> unstall.FileDataset:
    return unstall.FileDataset(root, keys, labels=list(range(len(keys))), transform=transform)


def epoch(loader) -> dict[int, bytes]:
    return {int(j): x.numpy().tobytes() for xs, ys in loader for x, j in zip(xs, ys, strict=True)}


def own(ds) -> dict[int, bytes]:
    """The samples as the dataset itself prepares them, uncached."""
    return {i: ds[i][0].numpy().tobytes() for i in range(len(ds))}


def figures(loader) -> dict:
    return loader.stats()["cache"]


def test_a_keyed_dataset_is_sample_cached(tmp_path):
    root = tmp_path / "items"
    ds = dataset(root, write_items(root))
    want = own(ds)
    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, cache=cache)
        (first, s1), (second, s2) = [(epoch(loader), dict(figures(loader))) for _ in "12"]
        assert first == second == want  # every sample once, bit-identical to uncached
        assert (s1["hits"], s1["misses"], s1["inserted"]) == (0, N, N)
        assert (s2["hits"] - s1["hits"], s2["misses"] - s1["misses"]) == (N, 0)
        assert s2["holds"] == "samples" and s2["listed"] == "store versions"
        assert s2["determinism"] == "checked"
        # SIZE float32 values a sample, stored as they are, and a small header
        assert N * SIZE * 4 <= s2["inserted_bytes"] < N * (SIZE * 4 + 400)
        loader.close()


def test_a_changed_item_is_a_new_entry(tmp_path):
    root = tmp_path / "items"
    keys = write_items(root)
    with unstall.Cache("4MiB", hold="samples") as a:
        first = unstall.DataLoader(dataset(root, keys), batch_size=4, cache=a)
        epoch(first)
        changed = bytes(range(256)) * (SIZE // 256) + bytes(SIZE % 256)
        (root / keys[5]).write_bytes(changed)
        age(root / keys[5], 30)
        ds = dataset(root, keys)  # the next job: its items' versions taken at its bind
        with unstall.Cache("4MiB", hold="samples") as b:
            second = unstall.DataLoader(ds, batch_size=4, cache=b)
            got = epoch(second)
            assert got == own(ds)
            assert got[5] == scale(changed).numpy().tobytes()
            s = figures(second)
            assert s["name"] == figures(first)["name"]  # the same preparation: shared
            assert (s["hits"], s["misses"], s["stale"]) == (N - 1, 1, 1)


def test_a_random_transform_falls_back_to_bytes_with_the_reason(tmp_path):
    root = tmp_path / "items"
    ds = dataset(root, write_items(root), transform=jitter)
    with unstall.Cache("4MiB", hold="samples") as cache:
        loader = unstall.DataLoader(ds, batch_size=4, num_workers=2, cache=cache)
        assert sorted(epoch(loader)) == list(range(N))
        epoch(loader)
        s = figures(loader)
        assert s["asked"] == "samples" and s["holds"] == "bytes"
        assert s["failed_check"] == "generator untouched"
        assert "numpy's global generator" in s["reason"]
        assert (s["hits"], s["misses"]) == (N, N)  # its bytes: epoch 2 from the cache
        loader.close()
