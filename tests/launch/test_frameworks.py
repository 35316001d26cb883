"""Ordinary framework scripts (examples/frameworks/, nothing of unstall in them) under
`unstall run`: the loader that trained is reported with the right batches per epoch,
epochs and samples; shares stay <= 100 %; under DDP each rank is a row named by its
rank; loaders a framework replaced before using them are folded away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "frameworks"


def run_example(tmp_path: Path, name: str, *args: str, timeout: float = 240) -> dict:
    """`unstall run --json` on an example; returns the JSON (the run must succeed)."""
    out = tmp_path / "run.json"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "unstall", "run", "--json", str(out), "--",
         sys.executable, str(EXAMPLES / name), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "trained 2 epochs" in done.stdout, done.stdout[-2000:]
    assert "where the training loop waited for data" in done.stderr
    assert not list(tmp_path.glob("unstall-run-*")), "the run's folder was left behind"
    doc = json.loads(out.read_text())
    for proc in doc["processes"]:
        for row in proc["loaders"]:
            assert 0 <= row["wait_share"] <= 1, row
            assert row["batches"] > 0  # 0-batch loaders are folded, not rows
    return doc


def training_row(proc: dict) -> dict:
    """The loader with the most batches: the training loader in these scripts."""
    return max(proc["loaders"], key=lambda r: r["batches"])


def test_lightning_ddp_two_cpu_ranks(tmp_path):
    """Each rank a row, every sample once; its loaders as on one device (the sanity check's
    first), with the two it replaced folded. (One device, the same loaders less the
    replaced ones, is analyzed in tests/analysis/test_frameworks.py.)"""
    pytest.importorskip("lightning")
    ids = tmp_path / "ids"
    ids.mkdir()
    doc = run_example(tmp_path, "lightning_ddp.py", "--ids", str(ids))
    procs = doc["processes"]
    assert [p["rank"] for p in procs] == [0, 1]
    for proc in procs:
        train = training_row(proc)
        assert (train["batches_per_epoch"], train["epochs_completed"]) == ([4, 4], 2)
        assert (train["batches"], train["samples"]) == (8, 256)
        assert train["samples_per_s"] == pytest.approx(256 / train["wall_s"], rel=0.01)
        # Lightning re-made the training and validation loaders with a DistributedSampler
        assert [f["why"] for f in proc["folded"]] == ["replaced", "replaced"]
        # validation, made first: the sanity check (one batch: 32 samples a rank) and one pass
        # after each epoch
        val = proc["loaders"][0]
        assert val is not train
        assert (val["batches_per_epoch"], val["samples"]) == ([1, 1, 1], 96)
    for epoch in range(2):  # the ranks' samples: disjoint, and every sample once
        seen = [json.loads((ids / f"rank{r}-epoch{epoch}.json").read_text()) for r in (0, 1)]
        assert len(seen[0]) == len(seen[1]) == 128
        assert sorted(seen[0] + seen[1]) == list(range(256))


def test_hugging_face_trainer(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    doc = run_example(tmp_path, "hf_trainer.py")  # 256 samples, batch 32, 2 epochs
    (proc,) = doc["processes"]
    (train,) = proc["loaders"]
    assert [f["why"] for f in proc["folded"]] == ["replaced"]  # Trainer's, before accelerate's
    assert train["batch_size"] is None  # accelerate hands its loader a batch sampler
    assert (train["batches_per_epoch"], train["epochs_completed"]) == ([8, 8], 2)
    assert (train["batches"], train["samples"]) == (16, 512)
    assert train["samples_per_s"] == pytest.approx(512 / train["wall_s"], rel=0.01)


def test_a_batch_sampler_script_counts_real_samples(tmp_path):
    doc = run_example(tmp_path, "batch_sampler.py", "--samples", "200")  # batches 32 ... 8
    (proc,) = doc["processes"]
    (row,) = proc["loaders"]
    assert (row["batch_size"], row["batches_per_epoch"]) == (None, [7, 7])
    assert row["samples"] == 400  # not 14, one per batch
    assert row["samples_per_s"] == pytest.approx(400 / row["wall_s"], rel=0.01)
