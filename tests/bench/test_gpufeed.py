"""`bench gpufeed`: one case end to end (small), and the result built from its cases."""

from __future__ import annotations

import os

import pytest

from unstall.bench import gpufeed
from unstall.bench.registry import load
from unstall.gpu.engine import ENGINE_ENV, FEED_ENV, dali_importable


def figures(loop: float, stage: float, feed: float) -> dict:
    return {
        "samples": 1536, "wall_s": 10.0, "samples_per_s": 153.6, "main_cpu_ms_per_batch": loop,
        "stage_cpu_ms_per_batch": stage, "process_cpu_ms_per_batch": 50.0,
        "dali_feed_cpu_ms_per_batch": feed, "dali_copy_cpu_ms_per_batch": 3.0,
    }  # fmt: skip


def test_the_result_has_the_feeds_ratio_and_the_loop_threads_goal():
    cases = {
        "cpu/-": figures(0.7, 0.0, 0.0),
        "gpu/tensors": figures(1.2, 10.0, 1.0),
        "gpu/arrays": figures(1.1, 12.0, 2.0),
        "hybrid/tensors": figures(3.5, 20.0, 0.8),
        "hybrid/arrays": figures(1.0, 21.0, 1.6),
        "auto/tensors": figures(1.3, 22.0, 0.9),
    }
    result = gpufeed._result(cases, {k: [v] for k, v in cases.items()}, 2, 6, 1).to_json()
    assert result["ratio"] == 2.0 and result["baseline"]["variant"] == "gpu/arrays"
    assert result["goal_met"] is False  # hybrid's loop thread: 3.5 ms > 3
    rows = {r["case"]: r for r in result["rows"]}
    assert rows["hybrid/tensors"]["ratio"] == 2.0 and rows["gpu/arrays"]["ratio"] is None
    assert rows["hybrid/tensors"]["loop_ms"] == 3.5 and rows["cpu/-"]["feed_ms"] == 0.0
    assert load("gpufeed") is gpufeed


@pytest.mark.skipif(not dali_importable(), reason="pip install 'unstall[dali]'")
def test_one_case_measures_the_loop_and_the_stage_thread(tmp_path, monkeypatch):
    from tests.conftest import write_jpegs
    from unstall.stores import LocalStore

    monkeypatch.setattr(gpufeed, "BATCH", 4)
    monkeypatch.setenv(ENGINE_ENV, "dali")
    store = LocalStore(write_jpegs(tmp_path, 16, classes=4, seed=1))
    got = gpufeed.one_case(store, "gpu", "arrays", warmup=1, timed=2)
    assert got["samples"] == 8 and got["dali_feed"] == "arrays" and got["mode"] == "gpu"
    assert got["main_cpu_ms_per_batch"] > 0 and got["stage_cpu_ms_per_batch"] > 0
    assert got["dali_feed_cpu_ms_per_batch"] > 0
    assert gpufeed.FEED_ENV == FEED_ENV and FEED_ENV not in os.environ  # put back as it was
