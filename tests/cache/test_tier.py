"""Both cache tiers are `Tier`s: the composing layer needs nothing else of them."""

from __future__ import annotations

from unstall.cache.disk_tier import DiskTier
from unstall.cache.ram_tier import RamTier
from unstall.cache.tier import Tier


def test_both_tiers_are_tiers():
    args = dict(path=None, name="n", group=1, owner=1, capacity=0, how="off")
    for tier in (RamTier(policy="noevict", **args), DiskTier(**args)):
        assert isinstance(tier, Tier)
        assert tier.get_many([0, 1], None) == ([None, None], 0)
        assert tier.put_many([(0, b"x")], None, 0) == (0, 0)
        assert tier.stats()["enabled"] is False
        assert tier.close() is False
