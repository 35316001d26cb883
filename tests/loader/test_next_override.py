"""An observer that hands out a running epoch's batches itself (`hooks.next_replacer`): how
`unstall analyze` times the model alone in the cold run's own process, once its window is
written. The epoch keeps its length and ends as it would; one real batch is pulled."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

import unstall
from tests.conftest import IdDataset, flatten_ids
from unstall.loader import hooks


class Switch:
    """Real batches until ``after`` were handed out, then ``"again"`` in place of each next."""

    def __init__(self, after: int):
        self.after, self.real, self.fetching = after, 0, False
        self.pulled: list[torch.Tensor] = []
        self.finished_epochs = 0

    def created(self, loader: object) -> None:
        pass

    def batch(self, loader: object, wait_s: float, samples: int | None = None) -> None:
        if not self.fetching:
            self.real += 1

    def finished(self, loader: object) -> None:
        self.finished_epochs += 1

    def replaces_next(self, loader: object) -> bool:
        return self.real >= self.after and not self.fetching

    def next_batch(self, loader: object, pull) -> str:
        if not self.pulled:  # one real batch, as the analyzer's agent takes it
            self.fetching = True
            try:
                self.pulled.append(pull())
            finally:
                self.fetching = False
        return "again"


class Counted(torch.utils.data.IterableDataset):
    """Samples 0..n-1 from one worker (an iterable dataset: torch's own iterator, timed)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("workers", [0, 2])
def test_the_running_epoch_keeps_its_length_and_the_next_is_replaced_whole(workers):
    # processes of earlier tests in this interpreter (an S3 store's helper) are not ours
    before = set(multiprocessing.active_children())
    switch = Switch(after=3)
    remove = hooks.add_observer(switch)
    try:
        loader = unstall.DataLoader(IdDataset(20), batch_size=2, num_workers=workers)
        first = list(loader)  # 10 batches: 3 real, then the observer's
        assert flatten_ids(first[:3]) == [0, 1, 2, 3, 4, 5]
        assert first[3:] == ["again"] * 7
        assert [b.tolist() for b in switch.pulled] == [[6, 7]]  # the one real batch pulled
        second = list(loader)
        assert second == ["again"] * 10  # the next epoch: its length, each batch replaced
        assert loader.stats()["epochs_completed"] == 2
        assert switch.finished_epochs == 2
    finally:
        remove()
    del loader, first, second
    assert set(multiprocessing.active_children()) - before == set()  # the workers are gone


def test_an_iterable_datasets_epoch_keeps_its_length_too():
    switch = Switch(after=2)
    remove = hooks.add_observer(switch)
    try:
        loader = unstall.DataLoader(Counted(12), batch_size=4, num_workers=1)
        batches = list(loader)
        assert flatten_ids(batches[:2]) == list(range(8))
        assert batches[2:] == ["again"]  # 3 batches in all, as len(loader) says
        assert [b.tolist() for b in switch.pulled] == [[8, 9, 10, 11]]
    finally:
        remove()


def test_without_an_observer_that_replaces_nothing_changes():
    remove = hooks.add_observer(Switch(after=10**9))
    try:
        loader = unstall.DataLoader(IdDataset(10), batch_size=3, shuffle=False)
        assert flatten_ids(list(loader)) == list(range(10))
    finally:
        remove()
