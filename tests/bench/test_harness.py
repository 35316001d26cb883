"""The benchmark harness: measurement, JSON shape, the pair runner, and the overhead benchmark
end to end."""

from __future__ import annotations

import json
import time

import pytest

from unstall.bench import load
from unstall.bench.harness import (
    BenchResult,
    Pairs,
    measure,
    rotate,
    row,
    run_pairs,
    write_json,
)
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


def test_pairs_alternate_which_side_goes_first_and_take_each_pairs_ratio():
    calls: list[str] = []
    rates = iter([10.0, 20.0, 40.0, 15.0, 12.0, 36.0])  # in the order the runs happen

    def side(name: str):
        def one_run() -> float:
            calls.append(name)
            return next(rates)

        return one_run

    seen: list[tuple[int, float, float]] = []
    runs = run_pairs(
        side("base"), side("new"), 3, rate=float, on_pair=lambda i, b, n: seen.append((i, b, n))
    )
    assert calls == ["base", "new", "new", "base", "base", "new"]
    assert (runs.base, runs.new) == ([10.0, 15.0, 12.0], [20.0, 40.0, 36.0])
    assert seen == [(0, 10.0, 20.0), (1, 15.0, 40.0), (2, 12.0, 36.0)]
    assert runs.rates.ratios == pytest.approx([2.0, 40 / 15, 3.0])
    assert runs.rates.ratio == pytest.approx(40 / 15)  # the median pair's, not 36 / 12


def test_pair_summary_has_both_medians_the_pairs_ratios_and_their_median():
    s = Pairs([100.0, 50.0, 120.0], [180.0, 150.0, 300.0])
    assert s.base_median == 100.0 and s.new_median == 180.0
    assert s.ratios == pytest.approx([1.8, 3.0, 2.5])  # in run order
    assert s.ratio == pytest.approx(2.5)  # the median pair's ratio: the headline
    assert s.ratio_of_medians == pytest.approx(1.8)


def test_three_sides_rotate_one_place_a_round():
    order: list[list[str]] = []
    runs = rotate({k: (lambda k=k: k.upper()) for k in "abc"}, 4, lambda _i, o, _r: order.append(o))
    assert order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert runs == {"a": ["A"] * 4, "b": ["B"] * 4, "c": ["C"] * 4}
