"""`bench launch` end to end on a tiny run (its figures are the bench's, not asserted here)."""

from __future__ import annotations

import pytest

from unstall.bench import load
from unstall.bench.launch import CASES


def test_bench_launch_reports_its_cases():
    bench = load("launch")
    # two cases of the four (the headline's and the launcher alone: every row is the same code,
    # a pair of commands timed alternately); no fresh cache to compile torch into, no warm-up
    # runs: the figures are not asserted
    script_args = ("--epochs", "1", "--samples", "128")
    result = bench.run(
        quick=True, repeats=1, script_args=script_args, fresh_cache=False, cases=("train", "true")
    )
    assert [r["case"] for r in result.rows] == [
        "python examples/train_min.py",
        "true (the launcher alone)",
    ]
    for r in result.rows:
        assert r["plain_ms"] > 0 and r["unstall_ms"] > 0 and r["ratio"] > 0
    assert result.rows[0]["unstall_cpu_ms"] > 0  # the script and its workers ran
    assert abs(result.ratio - result.rows[0]["ratio"]) < 1e-3  # the headline is train_min's
    assert result.detail == {"goal": 0.98, "repeats": 1}
    for wrong in (("true", "train"), ("train", "train"), ("train", "gpu")):
        with pytest.raises(ValueError, match="train first"):
            bench.run(quick=True, cases=wrong)
    assert set(CASES) == {"train", "tiny", "true", "torch"}
