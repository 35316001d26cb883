"""`unstall.sizes`: the one reader of sizes written as text (the cache's capacities, the
remote workers' bytes in flight)."""

from __future__ import annotations

import pytest

import unstall
from unstall.cache import parse_capacity
from unstall.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", 512),
        ("2k", 2000),
        ("1.5 MB", 1_500_000),
        ("64MiB", 64 * 2**20),
        ("64mib", 64 * 2**20),
        (".5GiB", 2**29),
        ("1TB", 10**12),
    ],
)
def test_one_reader_for_the_cache_and_the_remote_workers(text, expected):
    assert parse_size(text) == expected
    assert parse_capacity(text) == expected
    assert unstall.Remote.of({"max_bytes_in_flight": text}).max_bytes_in_flight == expected


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "", "1e3", "-5MB"])
def test_what_is_not_a_size_is_refused_by_each_setting_by_its_name(text):
    with pytest.raises(ValueError, match="cannot read"):
        parse_size(text)
    with pytest.raises(ValueError, match="cannot read this size"):
        parse_capacity(text)
    with pytest.raises(ValueError, match="max_bytes_in_flight"):
        unstall.Remote.of({"max_bytes_in_flight": text})
