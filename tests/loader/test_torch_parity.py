"""Swapped in under torch's own name, unstall's loader behaves as torch's where torch defines it."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.utils.data

import unstall
from tests.conftest import IdDataset, flatten_ids
from unstall.loader.swap import TorchDataLoader, is_patched


@pytest.fixture
def swapped(monkeypatch):
    """``torch.utils.data.DataLoader = unstall.DataLoader``, as any swap-in tool does."""
    monkeypatch.setattr(torch.utils.data, "DataLoader", unstall.DataLoader)
    return torch.utils.data.DataLoader


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_swapped_loader_yields_torchs_batches(swapped, num_workers):
    ds = IdDataset(37)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=num_workers)
    assert type(loader) is unstall.DataLoader
    ours = [b.tolist() for b in loader]
    theirs = [b.tolist() for b in TorchDataLoader(ds, batch_size=5, num_workers=num_workers)]
    assert ours == theirs
    shuffled = torch.utils.data.DataLoader(
        ds, batch_size=5, shuffle=True, num_workers=num_workers, drop_last=False
    )
    for _ in range(2):
        ids = flatten_ids(list(shuffled))
        assert sorted(ids) == list(range(37))  # every sample exactly once


def test_patch_torch_and_its_undo(monkeypatch):
    real = torch.utils.data.DataLoader
    assert real is TorchDataLoader
    undo = unstall.patch_torch()
    try:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import DataLoader as Deep

        assert DataLoader is Deep is unstall.DataLoader and is_patched()
        loader = DataLoader(IdDataset(8), batch_size=3, num_workers=1)
        assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6, 7]]
        assert isinstance(loader, real)  # code holding torch's class still recognises it
    finally:
        undo()
    assert torch.utils.data.DataLoader is real and not is_patched()
    assert torch.utils.data.dataloader.DataLoader is real


class Failing(IdDataset):
    """Raises the exception type given for index ``bad``."""

    def __init__(self, n: int, bad: int, exc: type[Exception]):
        super().__init__(n)
        self.bad, self.exc = bad, exc

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            raise self.exc(f"record {index}")
        return index


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("exc", [KeyError, ValueError])
def test_dataset_errors_keep_their_type_and_the_epoch_goes_on(swapped, num_workers, exc):
    loader = torch.utils.data.DataLoader(
        Failing(12, bad=5, exc=exc), batch_size=4, num_workers=num_workers
    )
    it = iter(loader)
    got, caught = [], []
    for _ in range(4):  # bounded: 3 batches and one error
        try:
            got.append(next(it).tolist())
        except exc as e:
            caught.append(e)
        except StopIteration:
            break
    assert [b for b in got] == [[0, 1, 2, 3], [8, 9, 10, 11]]  # as torch: the rest still comes
    (error,) = caught
    note = "\n".join(getattr(error, "__notes__", []))
    assert "dataset index 5" in note
    assert ("DataLoader worker" in note) == (num_workers > 0)
    torch_it = iter(TorchDataLoader(Failing(12, 5, exc), batch_size=4, num_workers=num_workers))
    assert next(torch_it).tolist() == [0, 1, 2, 3]
    with pytest.raises(exc):
        next(torch_it)
    assert next(torch_it).tolist() == [8, 9, 10, 11]
    # to its end, so torch stops its workers now: its re-raise left the iterator in a cycle,
    # and torch's own iterator freed by the garbage collector takes 10 s to stop 2 workers
    assert next(torch_it, None) is None


def test_len_follows_a_dataset_that_grows(swapped):
    ds = IdDataset(10)
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    theirs = TorchDataLoader(ds, batch_size=4)
    assert len(loader) == len(theirs) == 3
    ds.n = 21
    assert len(loader) == len(theirs) == 6
    assert flatten_ids(list(loader)) == list(range(21))
    shuffled = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
    ds.n = 30
    assert len(shuffled) == 8 and sorted(flatten_ids(list(shuffled))) == list(range(30))


def test_generic_subscript_and_frozen_attributes(swapped):
    assert unstall.DataLoader[int] is not None
    assert torch.utils.data.DataLoader[int] is not None
    loader = torch.utils.data.DataLoader(IdDataset(6), batch_size=2)
    for attr, value in [("batch_size", 8), ("sampler", None), ("drop_last", True)]:
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set after"):
            setattr(loader, attr, value)
    loader.num_workers = 0  # torch lets other attributes change
    assert loader.batch_size == 2 and loader.drop_last is False


def test_torch_attributes_are_torchs(swapped):
    ds = IdDataset(10)
    sampler = torch.utils.data.SequentialSampler(ds)
    ours = torch.utils.data.DataLoader(ds, batch_size=3, sampler=sampler, num_workers=2)
    theirs = TorchDataLoader(ds, batch_size=3, sampler=sampler, num_workers=2)
    for attr in ("batch_size", "num_workers", "prefetch_factor", "drop_last", "timeout"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert ours.sampler is sampler and len(iter(ours)) == len(iter(theirs)) == 4
    shuffled = torch.utils.data.DataLoader(ds, batch_size=3, shuffle=True, seed=4)
    assert flatten_ids(list(shuffled)) == list(shuffled.sampler)[:0] + flatten_ids(
        list(torch.utils.data.DataLoader(ds, batch_size=3, shuffle=True, seed=4))
    )
    again = torch.utils.data.DataLoader(ds, batch_size=3, shuffle=True, seed=4)
    assert list(again.sampler) == flatten_ids(list(again))  # the sampler shows the next epoch


class Stream(torch.utils.data.IterableDataset):
    """0..n-1, split between workers as torch's docs show (get_worker_info)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(range(self.n))
        per = math.ceil(self.n / info.num_workers)
        return iter(range(info.id * per, min(self.n, (info.id + 1) * per)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_runs_as_torchs(swapped, num_workers):
    loader = torch.utils.data.DataLoader(Stream(50), batch_size=4, num_workers=num_workers)
    ours = [b.tolist() for b in loader]
    reference = TorchDataLoader(Stream(50), batch_size=4, num_workers=num_workers)
    theirs = [b.tolist() for b in reference]
    if num_workers == 0:
        assert ours == theirs
    assert Counter(flatten_ids(ours)) == Counter(flatten_ids(theirs)) == Counter(range(50))
    stats = loader.stats()
    assert stats["batches"] == len(ours) and stats["samples"] == 50
    assert stats["wait"]["count"] == len(ours)
    with pytest.raises(ValueError, match="shuffle"):  # torch's own check
        torch.utils.data.DataLoader(Stream(5), shuffle=True)


def test_user_sampler_set_epoch_is_the_users(swapped):
    ds = IdDataset(20)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=2, rank=0, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=sampler)
    theirs = TorchDataLoader(ds, batch_size=5, sampler=sampler)
    for epoch in (3, 3, 7):
        loader.sampler.set_epoch(epoch)
        ours = flatten_ids(list(loader))
        assert ours == flatten_ids(list(theirs)), epoch


def _clone_all(batch):
    return [x.clone() for x in batch]


def test_nested_tensors_and_torchs_iterator_attributes(swapped):
    """Nested tensors pass through workers as torch passes them; ``it._workers`` is torch's."""
    data = [torch.nested.nested_tensor([torch.full((3,), float(i))]) for i in range(4)]
    loader = torch.utils.data.DataLoader(data, batch_size=1, num_workers=2, collate_fn=_clone_all)
    it = iter(loader)
    assert len(it._workers) == 2 and all(w.is_alive() for w in it._workers)
    for i, batch in enumerate(it):
        assert batch[0].is_nested and torch.equal(batch[0].unbind()[0], torch.full((3,), float(i)))
    with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
        next(iter(torch.utils.data.DataLoader(data, batch_size=1, num_workers=2)))
