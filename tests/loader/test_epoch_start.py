"""`DataLoader.start_epoch`: the one entry that starts an epoch at a position. ``iter()``
runs it at the loader's position; given ``(epoch, start)`` it makes the rest of that epoch
(a process that makes part of one); with ``continues=`` the running epoch goes on from its
next batch on a pool of another size (the autotuner's pool change)."""

from __future__ import annotations

import pytest
import torch

import unstall
from tests.conftest import IdDataset


def _epochs(n: int) -> list[list[list[int]]]:
    ref = unstall.DataLoader(IdDataset(40), batch_size=4, shuffle=True, seed=3)
    return [[b.tolist() for b in ref] for _ in range(n)]


def test_an_epoch_started_at_a_position_gives_the_rest_of_it_then_iter_goes_on():
    want = _epochs(3)
    loader = unstall.DataLoader(IdDataset(40), batch_size=4, shuffle=True, seed=3, num_workers=1)
    it = loader.start_epoch(1, 2, workers=2, prefetch=3)
    assert len(it) == 8 and it.cursor.epoch == 1
    assert [b.tolist() for b in it] == want[1][2:]
    assert (loader.num_workers, loader.prefetch_factor) == (2, 3)
    assert len(it.workers_iter._workers) == 2
    assert [b.tolist() for b in loader] == want[2]  # the next iter(): the next epoch
    assert loader.state_dict()["epoch"] == 3


@pytest.mark.parametrize("persistent", [False, True])
def test_the_running_epoch_continues_on_new_workers(persistent):
    want = _epochs(2)
    loader = unstall.DataLoader(
        IdDataset(40), batch_size=4, shuffle=True, seed=3, num_workers=1,
        persistent_workers=persistent,
    )  # fmt: skip
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    old = it.workers_iter
    assert loader.start_epoch(continues=it, workers=3, prefetch=1) is it
    assert it.workers_iter is not old and len(it.workers_iter._workers) == 3
    assert it.pulled == 3 and it.has_more()
    got += [b.tolist() for b in it]
    assert got == want[0] and not it.has_more()
    assert [b.tolist() for b in loader] == want[1]  # the new pool serves the next epoch
    assert loader.num_workers == 3


def test_an_iterable_dataset_has_no_position_to_start_at():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(TypeError, match=r"start_epoch\(\) needs a map-style dataset"):
        unstall.DataLoader(Stream(), batch_size=2).start_epoch(0, 1)
