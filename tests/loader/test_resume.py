"""Resume mid-epoch from state_dict(): exactly the remaining batches, in order."""

from __future__ import annotations

import json

import pytest

import unstall
from tests.conftest import IdDataset, check_resume


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(("n", "batch_size", "drop_last"), [(40, 4, False), (43, 5, True)])
def test_resume_gives_exactly_the_remaining_sequence(num_workers, n, batch_size, drop_last):
    check_resume(
        lambda: unstall.DataLoader(
            IdDataset(n),
            batch_size=batch_size,
            shuffle=True,
            seed=11,
            num_workers=num_workers,
            drop_last=drop_last,
        )
    )


def test_resume_with_persistent_workers_and_sharding():
    check_resume(
        lambda: unstall.DataLoader(
            IdDataset(37),
            batch_size=3,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            rank=1,
            world_size=2,
        )
    )


def test_state_is_json_safe_and_names_a_mismatch():
    loader = unstall.DataLoader(IdDataset(20), batch_size=4, shuffle=True, seed=2, num_workers=1)
    it = iter(loader)
    next(it)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == 0 and state["batches_done"] == 2
    other = unstall.DataLoader(IdDataset(20), batch_size=4, shuffle=True, seed=3)
    with pytest.raises(ValueError, match="seed=2"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="lacks keys"):
        other.load_state_dict({"epoch": 1})


def test_set_epoch_after_load_keeps_the_loaded_position():
    ref = unstall.DataLoader(IdDataset(30), batch_size=5, shuffle=True, seed=0)
    ref.set_epoch(3)
    expected = [b.tolist() for b in ref][2:]
    loader = unstall.DataLoader(IdDataset(30), batch_size=5, shuffle=True)
    loader.load_state_dict({"epoch": 3, "batches_done": 2, "seed": 0})
    loader.set_epoch(3)  # the usual `for epoch in range(start, E): set_epoch(epoch)` loop
    assert [b.tolist() for b in loader] == expected
