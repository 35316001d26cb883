"""`unstall analyze --quick` on ordinary Lightning and Hugging Face scripts (issue 27).

Frameworks make, replace and wrap loaders (Lightning's sanity-check validation loader
first, a re-made loader with a distributed sampler under DDP; accelerate's
`DataLoaderShard` around the Trainer's own): the analyzer must measure the loader that
carries the training loop and list the others.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.analysis.conftest import run_analyze

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ROOT / "examples" / "frameworks"


def analyze(tmp_path: Path, script: str, *args: str) -> dict:
    options = ["--quick", "--steps", "6", "--min-seconds", "0.5"]
    command = [sys.executable, str(FRAMEWORKS / script), *args]
    return run_analyze(tmp_path, options, command, pythonpath=str(FRAMEWORKS))


def needs(*modules: str) -> None:
    """Skip unless ``modules`` are installed: only the script imports them (importing
    Lightning or transformers here, to check, would cost every run of the suite seconds)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


def measured_loader(report: dict) -> dict:
    (row,) = [r for r in report["loaders"] if r["measured"]]
    return row


@pytest.mark.timeout(300)
def test_lightning_one_device_measures_the_training_loader(tmp_path):
    needs("lightning")
    report = analyze(tmp_path, "lightning_train.py", "--samples", "4096", "--epochs", "40")
    row = measured_loader(report)
    # Lightning makes the validation loader first (its sanity check runs 2 batches, then a pass
    # after each epoch): it is listed, not measured; the training loader is
    first = report["loaders"][0]
    assert not first["measured"] and row["index"] == 1
    assert first["batches"] >= 2 and (first["batches"] - 2) % 32 == 0  # 1,024 / 32 per pass
    cold = report["runs"]["cold"]
    assert cold["samples"] == 32 * cold["steps"]
    assert report["batch_size"] == 32
    assert all(0 <= r["wait_share"] <= 1 for r in report["loaders"] if r["wait_share"] is not None)


@pytest.mark.timeout(300)
def test_lightning_ddp_two_ranks_stop_together_and_are_both_reported(tmp_path):
    needs("lightning")
    report = analyze(tmp_path, "lightning_ddp.py", "--samples", "4096", "--epochs", "40")
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    row = measured_loader(report)
    # Lightning re-made the loaders with a distributed sampler: the originals handed out none
    assert any(r["batches"] == 0 for r in report["loaders"])
    assert row["batches"] > 0 and row["samples"] == 32 * row["batches"]


@pytest.mark.timeout(300)
def test_hf_trainer_measures_accelerates_loader(tmp_path):
    needs("transformers", "accelerate")
    report = analyze(tmp_path, "hf_trainer.py", "--samples", "2048", "--epochs", "40")
    row = measured_loader(report)
    # the Trainer's own DataLoader is replaced by accelerate's before any batch
    assert report["loaders"][0]["batches"] == 0 and not report["loaders"][0]["measured"]
    assert row["batches"] > 0
    cold = report["runs"]["cold"]
    assert cold["samples"] == 32 * cold["steps"]
