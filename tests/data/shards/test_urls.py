"""Brace patterns, shard locations, coalesced ranges and the window order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from unstall.data.shards import order
from unstall.data.shards.ranges import plan_ranges
from unstall.data.shards.urls import expand, resolve


def test_brace_patterns_expand_like_webdataset():
    assert expand("a-{000..002}.tar") == ["a-000.tar", "a-001.tar", "a-002.tar"]
    want = ["a-8.tar", "a-9.tar", "a-10.tar", "b-8.tar", "b-9.tar", "b-10.tar"]
    assert expand("{a,b}-{8..10}.tar") == want
    assert expand("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError, match="counts down"):
        expand("x-{3..1}.tar")


def test_resolve_splits_root_and_keys():
    want2 = ("s3://b/p", ["train-0.tar", "train-1.tar"])
    assert resolve("s3://b/p/train-{0..1}.tar", (".tar",)) == want2
    assert resolve("s3://b/p", (".tar",)) == ("s3://b/p", None)
    assert resolve(["/d/x/a.tar", "/d/y/b.tar"], (".tar",)) == ("/d", ["x/a.tar", "y/b.tar"])
    with pytest.raises(ValueError, match="named twice"):
        resolve(["/d/a.tar", "/d/a.tar"], (".tar",))


def test_ranges_coalesce_near_spans_and_locate_each():
    spans = [(5000, 6000), (0, 100), (150, 300), (10_000_000, 10_000_010), (150, 300)]
    plan = plan_ranges(spans, gap=4096)
    assert [r for r, _ in plan] == [(0, 300), (5000, 6000), (10_000_000, 10_000_010)]
    blob = bytes(range(256)) * 40000
    for (a, _b), parts in plan:
        for k, x, y in parts:
            assert blob[a + x : a + y] == blob[spans[k][0] : spans[k][1]]
    assert sorted(k for _, parts in plan for k, _, _ in parts) == [0, 1, 2, 3, 4]


def test_window_order_is_a_permutation_with_locality():
    first = np.array([0, 10, 25, 30, 50, 61])  # 5 shards of uneven sizes
    shard_of = np.searchsorted(first, np.arange(61), side="right") - 1
    a = order.window_order(first, 2, seed=1, epoch=0)
    assert sorted(a.tolist()) == list(range(61))
    b = order.window_order(first, 2, seed=1, epoch=1)
    assert a.tolist() != b.tolist()
    assert a.tolist() == order.window_order(first, 2, seed=1, epoch=0).tolist()
    # windows of 2 shards follow each other: a shard's samples all lie inside its window
    for perm in (a, b):
        pos = np.empty(61, np.int64)
        pos[perm] = np.arange(61)
        spans = sorted((pos[shard_of == s].min(), pos[shard_of == s].max()) for s in range(5))
        groups = [spans[i : i + 2] for i in range(0, 5, 2)]
        for g, h in itertools.pairwise(groups):
            assert max(e for _, e in g) < min(s for s, _ in h)
