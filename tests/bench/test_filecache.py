"""`bench filecache`: a plain script's Dataset, torch vs the same script under `unstall run` with
a cache of half the dataset, in one run."""

from __future__ import annotations

import pytest

from unstall.bench import load
from unstall.bench.filecache import run


@pytest.mark.timeout(600)
def test_epoch_two_reads_half_the_bytes_and_runs_faster_on_slow_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSTALL_BENCH_DIR", str(tmp_path))  # a disk (pytest's tmp), not tmpfs
    result = run(quick=True, files=64, file_kib=64, mb_per_s=4.0)
    assert load("filecache").run is run
    data = result.to_json()
    assert data["same_samples"] is True
    assert data["config"]["dataset_bytes"] == 64 * 64 * 1024
    torch_1, unstall_1, torch_2, unstall_2 = result.rows
    assert torch_1["storage_MiB"] == pytest.approx(4.0, abs=0.1)
    assert [r["case"] for r in result.rows] == ["epoch 1"] * 2 + ["epoch 2"] * 2
    assert torch_2["storage_MiB"] == pytest.approx(4.0, abs=0.1)  # cold: the whole dataset
    assert (unstall_1["cache_hits"], unstall_2["cache_hits"]) == (0, 32)  # C/N = 0.5
    assert data["bytes_ratio"] <= 0.55
    assert data["unstall"]["epoch_2_hit_rate"] == 0.5
    # The rate goal (1.6x) is the bench's, measured at its size (`unstall bench filecache`):
    # here only that the ratio is the epoch-2 rates' (no timed threshold in a unit test).
    assert result.ratio == pytest.approx(
        unstall_2["samples_per_s"] / torch_2["samples_per_s"], rel=1e-2
    )
