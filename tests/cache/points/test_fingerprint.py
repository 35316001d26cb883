"""The preparation's fingerprint: changed by what changes a sample, stable otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import transforms as T

from unstall.cache.points.fingerprint import preparation_fingerprint

REPO = Path(__file__).resolve().parents[3]


def scale(x):
    return x * 2


def scale_other(x):
    return x * 3


def helper(i):
    return torch.full((4,), float(i))


class Clips(torch.utils.data.Dataset):
    def __init__(self, rate=8000, transform=None, loader=scale):
        self.files = [f"/data/{i}.wav" for i in range(100)]
        self.rate, self.transform, self.loader = rate, transform, loader
        self.kinds = {"wav", "flac", "mp3"}

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return self.loader(helper(i))


def fp(ds) -> str:
    return preparation_fingerprint(ds)


def test_same_preparation_same_fingerprint_any_change_another():
    base = fp(Clips(transform=T.Compose([T.Resize(256), T.CenterCrop(224)])))
    assert base == fp(Clips(transform=T.Compose([T.Resize(256), T.CenterCrop(224)])))
    changed = [
        Clips(transform=T.Compose([T.Resize(256), T.CenterCrop(200)])),  # a parameter
        Clips(transform=T.Compose([T.Resize(256)])),  # a step less
        Clips(rate=16000, transform=T.Compose([T.Resize(256), T.CenterCrop(224)])),
        Clips(transform=T.Compose([T.Resize(256), T.CenterCrop(224)]), loader=scale_other),
    ]
    fps = [fp(ds) for ds in changed]
    assert base not in fps and len(set(fps)) == len(fps)


def test_a_changed_function_the_dataset_calls_changes_it():
    global helper
    before = fp(Clips())
    keep = helper

    def helper(i):  # the same name, other code
        return torch.full((4,), float(i) + 1)

    try:
        assert fp(Clips()) != before
    finally:
        helper = keep
    assert fp(Clips()) == before


def test_arrays_and_tensors_by_content():
    class Held(torch.utils.data.Dataset):
        def __init__(self, table):
            self.table = table

    a = np.arange(1000.0)
    assert fp(Held(a)) == fp(Held(a.copy()))
    b = a.copy()
    b[500] = -1
    assert fp(Held(a)) != fp(Held(b))
    assert fp(Held(torch.ones(3))) != fp(Held(torch.zeros(3)))


SCRIPT = """
from tests.cache.points.test_fingerprint import Clips, fp
from torchvision import transforms as T
print(fp(Clips(transform=T.Compose([T.Resize(256), T.CenterCrop(224)]))))
"""


@pytest.mark.timeout(600)
def test_stable_across_processes_and_hash_seeds():
    """This process's fingerprint and another's, under a hash seed other than this one's."""
    here = fp(Clips(transform=T.Compose([T.Resize(256), T.CenterCrop(224)])))
    assert Clips.__module__ == "tests.cache.points.test_fingerprint"  # as the other imports it
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": seed}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=500,
        check=True,
    )
    assert done.stdout.strip() == here
