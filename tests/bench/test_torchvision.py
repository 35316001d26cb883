"""`bench torchvision`'s figures from the analyzer's report (a pure function: milliseconds);
the runs themselves are the bench's (`unstall bench torchvision`), too long for the suite, and
their pairs the harness's (tests/bench/test_harness.py)."""

from __future__ import annotations

import json

import pytest

from unstall.bench.torchvision import _lean_probe


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
