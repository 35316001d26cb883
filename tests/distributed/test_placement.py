"""Placement is a fixed function of the key; torchrun's environment is read strictly."""

from __future__ import annotations

import collections

import pytest

from unstall.distributed import owner_of
from unstall.distributed.membership import node_env


def test_owner_is_fixed_balanced_and_stable_when_a_node_is_added():
    keys = [f"{i:05d}.jpg" for i in range(4000)]
    owners = [owner_of(k, 4) for k in keys]
    assert owners == [owner_of(k, 4) for k in keys]
    counts = collections.Counter(owners)
    assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > 850
    # rendezvous hashing: with a 5th node, items move only to it
    moved = [(a, owner_of(k, 5)) for k, a in zip(keys, owners, strict=True)]
    assert all(b in (a, 4) for a, b in moved)
    assert owner_of("x", 1) == 0


def test_node_env_from_torchrun_variables():
    env = dict(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4", MASTER_ADDR="h")
    with pytest.raises(RuntimeError, match="MASTER_PORT"):
        node_env(env)
    got = node_env(dict(env, MASTER_PORT="29500"))
    assert (got.node, got.nodes, got.local_rank) == (1, 2, 1)
    with pytest.raises(RuntimeError, match="not a multiple"):
        node_env(dict(env, MASTER_PORT="1", WORLD_SIZE="6", LOCAL_WORLD_SIZE="4"))
