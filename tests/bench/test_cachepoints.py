"""`bench cachepoints`: its rows and figures, at a tiny size (the goals are the bench's, at its
own size: no timed threshold here)."""

from __future__ import annotations

import pytest

from unstall.bench import load
from unstall.bench.cachepoints import GOAL_MIXED, GOAL_VALIDATION, run


@pytest.mark.timeout(900)
def test_rows_ratios_and_the_caches_each_side_used():
    result = run(quick=True, repeats=1, images=40)
    assert load("cachepoints").run is run
    data = result.to_json()
    val, third, twelfth = result.rows
    assert val["case"] == "validation pass 2+" and val["goal"] == GOAL_VALIDATION
    assert (val["baseline"], val["unstall"]) == ("as is", "hold=samples")
    assert third["goal"] == GOAL_MIXED and twelfth["goal"] == 1.0
    for r in (third, twelfth):
        assert (r["baseline"], r["unstall"]) == ("hold=bytes", "hold=auto")
    for r in result.rows:  # each ratio is its pair's rates
        assert r["ratio"] == pytest.approx(
            r["unstall_samples_per_s"] / r["baseline_samples_per_s"], rel=0.02
        )
    assert result.ratio == pytest.approx(val["ratio"], abs=1e-3)
    v = data["validation"]
    assert v["base_cache"] is None  # the script as it is: torch's loader, no cache
    assert v["new_cache"]["holds"] == "samples"
    assert (v["new_cache"]["hits"], v["new_cache"]["misses"]) == (80, 40)  # passes 2-3 hit
    m = data["mixed"]["third"]
    assert m["base_cache"].get("holds", "bytes") == "bytes" and m["new_cache"]["holds"] == "auto"
    assert 0 < m["new_cache"]["decoded_samples"] < data["config"]["training_images"]
    assert data["config"]["training_images"] == 12 and data["config"]["repeats"] == 1
    assert isinstance(data["goals_met"], bool)
