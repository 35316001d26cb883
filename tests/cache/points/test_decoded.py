"""The decoded point and mixed placement on a torchvision ImageFolder: the random part of
the transform never cached (every batch equal to the uncached loader's, per seed, epoch
and batch), the deterministic start cached as uint8 pixels."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import transforms as T

import unstall
from unstall.cache.points.decoded import split_folder
from unstall.cache.points.planning import plan

N = 32
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
VAL = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])
TRAIN = T.Compose(
    [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
)


def make_folder(root: Path) -> Path:
    """``N`` JPEGs of 120x90 in 2 classes, dated back past the cache's recent-write rule."""
    rng = np.random.default_rng(58)
    old = time.time_ns() - 60 * 10**9
    for i in range(N):
        d = root / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        base = np.linspace(0, 255, 120, dtype=np.float32)[None, :, None]
        pixels = np.clip(base + rng.normal(0, 30, (90, 120, 3)), 0, 255).astype(np.uint8)
        path = d / f"{i:03d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        os.utime(path, ns=(old, old))
    return root


def batches(loader, epoch: int) -> list[torch.Tensor]:
    loader.set_epoch(epoch)
    return [x for x, _y in loader]


def figures(loader) -> dict:
    return loader.stats()["cache"]


def test_the_split_of_validation_and_training_transforms(tmp_path):
    root = make_folder(tmp_path / "img")
    val = split_folder(torchvision.datasets.ImageFolder(root, transform=VAL))
    assert [type(s).__name__ for s in val.prefix] == ["Resize", "CenterCrop"]
    assert [type(s).__name__ for s in val.rest] == ["ToTensor", "Normalize"]
    train = split_folder(torchvision.datasets.ImageFolder(root, transform=TRAIN))
    assert train.prefix == () and type(train.rest[0]).__name__ == "RandomResizedCrop"
    assert train.describe() == "decode"


@pytest.mark.parametrize(
    ("hold", "transform", "size", "prefix"),
    [
        ("decoded", VAL, "8MiB", "decode + Resize + CenterCrop"),
        ("decoded", TRAIN, "8MiB", "decode"),
        ("auto", TRAIN, "400KiB", "decode"),
    ],
)
def test_every_batch_equals_the_uncached_loaders(tmp_path, hold, transform, size, prefix):
    root = make_folder(tmp_path / "img")
    ds = torchvision.datasets.ImageFolder(root, transform=transform)
    plain = unstall.DataLoader(ds, batch_size=4, shuffle=True, seed=7, num_workers=2)
    with unstall.Cache(size, hold=hold) as cache:
        loader = unstall.DataLoader(
            ds, batch_size=4, shuffle=True, seed=7, num_workers=2, cache=cache
        )
        for epoch in range(3):
            got, want = batches(loader, epoch), batches(plain, epoch)
            assert len(got) == len(want) == N // 4
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b)
        s = figures(loader)
        assert s["prefix"] == prefix
        assert s["holds"] == hold
        if hold == "decoded":
            assert (s["hits"], s["misses"]) == (2 * N, N)
            side = 64 if transform is VAL else None
            if side:  # 64x64 RGB pixels, one byte each, plus a small header
                assert N * side * side * 3 <= s["inserted_bytes"] < N * (side * side * 3 + 400)
        else:  # a budget of about a third of the decoded set: some decoded, not all
            assert 0 < s["decoded_samples"] < N
            assert s["hits"] == 2 * s["decoded_samples"]
        loader.close()


def test_a_training_and_an_evaluation_job_with_the_same_prefix_share(tmp_path):
    root = make_folder(tmp_path / "img")
    other = T.Compose([T.RandomResizedCrop(48), T.ToTensor()])
    with unstall.Cache("8MiB", hold="decoded") as a, unstall.Cache("8MiB", hold="decoded") as b:
        first = unstall.DataLoader(
            torchvision.datasets.ImageFolder(root, transform=TRAIN), batch_size=8, cache=a
        )
        batches(first, 0)
        second = unstall.DataLoader(
            torchvision.datasets.ImageFolder(root, transform=other), batch_size=8, cache=b
        )
        batches(second, 0)
        assert figures(second)["name"] == figures(first)["name"]
        assert (figures(second)["hits"], figures(second)["misses"]) == (N, 0)
        with unstall.Cache("8MiB", hold="decoded") as c:
            val = unstall.DataLoader(
                torchvision.datasets.ImageFolder(root, transform=VAL), batch_size=8, cache=c
            )
            batches(val, 0)
            assert figures(val)["name"] != figures(first)["name"]  # another prefix


#: Measured costs of a plan's test: 90 files of 100 kB decoding to 500 kB in 4 ms.
COSTS = {
    "read_s": 0.0002,
    "prefix_s": 0.004,
    "file_bytes": 100_000.0,
    "decoded_bytes": 500_000.0,
    "decoded_spread": 0.0,
}


def test_the_plan_never_saves_less_than_the_byte_cache_and_mixes():
    files = np.full(90, 100_000.0)
    costs = COSTS
    decoded_set = 90 * 500_256
    for budget in (50_000, 2_000_000, decoded_set // 3, decoded_set):
        p = plan(files, costs, budget)
        assert p.saved_s >= p.bytes_only_saved_s
        assert p.decoded_bytes + p.file_bytes <= budget
        assert not (p.decoded & p.as_bytes).any()
    third = plan(files, costs, decoded_set // 3)
    assert 25 <= third.decoded.sum() <= 31  # about a third decoded, never all or nothing
    assert plan(files, costs, 50_000).decoded.sum() == 0  # no room for one: bytes alone
    cheap = dict(costs, prefix_s=0.0)  # decoding costs nothing: bytes save as much per byte
    p = plan(files, cheap, 2_000_000)
    assert p.as_bytes.sum() >= 19 and p.decoded.sum() == 0
