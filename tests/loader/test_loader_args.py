"""The loader's arguments as one frozen value (`unstall.loader.settings.LoaderArgs`): the steps
that decide from them return what they decide, and nothing writes into them."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import unstall
from unstall.loader.autotune.controller import AutoStart, take_auto
from unstall.loader.settings import LoaderArgs, adapt, check_passthrough, loader_args


class Ten(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i


def test_the_arguments_are_frozen_and_typed():
    args = loader_args({"num_workers": 2, "cache": False})
    assert (args.num_workers, args.cache, args.batch_size) == (2, False, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.cache = None  # type: ignore[misc]
    with pytest.raises(TypeError, match="no_such_argument"):
        loader_args({"no_such_argument": 1})


def test_a_config_files_kwargs_go_over_the_scripts(tmp_path, monkeypatch):
    """``$UNSTALL_CONFIG``'s kwargs replace the script's; the rest stays as given."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"kwargs": {"num_workers": 3, "prefetch_factor": 4}}))
    monkeypatch.setenv("UNSTALL_CONFIG", str(config))
    given = {"num_workers": 1, "batch_size": 8, "seed": 5}
    args = loader_args(given)
    assert (args.num_workers, args.prefetch_factor, args.batch_size, args.seed) == (3, 4, 8, 5)
    assert given == {"num_workers": 1, "batch_size": 8, "seed": 5}  # the script's untouched


def test_the_adapt_step_returns_its_arguments_and_leaves_the_given_ones():
    """``prep="lean"`` on unstall's own dataset becomes the loader's default (None) in the
    returned arguments; the ones passed in keep what the script said."""

    class Own(Ten):  # unstall's own kind of dataset: it fetches its items itself
        def fetch(self, i: int) -> bytes:
            return b""

    data = Own()
    given = loader_args({"prep": "lean"})
    dataset, args = adapt(data, given)
    assert dataset is data
    assert (given.prep, args.prep) == ("lean", None)


def test_auto_returns_the_starting_pool_and_writes_nothing():
    """``take_auto`` is handed values and returns an `AutoStart`: the starting pool, and the
    tuner for a map-style dataset (none for an iterable one, which keeps the pool)."""
    assert take_auto(2, None, map_style=True) == AutoStart(2, None, None)
    start = take_auto("auto", "auto", map_style=False)
    assert (start.num_workers, start.prefetch_factor, start.tuner) == (1, 2, None)
    start = take_auto(3, "auto", map_style=True)
    try:
        assert (start.num_workers, start.prefetch_factor) == (3, 2)
        assert (start.tuner.workers, start.tuner.prefetch) == (3, 2)
        assert (start.tuner.tune_workers, start.tuner.tune_prefetch) == (False, True)
    finally:
        start.tuner.close()
    with pytest.raises(ValueError, match=r"prefetch_factor='x' must be an int or 'auto'"):
        take_auto("auto", "x", map_style=True)
    with pytest.raises(ValueError, match="prefetch_factor='auto' needs num_workers > 0"):
        take_auto(0, "auto", map_style=False)


def test_an_iterable_datasets_extras_are_refused_by_name():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    check_passthrough(Stream(), LoaderArgs(cache=False))  # cache=False: none asked
    with pytest.raises(ValueError, match=r"^seed=3 needs a map-style dataset"):
        check_passthrough(Stream(), LoaderArgs(seed=3))


def test_a_pool_change_reaches_the_loaders_own_attributes():
    """`DataLoader.start_epoch` takes the pool its starter sized into ``num_workers`` and
    ``prefetch_factor`` (the starter writes nothing on the loader); every sample once."""
    loader = unstall.DataLoader(Ten(), batch_size=2, num_workers=1, seed=0)
    try:
        it = loader.start_epoch(workers=2, prefetch=3)
        assert (loader.num_workers, loader.prefetch_factor) == (2, 3)
        first = next(it).tolist()
        loader.start_epoch(continues=it, workers=1, prefetch=2)
        assert (loader.num_workers, loader.prefetch_factor) == (1, 2)
        rest = [i for batch in it for i in batch.tolist()]
        assert sorted(first + rest) == list(range(10))
    finally:
        loader.close()
