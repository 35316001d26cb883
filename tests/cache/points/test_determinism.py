"""Determinism known for torchvision's ops, checked on the job's own samples otherwise."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torchvision import transforms as T

from unstall.cache.points import codec
from unstall.cache.points.determinism import check_samples, random_step, verdict_for


class Plain(torch.utils.data.Dataset):
    """Sample ``i`` is a function of ``i`` alone, unless ``draw`` makes it draw."""

    def __init__(self, n: int = 8, draw: str = "", transform=None):
        self.n, self.draw, self.transform = n, draw, transform
        self.own = np.random.default_rng()  # an augmentation library's own generator
        self.mine = random.Random()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.arange(16, dtype=torch.float32) + i
        if self.draw == "random":
            x = x + random.random()
        elif self.draw == "unused":  # drawn, and the output does not show it
            random.random()
        elif self.draw == "numpy":
            x = x + float(np.random.rand())
        elif self.draw == "torch":
            x = x + torch.rand(1)
        elif self.draw == "own-numpy":
            x = x + float(self.own.random())
        elif self.draw == "own-random":
            x = x + self.mine.random()
        return x, i % 3


def verdict(ds, declared=None):
    return verdict_for(ds, lambda i: codec.encode(ds[i]), declared)


def test_a_deterministic_dataset_passes_and_the_generators_are_as_before():
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    expect = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    v = verdict(Plain())
    assert (v.ok, v.how, v.check) == (True, "checked", "")
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expect


@pytest.mark.parametrize(
    ("draw", "check", "words"),
    [
        ("random", "generator untouched", "random's global generator"),
        ("unused", "generator untouched", "random's global generator"),
        ("numpy", "generator untouched", "numpy's global generator"),
        ("torch", "generator untouched", "torch's global generator"),
        ("own-numpy", "same output", "differs between two preparations"),
        ("own-random", "same output", "differs between two preparations"),
    ],
)
def test_a_hidden_draw_is_refused_with_the_check_that_failed(draw, check, words):
    v = verdict(Plain(draw=draw))
    assert not v.ok
    assert v.check == check
    assert words in v.reason and "dataset[0]" in v.reason
    assert v.as_stats()["failed_check"] == check


def test_a_recognized_random_op_is_refused_by_name_without_running():
    calls = []

    class Counting(Plain):
        def __getitem__(self, i):
            calls.append(i)
            return super().__getitem__(i)

    ds = Counting(transform=T.Compose([T.RandomResizedCrop(8), T.ToTensor()]))
    v = verdict(ds)
    assert (v.ok, v.check) == (False, "random op")
    assert "RandomResizedCrop" in v.reason
    assert calls == []
    sub = torch.utils.data.Subset(ds, [0, 1])
    assert "RandomResizedCrop" in (random_step(sub) or "")
    det = T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor(), T.Normalize([0.5], [0.5])])
    assert random_step(Plain(transform=det)) is None


def test_opt_in_and_opt_out():
    assert verdict(Plain(draw="random"), declared=True).how == "declared"
    v = verdict(Plain(), declared=False)
    assert (v.ok, v.check) == (False, "opted out")


def test_an_error_while_checking_is_a_refusal_naming_the_sample():
    def get(i):
        raise OSError(f"cannot read clip {i}")

    v = check_samples(get, [4])
    assert (v.ok, v.check) == (False, "error")
    assert v.reason == "dataset[4] raised OSError: cannot read clip 4"
