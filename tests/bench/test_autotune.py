"""`bench autotune` runs end to end (tiny sizes) and its JSON carries each job's figures."""

from __future__ import annotations

import json

import unstall.bench.autotune as bench
from unstall.bench import registry
from unstall.bench.harness import write_json


def test_bench_autotune_runs_and_reports_each_job(tmp_path, monkeypatch):
    # tiny: 16 batches for the prep-bound job; one (workers, in flight) setting of the S3
    # sweep's three (the same code path, a third of its runs)
    monkeypatch.setattr(bench, "SCALE", 0.04)
    monkeypatch.setattr(bench, "REPEATS", 1)
    monkeypatch.setattr(bench, "S3_INFLIGHT", ((2, 16),))
    assert registry.load("autotune") is bench
    result = bench.run(quick=True)
    out = tmp_path / "autotune.json"
    write_json(result, str(out))
    doc = json.loads(out.read_text())
    jobs = doc["jobs_summary"]
    expected = {"prep_bound", "compute_bound", "cost_doubles", "two_ranks"}
    assert expected <= set(jobs) <= expected | {"fetch_bound_s3"}
    for name, job in jobs.items():
        assert job["ratio"] > 0 and job["cpu_ratio"] > 0, name
        runs = doc["jobs"][name]["runs"]
        assert set(runs) >= {str(n) for n in range(1, 2 * doc["cores"] + 1)} | {"auto"}
    assert "asked_8x4" in doc["jobs"]["prep_bound"]["runs"]
    if "fetch_bound_s3" in jobs:
        assert "2w_16inflight" in doc["jobs"]["fetch_bound_s3"]["runs"]
    assert doc["jobs"]["two_ranks"]["most_workers_together"] <= doc["cores"]
    assert set(doc["met"]) == {"ratio", "compute_cpu", "two_ranks_within_cores"}
    assert doc["goals"] == {"ratio_min": 0.92, "compute_cpu_max": 1.15}
