"""`bench cache` on a tiny dataset: the figures it reports, and their JSON shape."""

from __future__ import annotations

from unstall.bench import cache as bench


def test_variants_report_hit_rates_per_epoch(tmp_path):
    n, size = 128, 1024
    keys = bench._write_dataset(str(tmp_path), n, size)
    cfg = {
        "capacity_fraction": 0.5,
        "bytes_per_s": 20e6,
        "batch_size": 16,
        "workers": 1,
        "seed": 0,
        "dataset_bytes": n * size,
    }
    runs = {v: [bench._run_variant(v, str(tmp_path), keys, cfg)] for v in bench.VARIANTS}
    assert runs["noevict"][0]["hit_rate"] == [0.0, 0.5, 0.5]
    assert runs["noevict"][0]["second_job"]["hit_rate"] == [0.5]
    assert runs["noevict"][0]["storage_bytes"] == [n * size, n * size // 2, n * size // 2]
    for v in ("torch", "lru"):
        assert runs[v][0]["hit_rate"][0] == 0.0 and max(runs[v][0]["hit_rate"]) < 0.5
    out = bench._result(runs, cfg, n, size, 1).to_json()
    assert out["capacity_fraction"] == 0.5 and out["ratio"] > 0
    assert set(out["variants"]) == {"torch", "lru", "noevict"}
    assert all(len(out["variants"][v]["hit_rate"]) == 3 for v in bench.VARIANTS)
    assert out["baseline"]["samples_per_s"] > 0 and out["unstall"]["samples_per_s"] > 0
