"""`bench cachepoints`: its rows and figures, at a tiny size (the goals are the bench's, at its
own size: no timed threshold here)."""

from __future__ import annotations

import pytest

from unstall.bench import load
from unstall.bench.cachepoints import GOAL_BUDGET, GOAL_MIXED, GOAL_VALIDATION, run


@pytest.mark.timeout(900)
def test_rows_ratios_and_the_caches_each_side_used():
    # one budget of the three (the goal's): the others' rows are the same code at other
    # sizes; the cost breakdown (the bounds' note) timed on two images, not sixteen
    assert GOAL_BUDGET == "half"
    result = run(quick=True, repeats=1, images=12, budgets=("half",), cost_images=2)
    assert load("cachepoints").run is run
    data = result.to_json()
    val, third = result.rows
    assert val["case"] == "validation pass 2+" and val["goal"] == GOAL_VALIDATION
    assert (val["baseline"], val["unstall"]) == ("as is", "hold=samples")
    assert third["case"].startswith("training epoch 2+, budget half of decoded")
    assert third["goal"] == GOAL_MIXED
    assert (third["baseline"], third["unstall"]) == ("hold=bytes", "hold=auto")
    pairs = (data["validation"], data["mixed"]["half"])
    for r, pair in zip(result.rows, pairs, strict=True):  # each ratio is its pair's rates
        assert pair["ratio"] == pytest.approx(pair["new_rate"] / pair["base_rate"], rel=1e-9)
        assert pair["ratios"] == [round(pair["ratio"], 3)]  # one pair
        assert r["ratio"] == round(pair["ratio"], 3)
        assert r["baseline_samples_per_s"] == round(pair["base_rate"], 1)
        assert r["unstall_samples_per_s"] == round(pair["new_rate"], 1)
    assert result.ratio == pytest.approx(val["ratio"], abs=1e-3)
    v = data["validation"]
    assert v["base_cache"] is None  # the script as it is: torch's loader, no cache
    assert v["new_cache"]["holds"] == "samples"
    assert (v["new_cache"]["hits"], v["new_cache"]["misses"]) == (24, 12)  # passes 2-3 hit
    m = data["mixed"]["half"]
    assert m["base_cache"].get("holds", "bytes") == "bytes" and m["new_cache"]["holds"] == "auto"
    assert 0 < m["new_cache"]["decoded_samples"] < data["config"]["training_images"]
    assert data["config"]["training_images"] == 12 and data["config"]["repeats"] == 1
    decoded = 12 * 1024 * 768 * 3
    assert data["config"]["budgets"] == {"half": decoded // 2}
    assert set(data["mixed"]) == {"half"} and len(result.notes) == 4
    assert result.notes[2].startswith("a training image, one thread: decode ")  # the costs
    # the ceiling at the share held decoded: dataset[i]'s CPU over it less the decodes skipped
    costs, bound = data["costs"], data["bounds"]["half"]
    share = m["new_cache"]["decoded_samples"] / 12
    assert bound["decoded_share"] == round(share, 3)
    spared = share * max(0.0, costs["decode_ms"] - costs["read_back_ms"])
    assert bound["ceiling"] == round(costs["sample_ms"] / (costs["sample_ms"] - spared), 3)
    assert isinstance(data["goals_met"], bool)
