"""The unchanged SSD-style script (examples/detection_ssd.py) under ``unstall run --config``
with prep lean: its pipeline planned, each sample once per epoch, the script's batch types,
and an epoch stopped and resumed that sees exactly what an uninterrupted one does (the
augmentations depend on the loader's seed, epoch and batch only).

The script's three runs (whole, stopped, resumed) are three calls of its ``main`` in one
interpreter under one ``unstall run`` (a plain ``python -c`` driver with nothing of unstall in
it): torch and torchvision are imported once, not three times. The resumed run still starts
from nothing but the checkpoint file the stopped one wrote: a new loader, its state loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unstall.bench.detection import make_detection_data

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "detection_ssd.py"
IMAGES = 8
#: The driver: the script's ``main`` run once per argument list, as ``python SCRIPT ARGS``
#: would (``sys.argv``, ``__name__ == "__main__"``), each run's files closed before the next.
DRIVER = """
import gc, json, runpy, sys
for argv in json.loads(sys.argv[1]):
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")
    gc.collect()
"""


def _records(ids: Path) -> list[dict]:
    return [json.loads(line) for line in ids.read_text().splitlines()]


@pytest.mark.timeout(300)  # one interpreter, three loaders with 2 workers each
def test_unchanged_script_planned_once_per_epoch_and_resumed_exactly(tmp_path: Path) -> None:
    data = make_detection_data(tmp_path / "data", IMAGES, size=(96, 72), seed=3)
    whole, parts = tmp_path / "whole.jsonl", tmp_path / "parts.jsonl"
    script = [str(SCRIPT), str(data), "--size", "64", "--batch-size", "2", "--workers", "2"]
    runs = [
        [*script, "--ids", str(whole)],
        [*script, "--ids", str(parts), "--stop-after", "2"],
        [*script, "--ids", str(parts), "--resume", f"{parts}.ckpt"],
    ]
    config = tmp_path / "lean.json"
    config.write_text(json.dumps({"kwargs": {"prep": "lean"}}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--"]
    command += [sys.executable, "-c", DRIVER, json.dumps(runs)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("prep='lean': JpegBoxes detection pipeline planned") == 3
    records = _records(whole)
    ids = [s["id"] for r in records for s in r["samples"]]
    assert sorted(ids) == list(range(IMAGES)) and len(records) == IMAGES // 2
    for r in records:
        assert r["epoch"] == 0 and r["loader"].startswith("unstall.")
        for s in r["samples"]:
            assert s["image"] == ["Image", "torch.float32", [3, 64, 64]]
            assert s["boxes_type"] == "BoundingBoxes" and s["canvas"] == [64, 64]
            assert len(s["boxes"]) == len(s["labels"])
    # the epoch stopped after 2 batches and resumed: the same samples, boxes and pixels, batch
    # for batch, as the uninterrupted run's
    stopped = _records(parts)
    assert stopped == records
