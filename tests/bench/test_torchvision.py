"""`bench torchvision`'s figures from its runs (pure functions: milliseconds); the runs
themselves are the bench's (`unstall bench torchvision`), too long for the suite."""

from __future__ import annotations

import json

import pytest

from unstall.bench.torchvision import _lean_probe, summarize


def test_summary_has_both_medians_the_pairs_ratios_and_their_median():
    s = summarize([100.0, 50.0, 120.0], [180.0, 150.0, 300.0])
    assert s["as_is"] == 100.0 and s["applied"] == 180.0
    assert s["pair_ratios"] == pytest.approx([1.8, 3.0, 2.5])  # in run order
    assert s["ratio"] == pytest.approx(2.5)  # the median pair's ratio: the headline
    assert s["ratio_of_medians"] == pytest.approx(1.8)


def test_lean_probe_is_read_from_the_analyzers_report(tmp_path):
    report = tmp_path / "report.json"
    lean = {"remedy": "lean", "probe": {"own_cpu_s": 0.004, "lean_cpu_s": 0.0025}}
    report.write_text(json.dumps({"remedies": [{"remedy": "auto"}, lean]}))
    assert _lean_probe(str(report)) == pytest.approx(
        {"own_cpu_ms": 4.0, "lean_cpu_ms": 2.5, "ratio": 1.6}
    )
    report.write_text(json.dumps({"remedies": [{"remedy": "lean", "not_measured": "..."}]}))
    assert _lean_probe(str(report)) is None
    assert _lean_probe(str(tmp_path / "missing.json")) is None
