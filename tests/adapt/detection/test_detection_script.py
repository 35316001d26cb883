"""The unchanged SSD-style script (examples/detection_ssd.py) under ``unstall run --config``
with prep lean: its pipeline planned, each sample once per epoch, the script's batch types,
and an epoch stopped and resumed that sees exactly what an uninterrupted one does (the
augmentations depend on the loader's seed, epoch and batch only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unstall.bench.detection import make_detection_data

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "detection_ssd.py"
IMAGES = 12


def _run(tmp_path: Path, data: Path, ids: Path, *extra: str) -> subprocess.CompletedProcess:
    config = tmp_path / "lean.json"
    config.write_text(json.dumps({"kwargs": {"prep": "lean"}}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--"]
    command += [sys.executable, str(SCRIPT), str(data), "--size", "64", "--batch-size", "4"]
    command += ["--workers", "2", "--ids", str(ids), *extra]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _records(ids: Path) -> list[dict]:
    return [json.loads(line) for line in ids.read_text().splitlines()]


@pytest.mark.timeout(600)  # three runs of a script with 2 workers each
def test_unchanged_script_planned_once_per_epoch_and_resumed_exactly(tmp_path: Path) -> None:
    data = make_detection_data(tmp_path / "data", IMAGES, size=(160, 120), seed=3)
    whole = tmp_path / "whole.jsonl"
    done = _run(tmp_path, data, whole, "--epochs", "2")
    assert "prep='lean': JpegBoxes detection pipeline planned" in done.stderr
    records = _records(whole)
    for epoch in (0, 1):
        ids = [s["id"] for r in records if r["epoch"] == epoch for s in r["samples"]]
        assert sorted(ids) == list(range(IMAGES))
    for r in records:
        assert r["loader"].startswith("unstall.")
        for s in r["samples"]:
            assert s["image"] == ["Image", "torch.float32", [3, 64, 64]]
            assert s["boxes_type"] == "BoundingBoxes" and s["canvas"] == [64, 64]
            assert len(s["boxes"]) == len(s["labels"])
    parts = tmp_path / "parts.jsonl"
    _run(tmp_path, data, parts, "--epochs", "1", "--stop-after", "2")
    assert len(_records(parts)) == 2
    _run(tmp_path, data, parts, "--epochs", "1", "--resume", str(parts) + ".ckpt")
    # epoch 0 stopped after 2 batches and resumed: the same samples, boxes and pixels, batch
    # for batch, as the uninterrupted run's
    assert _records(parts) == [r for r in records if r["epoch"] == 0]
