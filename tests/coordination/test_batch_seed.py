"""A batch's augmentation depends only on (seed, epoch, batch index): not on workers."""

from __future__ import annotations

import os

import torch

import unstall
from tests.conftest import write_jpegs
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

from .member import Counted


def _batches(num_workers: int, **kw):
    loader = unstall.DataLoader(
        Counted(24, os.devnull), batch_size=4, shuffle=True, seed=9, num_workers=num_workers, **kw
    )
    return [(x.clone(), y.clone()) for _ in range(2) for x, y in loader]


def test_augmentation_is_the_same_for_any_number_of_workers():
    runs = [_batches(n) for n in (0, 1, 3)]
    for other in runs[1:]:
        for (x0, y0), (x, y) in zip(runs[0], other, strict=True):
            assert torch.equal(x0, x) and torch.equal(y0, y)
    first, second = runs[0][:6], runs[0][6:]  # epochs draw anew
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(first, second, strict=True))


def test_main_process_loading_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    _batches(0)
    assert torch.equal(torch.rand(4), expected)


def test_image_pipeline_crops_follow_the_batch_not_the_worker(tmp_path):
    root = write_jpegs(tmp_path, 12, classes=2, seed=3)
    ds = unstall.ImageFolder(LocalStore(root), transform=ImagePipeline(size=32, seed=1))

    def run(n):
        loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, seed=2, num_workers=n)
        return [x.clone() for x, _ in loader]

    for a, b in zip(run(0), run(2), strict=True):
        assert torch.equal(a, b)
