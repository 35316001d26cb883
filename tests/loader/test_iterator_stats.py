"""Statistics per iterator: an epoch ends when its iterator is exhausted, dropped or
replaced; a waiting share never exceeds 100 %; samples are counted from the batches."""

from __future__ import annotations

import gc
import time

import pytest
import torch

import unstall
from tests.conftest import IdDataset
from unstall.loader import hooks


class Slow(IdDataset):
    def __getitem__(self, index: int) -> int:
        time.sleep(0.001)
        return index


def test_a_second_iterator_and_dropping_the_first_keep_the_clock_right():
    loader = unstall.DataLoader(Slow(40), batch_size=4, num_workers=2)
    a = iter(loader)
    b = iter(loader)  # replaces a: a's epoch (no batch) ends here, uncounted
    del a
    gc.collect()
    for _ in b:
        time.sleep(0.003)  # the training step: the loop waits less than it runs
    s = loader.stats()
    assert (s["batches"], s["samples"], s["epochs_completed"]) == (10, 40, 1)
    # the clock ran over b's whole epoch (10 steps of >= 3 ms), not from a's drop
    assert s["wall_s"] >= 10 * 0.003
    assert 0 < s["wait_s"] <= s["wall_s"] and 0 < s["stall_fraction"] <= 1


@pytest.mark.parametrize("device", [None, "cpu"])
def test_an_epoch_stopped_after_len_batches_completes_at_the_next_iter(device):
    """Lightning's loop: ``len(loader)`` batches taken, the iterator never exhausted."""
    loader = unstall.DataLoader(Slow(24), batch_size=4, num_workers=1, device=device)
    start = time.perf_counter()
    for _ in range(2):
        it = iter(loader)  # replaces the last epoch's iterator, which ends its epoch
        batches = [next(it) for _ in range(len(loader))]
        assert sorted(int(i) for b in batches for i in b) == list(range(24))
        time.sleep(0.05)  # e.g. validation: not this loader's time
    total = time.perf_counter() - start
    s = loader.stats()
    assert s["epochs_completed"] == 1  # the second one is still open
    del it
    gc.collect()  # dropped: its epoch ends too
    s = loader.stats()
    assert (s["batches"], s["samples"], s["epochs_completed"]) == (12, 48, 2)
    assert [(e["epoch"], e["batches"], e["samples"]) for e in s["per_epoch"]] == [
        (0, 6, 24),
        (1, 6, 24),
    ]
    # each epoch's span ends at its last batch: the 50 ms pauses after it are not counted
    assert s["wall_s"] <= total - 2 * 0.05
    assert s["stall_fraction"] <= 1


def test_a_loop_left_early_is_no_completed_epoch():
    loader = unstall.DataLoader(Slow(40), batch_size=4, num_workers=1)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    gc.collect()
    s = loader.stats()
    assert (s["batches"], s["epochs_completed"], s["per_epoch"]) == (3, 0, [])
    assert s["stall_fraction"] <= 1


def test_zip_of_two_iterators_of_one_loader_stays_within_100_percent():
    loader = unstall.DataLoader(Slow(16), batch_size=4, num_workers=2)
    pairs = [(int(a[0]), int(b[0])) for a, b in zip(loader, loader, strict=False)]
    assert pairs == [(0, 0), (4, 4), (8, 8), (12, 12)]
    s = loader.stats()
    assert (s["batches"], s["samples"], s["epochs_completed"]) == (8, 32, 2)
    assert 0 < s["stall_fraction"] <= 1


class Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int):
        return {"x": torch.full((3,), float(index)), "y": index % 2}


def test_samples_are_counted_from_batches_of_a_batch_sampler():
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.SequentialSampler(range(100)), batch_size=32, drop_last=False
    )
    loader = unstall.DataLoader(Points(), batch_sampler=sampler, num_workers=2)
    assert loader.batch_size is None
    seen = []

    class New:
        def created(self, loader):
            pass

        def batch(self, loader, wait_s, samples=None):
            seen.append(("new", samples))

        def finished(self, loader):
            seen.append(("finished", None))

    class Old:  # written before the sample count: two arguments
        def created(self, loader):
            pass

        def batch(self, loader, wait_s):
            seen.append(("old", wait_s >= 0))

        def finished(self, loader):
            pass

    removes = [hooks.add_observer(New()), hooks.add_observer(Old())]
    try:
        sizes = [len(b["y"]) for b in loader]
    finally:
        for remove in removes:
            remove()
    assert sizes == [32, 32, 32, 4]
    s = loader.stats()
    assert (s["batches"], s["samples"], s["epochs_completed"]) == (4, 100, 1)
    assert s["samples_per_s"] == pytest.approx(100 / s["wall_s"], rel=1e-3)
    news = [n for kind, n in seen if kind == "new"]
    assert news == [32, 32, 32, 4]
    assert [kind for kind, _ in seen].count("old") == 4
    assert [kind for kind, _ in seen].count("finished") == 1


def test_iterable_dataset_epochs_end_the_same_ways():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(12))

        def __len__(self) -> int:
            return 12

    loader = unstall.DataLoader(Stream(), batch_size=4)
    for _ in range(2):
        it = iter(loader)
        assert [len(next(it)) for _ in range(len(loader))] == [4, 4, 4]
    del it
    gc.collect()
    s = loader.stats()
    assert (s["batches"], s["samples"], s["epochs_completed"]) == (6, 24, 2)
    assert s["stall_fraction"] <= 1


def test_an_iterator_kept_to_the_end_ends_its_epoch_at_exit():
    from unstall.loader.workers.iterate import end_open_epochs

    loader = unstall.DataLoader(Slow(16), batch_size=4)
    kept = iter(loader)
    assert [len(next(kept)) for _ in range(len(loader))] == [4, 4, 4, 4]
    assert loader.stats()["epochs_completed"] == 0
    end_open_epochs()  # what `unstall run` does at the program's exit
    s = loader.stats()
    assert (s["epochs_completed"], [e["batches"] for e in s["per_epoch"]]) == (1, [4])
    end_open_epochs()  # again: nothing more
    assert loader.stats()["epochs_completed"] == 1
