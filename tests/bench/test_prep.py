"""`bench prep` runs end to end on a tiny dataset and reports what the issue asks for."""

from __future__ import annotations

import json

from unstall.bench import load, write_json


def test_bench_prep_reports_rates_cpu_and_ratio(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "cache"))
    result = load("prep").run(quick=True, repeats=1, images=48, batch_size=16)
    write_json(result, str(tmp_path / "prep.json"))
    out = json.loads((tmp_path / "prep.json").read_text())
    assert out["benchmark"] == "prep" and out["ratio"] > 0
    for side in ("baseline", "unstall"):
        assert out[side]["samples_per_s"] > 0 and out[side]["main_cpu_s_per_1k"] > 0
    assert set(out["others"]) >= {"unstall cpu-normalize", "torch + uint8 pipeline"}
    loaders = [r["loader"] for r in out["rows"]]
    assert loaders[:2] == ["torch", "unstall"]
