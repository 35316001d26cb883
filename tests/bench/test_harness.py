"""The benchmark harness: measurement, JSON shape, and the overhead benchmark end to end."""

from __future__ import annotations

import json
import time

import pytest

from unstall.bench import load
from unstall.bench.harness import BenchResult, measure, row, write_json
from unstall.bench.overhead import run as run_overhead


def test_measure_counts_samples_and_splits_wait_from_compute():
    def slow_batches():
        for _ in range(4):
            time.sleep(0.02)  # the "loader" takes 20 ms per batch
            yield list(range(8))

    m = measure(slow_batches(), rate=800.0)  # 8 samples at 800/s: 10 ms of compute
    assert m.samples == 32 and m.batches == 4
    assert m.wait_s >= 0.08 * 0.9
    assert m.compute_s == pytest.approx(0.04)
    assert 0.5 < m.stall_fraction < 0.9


def test_result_json_has_the_headline_fields(tmp_path):
    m = measure([[1, 2], [3]], rate=None)
    result = BenchResult(
        name="x",
        ratio=1.5,
        baseline={"samples_per_s": 10.0},
        unstall={"samples_per_s": 15.0},
        rows=[row("a", "torch", m)],
        detail={"extra": 1},
    )
    path = tmp_path / "out.json"
    write_json(result, str(path))
    data = json.loads(path.read_text())
    assert data["ratio"] == 1.5 and data["extra"] == 1
    assert data["baseline"]["samples_per_s"] == 10.0 and data["unstall"]["samples_per_s"] == 15.0
    assert data["rows"][0]["loader"] == "torch" and data["machine"]["cpus"] >= 1


def test_overhead_benchmark_runs_both_loaders_on_the_same_items():
    result = run_overhead(quick=True, repeats=1, items=20_000)
    data = result.to_json()
    assert data["config"]["items"] == 20_000
    assert [r["loader"] for r in data["rows"]] == ["torch", "unstall"]
    assert data["baseline"]["samples_per_s"] > 0 and data["unstall"]["samples_per_s"] > 0
    assert data["ratio"] == pytest.approx(data["ratios"][0], rel=1e-3)


def test_unknown_benchmark_names_the_known_ones():
    with pytest.raises(ValueError, match=r"known: .*overhead"):
        load("nope")
