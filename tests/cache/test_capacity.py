"""Capacity forms and their errors: bytes, size strings, fractions of the dataset."""

from __future__ import annotations

import pytest

from unstall.cache import Cache, parse_capacity
from unstall.cache.capacity import estimate_dataset_bytes, format_bytes, resolve_capacity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("8GiB", 8 * 2**30),
        ("8 gib", 8 * 2**30),
        ("500MB", 500 * 10**6),
        ("1.5K", 1500),
        ("64", 64),
        (0.5, 0.5),
        (1.0, 1.0),
    ],
)
def test_capacity_forms(value, expected):
    assert parse_capacity(value) == expected


@pytest.mark.parametrize("value", ["8 parsecs", "", "GiB", -1, 0, 0.0, 1.5, True, [1], "0MB"])
def test_capacity_errors_name_the_value(value):
    with pytest.raises(ValueError) as info:
        Cache(value)
    message = str(info.value)
    assert f"capacity={value!r}" in message
    assert "'8GiB'" in message  # and say what would be accepted


def test_policy_and_name_errors():
    with pytest.raises(
        ValueError, match=r"policy='fifo' is unknown; use one of \['lru', 'noevict'\]"
    ):
        Cache(1024, policy="fifo")
    with pytest.raises(ValueError, match=r"name='' must be a non-empty string"):
        Cache(1024, name="")


def test_fraction_is_of_the_dataset_bytes(make_dataset):
    ds = make_dataset(40, size=1000)
    assert estimate_dataset_bytes(ds) == 40_000
    assert resolve_capacity(0.25, ds) == (10_000, 40_000)
    assert resolve_capacity(4096, ds) == (4096, 40_000)


def test_bind_rejects_datasets_without_fetch(id_dataset):
    with pytest.raises(TypeError, match=r"IdDataset has no fetch\(\)"):
        Cache(1024).bind(id_dataset(4))


def test_format_bytes():
    assert [format_bytes(x) for x in (512, 1536, 3 * 2**30)] == ["512 B", "1.5 KiB", "3.0 GiB"]
