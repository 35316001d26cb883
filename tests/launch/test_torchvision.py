"""An unchanged torchvision ImageFolder script under ``unstall run --config`` with prep lean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.adapt.solid import CLASSES, class_of, make_solid_folder

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "torchvision_imagefolder.py"


def _run(tmp_path: Path, data: Path, ids: Path, *extra: str) -> subprocess.CompletedProcess:
    config = tmp_path / "lean.json"
    config.write_text(json.dumps({"kwargs": {"prep": "lean"}}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--"]
    command += [sys.executable, str(SCRIPT), str(data), "--size", "32", "--batch-size", "8"]
    command += ["--workers", "2", "--epochs", "2", "--ids", str(ids), *extra]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done


def _records(ids: Path) -> list[dict]:
    return [json.loads(line) for line in ids.read_text().splitlines()]


def _check(records: list[dict]) -> None:
    lo, hi = (0 - 0.485) / 0.229, (1 - 0.406) / 0.225
    for r in records:
        assert r["dtype"] == "torch.float32" and r["shape"][1:] == [3, 32, 32]
        assert r["loader"].startswith("unstall.") and lo - 1e-3 <= r["min"] <= r["max"] <= hi + 1e-3
        assert [class_of(px) for px in r["corner"]] == r["labels"]  # each image with its label


def test_unchanged_script_under_lean_config_resumes_exactly_once(tmp_path: Path) -> None:
    """2 epochs, stopped after 3 batches and resumed from the loader's saved position: float32
    normalized batches, every image with its label, each sample once per epoch."""
    data = make_solid_folder(tmp_path / "data")
    ids = tmp_path / "ids.jsonl"
    done = _run(tmp_path, data, ids, "--stop-after", "3")
    assert "prep='lean': ImageFolder prepared lean" in done.stderr
    assert len(_records(ids)) == 3
    _run(tmp_path, data, ids, "--resume", str(ids) + ".ckpt")
    records = _records(ids)
    _check(records)
    epoch0 = [t for r in records if r["epoch"] == 0 for t in r["labels"]]
    epoch1 = [t for r in records if r["epoch"] == 1 for t in r["labels"]]
    assert sorted(epoch0) == list(range(CLASSES))  # the 3 batches + the rest: once each
    assert sorted(epoch1) == list(range(CLASSES))
